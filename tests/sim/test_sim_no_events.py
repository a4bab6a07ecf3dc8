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
from ratrain.schedule.ir import Op
from ratrain.sim import simulate, simulate_schedule
from ratrain.sim.flat import Needed, graph
from ratrain.sim.result import stage_metrics_flat
from ratrain.sim.simulate import _timeline

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


def _transient_plan(
    pipeline: str, pp: int = 4, dp: int = 2, lookahead: int = 1, m: int = 0
) -> Plan:
    return Plan(
        pp=pp,
        dp=dp,
        micro_batch=1,
        global_batch=dp * (m or 3 * pp),
        seq=128,
        schedule="ratrain",
        shard_optimizer=True,
        view_policy="transient",
        view_lookahead=lookahead,
        offload_activations=pipeline != "1f1b",
        pipeline=pipeline,
        model="tiny",
    )


@pytest.mark.parametrize("platform", ["mt3000", "a100-80g", "cpu-local"])
@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h1", "zb-h2"])
@pytest.mark.parametrize("lookahead", [1, 2])
def test_a_step_timed_without_its_view_drops(platform, pipeline, lookahead):
    """A step timed alone leaves its VIEW_DROPs out where they time nothing (`_untimed`):
    the same figures as the replay of every action, on one node and across nodes (links
    shared, a100-80g's 8 GPUs per node: pp=4 x dp=4 spans two) and with ranks sharing
    cores (cpu-local: every action replayed, by the processor-sharing engine)."""
    spec, pf = get_preset("tiny"), load(platform)
    plan = _transient_plan(pipeline, dp=4 if platform == "a100-80g" else 2, lookahead=lookahead)
    sch = build_schedule(spec, plan)
    drops = sum(a.op is Op.VIEW_DROP for st in sch.stages for a in st)
    assert drops
    every = _timeline(sch, CostModel(spec, plan, pf), False, drops=True)
    alone = _timeline(sch, CostModel(spec, plan, pf), False, drops=False)
    n = sum(len(c[0]) for c in every[1])
    sharing = platform == "cpu-local"
    assert sum(len(c[0]) for c in alone[1]) == (n if sharing else n - drops)
    assert alone[2] == every[2]  # the step's end
    assert stage_metrics_flat(alone[1], alone[2]) == stage_metrics_flat(every[1], every[2])
    with_events = simulate_schedule(sch, CostModel(spec, plan, pf))
    for keep_events in (True, False):
        alone = simulate_schedule(
            sch, CostModel(spec, plan, pf), keep_events=keep_events, drops=False
        )
        for name in _FIGURES:
            assert getattr(alone, name) == getattr(with_events, name), name
        if keep_events:  # the events of every other action, as they were
            others = [e for e in with_events.events if e.action.op is not Op.VIEW_DROP]
            assert alone.events == (with_events.events if sharing else others)


def test_a_drop_something_waits_for_is_replayed():
    """Where an action depends on a VIEW_DROP (no lowering makes one), the drop is not left
    out: `graph` says so (`Needed`) and every action is replayed."""
    spec, pf = get_preset("tiny"), load("mt3000")
    plan = _transient_plan("1f1b")
    sch = build_schedule(spec, plan)
    stage = sch.stages[0]
    drop = next(a for a in stage if a.op is Op.VIEW_DROP)
    later = next(a for a in stage[stage.index(drop) + 1 :] if a.op is Op.F)
    sch.add_dep(later, drop)
    with pytest.raises(Needed):
        graph(sch, frozenset({Op.VIEW_DROP}))
    every = _timeline(sch, CostModel(spec, plan, pf), False, drops=True)
    alone = _timeline(sch, CostModel(spec, plan, pf), False, drops=False)
    assert alone[2] == every[2]
    assert [len(c[0]) for c in alone[1]] == [len(c[0]) for c in every[1]]


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h2"])
def test_a_long_step_from_a_short_one_timed_without_its_drops(pipeline, monkeypatch):
    """The evaluator's steady-state path reads a short step timed without its VIEW_DROPs:
    the same long step's figures as from the short step with them, and the checks pass on
    either (neither evaluator simulates the whole step)."""
    import ratrain.planner.evaluate as evaluate

    spec, pf = get_preset("tiny"), load("mt3000")
    plan = _transient_plan(pipeline, pp=2, m=96)
    req = Request(spec, pf, 4, plan.global_batch, plan.seq)
    shorts: list = []
    timed = evaluate.Evaluator._simulate_short

    def short(self, p):
        res = timed(self, p)
        shorts.append(sum(e.action.op is Op.VIEW_DROP for e in res.events))
        return res

    def whole(self, p):
        raise AssertionError("the whole step simulated: no steady state found")

    monkeypatch.setattr(evaluate.Evaluator, "_simulate_short", short)
    monkeypatch.setattr(evaluate.Evaluator, "_simulate_full", whole)
    alone = Evaluator(req).simulate(plan)
    assert shorts and not any(shorts)  # short steps timed, none with a drop
    every_action = evaluate.simulate_schedule

    def with_drops(*args, **kw):
        return every_action(*args, **{**kw, "drops": True})

    monkeypatch.setattr(evaluate, "simulate_schedule", with_drops)
    shorts.clear()
    every = Evaluator(req).simulate(plan)
    assert shorts and all(shorts)
    for name in _FIGURES:
        assert getattr(alone, name) == getattr(every, name), name
