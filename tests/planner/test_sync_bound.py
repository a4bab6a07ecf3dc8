"""The step-time bound's DP term (every stage's gradient syncs, and the refreshing gathers of
a sharded optimizer's views, after its last backward pass begins) never exceeds the
simulated step, and tightens the bound where DP is wide and the microbatches few."""

import itertools
from dataclasses import replace

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner.time_bound import overheads, step_time_lower_bound_s, unit_times
from ratrain.platforms.load import load
from ratrain.sim import simulate


def _plans():
    for platform, sched, pipe, pp, dp, m, shard, view in itertools.product(
        ("a100-80g", "mt3000"),
        ("ratrain", "gpu-style", "baseline", "fsdp-pp"),
        ("1f1b", "zb-h1"),
        (1, 3),
        (8, 64),
        (1, 4),
        (False, True),
        ("persistent", "transient"),
    ):
        if sched == "fsdp-pp" and (not shard or pipe != "1f1b"):
            continue
        if sched in ("gpu-style", "baseline") and view == "transient":
            continue
        yield (
            platform,
            Plan(
                pp=pp,
                dp=dp,
                global_batch=dp * m,
                seq=512,
                schedule=sched,
                pipeline=pipe,
                shard_optimizer=shard,
                view_policy=view,
                compute_dtype="bf16",
                grad_dtype="bf16",
                model="llama3.2-1b",
            ),
        )


def test_dp_sync_bound_never_exceeds_the_simulation():
    spec = get_preset("llama3.2-1b")
    checked = active = 0
    for platform, plan in _plans():
        pl = load(platform)
        ut = unit_times(spec, pl, 1, plan.seq, "bf16")
        over = overheads(spec, plan, pl)
        split = plan.blocks_per_stage(spec)
        m = plan.microbatches
        lb = step_time_lower_bound_s(split, m, ut, plan.recompute, over, pipeline=plan.pipeline)
        step = simulate(spec, plan, pl).step_time_s
        assert lb <= step * (1 + 1e-12), (platform, plan, lb, step)
        plain = replace(over, sync_s=())
        lb0 = step_time_lower_bound_s(split, m, ut, plan.recompute, plain, pipeline=plan.pipeline)
        active += lb > lb0 * (1 + 1e-9)
        checked += 1
    assert checked > 100
    assert active > checked // 4  # the DP term tightened many of them


def test_the_dp_term_counts_the_refresh_gather_only_where_the_lowering_makes_one():
    spec, pl = get_preset("llama3.2-1b"), load("a100-80g")
    base = Plan(
        pp=2,
        dp=8,
        global_batch=8,
        seq=512,
        compute_dtype="bf16",
        grad_dtype="bf16",
        model="llama3.2-1b",
    )
    sync_only = overheads(spec, base.replace(shard_optimizer=False), pl).sync_s
    gathered = overheads(spec, base.replace(shard_optimizer=True), pl).sync_s
    transient = overheads(
        spec, base.replace(shard_optimizer=True, view_policy="transient"), pl
    ).sync_s
    fsdp = overheads(spec, base.replace(schedule="fsdp-pp", shard_optimizer=True), pl).sync_s
    # An all-reduce is twice a reduce-scatter's traffic; the refreshing all-gather adds the
    # other half back, where the views outlive the step.
    assert all(g > t for g, t in zip(gathered, transient, strict=True))
    assert transient == fsdp  # neither refreshes its views after the update
    assert all(s > 0 for s in sync_only)
    assert overheads(spec, base.replace(dp=1, global_batch=1), pl).sync_s == ()
