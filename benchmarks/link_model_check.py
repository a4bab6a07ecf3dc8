"""Predicted against measured step times of a grid of plans on the emulated cluster, with
the links shaped and unshaped, interleaved; the prediction with the link model of
`ratrain.cost.links` ("links") and without it ("queues": no link held, each transfer on
its sender's queue alone). The grid (`CASES`): 1F1B, zb-h1, zb-h2 and a V order;
ratrain, gpu-style and fsdp-pp; pp-inner and dp-inner; 4x1 and 2x2; 50, 100 and 200
Mbit/s. Where every plan ran, it ends with the whole step's MAPE, max error and Kendall's
tau, and how far what the links add is predicted on each plan.

    python benchmarks/link_model_check.py --platform base.yaml [--repeats 2] [--steps 6]
        [--json out.json]

The base platform (`ratrain calibrate`, this machine) gives the compute; the links are
the nominal rate of the emulated links shared by a node's ranks (`link_platform`, assumed,
not fitted to anything here). Unshaped runs use links of `UNSHAPED_MBIT` and are predicted
with the base platform's loopback link between nodes. What the links add is shaped minus
unshaped, measured against predicted; the compute drift between runs shows in the
unshaped column. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ratrain.bench.platform import base_platform_dict, link_platform
from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.platforms import load
from ratrain.platforms.load import from_dict
from ratrain.sim.simulate import simulate

sim_mod = sys.modules["ratrain.sim.simulate"]  # the module (the package exports the function)

MODEL, SEQ, GLOBAL_BATCH = "bench-256", 128, 16
UNSHAPED_MBIT = 20000
"""Links far faster than the runs need: the veths' own speed, in effect."""

CASES = [
    # (name, nodes, ranks per node, shaped Mbit/s, plan fields)
    ("4x1 pp=4 ratrain 1f1b", 4, 1, 50, {"pp": 4, "dp": 1, "schedule": "ratrain"}),
    (
        "4x1 pp=4 ratrain zb-h1",
        4,
        1,
        50,
        {"pp": 4, "dp": 1, "schedule": "ratrain", "pipeline": "zb-h1"},
    ),
    ("4x1 pp=2 dp=2 ratrain", 4, 1, 50, {"pp": 2, "dp": 2, "schedule": "ratrain"}),
    ("4x1 pp=2 dp=2 gpu-style", 4, 1, 50, {"pp": 2, "dp": 2, "schedule": "gpu-style"}),
    ("2x2 ratrain pp-inner", 2, 2, 100, {"pp": 2, "dp": 2, "schedule": "ratrain"}),
    (
        "2x2 ratrain dp-inner",
        2,
        2,
        100,
        {"pp": 2, "dp": 2, "schedule": "ratrain", "rank_layout": "dp-inner"},
    ),
    (
        "2x2 gpu-style dp-inner",
        2,
        2,
        100,
        {"pp": 2, "dp": 2, "schedule": "gpu-style", "rank_layout": "dp-inner"},
    ),
    # the rest of the grid: zb-h2 and a V order, fsdp-pp, a second rate
    (
        "4x1 pp=4 ratrain zb-h2",
        4,
        1,
        50,
        {"pp": 4, "dp": 1, "schedule": "ratrain", "pipeline": "zb-h2"},
    ),
    (
        "4x1 pp=4 ratrain 1f1b 200M",
        4,
        1,
        200,
        {"pp": 4, "dp": 1, "schedule": "ratrain"},
    ),
    (
        "4x1 pp=4 gpu-style 1f1b",
        4,
        1,
        50,
        {"pp": 4, "dp": 1, "schedule": "gpu-style"},
    ),
    (
        "2x2 ratrain zb-v dp-inner",
        2,
        2,
        100,
        {"pp": 2, "dp": 2, "schedule": "ratrain", "pipeline": "zb-v", "rank_layout": "dp-inner"},
    ),
    (
        "2x2 fsdp-pp dp-inner",
        2,
        2,
        100,
        {
            "pp": 2,
            "dp": 2,
            "schedule": "fsdp-pp",
            "shard_optimizer": True,
            "rank_layout": "dp-inner",
        },
    ),
    (
        "2x2 ratrain dp-inner 50M",
        2,
        2,
        50,
        {"pp": 2, "dp": 2, "schedule": "ratrain", "rank_layout": "dp-inner"},
    ),
]


def _plan(fields: dict) -> Plan:
    return Plan(
        micro_batch=1,
        global_batch=GLOBAL_BATCH,
        seq=SEQ,
        compute_dtype="fp32",
        grad_dtype="fp32",
        clip_grad=None,
        **fields,
    )


def _predict(plan: Plan, platform, links: bool) -> float:
    """The simulated step time, with the link model or without it (every transfer on its
    sender's queue alone)."""
    keep = sim_mod._links
    if not links:
        sim_mod._links = lambda *a: None
    try:
        return simulate(get_preset(MODEL), plan, platform, memory_timeline=False).step_time_s
    finally:
        sim_mod._links = keep


def _platforms(base_path: str, nodes: int, r: int, mbit: float):
    base = base_platform_dict(base_path)
    shaped = from_dict(link_platform(base, nodes, r, mbit), f"{nodes}x{r} at {mbit:g} Mbit/s")
    loop = load(base_path)
    # unshaped: the same nodes and sharing, the loopback link between them
    unshaped = dataclasses.replace(shaped, inter_node=loop.intra_node)
    return shaped, unshaped


def _measure(case, plan: Plan, mbit: float, steps: int, warmup: int, port: int) -> float:
    """The median step time of `steps` (after `warmup`) on the emulated network."""
    name, nodes, r, _, _ = case
    with tempfile.TemporaryDirectory() as d:
        metrics = Path(d) / "m.jsonl"
        argv = [sys.executable, "-m", "ratrain", "emulate", "--nodes", str(nodes)]
        argv += ["--ranks-per-node", str(r), "--link-mbit", f"{mbit:g}"]
        argv += ["--master-port", str(port), "--timeout", "900", "--"]
        argv += ["train", "--model", MODEL, "--pp", str(plan.pp), "--dp", str(plan.dp)]
        argv += ["--micro-batch", "1", "--global-batch", str(GLOBAL_BATCH), "--seq", str(SEQ)]
        argv += ["--schedule", plan.schedule, "--pipeline", plan.pipeline]
        argv += ["--rank-layout", plan.rank_layout, "--steps", str(steps)]
        if plan.shard_optimizer:
            argv += ["--shard-optimizer"]
        argv += ["--dtype", "fp32", "--grad-dtype", "fp32", "--clip-grad", "0"]
        argv += ["--threads", "1", "--metrics", str(metrics), "--quiet"]
        # OMP_NUM_THREADS=1 as `ratrain bench cluster` runs its nodes: with `--threads 1`
        # alone, 4x1 pp=4 steps measured 5.0-6.5 s here, and 1.9 s with it (1.1 s on
        # loopback): the nodes' shared cores were oversubscribed
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        r_ = subprocess.run(argv, capture_output=True, text=True, timeout=1000, env=env)
        if r_.returncode != 0 or not metrics.exists():
            tail = (r_.stdout + r_.stderr).strip().splitlines()[-3:]
            raise SystemExit(f"{name} at {mbit:g} Mbit/s failed: {' | '.join(tail)}")
        times = [json.loads(x)["step_time_s"] for x in metrics.read_text().splitlines()]
    return statistics.median(times[warmup:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", required=True, help="this machine's calibrated platform")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--port", type=int, default=29741)
    ap.add_argument("--cases", default="", help="comma-separated case numbers (default all)")
    ap.add_argument("--json", help="write every figure here (after each run)")
    ap.add_argument("--measured", help="predict only, beside the runs of this --json file")
    args = ap.parse_args()
    picked = [CASES[int(k)] for k in args.cases.split(",")] if args.cases else CASES
    rows = [
        {"case": c[0], "mbit": c[3], "measured": {"shaped": [], "unshaped": []}} for c in picked
    ]
    if args.measured:
        old = {r["case"]: r["measured"] for r in json.loads(Path(args.measured).read_text())}
        for row in rows:
            row["measured"] = old.get(row["case"], row["measured"])
    _predict_all(rows, picked, args.platform)
    for rep in range(0 if args.measured else args.repeats):
        for row, case in zip(rows, picked, strict=True):
            plan = _plan(case[4])
            for kind, mbit in (("shaped", case[3]), ("unshaped", UNSHAPED_MBIT)):
                t = _measure(case, plan, mbit, args.steps, args.warmup, args.port)
                row["measured"][kind].append(t)
                print(f"repeat {rep}: {row['case']} {kind}: {t:.3f} s", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
    done = [r for r in rows if r["measured"]["shaped"] and r["measured"]["unshaped"]]
    _report(done)
    if len(done) >= 2:
        _summary(done)
    if args.json and not args.measured:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _predict_all(rows, picked, platform: str) -> None:
    for row, (_, nodes, r, mbit, fields) in zip(rows, picked, strict=True):
        plan = _plan(fields)
        shaped, unshaped = _platforms(platform, nodes, r, mbit)
        row["predicted"] = {
            model: {
                "shaped": _predict(plan, shaped, model == "links"),
                "unshaped": _predict(plan, unshaped, model == "links"),
            }
            for model in ("queues", "links")
        }


def _summary(rows) -> None:
    """Whole step: MAPE, max error and Kendall's tau over the plans; what the links add:
    the error of each plan's (shaped - unshaped), measured against predicted."""
    from ratrain.validate.stats import kendall_tau, mape, max_error

    meas = [statistics.median(r["measured"]["shaped"]) for r in rows]
    pred = [r["predicted"]["links"]["shaped"] for r in rows]
    adds = []
    for r in rows:
        ms, mu = (statistics.median(r["measured"][k]) for k in ("shaped", "unshaped"))
        p = r["predicted"]["links"]
        adds.append(((p["shaped"] - p["unshaped"]) - (ms - mu)) / (ms - mu) * 100)
    print(
        f"whole step over {len(rows)} plans: MAPE {mape(pred, meas) * 100:.1f}%, max "
        f"{max_error(pred, meas) * 100:.1f}%, Kendall tau {kendall_tau(pred, meas):.2f}; "
        f"what the links add: within {max(map(abs, adds)):.0f}% on every plan, "
        f"{sum(abs(a) <= 15 for a in adds)} of {len(adds)} within 15%"
    )


def _report(rows) -> None:
    print(
        "| plan | link | measured shaped s | unshaped s | links add s | predicted (queues) "
        "step / links add | predicted (links) step / links add |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        ms = statistics.median(row["measured"]["shaped"])
        mu = statistics.median(row["measured"]["unshaped"])
        cells = []
        for model in ("queues", "links"):
            p = row["predicted"][model]
            add = p["shaped"] - p["unshaped"]
            err = (p["shaped"] - ms) / ms * 100
            add_err = (add - (ms - mu)) / (ms - mu) * 100 if ms != mu else float("nan")
            cells.append(f"{p['shaped']:.3f} ({err:+.0f}%) / {add:.3f} ({add_err:+.0f}%)")
        print(
            f"| {row['case']} | {row['mbit']} Mbit/s | {ms:.3f} | {mu:.3f} | {ms - mu:.3f} | "
            + " | ".join(cells)
            + " |"
        )


if __name__ == "__main__":
    main()
