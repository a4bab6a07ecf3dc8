"""How long one simulated step takes, by phase, on a few deep or varied plans.

    python benchmarks/sim_speed.py [--quick] [--repeat 3] [--json]

Plans (`--quick` keeps the first three and one repeat):
- `70b-pp32`: LLaMA-2-70B on 256 mt3000 clusters at 4096 sequences, the planner's answer
  (pp=32, dp=8, 512 microbatches, ratrain, transient views, offload): ~340k actions;
- `32b-a100`: Qwen2.5-32B on a100-80g, pp=8, dp=1, 256 microbatches, offload;
- `cpu-local`: the tiny model on cpu-local, pp=2, dp=2, 256 microbatches (processor sharing);
- `70b-pp16-<schedule>`: LLaMA-2-70B, pp=16, dp=64, 128 microbatches on mt3000, each schedule.

Phases, each timed on its own (median wall time over the repeats):
- `build`: `build_schedule`;
- `cost`: `CostModel` setup and every action's cost and resource;
- `engine`: the event engine on those durations (`run_flat`, or `run_shared` under sharing),
  with the links each action holds between nodes (`ratrain.cost.links`);
- `sim`: `simulate_schedule` without a ledger, as the planner times a candidate
  (costs, engine, events, metrics); `result` is `sim` minus `cost` and `engine`;
- `ledger`: the memory ledger's replay, with its trace (as `ratrain simulate` does);
- `planner`: `build` + `sim`, the planner's path for one simulation.
The first run in a process also plans each kernel shape (cached per shape) and is dropped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ratrain.config import SCHEDULES, Plan
from ratrain.cost import CostModel
from ratrain.models.presets import get_preset
from ratrain.platforms import load
from ratrain.schedule import build_schedule
from ratrain.sim.engine import run_flat
from ratrain.sim.flat import graph
from ratrain.sim.sharing import node_sharing, run_shared
from ratrain.sim.simulate import _charge_stolen_compute, platform_ledger, simulate_schedule

try:  # the links between nodes (`ratrain.cost.links`); absent from a tree before them
    from ratrain.sim.simulate import _links
except ImportError:  # PYTHONPATH=<an older tree>/src, to compare
    _links = None

PHASES = ("build", "cost", "engine", "result", "sim", "ledger", "planner")


def _plans() -> list[tuple[str, str, str, Plan]]:
    """(name, model, platform, plan)."""
    out = [
        (
            "70b-pp32",
            "llama2-70b",
            "mt3000",
            Plan(
                pp=32,
                dp=8,
                global_batch=4096,
                seq=4096,
                schedule="ratrain",
                layer_split=(2,) + (3,) * 16 + (2,) * 15,
                recompute=("none",) + ("first:1",) * 16 + ("none",) * 15,
                shard_optimizer=True,
                view_policy="transient",
                compute_dtype="fp16",
                grad_dtype="fp16",
                offload_activations=True,
            ),
        ),
        (
            "32b-a100",
            "qwen2.5-32b",
            "a100-80g",
            Plan(
                pp=8,
                dp=1,
                global_batch=256,
                seq=4096,
                schedule="ratrain",
                recompute="full",
                compute_dtype="bf16",
                offload_activations=True,
            ),
        ),
        (
            "cpu-local",
            "tiny",
            "cpu-local",
            Plan(pp=2, dp=2, global_batch=512, seq=128, schedule="ratrain", shard_optimizer=True),
        ),
    ]
    for schedule in SCHEDULES:
        plan = Plan(
            pp=16,
            dp=64,
            global_batch=128 * 64,
            seq=4096,
            schedule=schedule,
            compute_dtype="fp16",
            recompute="full",
            shard_optimizer=schedule == "fsdp-pp",
        )
        out.append((f"70b-pp16-{schedule}", "llama2-70b", "mt3000", plan))
    return out


def _phases(spec, plan, platform) -> dict[str, float]:
    t = {}
    t0 = time.perf_counter()
    sch = build_schedule(spec, plan)
    t["build"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    cost = CostModel(spec, plan, platform)
    acts = [a for stage in sch.stages for a in stage]
    costs = [cost.action(a) for a in acts]
    resources = [cost.resource(a) for a in acts]
    durations = [c.time_s for c in costs]
    if platform.collective_compute_s_per_byte:
        _charge_stolen_compute(sch, cost, durations, resources)
    t["cost"] = time.perf_counter() - t0

    sharing = node_sharing(cost)
    t0 = time.perf_counter()
    links = _links(sch, cost, graph(sch)) if _links else None
    if sharing is None:
        run_flat(sch, durations, resources, *([links] if _links else []))
    else:
        fixed = [c.fixed_s for c in costs]
        run_shared(sch, durations, resources, fixed, sharing, *([links] if _links else []))
    t["engine"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    result = simulate_schedule(sch, CostModel(spec, plan, platform))
    t["sim"] = time.perf_counter() - t0
    t["result"] = t["sim"] - t["cost"] - t["engine"]

    t0 = time.perf_counter()
    platform_ledger(sch, spec, plan, platform, keep_trace=True)
    t["ledger"] = time.perf_counter() - t0
    t["planner"] = t["build"] + t["sim"]
    t["actions"] = len(acts)
    t["step_time_s"] = result.step_time_s
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per plan (median)")
    ap.add_argument("--quick", action="store_true", help="the first three plans, one run each")
    ap.add_argument("--only", default=None, help="run only the plans whose name contains this")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args()
    plans = _plans()[:3] if args.quick else _plans()
    if args.only:
        plans = [p for p in plans if args.only in p[0]]
    repeat = 1 if args.quick else max(1, args.repeat)
    rows = []
    if not args.json:
        head = " ".join(f"{p:>7s}" for p in PHASES)
        print(f"{'plan':22s} {'actions':>7s} {head}   (median s over {repeat})")
    for name, model, platform_name, plan in plans:
        spec, platform = get_preset(model), load(platform_name)
        _phases(spec, plan, platform)  # warm the per-shape kernel caches
        runs = [_phases(spec, plan, platform) for _ in range(repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        row = {"plan": name, "model": model, "platform": platform_name, **med}
        row["actions"] = int(row["actions"])
        rows.append(row)
        if not args.json:
            cells = " ".join(f"{med[p]:7.2f}" for p in PHASES)
            print(f"{name:22s} {row['actions']:7d} {cells}", flush=True)
    if args.json:
        print(json.dumps({"repeat": repeat, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
