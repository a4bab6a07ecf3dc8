"""A simulation without its events (`simulate_schedule(keep_events=False)`, what the
planner's evaluator runs for a whole step) times the step exactly as one with them, and
the evaluator's full steps match `ratrain.sim.simulate`'s figures."""

from __future__ import annotations

import pytest

from ratrain.config import Plan
from ratrain.cost.model import CostModel
from ratrain.models.presets import get_preset
from ratrain.planner.evaluate import Evaluator
from ratrain.planner.space import Request
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.sim import simulate, simulate_schedule

_FIGURES = ("step_time_s", "bubble_fraction", "stage_bubble", "utilization", "exposed")


@pytest.mark.parametrize("platform", ["mt3000", "cpu-local"])
@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h2"])
def test_the_same_figures_without_events(platform, pipeline):
    spec, pf = get_preset("tiny"), load(platform)
    plan = Plan(
        pp=2,
        dp=2,
        micro_batch=1,
        global_batch=12,
        seq=128,
        schedule="ratrain",
        offload_activations=platform == "mt3000",
        pipeline=pipeline,
        model=spec.name,
    )
    sch = build_schedule(spec, plan)
    with_events = simulate_schedule(sch, CostModel(spec, plan, pf))
    without = simulate_schedule(sch, CostModel(spec, plan, pf), keep_events=False)
    assert with_events.events and not without.events
    for name in _FIGURES:
        assert getattr(without, name) == getattr(with_events, name), name
    # The evaluator's whole step (too short for the steady-state shortcut) has no events
    # and `simulate`'s figures.
    req = Request(spec, pf, 4, 12, 128)
    got = Evaluator(req).simulate(plan)
    ref = simulate(spec, plan, pf)
    assert not got.events
    for name in _FIGURES:
        assert getattr(got, name) == getattr(ref, name), name
    assert got.peak_memory_bytes == ref.peak_memory_bytes
