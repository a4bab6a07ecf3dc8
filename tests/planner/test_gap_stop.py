"""A budgeted search stops once its best plan is certified within the budget's gap
(`Budget.gap`, `ratrain plan --gap`): before its time budget, with a floor that still bounds
the optimum; at gap 0 it runs as before. The tightening after a cut stops where a higher
floor no longer changes the gap it reports."""

from __future__ import annotations

import importlib

import pytest

from ratrain.cli import main
from ratrain.deadline import Budget
from ratrain.models.presets import get_preset
from ratrain.planner import Request, search
from ratrain.planner.structure import State
from ratrain.platforms.load import load

S = importlib.import_module("ratrain.planner.search")  # the name is shadowed by the function


@pytest.fixture(scope="module")
def job():
    """llama2-7b on 16 a100-80g clusters at 64 x 4096: the exact search takes 0.2 s."""
    req = Request(get_preset("llama2-7b"), load("a100-80g"), 16, 64, 4096)
    return req, search(req, top=1)


def test_the_search_stops_at_its_gap_with_a_floor_under_the_optimum(job):
    req, exact = job
    assert not exact.cut
    opt_s = exact.best.step_time_s
    # A budget it never reaches: only the gap stops it.
    res = search(req, top=1, budget=Budget(60.0, 300.0, gap=0.05))
    assert res.cut and res.gap <= 0.05
    assert res.floor_step_s <= opt_s * (1 + 1e-12)
    assert opt_s <= res.best.step_time_s <= opt_s * 1.05
    assert res.candidates_evaluated < exact.candidates_evaluated


def test_at_gap_zero_the_budgeted_search_runs_to_the_optimum(job):
    req, exact = job
    res = search(req, top=1, budget=Budget(60.0, 300.0, gap=0.0))
    assert not res.cut
    assert res.best.plan == exact.best.plan
    assert res.candidates_evaluated == exact.candidates_evaluated


def test_tightening_stops_where_its_floor_is_enough(job):
    req, _ = job
    tasks, _ = S._tasks(req, req.families, State())
    head = min(tasks)
    before = sorted(tasks)
    # The least bound already reaches it: nothing is refined.
    assert S._tighten(req, tasks, Budget(10.0), enough_s=head.lb) == head.lb
    assert sorted(tasks) == before
    # Above it: the head is refined (its bound rises, or it leaves the heap).
    S._tighten(req, tasks, Budget(10.0), enough_s=head.lb * 1.5)
    assert sorted(tasks) != before


def test_plan_says_it_stopped_at_the_gap(capsys):
    argv = ["plan", "--model", "llama2-7b", "--platform", "a100-80g", "--clusters", "16"]
    argv += ["--global-batch", "64", "--seq", "4096", "--quiet", "--time-budget", "60"]
    assert main([*argv, "--gap", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "search stopped once its best plan was within 5.0% of the optimum" in out
    assert main([*argv, "--gap", "0"]) == 0
    assert "search stopped once" not in capsys.readouterr().out
