"""The step-time bound's resource-load term (offload traffic, per-use view fetches on one
copy engine or DP network) never exceeds the simulated step, and tightens it somewhere."""

import itertools
from dataclasses import replace

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner.time_bound import overheads, step_time_lower_bound_s, unit_times
from ratrain.platforms.load import load
from ratrain.sim import simulate


def test_resource_load_bound_never_exceeds_the_simulation():
    spec = get_preset("llama2-7b")
    active = checked = 0
    for platform, sched, view, rec, pp, m in itertools.product(
        ("mt3000", "h100-80g"),
        ("ratrain", "fsdp-pp"),
        ("transient", "persistent"),
        ("none", "full"),
        (2, 4),
        (3, 8),
    ):
        pl = load(platform)
        ut = unit_times(spec, pl, 1, 1024, "bf16")
        plan = Plan(
            pp=pp,
            dp=2,
            global_batch=2 * m,
            seq=1024,
            schedule=sched,
            shard_optimizer=True,
            view_policy=view,
            recompute=rec,
            compute_dtype="bf16",
            grad_dtype="bf16",
            offload_activations=sched == "ratrain",
        )
        over = overheads(spec, plan, pl)
        split = plan.blocks_per_stage(spec)
        lb = step_time_lower_bound_s(split, m, ut, plan.recompute, over)
        step = simulate(spec, plan, pl, memory_timeline=False).step_time_s
        assert lb <= step * (1 + 1e-12), (plan, lb, step)
        plain = replace(over, loads=())
        active += lb > step_time_lower_bound_s(split, m, ut, plan.recompute, plain)
        checked += 1
    assert active, checked  # the load term tightened some of them
