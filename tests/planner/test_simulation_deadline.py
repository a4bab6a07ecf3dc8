"""A simulation under a deadline (`Evaluator.simulate(plan, budget)`, used once a plan is
ranked) does not start a later steady-state try, or the full simulation the failed tries
fall back to, when it is expected to end past the deadline: it answers None, and the
search is cut there, instead of overrunning its budget by a whole simulation."""

import pytest

from _steady import offload_plan
from ratrain.config import Plan
from ratrain.deadline import Budget
from ratrain.models.presets import get_preset
from ratrain.planner import Request
from ratrain.planner.evaluate import Evaluator
from ratrain.platforms.load import load

TINY = get_preset("tiny")


def _plan(m: int) -> Plan:
    """Offload on mt3000: the first one-run try (12 microbatches) does not repeat yet, the
    second (26: a multiple of 2 pp from the step's count, `steady_one.SPANS`) does."""
    return offload_plan(2, m)


def _tries(ev: Evaluator) -> list[int]:
    calls = []
    short = ev._simulate_short

    def counting(plan):
        calls.append(plan.microbatches)
        return short(plan)

    ev._simulate_short = counting
    return calls


def test_a_later_try_past_the_deadline_is_not_started():
    req = Request(TINY, load("mt3000"), 4, 180, 128)
    plan = _plan(90)
    free = Evaluator(req)
    calls = _tries(free)
    full = free.simulate(plan)
    assert full is not None and calls == [12, 26]  # the second try repeats

    late = Evaluator(req)
    calls = _tries(late)
    assert late.simulate(plan, budget=Budget(soft_s=-1.0)) is None
    assert calls == [12]  # the first try ran (no rate known before it), not the second
    assert late.n_simulated == 0  # nothing cached or counted: a later call may run it

    ahead = Evaluator(req)
    got = ahead.simulate(plan, budget=Budget(soft_s=600.0))
    assert got.step_time_s == pytest.approx(full.step_time_s, rel=0, abs=0)


def test_a_full_fallback_past_the_deadline_is_not_started():
    """Steady-state tries that all fail: the full simulation is expected to take the tries'
    rate per microbatch x stage over the whole step."""
    req = Request(TINY, load("mt3000"), 4, 180, 128)
    ev = Evaluator(req)
    ev._short_rate.s_per_unit = 1.0  # a second per microbatch x stage: a step of 90 x 2 is far past
    assert ev._late(_plan(90), Budget(soft_s=100.0))
    assert not ev._late(_plan(90), Budget(soft_s=200.0))
