"""Memory-tight jobs get a plan within their budget: LLaMA-2-70B on 64 A100-80GB (global
batch 512 x 4096), whose fastest structures by their step-time bound do not fit. Searched
by their bound alone, the budget went on proving that and the answer was "no plan found in
time"; with the plan looked for apart early (`deadline.LOOK_APART_AT` of the soft limit) as
the incumbent, the search answers with it, or better, at its soft limit."""

from __future__ import annotations

import time

import pytest

from ratrain.deadline import Budget
from ratrain.models.presets import get_preset
from ratrain.planner import Request, search
from ratrain.planner.evaluate import Evaluator
from ratrain.platforms.load import load


@pytest.fixture(scope="module")
def llama70b_64():
    return Request(get_preset("llama2-70b"), load("a100-80g"), 64, 512, 4096)


@pytest.mark.timeout(120)
def test_a_memory_tight_job_gets_a_plan_at_a_small_budget(llama70b_64):
    # `ratrain plan`'s default budget: 1.2 s, and 6 s with no plan fitting yet. The search
    # answered "no plan found" at 6 s; the look apart now starts at 0.3 s.
    res = search(llama70b_64, budget=Budget(1.2, 6.0))
    assert res.ranked and not res.unfinished and res.cut
    best = res.ranked[0]
    ev = Evaluator(llama70b_64)
    assert ev.memory(best.plan).fits
    assert max(best.peak_memory_bytes) <= llama70b_64.platform.plan_limit_bytes
    # Its gap is certified by the smallest step-time bound left.
    assert res.floor_step_s is not None and res.floor_step_s <= best.step_time_s
    assert res.gap == pytest.approx(best.step_time_s / res.floor_step_s - 1)


def test_the_look_apart_starts_a_quarter_into_the_soft_limit():
    now = time.perf_counter()
    # 0.4 s into `ratrain plan`'s default budget (1.2 s, 6 s with none fitting): due. It
    # used to wait until halfway from the soft to the hard limit (3.6 s).
    assert Budget(1.2, 6.0, start=now - 0.4).look_apart_due()
    assert not Budget(1.2, 6.0, start=now + 10).look_apart_due()
    # Where nothing the search worked on has come to nothing yet, it waits until the soft
    # limit (`LOOK_APART_LATE`).
    assert not Budget(1.2, 6.0, start=now - 0.4).look_apart_due(stuck=False)
    assert Budget(1.2, 6.0, start=now - 1.3).look_apart_due(stuck=False)
    # Never without both limits (the exact search, and a soft limit alone).
    assert not Budget(None, None, start=now - 100).look_apart_due()
    assert not Budget(1.2, None, start=now - 100).look_apart_due()


def test_with_the_plan_apart_in_hand_the_search_goes_on_to_twice_the_soft_limit():
    b = Budget(1.2, 6.0)
    assert b.with_grace().hard_s == pytest.approx(2.4)
    assert b.with_grace().soft_s == 1.2 and b.with_grace().start == b.start
    # never past the hard limit, and nothing to bring in without both limits
    assert Budget(1.2, 2.0).with_grace().hard_s == 2.0
    unlimited = Budget(None, None)
    assert unlimited.with_grace() is unlimited
    assert Budget(1.2, None).with_grace().hard_s is None


def test_the_walk_takes_its_share_of_the_grace_left():
    now = time.perf_counter()
    b = Budget(1.2, 6.0, start=now - 1.0)  # 1.4 s left to the grace's 2.4 s
    walk = b.share_of_grace(0.5)
    assert walk.soft_s == walk.hard_s and 0.6 < walk.soft_s <= 0.7
    assert walk.start >= now
    assert Budget(1.2, 6.0, start=now - 5.0).share_of_grace(0.5).soft_s == 0.0  # past it
    unlimited = Budget(None, None)
    assert unlimited.share_of_grace(0.5) is unlimited
