"""The step-time bound's offload walk (`OffloadWalk`: an offloading stage's compute waits
for RELOADs the walk issues late, and behind the OFFLOADs of the forward just before)
never exceeds the simulated step, tightens the bound where the host link is slow next to
the compute, and counts the passes as the pass order has them."""

import itertools
from dataclasses import replace

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner.time_bound import (
    _offload_passes,
    overheads,
    step_time_lower_bound_s,
    unit_times,
)
from ratrain.platforms.load import load
from ratrain.schedule.lowering import offloaded_mbs
from ratrain.sim import simulate


def _without_walk(over):
    return replace(over, loads=tuple(replace(load, walk=None) for load in over.loads))


def test_offload_walk_bound_never_exceeds_the_simulation():
    spec = get_preset("llama2-7b")
    checked = active = 0
    for platform, pipe, pp, m, rec in itertools.product(
        ("a100-80g", "mt3000"),
        ("1f1b", "zb-h1", "zb-h2"),
        (2, 4),
        (4, 8),
        ("none", "selective", "first:1", "full"),
    ):
        pl = load(platform)
        ut = unit_times(spec, pl, 1, 1024, "bf16")
        plan = Plan(
            pp=pp,
            dp=2,
            global_batch=2 * m,
            seq=1024,
            schedule="ratrain",
            pipeline=pipe,
            recompute=rec,
            shard_optimizer=True,
            compute_dtype="bf16",
            grad_dtype="bf16",
            offload_activations=True,
        )
        over = overheads(spec, plan, pl)
        split = plan.blocks_per_stage(spec)
        lb = step_time_lower_bound_s(split, m, ut, plan.recompute, over, pipeline=pipe)
        step = simulate(spec, plan, pl).step_time_s
        assert lb <= step * (1 + 1e-12), (plan, lb, step)
        plain = _without_walk(over)
        active += lb > step_time_lower_bound_s(split, m, ut, plan.recompute, plain, pipeline=pipe)
        checked += 1
    assert checked == 96
    assert active >= 8  # the walk tightened some of them


def test_offload_passes_count_each_offloaded_backward_once():
    for pipe, pp, m in itertools.product(("1f1b", "zb-h1", "zb-h2"), (2, 4, 8), (1, 4, 16)):
        for s in range(pp):
            pairs, solos = _offload_passes(pp, m, s, pipe)
            assert pairs + solos == len(offloaded_mbs(pp, m, s, pipe))
            if pipe == "1f1b" and m >= 2 * pp and s < pp - 1:
                assert pairs > 0  # 1F1B's steady state: each backward right after a forward
