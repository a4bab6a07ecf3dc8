"""`ratrain validate --cluster`: a grid of plans run on the emulated cluster (`ratrain
emulate`), each set beside its prediction, with the links shaped and unshaped.

This machine's compute drifts from one run to the next by as much as the links add to a
step, so each plan is also run with its links unshaped (`UNSHAPED_MBIT`: faster than any
run here needs), the two interleaved pass by pass, and two errors are reported:

- the whole step's: the shaped run against its prediction (MAPE, max error and Kendall's
  tau over the grid);
- what the links add: shaped minus unshaped, measured against predicted, per plan.

Predictions: the base platform (`ratrain calibrate` on this machine: its kernels, memory
and runtime costs; the nodes are namespaces of this machine and share its cores) with the
links between nodes at the emulated link's rate, of which TCP's headers leave 1448 of
every 1514 bytes to the messages (sourced), shared by a node's ranks, each byte carried
taking compute from the ranks on the machine's cores (`LINK_CPU_S_PER_BYTE`, from `ratrain
link-probe --cpu-only`) (`ratrain.bench.platform.link_platform`, assumed, not fitted to
anything measured here); the unshaped runs with the base platform's loopback link between
nodes and its own CPU per byte (none unless it says).

The default grid (`DEFAULT_CASES`, 13 plans): 1F1B, zb-h1, zb-h2 and a V order; ratrain,
gpu-style and fsdp-pp; pp-inner and dp-inner; 4 nodes x 1 rank and 2 x 2; 50, 100 and 200
Mbit/s. A grid file (YAML or JSON) is a list of cases, each a mapping with `name`,
`nodes`, `ranks_per_node`, `link_mbit` and `plan` (plan fields: `pp`, `dp`, `schedule`,
`pipeline`, `rank_layout`, `shard_optimizer`), and optionally `model`, `seq` and
`global_batch` (default bench-256, 128 and 16). Needs root (network namespaces).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ratrain.bench.platform import base_platform_dict, link_platform
from ratrain.errors import RatrainError

__all__ = [
    "ClusterCase",
    "DEFAULT_CASES",
    "UNSHAPED_MBIT",
    "load_cases",
    "measure",
    "plan_of",
    "platforms",
    "predict",
    "summarize",
    "table",
    "validate_cluster",
]

UNSHAPED_MBIT = 20000.0
"""assumed: links far faster than the runs need, the veths' own speed in effect."""

MODEL, SEQ, GLOBAL_BATCH = "bench-256", 128, 16
"""The default job of every case: the benchmark model at a short sequence, 16 microbatches
of one sequence (fp32, no clipping: the runs are timed, not trained)."""

_PLAN_FIELDS = ("pp", "dp", "schedule", "pipeline", "rank_layout", "shard_optimizer")


@dataclass(frozen=True)
class ClusterCase:
    """One plan of the grid on one emulated cluster."""

    name: str
    nodes: int
    ranks_per_node: int
    link_mbit: float
    plan: dict = field(hash=False)
    """Plan fields (`_PLAN_FIELDS`)."""
    model: str = MODEL
    seq: int = SEQ
    global_batch: int = GLOBAL_BATCH


def _case(name, nodes, r, mbit, **plan) -> ClusterCase:
    return ClusterCase(name, nodes, r, float(mbit), plan)


DEFAULT_CASES = (
    _case("4x1 pp=4 ratrain 1f1b", 4, 1, 50, pp=4, dp=1, schedule="ratrain"),
    _case("4x1 pp=4 ratrain zb-h1", 4, 1, 50, pp=4, dp=1, schedule="ratrain", pipeline="zb-h1"),
    _case("4x1 pp=2 dp=2 ratrain", 4, 1, 50, pp=2, dp=2, schedule="ratrain"),
    _case("4x1 pp=2 dp=2 gpu-style", 4, 1, 50, pp=2, dp=2, schedule="gpu-style"),
    _case("2x2 ratrain pp-inner", 2, 2, 100, pp=2, dp=2, schedule="ratrain"),
    _case(
        "2x2 ratrain dp-inner", 2, 2, 100, pp=2, dp=2, schedule="ratrain", rank_layout="dp-inner"
    ),
    _case(
        "2x2 gpu-style dp-inner",
        2,
        2,
        100,
        pp=2,
        dp=2,
        schedule="gpu-style",
        rank_layout="dp-inner",
    ),
    _case("4x1 pp=4 ratrain zb-h2", 4, 1, 50, pp=4, dp=1, schedule="ratrain", pipeline="zb-h2"),
    _case("4x1 pp=4 ratrain 1f1b 200M", 4, 1, 200, pp=4, dp=1, schedule="ratrain"),
    _case("4x1 pp=4 gpu-style 1f1b", 4, 1, 50, pp=4, dp=1, schedule="gpu-style"),
    _case(
        "2x2 ratrain zb-v dp-inner",
        2,
        2,
        100,
        pp=2,
        dp=2,
        schedule="ratrain",
        pipeline="zb-v",
        rank_layout="dp-inner",
    ),
    _case(
        "2x2 fsdp-pp dp-inner",
        2,
        2,
        100,
        pp=2,
        dp=2,
        schedule="fsdp-pp",
        shard_optimizer=True,
        rank_layout="dp-inner",
    ),
    _case(
        "2x2 ratrain dp-inner 50M", 2, 2, 50, pp=2, dp=2, schedule="ratrain", rank_layout="dp-inner"
    ),
)


def load_cases(path: str) -> list[ClusterCase]:
    """The cases of a grid file (see the module's docstring); one-line errors."""
    from ratrain.yaml_io import read_yaml_file

    doc = read_yaml_file(Path(path), "cluster grid file")
    if not isinstance(doc, list) or not doc:
        raise RatrainError(f"{path}: a cluster grid is a non-empty list of cases")
    out = []
    for i, item in enumerate(doc):
        where = f"{path}: case {i + 1}"
        if not isinstance(item, dict):
            raise RatrainError(f"{where}: expected a mapping, got {type(item).__name__}")
        known = {"name", "nodes", "ranks_per_node", "link_mbit", "plan", "model", "seq"}
        unknown = sorted(set(item) - known - {"global_batch"})
        if unknown:
            raise RatrainError(f"{where}: unknown key(s) {', '.join(unknown)}")
        missing = [k for k in ("nodes", "ranks_per_node", "link_mbit", "plan") if k not in item]
        if missing:
            raise RatrainError(f"{where}: missing {', '.join(missing)}")
        plan = item["plan"]
        if not isinstance(plan, dict) or set(plan) - set(_PLAN_FIELDS):
            bad = sorted(set(plan) - set(_PLAN_FIELDS)) if isinstance(plan, dict) else plan
            raise RatrainError(f"{where}: plan takes {', '.join(_PLAN_FIELDS)}; got {bad!r}")
        for k in ("nodes", "ranks_per_node", "seq", "global_batch"):
            v = item.get(k, 1)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RatrainError(f"{where}: {k} must be a positive integer, got {v!r}")
        rate = item["link_mbit"]
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
            raise RatrainError(f"{where}: link_mbit must be a positive number, got {rate!r}")
        case = ClusterCase(
            str(item.get("name", f"case {i + 1}")),
            item["nodes"],
            item["ranks_per_node"],
            float(rate),
            dict(plan),
            str(item.get("model", MODEL)),
            item.get("seq", SEQ),
            item.get("global_batch", GLOBAL_BATCH),
        )
        _check(case, where)
        out.append(case)
    return out


def _check(case: ClusterCase, where: str) -> None:
    """The plan is valid for the model and fills the cluster's ranks."""
    from ratrain.models.presets import get_preset

    try:
        spec = get_preset(case.model)
        plan = plan_of(case)
        plan.check_for(spec)
    except (RatrainError, ValueError, KeyError) as e:
        raise RatrainError(f"{where}: {e}") from None
    ranks = case.nodes * case.ranks_per_node
    if plan.pp * plan.dp != ranks:
        raise RatrainError(
            f"{where}: pp x dp = {plan.pp * plan.dp} ranks, but {case.nodes} nodes x "
            f"{case.ranks_per_node} ranks make {ranks}"
        )


def plan_of(case: ClusterCase):
    """The case's `Plan`: micro-batch 1, fp32, no clipping."""
    from ratrain.config import Plan

    return Plan(
        micro_batch=1,
        global_batch=case.global_batch,
        seq=case.seq,
        compute_dtype="fp32",
        grad_dtype="fp32",
        clip_grad=None,
        **case.plan,
    )


def platforms(base_path: str, case: ClusterCase, link_mbit: float | None = None):
    """(shaped, unshaped) platforms of the case: the base platform with the emulated links
    between nodes, and with its own loopback link between them instead."""
    from ratrain.platforms import load
    from ratrain.platforms.load import from_dict

    rate = case.link_mbit if link_mbit is None else link_mbit
    base = base_platform_dict(base_path)
    shaped = from_dict(
        link_platform(base, case.nodes, case.ranks_per_node, rate),
        f"{case.nodes}x{case.ranks_per_node} at {rate:g} Mbit/s",
    )
    loop = load(base_path)
    # assumed: unshaped, the veths pass the kernel's large segments whole, and the base
    # platform's calibration (on one machine, through loopback) already bears their cost
    return shaped, dataclasses.replace(
        shaped, inter_node=loop.intra_node, link_cpu_s_per_byte=loop.link_cpu_s_per_byte
    )


def predict(case: ClusterCase, base_path: str) -> dict[str, float]:
    """The simulated step time, shaped and unshaped."""
    from ratrain.models.presets import get_preset
    from ratrain.sim import simulate

    spec, plan = get_preset(case.model), plan_of(case)
    return {
        kind: simulate(spec, plan, pl, memory_timeline=False).step_time_s
        for kind, pl in zip(("shaped", "unshaped"), platforms(base_path, case), strict=True)
    }


def measure(
    case: ClusterCase, link_mbit: float, steps: int, warmup: int, port: int, timeout_s: float
) -> float:
    """The median step time of `steps` steps after `warmup` untimed ones, on the emulated
    cluster at `link_mbit`: `ratrain emulate ... -- train ...` in a child process, one
    thread per rank (as `ratrain bench cluster` runs its nodes: the namespaces share this
    machine's cores)."""
    plan = plan_of(case)
    with tempfile.TemporaryDirectory() as d:
        metrics = Path(d) / "m.jsonl"
        argv = [sys.executable, "-m", "ratrain", "emulate", "--nodes", str(case.nodes)]
        argv += ["--ranks-per-node", str(case.ranks_per_node), "--link-mbit", f"{link_mbit:g}"]
        argv += ["--master-port", str(port), "--timeout", f"{timeout_s:g}", "--"]
        argv += ["train", "--model", case.model, "--pp", str(plan.pp), "--dp", str(plan.dp)]
        argv += ["--micro-batch", "1", "--global-batch", str(plan.global_batch)]
        argv += ["--seq", str(plan.seq), "--schedule", plan.schedule]
        argv += ["--pipeline", plan.pipeline, "--rank-layout", plan.rank_layout]
        argv += ["--steps", str(warmup + steps)]
        if plan.shard_optimizer:
            argv += ["--shard-optimizer"]
        argv += ["--dtype", "fp32", "--grad-dtype", "fp32", "--clip-grad", "0"]
        argv += ["--threads", "1", "--metrics", str(metrics), "--quiet"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s + 60, env=env
            )
        except subprocess.TimeoutExpired:
            raise RatrainError(
                f"{case.name} at {link_mbit:g} Mbit/s did not end in {timeout_s:g} s"
            ) from None
        if r.returncode != 0 or not metrics.exists():
            tail = [x for x in (r.stdout + r.stderr).strip().splitlines() if x.strip()][-1:]
            raise RatrainError(
                f"{case.name} at {link_mbit:g} Mbit/s failed: {tail[0] if tail else 'no output'}"
            )
        times = [json.loads(x)["step_time_s"] for x in metrics.read_text().splitlines()]
    if len(times) <= warmup:
        raise RatrainError(f"{case.name}: {len(times)} steps recorded, {warmup} of them warm-up")
    return statistics.median(times[warmup:])


Measure = Callable[[ClusterCase, float, int, int, int, float], float]


def validate_cluster(
    cases: list[ClusterCase],
    base_path: str,
    *,
    passes: int = 2,
    steps: int = 5,
    warmup: int = 1,
    port: int = 29741,
    timeout_s: float = 900.0,
    progress: Callable[[int, int, str, float], None] | None = None,
    run: Measure = measure,
) -> list[dict]:
    """Predict every case, then run each shaped and unshaped, case after case, `passes`
    times over the grid (alternating its order: a drifting machine slows every plan
    alike). One row per case: its predicted and measured (per pass) step times."""
    rows = [
        {
            "case": c.name,
            "nodes": c.nodes,
            "ranks_per_node": c.ranks_per_node,
            "link_mbit": c.link_mbit,
            "plan": dict(c.plan),
            "predicted": predict(c, base_path),
            "measured": {"shaped": [], "unshaped": []},
        }
        for c in cases
    ]
    total, done, t0 = 2 * passes * len(cases), 0, time.perf_counter()
    for p in range(passes):
        order = list(range(len(cases)))
        if p % 2:
            order.reverse()
        for i in order:
            case, row = cases[i], rows[i]
            for kind, rate in (("shaped", case.link_mbit), ("unshaped", UNSHAPED_MBIT)):
                if progress is not None:
                    progress(done + 1, total, f"{case.name} {kind}", time.perf_counter() - t0)
                row["measured"][kind].append(run(case, rate, steps, warmup, port, timeout_s))
                done += 1
    return rows


def summarize(rows: list[dict]) -> dict:
    """The whole step's MAPE, max error and Kendall's tau over the plans (measured: the
    median of the passes), and per plan what the links add: predicted (shaped - unshaped)
    against measured, as a signed fraction; with the count within 15%."""
    from ratrain.validate.stats import kendall_tau, mape, max_error

    meas = [statistics.median(r["measured"]["shaped"]) for r in rows]
    pred = [r["predicted"]["shaped"] for r in rows]
    adds = []
    for r in rows:
        ms, mu = (statistics.median(r["measured"][k]) for k in ("shaped", "unshaped"))
        added = ms - mu
        p = r["predicted"]["shaped"] - r["predicted"]["unshaped"]
        adds.append(None if added <= 0 else (p - added) / added)
    known = [a for a in adds if a is not None]
    return {
        "plans": len(rows),
        "mape": mape(pred, meas),
        "max_error": max_error(pred, meas),
        "kendall_tau": kendall_tau(pred, meas) if len(rows) >= 2 else None,
        "links_add_errors": adds,
        "links_add_within_15pct": sum(abs(a) <= 0.15 for a in known),
        "links_add_max_error": max(map(abs, known)) if known else None,
    }


def table(rows: list[dict], summary: dict) -> str:
    """The rows as a table, then the summary line."""
    lines = [
        f"{'plan':<28} {'link':>9} {'meas s':>8} {'unsh s':>8} {'pred s':>8} {'err':>7} "
        f"{'links add':>9} {'pred add':>9} {'err':>7}"
    ]
    for r, add_err in zip(rows, summary["links_add_errors"], strict=True):
        ms, mu = (statistics.median(r["measured"][k]) for k in ("shaped", "unshaped"))
        ps, pu = r["predicted"]["shaped"], r["predicted"]["unshaped"]
        err = (ps - ms) / ms
        add = "n/a" if add_err is None else f"{add_err:+.0%}"
        lines.append(
            f"{r['case']:<28} {r['link_mbit']:>5g} Mb/s {ms:8.3f} {mu:8.3f} {ps:8.3f} {err:+7.1%} "
            f"{ms - mu:9.3f} {ps - pu:9.3f} {add:>7}"
        )
    s = summary
    tau = "" if s["kendall_tau"] is None else f", Kendall tau {s['kendall_tau']:.2f}"
    lines.append(
        f"whole step over {s['plans']} plans: MAPE {s['mape']:.1%}, max {s['max_error']:.1%}" + tau
    )
    known = [a for a in s["links_add_errors"] if a is not None]
    if known:
        lines.append(
            f"what the links add: {s['links_add_within_15pct']} of {len(known)} plans within "
            f"15%, worst {s['links_add_max_error']:.0%}"
        )
    skipped = len(s["links_add_errors"]) - len(known)
    if skipped:
        lines.append(
            f"{skipped} plan(s) ran no slower shaped than unshaped: what the links add is "
            "not measured there"
        )
    return "\n".join(lines)
