"""The memory bound counts the view fetched ahead: with transient views fetched at least
one use ahead (ratrain's transient views, fsdp-pp resharding), while B(u) runs the view of
the unit the backward pass reads next is held too. The bound stays below the ledger over
random plans on three presets, and the term is what proves llama2-13b on 1024 cpu-local
clusters (1024 sequences) infeasible without a ledger replay."""

import random

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models import counts
from ratrain.models.presets import get_preset
from ratrain.planner import search
from ratrain.planner.memory_bound import MemoryBound
from ratrain.planner.space import Request
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.sim.simulate import platform_ledger


def _random_plans(n: int, seed: int):
    rnd = random.Random(seed)
    for _ in range(n):
        pp, dp, m = rnd.choice([1, 2, 3, 4]), rnd.choice([1, 2]), rnd.choice([1, 2, 3, 5, 8])
        sched = rnd.choice(["ratrain", "ratrain", "fsdp-pp", "gpu-style"])
        yield dict(
            pp=pp,
            dp=dp,
            global_batch=m * dp,
            seq=128,
            schedule=sched,
            recompute=rnd.choice(["none", "selective", "full", "first:1", "first:2"]),
            view_policy=rnd.choice(["transient", "transient", "persistent"])
            if sched != "gpu-style"
            else "persistent",
            view_lookahead=rnd.choice([0, 1, 1, 2]),
            shard_optimizer=sched == "fsdp-pp" or (dp > 1 and rnd.random() < 0.5),
            compute_dtype=rnd.choice(["fp16", "bf16"]),
            grad_dtype=rnd.choice(["fp32", "fp16"]),
            offload_activations=sched == "ratrain" and rnd.random() < 0.5,
        )


def test_the_bound_with_the_view_fetched_ahead_stays_below_the_ledger():
    spec = get_preset("tiny")
    binding = checked = 0
    for seed, name in enumerate(("mt3000", "a100-80g", "cpu-local")):
        pl = load(name)
        for fields in _random_plans(70, seed):
            try:
                plan = Plan(**fields)
                plan.check_for(spec)
            except RatrainError:
                continue
            led = platform_ledger(build_schedule(spec, plan), spec, plan, pl, keep_trace=False)
            bound = MemoryBound(
                spec, plan, sends_held=pl.sends_held_until_waited, eager_kernels=pl.eager_kernels
            )
            rec = plan.recompute[0]
            for s, st in enumerate(led.stages):
                lb = bound.stage(s, rec)
                assert lb <= st.peak_bytes, (name, plan, s, lb, st.peak_bytes)
                parts = bound.breakdown(s, rec)
                assert sum(parts.values()) == lb
                block_view = counts.unit_params(spec, 1) * bound.vbp
                binding += bound.prefetch and parts["view"] >= 2 * block_view
            checked += 1
    assert checked >= 120 and binding > 0


def test_llama2_13b_on_1024_cpu_local_clusters_is_proved_by_the_bounds():
    spec, pl = get_preset("llama2-13b"), load("cpu-local")
    plan = Plan(
        pp=16,
        dp=64,
        global_batch=1024,
        seq=4096,
        schedule="ratrain",
        recompute="full",
        view_policy="transient",
        shard_optimizer=True,
        compute_dtype="bf16",
        grad_dtype="bf16",
        offload_activations=True,
        model="llama2-13b",
    )
    bound = MemoryBound(spec, plan, sends_held=True, eager_kernels=True)
    led = platform_ledger(build_schedule(spec, plan), spec, plan, pl, keep_trace=False)
    view = counts.unit_params(spec, 1) * bound.vbp
    for s in (1, 8):  # middle stages: the running block's view and the next one's
        assert bound.breakdown(s, "full")["view"] == 2 * view
        assert bound.stage(s, "full") <= led.stages[s].peak_bytes
    res = search(Request(spec, pl, 1024, 1024, 4096))
    assert not res.feasible and res.memory_replays == 0
