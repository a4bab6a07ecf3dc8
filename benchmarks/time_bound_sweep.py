"""The planner's step-time bound against the simulator on random plans: the bound a knob
combination is queued under (`step_time_lower_bound_s` with the plan's recompute and its
`overheads`) must be at most the simulated step (a bound over it could prune the
fastest plan), and the closer it comes, the smaller the gap a cut search certifies.

    PYTHONPATH=src python benchmarks/time_bound_sweep.py --plans 600 --seed 1

The plans: models tiny, llama3.2-1b and llama2-7b, platforms mt3000, a100-80g, h100-80g and
cpu-local, 1-8 stages, 1-12 microbatches (half of the draws no more than the stages: the
few-microbatch steps of large data-parallel jobs), data-parallel groups of 1-64, the four
families' schedules, 1F1B, zb-h1 and zb-h2, views persistent or transient, offload,
recompute uniform or per stage. Plans a feature refuses are skipped. Prints every plan whose
bound is over its step, then per group (microbatches at most the stages, or more) the
count, the median bound / step and the share within 5% of it. Pure Python (no torch).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings

from ratrain.config import Plan
from ratrain.cost.model import CostModel
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.planner.time_bound import overheads, step_time_lower_bound_s, unit_times
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.schedule.zerobubble import refuse_unsupported
from ratrain.sim.simulate import simulate_schedule

_POLICIES = ("none", "selective", "full", "first:1")


def _plan(rnd: random.Random):
    spec = get_preset(rnd.choice(["tiny", "llama3.2-1b", "llama2-7b"]))
    pf = load(rnd.choice(["mt3000", "a100-80g", "h100-80g", "cpu-local"]))
    pp = rnd.choice([1, 2, 3, 4, 6, 8])
    m = rnd.randint(1, pp) if rnd.random() < 0.5 else rnd.randint(pp + 1, 12)
    dp = rnd.choice([1, 2, 8, 64])
    schedule = rnd.choice(["ratrain", "ratrain", "ratrain", "gpu-style", "fsdp-pp", "baseline"])
    ours = schedule == "ratrain"
    policy = rnd.choice([*_POLICIES, "mixed"])
    rec = (
        tuple(rnd.choice(_POLICIES) for _ in range(pp)) if policy == "mixed" else (policy,) * pp
    )
    plan = Plan(
        pp=pp,
        dp=dp,
        micro_batch=1,
        global_batch=m * dp,
        seq=min(512, spec.max_seq),
        schedule=schedule,
        view_policy=rnd.choice(["transient", "persistent"]) if ours else "persistent",
        view_lookahead=rnd.choice([1, 1, 2]),
        shard_optimizer=schedule == "fsdp-pp" or rnd.random() < 0.5,
        compute_dtype="fp32" if pf.name == "cpu-local" else rnd.choice(["bf16", "fp16"]),
        offload_activations=ours and rnd.random() < 0.3,
        pipeline=rnd.choice(["1f1b", "zb-h1", "zb-h2"]),
        recompute=rec,
        model=spec.name,
        rank_layout=rnd.choice(["pp-inner", "dp-inner"]),
    )
    plan.check_for(spec)
    refuse_unsupported(plan)
    return spec, pf, plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=600, help="random plans to draw")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # cpu-local's host mismatch, once per load
    rnd = random.Random(args.seed)
    t0 = time.perf_counter()
    over = 0
    ratios: dict[str, list[float]] = {"m <= pp": [], "m > pp": [], "offloading": []}
    for _ in range(args.plans):
        try:
            spec, pf, plan = _plan(rnd)
            sch = build_schedule(spec, plan)
        except (RatrainError, ValueError):
            continue
        step = simulate_schedule(sch, CostModel(spec, plan, pf)).step_time_s
        ut = unit_times(spec, pf, plan.micro_batch, plan.seq, plan.compute_dtype)
        lb = step_time_lower_bound_s(
            plan.blocks_per_stage(spec),
            plan.microbatches,
            ut,
            tuple(plan.recompute),
            overheads(spec, plan, pf),
            pipeline=plan.pipeline,
        )
        if lb > step * (1 + 1e-9):
            over += 1
            print(f"OVER {lb:.6g} > {step:.6g} ({lb / step:.4f}x) {pf.name} {plan}")
        ratios["m <= pp" if plan.microbatches <= plan.pp else "m > pp"].append(lb / step)
        if plan.offload_activations:  # also counted above: a breakdown
            ratios["offloading"].append(lb / step)
    n = len(ratios["m <= pp"]) + len(ratios["m > pp"])
    print(f"{n} plans in {time.perf_counter() - t0:.0f} s: {over} bounded over the simulator")
    for name, rs in ratios.items():
        if rs:
            near = sum(r >= 0.95 for r in rs)
            print(
                f"  {name}: {len(rs)} plans, bound / step median {statistics.median(rs):.3f}, "
                f"within 5% on {near} ({near / len(rs):.0%}), smallest {min(rs):.3f}"
            )


if __name__ == "__main__":
    main()
