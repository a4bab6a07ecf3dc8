"""`ratrain bench cluster`: ratrain against its strongest peers on an emulated
bandwidth-constrained network, under memory caps, measured. (The benchmark keeps its name,
its output folder and its JSON keys; the network it runs on is `ratrain emulate`'s.)

Per link rate (`--link-mbit`), on `--nodes` network namespaces of `--ranks-per-node` ranks
joined by links shaped to that rate (an emulated network, `ratrain.launch.emulate`):

1. **The links are measured** from inside the emulated network (`ratrain link-probe`,
   `ratrain.bench.link_probe`) and written into a platform file: the machine's own
   calibrated platform (`--base-platform`, its kernels and its core sharing: the nodes are
   namespaces of this machine) with the measured link between nodes
   (`ratrain.bench.platform`).
2. **Planned systems.** Per cap, `ratrain plan` on that platform finds the best plan of
   each family (ratrain, gpu-style, zero1-pp, fsdp-pp) that fits the cap, its rank
   placement included; fp32 compute and gradients and no clipping are pinned, so that
   every system runs the same maths as the peers. ratrain's entry is measured before it
   is chosen (`--trial K`, `ratrain.validate.trial`): the best plans of its K best
   structures and each other family's best structure and plan under ratrain's lifecycle run a few
   steps on the emulated network, and the fastest measured is ratrain's plan; the
   prediction-only pick (the search's first) is timed beside it, and its regret reported.
3. **Peers.** torch.distributed.pipelining (each pipeline that runs here, with DDP or
   FSDP2 for the data-parallel dimension and with or without full activation
   checkpointing, as torchtitan composes them) and DeepSpeed's PipelineEngine (ZeRO 0 or
   1, activation-checkpoint interval 0 or 1; skipped when not installed), at each pp x dp
   of `--peer-layouts`, ranks placed as their defaults place them (the pipeline dimension
   outermost: torchtitan's mesh, DeepSpeed's topology; ratrain calls that `dp-inner`).
   A peer's configuration fits a cap when its measured peak fits; the best that fits is
   the fastest measured.
4. **Memory** is one measure for every system: the peak of live tensor bytes per rank
   (`ratrain.observe.memory.LiveBytes`, model, gradients, optimizer states, activations
   and communication buffers), counted in a separate 2-step run on local ranks (it slows
   every operator, so timed runs do not count it; tensor bytes do not depend on the
   links). The platform reserves no workspace, so the planner's ledger plans against the
   same measure; the cap is checked against the measured peak for every system.
5. **Runs** are interleaved: per repeat, per link rate, every system one after the other
   (the order reversed every other repeat), each a fresh torchrun job on every node.
   tokens/s = global-batch tokens / the median period between step ends after `--warmup`
   steps; the median over repeats is reported.

Writes `cluster-<rate>mbit.json` per link rate (the schema of `result_json`), a Markdown
report and a plot of tokens/s against the cap, one line per system.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ratrain.errors import RatrainError
from ratrain.validate.trial import DEFAULT_ROUNDS

__all__ = [
    "Setup",
    "FAMILIES",
    "peer_candidates",
    "run_bench",
    "result_json",
    "PINS",
]

FAMILIES = ("ratrain", "gpu-style", "zero1-pp", "fsdp-pp")
"""The plan families `ratrain plan` knows, each planned per cap."""

PINS = ("compute_dtype=fp32", "grad_dtype=fp32", "clip_grad=0")
"""The same maths as the peers: fp32 compute and gradients, no global-norm clipping."""

TORCH_FULL = (
    "torch-1f1b",
    "torch-interleaved-1f1b",
    "torch-izb",
    "torch-zbv",
    "torch-dualpipev",
)
TORCH_QUICK = ("torch-1f1b", "torch-interleaved-1f1b", "torch-zbv")


@dataclass
class Setup:
    model: str = "bench-256"
    seq: int = 128
    global_batch: int = 16
    nodes: int = 2
    ranks_per_node: int = 2
    link_mbits: tuple[float, ...] = (100.0, 400.0)
    caps_gib: tuple[float, ...] = (0.25, 0.12, 0.08)
    peer_layouts: tuple[tuple[int, int], ...] = ((2, 2), (4, 1))
    """The peers' pp x dp: each is one of their knobs."""
    peer_micro_batch: int = 2
    steps: int = 6
    warmup: int = 2
    repeats: int = 2
    quick: bool = False
    base_platform: str = "measure"
    """A platform preset or file describing this machine, or "measure": calibrate it first
    (`ratrain calibrate --quick`, fp32), so that the plans are made for the machine the
    sweep runs on."""
    out: Path = Path("out/bench-cluster")
    run_timeout_s: float = 600.0
    systems: tuple[str, ...] | None = None
    """Only these (families and peer names, e.g. ratrain,torch-1f1b); None: all."""
    progress: bool = True
    trial: int = 3
    """ratrain's entry: the trial's K (best structures measured before choosing); 0: the
    prediction-only pick."""
    trial_steps: int = 3
    """Timed steps per trial run (after `warmup` untimed)."""
    trial_rounds: int = DEFAULT_ROUNDS
    """Runs per trial plan at most (`ratrain.validate.trial.run_trial`'s rounds)."""
    _t0: float = field(default_factory=time.perf_counter, repr=False)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    def say(self, msg: str) -> None:
        if self.progress:
            dt = time.perf_counter() - self._t0
            print(f"ratrain bench cluster: {msg} ({dt:.0f} s)", file=sys.stderr, flush=True)

    def wants(self, name: str) -> bool:
        if self.systems is None:
            return True
        return name in self.systems or name.split("/")[0] in self.systems


# -- the platform of each link rate ---------------------------------------------------------
def _torchrun(setup: Setup, port: int, *argv: str, ranks: int | None = None) -> list[str]:
    """torchrun on every emulated node, or, for a job of fewer `ranks` than the nodes hold
    (a plan that leaves compute units over: pp x dp below `ratrain plan --clusters`), on the
    first nodes filled `ranks_per_node` at a time, the others running nothing (as the
    planner placed them: `ratrain.ranks`)."""
    from ratrain.launch.emulate import torchrun_argv

    r = setup.ranks_per_node
    ranks = setup.world if ranks is None else ranks
    if ranks <= r:
        nnodes, per_node = 1, ranks
    elif ranks % r == 0:
        nnodes, per_node = ranks // r, r
    else:
        raise RatrainError(f"{ranks} ranks do not fill nodes of {r}")
    cmd = torchrun_argv(nnodes, per_node, port, *argv)
    if nnodes == setup.nodes:
        return cmd
    script = f'if [ "{{node_rank}}" -lt {nnodes} ]; then exec {shlex.join(cmd)}; fi'
    return ["sh", "-c", script]


_PORTS = itertools.count(29600)


def _on_nodes(
    net, setup: Setup, argv: list[str], what: str, ranks: int | None = None
) -> str | None:
    """Run `argv` (a module and its arguments) under torchrun on every node of the emulated
    network `net` (`_torchrun`); None when every node succeeded, else one line saying which
    failed and the tail of its output."""
    env = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}
    cmd = _torchrun(setup, next(_PORTS), *argv, ranks=ranks)
    res = net.run_on_nodes(cmd, env=env, timeout_s=setup.run_timeout_s)
    bad = [r for r in res if r.returncode != 0]
    if not bad:
        return None
    r = bad[0]
    tail = " | ".join(line.strip() for line in r.output.strip().splitlines()[-4:])
    why = "timed out" if r.timed_out else f"exit {r.returncode}"
    return f"{what}: node {r.node_rank} {why}: {tail[-600:]}"


def measure_platform(net, setup: Setup, mbit: float, out: Path) -> Path:
    """Probe the links of the emulated network `net` and write its platform file; returns
    its path."""
    import yaml

    from ratrain.bench.platform import base_platform_dict, emulated_platform

    probe_json = out / f"links-{mbit:g}mbit.json"
    err = _on_nodes(
        net,
        setup,
        [
            "-m",
            "ratrain",
            "link-probe",
            str(probe_json),
            "--ranks-per-node",
            str(setup.ranks_per_node),
        ],
        "link probe",
    )
    if err:
        raise RatrainError(err)
    probe = json.loads(probe_json.read_text())
    on = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    plat = emulated_platform(base_platform_dict(setup.base_platform), probe, mbit, on)
    path = out / f"platform-{mbit:g}mbit.yaml"
    path.write_text(
        "# Written by `ratrain bench cluster`; every value says how it was obtained.\n"
        + yaml.safe_dump(plat, sort_keys=False, width=100)
    )
    return path


MEASURE = "measure"


def calibrate_base(setup: Setup, out: Path) -> Path:
    """This machine's platform, measured now (`ratrain calibrate --quick`, fp32 only: every
    planned system runs fp32 here) on the machine's own cores and loopback, before any
    link is shaped; returns the file's path. Values whose windows did not repeat are
    kept and listed in the file (`--allow-noisy`): a platform of this machine measured
    with some noise predicts it better than another machine's measured without."""
    path = out / "base-platform.yaml"
    setup.say(f"calibrating this machine (ratrain calibrate --quick): {path}")
    code, text = _cli(
        [
            "calibrate",
            "--quick",
            "--dtypes",
            "fp32",
            "--allow-noisy",
            "--no-progress",
            "--nproc",
            str(min(setup.world, 4)),
            "--name",
            "bench-base",
            "-o",
            str(path),
        ]
    )
    if code != 0:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise RatrainError(
            f"calibrating this machine failed ({tail[-400:]}); pass --base-platform "
            "cpu-local (or a platform file) to plan on a calibration made before"
        )
    return path


# -- planned systems ------------------------------------------------------------------------
def _cli(argv: list[str]) -> tuple[int, str]:
    """`ratrain ARGV` in a subprocess: exit code, output."""
    r = subprocess.run(
        [sys.executable, "-m", "ratrain", *argv], capture_output=True, text=True, timeout=600
    )
    return r.returncode, r.stdout + r.stderr


def plan_family(setup: Setup, platform: Path, cap_gib: float, family: str, path: Path):
    """The best plan of `family` under the cap on `platform`, written to `path`; None when
    none fits (the planner's one line is returned beside)."""
    pins = [a for p in PINS for a in ("--pin", p)]
    code, out = _cli(
        [
            "plan",
            "--model",
            setup.model,
            "--platform",
            str(platform),
            "--memory-cap",
            f"{cap_gib:g}",
            "--clusters",
            str(setup.world),
            "--seq",
            str(setup.seq),
            "--global-batch",
            str(setup.global_batch),
            "--family",
            family,
            *pins,
            "--quiet",
            "-o",
            str(path),
        ]
    )
    if code != 0:
        first = next((line for line in out.splitlines() if line.strip()), "no plan")
        return None, first.strip()
    from ratrain.config import load_plan

    plan, extra = load_plan(path)
    return plan, extra


def _train_argv(plan_path: Path, steps: int, metrics: Path) -> list[str]:
    return ["-m", "ratrain", "train", "--plan", str(plan_path), "--steps", str(steps)] + [
        "--metrics",
        str(metrics),
        "--quiet",
    ]


def ratrain_peak(setup: Setup, plan_path: Path, ranks: int, metrics: Path) -> list[int]:
    """Peak live tensor bytes per rank of a plan of `ranks` ranks: 2 steps on local ranks
    of the pipeline runtime (`--nproc`: also for one rank) with `--measure-memory`."""
    r = subprocess.run(
        [sys.executable, *_train_argv(plan_path, 2, metrics)]
        + ["--measure-memory", "--nproc", str(ranks)],
        capture_output=True,
        text=True,
        timeout=setup.run_timeout_s,
    )
    if r.returncode != 0:
        raise RatrainError(f"memory run of {plan_path} failed: {r.stderr.strip()[-400:]}")
    last = json.loads(metrics.read_text().splitlines()[-1])
    if last.get("peak_bytes_source") != "tensors":
        raise RatrainError(f"memory run of {plan_path} did not count tensor bytes")
    return [int(x) for x in last["peak_bytes_per_rank"]]


def ratrain_timed(
    net, setup: Setup, plan_path: Path, ranks: int, metrics: Path, steps: int | None = None
) -> dict:
    """Time the plan file `plan_path` (of `ranks` ranks) on the emulated network `net` for
    `steps` (default `setup.steps`)."""
    if metrics.exists():
        metrics.unlink()
    err = _on_nodes(
        net,
        setup,
        _train_argv(plan_path, steps or setup.steps, metrics),
        f"ratrain train --plan {plan_path.name}",
        ranks=ranks,
    )
    if err:
        return {"error": err}
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    times = [r["step_time_s"] for r in rows]
    return {"times": times, "losses": [r["loss"] for r in rows]}


# -- peers -------------------------------------------------------------------------------------
def peer_candidates(setup: Setup) -> list[tuple[str, dict]]:
    """(name, knobs) of every peer configuration tried, at each of `setup.peer_layouts`
    (pp x dp): torch pipelining's pipelines (`Schedule*`) x DDP/FSDP2 (dp > 1) x full activation
    checkpointing, and DeepSpeed's ZeRO stage (1 only with dp > 1) x checkpoint interval."""
    from ratrain.bench.peers import SPLIT_BACKWARD, deepspeed_available

    out = []
    for pp, dp in setup.peer_layouts:
        at = f"@{pp}x{dp}"
        for system in TORCH_QUICK if setup.quick else TORCH_FULL:
            if system != "torch-1f1b" and 2 * pp > _n_layers(setup):
                continue  # two chunks per rank need 2·pp blocks
            if dp == 1:
                wraps = ("allreduce",)  # nothing to wrap: one replica
            elif system in SPLIT_BACKWARD:
                wraps = ("fsdp2",)  # DDP does not see their weight-gradient passes
            else:
                wraps = ("ddp", "fsdp2")
            for wrap in wraps:
                for ac in (False, True):
                    name = (
                        system
                        + ("" if wrap == "allreduce" else f"/{wrap}")
                        + ("/ac" if ac else "")
                        + at
                    )
                    knobs = {
                        "system": system,
                        "dp_wrap": wrap,
                        "activation_checkpoint": ac,
                        "layout": "dp-inner",
                        "pp_dp": (pp, dp),
                    }
                    out.append((name, knobs))
        if deepspeed_available():
            for zero in (0, 1) if dp > 1 else (0,):
                for ac in (0, 1):
                    name = f"deepspeed/zero{zero}" + (f"/ac{ac}" if ac else "") + at
                    knobs = {
                        "system": "deepspeed",
                        "zero_stage": zero,
                        "ac_interval": ac,
                        "pp_dp": (pp, dp),
                    }
                    out.append((name, knobs))
    return [(n, k) for n, k in out if setup.wants(n) or setup.wants(_peer_family(n))]


def _n_layers(setup: Setup) -> int:
    from ratrain.models.presets import resolve_model

    return resolve_model(setup.model).n_layers


def _peer_family(name: str) -> str:
    return "deepspeed" if name.startswith("deepspeed") else "torch-pp"


def _peer_objects(setup: Setup, pp: int, dp: int):
    from ratrain.config import Plan, TrainConfig
    from ratrain.models.presets import resolve_model

    spec = resolve_model(setup.model)
    plan = Plan(
        pp=pp,
        dp=dp,
        micro_batch=setup.peer_micro_batch,
        global_batch=setup.global_batch,
        seq=setup.seq,
        compute_dtype="fp32",
        grad_dtype="fp32",
        clip_grad=None,
    )
    return spec, plan, TrainConfig(steps=setup.steps, seed=0)


def peer_config(setup: Setup, knobs: dict, steps: int, measure: bool) -> dict:
    from ratrain.bench.peer_rank import config_for

    k = dict(knobs)
    spec, plan, cfg = _peer_objects(setup, *k.pop("pp_dp"))
    cfg = dataclasses.replace(cfg, steps=steps)
    system = k.pop("system")
    return config_for(system, spec, plan, cfg, measure=measure, **k)


def peer_peak(setup: Setup, knobs: dict) -> list[int] | str:
    """Peak live tensor bytes per rank of a peer configuration (2 steps, local ranks), or
    why it did not run."""
    from ratrain.bench.peer_rank import run_local

    try:
        res = run_local(peer_config(setup, knobs, 2, True), deadline_s=setup.run_timeout_s)
    except Exception as e:  # a configuration that does not run here (reported, skipped)
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    return [int(r["peak"]) for r in sorted(res, key=lambda r: r["rank"])]


def peer_timed(net, setup: Setup, knobs: dict, where: Path) -> dict:
    where.mkdir(parents=True, exist_ok=True)
    for f in where.glob("rank-*.json"):
        f.unlink()
    cfg_path = where / "config.json"
    cfg_path.write_text(json.dumps(peer_config(setup, knobs, setup.steps, False)))
    err = _on_nodes(
        net, setup, ["-m", "ratrain.bench.peer_rank", str(cfg_path), str(where)], where.name
    )
    if err:
        return {"error": err}
    ranks = [json.loads(f.read_text()) for f in sorted(where.glob("rank-*.json"))]
    pp = knobs["pp_dp"][0]
    last = [r for r in ranks if r.get("stage") == pp - 1] or ranks
    last = min(last, key=lambda r: r["rank"])
    # the last chunk's rank reports the losses (stage 0 in the V-shaped pipelines)
    losses = next((r["losses"] for r in ranks if r.get("losses") is not None), None)
    return {"times": last["times"], "losses": losses}


# -- the sweep ---------------------------------------------------------------------------------
def _tokens_per_s(setup: Setup, times: list[float]) -> float:
    tail = times[setup.warmup :] if len(times) > setup.warmup else times
    return setup.global_batch * setup.seq / statistics.median(tail)


@dataclass
class Rate:
    """Everything measured at one link rate."""

    mbit: float
    platform: Path | None = None
    plans: dict = field(default_factory=dict)
    """(cap, family) -> {"plan": Plan | None, "path": Path, "predicted": float, "why": str}"""
    runs: dict = field(default_factory=dict)
    """system key (plan file name or peer name) -> [tokens/s per repeat]"""
    errors: dict = field(default_factory=dict)


def run_bench(setup: Setup) -> list[dict]:
    """The whole sweep; returns one `result_json` per link rate (also written)."""
    from ratrain.launch.emulate import EmulatedNetwork, unavailable

    why = unavailable()
    if why:
        raise RatrainError(why)
    out = Path(setup.out)
    out.mkdir(parents=True, exist_ok=True)
    if setup.base_platform == MEASURE:
        setup.base_platform = str(calibrate_base(setup, out))
    rates = [Rate(m) for m in setup.link_mbits]
    peers = peer_candidates(setup)
    setup.say(f"{len(peers)} peer configurations, measuring their memory on local ranks")
    peer_peaks = {}
    for name, knobs in peers:
        peer_peaks[name] = peer_peak(setup, knobs)
        got = peer_peaks[name]
        setup.say(
            f"  {name}: "
            + (got if isinstance(got, str) else f"peak {max(got) / 2**20:.1f} MiB per rank")
        )
    runnable = [(n, k) for n, k in peers if not isinstance(peer_peaks[n], str)]
    plan_peaks: dict[str, list[int]] = {}
    for rep in range(setup.repeats):
        for rate in rates if rep % 2 == 0 else reversed(rates):
            with EmulatedNetwork(setup.nodes, rate.mbit) as net:
                if rate.platform is None:
                    setup.say(f"{rate.mbit:g} Mbit/s: measuring the links")
                    rate.platform = measure_platform(net, setup, rate.mbit, out)
                    _plan_all(setup, rate, out, plan_peaks, net)
                jobs = _jobs(setup, rate, runnable)
                if rep % 2:
                    jobs.reverse()
                for key, fn in jobs:
                    setup.say(f"repeat {rep + 1}/{setup.repeats}, {rate.mbit:g} Mbit/s: {key}")
                    res = fn(net)
                    if "error" in res:
                        rate.errors[key] = res["error"]
                        setup.say(f"  failed: {res['error'][:300]}")
                        continue
                    tps = _tokens_per_s(setup, res["times"])
                    rate.runs.setdefault(key, []).append(tps)
                    setup.say(f"  {tps:,.0f} tokens/s")
    results = [result_json(setup, r, peers, peer_peaks, plan_peaks) for r in rates]
    for r, res in zip(rates, results, strict=True):
        (out / f"cluster-{r.mbit:g}mbit.json").write_text(json.dumps(res, indent=2))
    return results


def _plan_all(setup: Setup, rate: Rate, out: Path, plan_peaks: dict, net=None) -> None:
    """Plan every family under every cap on the rate's platform (ratrain's by its trial on
    the emulated network `net`, where `setup.trial`); measure each distinct plan's peak
    once (local ranks)."""
    for cap in setup.caps_gib:
        for fam in FAMILIES:
            if not setup.wants(fam):
                continue
            path = out / f"plan-{rate.mbit:g}mbit-{cap:g}gib-{fam}.yaml"
            if fam == "ratrain" and setup.trial and net is not None:
                plan, extra = ratrain_trial(net, setup, rate, cap, path)
            else:
                plan, extra = plan_family(setup, rate.platform, cap, fam, path)
            entry = {"plan": plan, "path": path, "why": extra if plan is None else ""}
            if plan is not None and "trial" in extra:
                entry["trial"], entry["prediction_pick"] = extra["trial"], extra["prediction_pick"]
            if plan is not None:
                entry["predicted"] = float(extra["predicted"]["tokens_per_s"])
                key = json.dumps(plan.to_dict(), sort_keys=True)
                if key not in plan_peaks:
                    plan_peaks[key] = ratrain_peak(
                        setup, path, plan.pp * plan.dp, out / f"{path.stem}.memory.jsonl"
                    )
                entry["peak"] = plan_peaks[key]
                setup.say(
                    f"  {cap:g} GiB {fam}: {entry['predicted']:,.0f} tokens/s predicted, "
                    f"peak {max(entry['peak']) / 2**20:.1f} MiB measured"
                )
            else:
                setup.say(f"  {cap:g} GiB {fam}: {entry['why']}")
            rate.plans[(cap, fam)] = entry


# -- ratrain's entry: the trial --------------------------------------------------------------
def trial_request(setup: Setup, platform: Path, cap_gib: float):
    """The planner's request of ratrain's entry at one cap: what `plan_family` asks
    `ratrain plan` for (the same pins, clusters, batch), in this process."""
    import dataclasses

    from ratrain.models.presets import resolve_model
    from ratrain.planner import Request, parse_pins
    from ratrain.platforms import load

    plat = dataclasses.replace(load(str(platform)), usable_memory_bytes=int(cap_gib * 2**30))
    spec = resolve_model(setup.model)
    pins = parse_pins(list(PINS))
    return Request(spec, plat, setup.world, setup.global_batch, setup.seq, pins=pins,
                   families=("ratrain",))  # fmt: skip


def ratrain_trial(net, setup: Setup, rate: Rate, cap_gib: float, path: Path):
    """ratrain's plan at one cap, measured before it is chosen: the search's candidates
    (`ratrain.planner.candidates`) each run `warmup` + `trial_steps` steps on the emulated
    network `net`, the fastest measured written to `path`. (plan, extras) as `plan_family`
    returns them, with the trial and the prediction-only pick among the extras; (None,
    why) when no plan fits."""
    from ratrain.config import save_plan
    from ratrain.deadline import DEFAULT_TIME_BUDGET_S, Budget
    from ratrain.planner import search
    from ratrain.planner.candidates import trial_candidates
    from ratrain.validate.trial import run_trial

    req = trial_request(setup, rate.platform, cap_gib)
    budget = Budget.for_plan(DEFAULT_TIME_BUDGET_S)
    res = search(req, top=4 * setup.trial, budget=budget.restarted())
    if not res.feasible:
        return None, f"no ratrain plan fits {cap_gib:g} GiB"
    cands = trial_candidates(req, res.ranked, setup.trial, budget=budget)
    files = {}  # by source: "#i" or "<family> structure", one per candidate
    for i, c in enumerate(cands):
        files[c.source] = path.with_name(f"{path.stem}-trial{i + 1}.yaml")
        save_plan(c.plan, files[c.source], **_predicted(c))

    def timer(c, total_steps: int, _left_s: float) -> list[list[float]]:
        f = files[c.source]
        metrics = f.with_suffix(".metrics.jsonl")
        got = ratrain_timed(net, setup, f, c.plan.pp * c.plan.dp, metrics, total_steps)
        if "error" in got:
            raise RatrainError(got["error"])
        return [got["times"]]

    setup.say(f"  {cap_gib:g} GiB ratrain: trial of {len(cands)} plans")
    trial = run_trial(cands, timer, warmup=setup.warmup, steps=setup.trial_steps,
                      rounds=setup.trial_rounds, limit_s=None,
                      progress=lambda m: setup.say(f"    {m}"))  # fmt: skip
    chosen = trial.pick.candidate if trial.pick is not None else cands[0]
    save_plan(chosen.plan, path, **_predicted(chosen))
    pred = cands[0]
    extras = {
        **_predicted(chosen),
        "trial": trial.to_json(),
        "prediction_pick": {
            "plan": pred.plan,
            "path": files[pred.source],
            "predicted": pred.predicted_tokens_per_s,
        },
    }
    return chosen.plan, extras


def _predicted(c) -> dict:
    return {"predicted": {"tokens_per_s": c.predicted_tokens_per_s,
                          "step_time_s": c.predicted_step_s}}  # fmt: skip


def _jobs(setup: Setup, rate: Rate, peers) -> list:
    """(key, fn(net) -> result) of every distinct timed run at this rate, `net` the
    emulated network."""
    jobs, seen = [], set()
    out = Path(setup.out)
    for (_cap, _fam), e in sorted(rate.plans.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if e["plan"] is None:
            continue
        key = _plan_key(e["plan"])
        if key in seen:
            continue
        seen.add(key)
        path = e["path"]
        metrics = out / f"{path.stem}.metrics.jsonl"
        n = e["plan"].pp * e["plan"].dp
        jobs.append((key, lambda net, p=path, n=n, m=metrics: ratrain_timed(net, setup, p, n, m)))
        pred = e.get("prediction_pick")
        if pred is not None and _plan_key(pred["plan"]) not in seen:  # timed beside the pick
            seen.add(_plan_key(pred["plan"]))
            p, n = pred["path"], pred["plan"].pp * pred["plan"].dp
            m = out / f"{p.stem}.metrics.jsonl"
            jobs.append(
                (_plan_key(pred["plan"]),
                 lambda net, p=p, n=n, m=m: ratrain_timed(net, setup, p, n, m))
            )  # fmt: skip
    for name, knobs in peers:
        where = out / f"peer-{rate.mbit:g}mbit-{name.replace('/', '-')}"
        jobs.append((name, lambda net, k=knobs, w=where: peer_timed(net, setup, k, w)))
    return jobs


def _plan_key(plan) -> str:
    from ratrain.planner.report import describe

    return describe(plan)


def _median(xs):
    return statistics.median(xs) if xs else None


def result_json(setup: Setup, rate: Rate, peers, peer_peaks, plan_peaks) -> dict:
    """The issue's schema: {"caps": [{"cap_bytes", "systems": {...}}], "link_bits_per_s",
    "nodes", "ranks_per_node"} plus what explains each figure."""
    caps = []
    for cap in setup.caps_gib:
        cap_bytes = int(cap * 2**30)
        systems: dict = {}
        for fam in FAMILIES:
            if not setup.wants(fam):
                continue
            e = rate.plans.get((cap, fam))
            if e is None or e["plan"] is None:
                systems[fam] = None
                continue
            key = _plan_key(e["plan"])
            tps = _median(rate.runs.get(key, []))
            systems[fam] = {
                "plan": key,
                "tokens_per_s": tps,
                "tokens_per_s_repeats": rate.runs.get(key, []),
                "predicted_tokens_per_s": e["predicted"],
                "peak_bytes": max(e["peak"]),
                "peak_bytes_per_rank": e["peak"],
                "fits": max(e["peak"]) <= cap_bytes,
                "error": rate.errors.get(key),
            }
        for fam in ("torch-pp", "deepspeed"):
            if not any(_peer_family(n) == fam for n, _ in peers):
                continue
            best = None
            for name, _ in peers:
                if _peer_family(name) != fam or isinstance(peer_peaks[name], str):
                    continue
                if max(peer_peaks[name]) > cap_bytes:
                    continue
                tps = _median(rate.runs.get(name, []))
                if tps is not None and (best is None or tps > best["tokens_per_s"]):
                    best = {
                        "config": name,
                        "tokens_per_s": tps,
                        "tokens_per_s_repeats": rate.runs[name],
                        "peak_bytes": max(peer_peaks[name]),
                        "peak_bytes_per_rank": peer_peaks[name],
                    }
            systems[fam] = best
        caps.append(
            {
                "cap_bytes": cap_bytes,
                "cap_gib": cap,
                "systems": systems,
                "speedups": speedups(systems),
                "picks": picks(rate, rate.plans.get((cap, "ratrain"))),
            }
        )
    return {
        "caps": caps,
        "link_bits_per_s": rate.mbit * 1e6,
        "nodes": setup.nodes,
        "ranks_per_node": setup.ranks_per_node,
        "model": setup.model,
        "seq": setup.seq,
        "global_batch": setup.global_batch,
        "steps": setup.steps,
        "warmup": setup.warmup,
        "repeats": setup.repeats,
        "platform": str(rate.platform),
        "base_platform": setup.base_platform,
        "peers_tried": {n: _peer_tried(p, rate.runs.get(n, [])) for n, p in peer_peaks.items()},
        "errors": rate.errors,
    }


def picks(rate: Rate, entry: dict | None) -> dict | None:
    """ratrain's two picks at one cap: the prediction-only pick (the search's first) and
    the trial's, each with its predicted and measured tokens/s (the median of the
    repeats, and the trial's own), and the prediction-only pick's regret: 1 - its
    tokens/s over the trial pick's, by the repeats where both were timed, else by the
    trial. None without a trial."""
    if not entry or entry.get("plan") is None or "trial" not in entry:
        return None
    trial, pred = entry["trial"], entry["prediction_pick"]
    runs = trial["plans"]
    pick_i = trial["pick"]

    def one(plan, predicted: float, trial_tps) -> dict:
        key = _plan_key(plan)
        return {
            "plan": key,
            "predicted_tokens_per_s": predicted,
            "tokens_per_s": _median(rate.runs.get(key, [])),
            "trial_tokens_per_s": trial_tps,
        }

    out = {
        "prediction": one(pred["plan"], pred["predicted"], runs[0]["measured_tokens_per_s"]),
        "trial": one(
            entry["plan"],
            entry["predicted"],
            None if pick_i is None else runs[pick_i]["measured_tokens_per_s"],
        ),
        "regret_trial": trial["regret"],
        "trial_plans": runs,
        "trial_wall_s": trial["wall_s"],
    }
    a, b = out["prediction"]["tokens_per_s"], out["trial"]["tokens_per_s"]
    out["regret"] = 1.0 - a / b if a and b else trial["regret"]
    return out


def _peer_tried(peak, tokens_per_s: list[float]) -> dict:
    if isinstance(peak, str):
        return {"skipped": peak}
    return {"peak_bytes_per_rank": peak, "tokens_per_s_repeats": tokens_per_s}


def speedups(systems: dict) -> dict:
    """ratrain's measured (and, against the planned families, predicted) tokens/s over
    each other system's; None where either has no figure."""
    me = systems.get("ratrain")
    out = {}
    for name, other in systems.items():
        if name == "ratrain":
            continue
        m = p = None
        if me and other and me.get("tokens_per_s") and other.get("tokens_per_s"):
            m = me["tokens_per_s"] / other["tokens_per_s"]
        if me and other and other.get("predicted_tokens_per_s"):
            p = me["predicted_tokens_per_s"] / other["predicted_tokens_per_s"]
        out[name] = {"measured": m, "predicted": p}
    return out
