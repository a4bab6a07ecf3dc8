"""How long one simulated step takes: LLaMA-2-70B, pp=16, dp=64, m=128 on mt3000.

    python benchmarks/sim_speed.py [--repeat 3] [--model llama2-70b] [--platform mt3000]

Reports, per schedule, the median wall time of `simulate` (schedule build, memory ledger,
costing, event replay, metrics) over the repeats, split into its phases. The first call in
a process also pays for planning each new kernel shape (a tile model caches its plans per
shape); it is reported apart as "cold". CPU time is reported too: on a shared machine it
is what the wall time would be on an idle core. Target: under 2 s per schedule (warm).
"""

from __future__ import annotations

import argparse
import statistics
import time

from ratrain.config import SCHEDULES, Plan
from ratrain.cost import CostModel
from ratrain.memory.ledger import replay as ledger_replay
from ratrain.models.presets import get_preset
from ratrain.platforms import load
from ratrain.schedule import build_schedule
from ratrain.sim import simulate_schedule


def _phases(spec, plan, platform) -> dict[str, float]:
    c0 = time.process_time()
    t0 = time.perf_counter()
    sch = build_schedule(spec, plan)
    t1 = time.perf_counter()
    ledger = ledger_replay(sch, spec, plan)
    t2 = time.perf_counter()
    result = simulate_schedule(sch, CostModel(spec, plan, platform), ledger=ledger)
    t3 = time.perf_counter()
    c3 = time.process_time()
    return {
        "cpu_s": c3 - c0,
        "build_s": t1 - t0,
        "ledger_s": t2 - t1,
        "sim_s": t3 - t2,
        "total_s": t3 - t0,
        "step_time_s": result.step_time_s,
        "actions": sum(len(s) for s in sch.stages),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-70b")
    ap.add_argument("--platform", default="mt3000")
    ap.add_argument("--pp", type=int, default=16)
    ap.add_argument("--dp", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=128)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    spec, platform = get_preset(args.model), load(args.platform)
    print(f"{args.model} on {args.platform}: pp={args.pp} dp={args.dp} m={args.microbatches}")
    for schedule in SCHEDULES:
        plan = Plan(
            pp=args.pp,
            dp=args.dp,
            micro_batch=1,
            global_batch=args.microbatches * args.dp,
            seq=args.seq,
            schedule=schedule,
            compute_dtype="fp16",
            recompute="full",
        )
        t = time.perf_counter()
        _phases(spec, plan, platform)
        cold_s = time.perf_counter() - t
        runs = [_phases(spec, plan, platform) for _ in range(args.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"  {schedule:10s} {int(med['actions']):6d} actions  median {med['total_s']:.2f} s "
            f"(build {med['build_s']:.2f}, ledger {med['ledger_s']:.2f}, sim {med['sim_s']:.2f}; "
            f"CPU {med['cpu_s']:.2f} s); "
            f"cold {cold_s:.2f} s; step {med['step_time_s']:.1f} s"
        )


if __name__ == "__main__":
    main()
