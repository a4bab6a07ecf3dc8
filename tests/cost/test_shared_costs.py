"""Cost models share their action costs (`ratrain.cost.model._SHARED`): a plan costed after
others gets the same cost for every action as a plan costed on its own."""

from __future__ import annotations

import pytest

import ratrain.cost.model as model
from ratrain.config import Plan
from ratrain.cost.model import CostModel
from ratrain.models.presets import get_preset
from ratrain.platforms import load
from ratrain.schedule.build import build_schedule


def _plan(spec_name: str, **kw) -> Plan:
    base = dict(
        pp=2,
        dp=2,
        micro_batch=1,
        global_batch=8,
        seq=64,
        model=spec_name,
        recompute=["none", "none"],
        offload_activations=True,
        view_policy="transient",
    )
    base.update(kw)
    return Plan(**base)


def _costs(spec, plan: Plan, platform, **kw) -> list:
    cm = CostModel(spec, plan, platform, **kw)
    return [cm.action(a) for stage in build_schedule(spec, plan).stages for a in stage]


# Plans alike but for their recompute (a RECOMPUTE's kernels and an OFFLOAD's bytes follow
# the policy), then others that share only the compute actions' costs (another pipeline
# depth, micro-batch, pass order or dtype), tied embeddings among them (the head's stage
# may store the embedding's matrix).
PLANS = [
    dict(recompute=["none", "none"]),
    dict(recompute=["full", "selective"]),
    dict(recompute=["selective", "full"]),
    dict(recompute=["first:1", "none"]),
    dict(pp=4, recompute=["full", "none", "selective", "first:1"]),
    dict(pp=4, dp=1, recompute=["none"] * 4, pipeline="zb-h1"),
    dict(micro_batch=2, global_batch=16),
    dict(shard_optimizer=True, recompute=["full", "full"]),
    dict(compute_dtype="fp32", grad_dtype="fp32", recompute=["full", "none"]),
]


@pytest.mark.parametrize("spec_name", ["tiny", "tiny-tied"])
@pytest.mark.parametrize("speed", ["busy", "peak"])
def test_a_plan_costs_the_same_after_others(spec_name, speed):
    spec, platform = get_preset(spec_name), load("cpu-local")
    layers = spec.n_layers
    plans = [_plan(spec_name, **kw) for kw in PLANS if kw.get("pp", 2) <= layers]
    alone = []
    for p in plans:
        model._SHARED.clear()
        alone.append(_costs(spec, p, platform, speed=speed))
    model._SHARED.clear()
    shared = [_costs(spec, p, platform, speed=speed) for p in plans]
    # And the other way round: the last plans first.
    model._SHARED.clear()
    backwards = [_costs(spec, p, platform, speed=speed) for p in reversed(plans)][::-1]
    for p, a, s, b in zip(plans, alone, shared, backwards, strict=True):
        assert s == a, p
        assert b == a, p
    assert len(model._SHARED) < 2 * len(plans)  # shared: not one cache per model and kind


def test_costs_are_not_shared_across_platforms_or_scales():
    spec = get_preset("tiny")
    plan = _plan("tiny", recompute=["full", "full"])
    a, b = load("cpu-local"), load("mt3000")
    model._SHARED.clear()
    on_a = _costs(spec, plan, a)
    on_b = _costs(spec, plan, b)
    halved = _costs(spec, plan, a, scale={"compute": 0.5})
    assert on_a != on_b
    model._SHARED.clear()
    assert _costs(spec, plan, b) == on_b
    assert _costs(spec, plan, a, scale={"compute": 0.5}) == halved != on_a
