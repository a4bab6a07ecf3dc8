"""The memory bound where sends are held to the step's end (cpu-local): it counts the last
backward pass, when every send of the step but that pass's own is held, and it stays a
lower bound on the ledger over a variety of plans (schedules, recompute, views, sharding,
gradient widths, offload, microbatch counts)."""

import random

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.planner.memory_bound import MemoryBound
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.sim.simulate import platform_ledger
from ratrain.sizes.activations import boundary_bytes


def _random_plans(n: int, seed: int = 0):
    rnd = random.Random(seed)
    for _ in range(n):
        pp, dp, m = rnd.choice([1, 2, 3, 4]), rnd.choice([1, 2]), rnd.choice([1, 2, 3, 5, 8])
        sched = rnd.choice(["gpu-style", "ratrain", "fsdp-pp"])
        ours = sched == "ratrain"
        yield dict(
            pp=pp,
            dp=dp,
            global_batch=m * dp,
            seq=128,
            schedule=sched,
            recompute=rnd.choice(["none", "selective", "full", "first:1"]),
            view_policy=rnd.choice(["transient", "persistent"]) if ours else "persistent",
            view_lookahead=rnd.choice([1, 2]),
            shard_optimizer=sched == "fsdp-pp" or (dp > 1 and rnd.random() < 0.5),
            compute_dtype=rnd.choice(["fp16", "bf16"]),
            grad_dtype=rnd.choice(["fp32", "fp16"]),
            offload_activations=ours and rnd.random() < 0.5,
        )


def test_held_send_bound_stays_below_the_ledger_and_counts_the_last_backward():
    spec, pl = get_preset("tiny"), load("cpu-local")
    assert pl.sends_held_until_waited
    checked = 0
    for fields in _random_plans(200):
        try:
            plan = Plan(**fields)
            plan.check_for(spec)
        except RatrainError:
            continue
        led = platform_ledger(build_schedule(spec, plan), spec, plan, pl, keep_trace=False)
        bound = MemoryBound(spec, plan, sends_held=True, eager_kernels=pl.eager_kernels)
        rec = plan.recompute[0]
        for s, st in enumerate(led.stages):
            lb = bound.stage(s, rec)
            assert lb <= st.peak_bytes, (plan, s, lb, st.peak_bytes)
            parts = bound.breakdown(s, rec)
            assert sum(parts.values()) == lb
        checked += 1
    assert checked >= 80


def test_the_last_backward_pass_is_where_held_sends_peak():
    """Full recompute with offload keeps little per microbatch: a middle stage's bound
    peaks at the last backward pass, with m forward sends and m - 1 backward sends held
    (before, the bound stopped at the last steady pair, m - 1 - w backward sends)."""
    spec, pl = get_preset("tiny"), load("cpu-local")
    m = 8
    plan = Plan(
        pp=4,
        global_batch=m,
        seq=128,
        schedule="ratrain",
        recompute="full",
        view_policy="transient",
        compute_dtype="fp16",
        grad_dtype="fp16",
        offload_activations=True,
    )
    bound = MemoryBound(spec, plan, sends_held=True, eager_kernels=pl.eager_kernels)
    assert bound.breakdown(1, "full")["comm_buffer"] == (2 * m - 1) * boundary_bytes(spec, plan)
    led = platform_ledger(build_schedule(spec, plan), spec, plan, pl, keep_trace=False)
    assert bound.stage(1, "full") <= led.stages[1].peak_bytes
