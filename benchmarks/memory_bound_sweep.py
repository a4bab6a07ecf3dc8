"""The planner's memory bounds against the ledger on random plans: every stage's
`MemoryBound` under its own recompute policy, and the states-with-gradients bound
(`gradients_bound_of`, two or more microbatches), each at most the ledger's peak (a bound
over it could rule out a plan that fits), and how close they come.

    PYTHONPATH=src python benchmarks/memory_bound_sweep.py --plans 4000 --seed 4
    PYTHONPATH=src python benchmarks/memory_bound_sweep.py --plans 1500 --seed 11 --deep

The plans: models tiny and llama2-7b (`--deep`: also llama3.2-1b, tied embeddings, and
qwen2.5-32b, with up to 16 stages and 33 microbatches), platforms mt3000, a100-80g and
cpu-local, 1-6 stages, 1-12 microbatches, the four families' schedules, 1F1B, zb-h1 and
zb-h2, views persistent or transient (lookahead 1 or 2), offload, per-stage or uniform
recompute, the plain or the fused loss. Plans a feature refuses are skipped. Prints every
stage over the ledger, then the counts: stages, stages within 2% of the ledger, the
smallest bound / peak. Pure Python (the ledger and the lowering; no torch).
"""

from __future__ import annotations

import argparse
import random
import time
import warnings

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.planner.memory_bound import MemoryBound, gradients_bound_of
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.schedule.views import transient_views_of
from ratrain.schedule.zerobubble import refuse_unsupported
from ratrain.sim.simulate import platform_ledger
from ratrain.sizes.states import grad_bytes_per_param, shards, view_bytes_per_param

_POLICIES = ("none", "selective", "full", "first:1")


def _plan(rnd: random.Random, deep: bool):
    models = ["tiny", "llama2-7b"] + (["llama3.2-1b", "qwen2.5-32b"] if deep else [])
    spec = get_preset(rnd.choice(models))
    pf = load(rnd.choice(["mt3000", "a100-80g", "cpu-local"]))
    pp = rnd.choice([1, 2, 3, 4, 6] + ([8, 16] if deep else []))
    m = rnd.choice([1, 2, 3, 4, 5, 7, 9, 12] + ([17, 33] if deep else []))
    dp = rnd.choice([1, 2])
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
        offload_activations=ours and rnd.random() < 0.6,
        pipeline=rnd.choice(["1f1b", "zb-h1", "zb-h2"]),
        recompute=rec,
        model=spec.name,
        loss_chunk_tokens=rnd.choice([None, None, 256]),
    )
    plan.check_for(spec)
    refuse_unsupported(plan)
    return spec, pf, plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=1000, help="random plans to draw")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deep", action="store_true", help="deeper pipelines, larger models")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # cpu-local's host mismatch, once per load
    rnd = random.Random(args.seed)
    t0 = time.perf_counter()
    plans = stages = near = over = 0
    worst = float("inf")
    for _ in range(args.plans):
        try:
            spec, pf, plan = _plan(rnd, args.deep)
            sch = build_schedule(spec, plan)
        except (RatrainError, ValueError):
            continue
        led = platform_ledger(sch, spec, plan, pf, keep_trace=False)
        bound = MemoryBound(spec, plan, pf.sends_held_until_waited, pf.eager_kernels)
        views = 0 if transient_views_of(plan.schedule, plan.view_policy) else None
        grads = gradients_bound_of(
            spec,
            plan.blocks_per_stage(spec),
            shards(plan),
            grad_bytes_per_param(plan),
            view_bytes_per_param(plan) if views is None else 0,
        )
        for s in range(plan.pp):
            peak = led.stages[s].peak_bytes
            got = bound.stage(s, plan.recompute[s])
            for name, b in (("MemoryBound", got), ("gradients", grads[s])):
                if b > peak and (name == "MemoryBound" or plan.microbatches >= 2):
                    over += 1
                    print(f"OVER {name} stage {s}: {b} > {peak} ({b / peak:.3f}x) {plan}")
            stages += 1
            near += got >= 0.98 * peak
            worst = min(worst, got / peak)
        plans += 1
    print(
        f"{plans} plans, {stages} stages in {time.perf_counter() - t0:.0f} s: {over} over the "
        f"ledger; MemoryBound within 2% of it on {near}, smallest bound / peak {worst:.3f}"
    )


if __name__ == "__main__":
    main()
