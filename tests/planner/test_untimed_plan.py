"""The hard deadline interrupts a search's first simulation (`ratrain.deadline`): the plan
the ledger found to fit is reported untimed instead of the answer running past the budget."""

from __future__ import annotations

import json
import time

import pytest

from ratrain import deadline
from ratrain.cli import main
from ratrain.config import Plan
from ratrain.deadline import Budget
from ratrain.models.presets import get_preset
from ratrain.planner import Request, search
from ratrain.planner.evaluate import Evaluator
from ratrain.platforms import load
from ratrain.sim import simulate


def test_check_raises_only_past_the_innermost_deadline():
    deadline.check()  # no deadline: never
    with deadline.until(Budget(hard_s=60)):
        deadline.check()
        with deadline.until(Budget(hard_s=-1)), pytest.raises(deadline.OutOfTime):
            deadline.check()
        deadline.check()  # the outer one again
    with deadline.until(None):
        deadline.check()
    with deadline.until(Budget(soft_s=-1)):  # only the hard limit is checked between phases
        deadline.check()


def test_simulation_stops_between_its_phases_past_the_deadline():
    spec = get_preset("tiny")
    plan = Plan(pp=2, micro_batch=1, global_batch=8, seq=64, offload_activations=True)
    with deadline.until(Budget(hard_s=-1)), pytest.raises(deadline.OutOfTime):
        simulate(spec, plan, "mt3000")
    assert simulate(spec, plan, "mt3000").step_time_s > 0  # outside: untouched


def _slow_simulations(monkeypatch):
    """Every simulation run under a deadline lasts past it, and checks it, as the
    simulator's phases do."""
    real = Evaluator.simulate

    def slow(self, plan, dl=None):
        active = deadline.active()
        if active is not None:
            time.sleep(max(0.0, active.hard - time.perf_counter()) + 0.01)
        deadline.check()
        return real(self, plan, dl)

    monkeypatch.setattr(Evaluator, "simulate", slow)


@pytest.mark.timeout(120)
def test_search_reports_the_fitting_plan_untimed(monkeypatch):
    req = Request(get_preset("tiny"), load("mt3000"), 4, 16, 128)
    _slow_simulations(monkeypatch)
    res = search(req, top=1, time_budget_s=1.0, hard_budget_s=2.0)
    assert not res.feasible and res.unfinished and res.untimed is not None
    u = res.untimed
    rep = Evaluator(req).memory(u.plan)
    assert tuple(rep.peak_bytes) == u.peak_bytes and max(u.peak_bytes) <= u.limit_bytes
    monkeypatch.undo()
    timed = simulate(req.spec, u.plan, req.platform, memory_timeline=False)
    assert u.step_lower_bound_s <= timed.step_time_s * (1 + 1e-9)
    # Without a hard budget the same search times it: nothing is left untimed.
    full = search(req, top=1)
    assert full.feasible and full.untimed is None


@pytest.mark.timeout(120)
def test_cli_says_the_untimed_plan(monkeypatch, capsys):
    _slow_simulations(monkeypatch)
    args = ["plan", "--model", "tiny", "--platform", "mt3000", "--clusters", "4"]
    args += ["--global-batch", "16", "--seq", "128", "--quiet", "--time-budget", "0.8"]
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "no plan timed within the time budget" in out and "fits, not timed: " in out
    assert main([*args, "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    fit = doc["untimed_fit"]
    assert max(fit["peak_memory_bytes"]) <= fit["limit_bytes"]
    assert fit["step_time_lower_bound_s"] > 0 and fit["plan"]["pp"] >= 1
    assert doc["explanation"]["text"][1].startswith("fits, not timed: ")
