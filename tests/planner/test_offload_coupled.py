"""The step-time bound of an offloading stage couples its traffic to its recompute: under
each policy the stage may take, its copy work, its reloads' waits and its compute chain
together, and the least over the policies (`step_time_lower_bound_s` with the policies
left). Bounded apart, the least traffic (full recompute's) beside the least compute
(none's) left the bound of llama2-7b's 4-stage 1F1B on h100-80g 19% under the best
simulated policy; under a split backward the weight visits' traffic (what B_IN keeps for a
deferred B_W, whatever the recompute) counts too. The bound never exceeds a simulated
step of any policies it was given."""

import itertools

import pytest

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner.time_bound import overheads, step_time_lower_bound_s, unit_times
from ratrain.platforms.load import load
from ratrain.sim import simulate

POLICIES = ("none", "selective", "first:1", "full")


@pytest.mark.parametrize("platform", ["h100-80g", "a100-80g"])
@pytest.mark.parametrize("pipe", ["1f1b", "zb-h1", "zb-h2"])
def test_coupled_bound_is_below_every_policy_and_near_the_best(platform, pipe):
    spec, pl = get_preset("llama2-7b"), load(platform)
    m, seq = 12, 2048
    ut = unit_times(spec, pl, 1, seq, "bf16")
    for pp in (2, 4):
        base = Plan(
            pp=pp,
            dp=2,
            global_batch=2 * m,
            seq=seq,
            schedule="ratrain",
            pipeline=pipe,
            recompute="none",
            shard_optimizer=True,
            compute_dtype="bf16",
            grad_dtype="bf16",
            offload_activations=True,
        )
        split = base.blocks_per_stage(spec)
        over = overheads(spec, base, pl)
        lb = step_time_lower_bound_s(split, m, ut, ("none",) * pp, over, (POLICIES,) * pp, pipe)
        vectors = [(p,) * pp for p in POLICIES]
        vectors += [v for v in itertools.product(("none", "full"), repeat=pp) if len(set(v)) > 1][
            :3
        ]
        steps = []
        for rec in vectors:
            step = simulate(
                spec, base.replace(recompute=rec), pl, memory_timeline=False
            ).step_time_s
            assert lb <= step * (1 + 1e-12), (pp, rec, lb, step)
            steps.append(step)
        # Near the best: 1F1B within 11% (bounded apart: 19% under at pp=4 on h100-80g);
        # the split backward's weight visits wait on the copy engine in ways the bound
        # does not follow (within 35%; bounded apart, 43% under).
        assert lb >= (0.89 if pipe == "1f1b" else 0.65) * min(steps), (pp, lb, min(steps))
