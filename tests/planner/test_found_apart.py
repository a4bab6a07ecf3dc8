"""A first fitting plan looked for apart (`search._dive`): where the bound-ordered search
ranks nothing by a part of its soft limit (memory-tight jobs: the structures with the
smallest step-time bounds are the ones that do not fit), the plan found by the memory
bound and the ledger is the incumbent, and the answer if the search does not better it,
with a certified gap, instead of "no plan found"."""

from __future__ import annotations

import importlib
import json
import time

import pytest

from _planner import TINY, small_cap
from ratrain import deadline
from ratrain.cli import main
from ratrain.deadline import Budget
from ratrain.planner import Request, search
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.feasible import find_feasible, relax
from ratrain.planner.result import candidate_of
from ratrain.platforms.load import PRESETS_DIR

search_mod = importlib.import_module("ratrain.planner.search")
real_run_queue = search_mod.run_queue


def _never_ranks(ev, req, st, fam, queue, best, state, prune):
    """The bound-ordered search's first structure takes it past its hard limit with nothing
    ranked (as on the 70B jobs whose fastest structures do not fit): it stops there, as
    `run_queue` does."""
    state.stopped = True


@pytest.fixture(autouse=True)
def _look_at_once(monkeypatch):
    """The look apart at once (`deadline.LOOK_APART_AT`, and `LOOK_APART_LATE` where no
    structure has come to nothing yet)."""
    monkeypatch.setattr(deadline, "LOOK_APART_AT", 0.0)
    monkeypatch.setattr(deadline, "LOOK_APART_LATE", 0.0)


@pytest.fixture
def tight():
    return Request(TINY, small_cap(), 4, 8, 128)


def test_without_the_look_apart_the_search_answers_no_plan(tight, monkeypatch):
    monkeypatch.setattr(search_mod, "run_queue", _never_ranks)
    monkeypatch.setattr(search_mod, "_dive", lambda *a: None)
    res = search(tight, budget=Budget(0.0, 30.0))
    assert not res.ranked and res.unfinished


def test_the_plan_found_apart_is_the_answer_with_an_honest_gap(tight, monkeypatch):
    monkeypatch.setattr(search_mod, "run_queue", _never_ranks)
    res = search(tight, budget=Budget(0.0, 30.0))  # the look starts at once
    assert res.found_apart and len(res.ranked) == 1 and not res.unfinished
    best = res.ranked[0]
    ev = Evaluator(tight)
    assert ev.memory(best.plan).fits
    assert best.step_time_s == pytest.approx(ev.simulate(best.plan).step_time_s)
    # The floor bounds every plan of the space: the optimum included (the exact search's,
    # which tests/planner/test_search.py holds to the exhaustive one).
    monkeypatch.setattr(search_mod, "run_queue", real_run_queue)
    optimum_step_s = search(tight).ranked[0].step_time_s
    assert res.floor_step_s <= optimum_step_s * (1 + 1e-9)
    assert res.gap == pytest.approx(best.step_time_s / res.floor_step_s - 1)


def test_a_search_that_ranks_in_time_does_not_look_apart(tight, monkeypatch):
    monkeypatch.setattr(deadline, "LOOK_APART_AT", 0.25)  # at 15 s of the 60 s below
    monkeypatch.setattr(deadline, "LOOK_APART_LATE", 0.25)
    calls = []
    monkeypatch.setattr(search_mod, "_dive", lambda *a: calls.append(a))
    res = search(tight, budget=Budget(60.0, 300.0))
    assert res.ranked and not res.found_apart and calls == []
    unlimited = search(tight)
    assert [c.plan for c in unlimited.ranked] == [c.plan for c in res.ranked]
    assert calls == []


def _slowly_never_ranks(ev, req, st, fam, queue, best, state, prune):
    """Each structure takes a while and ranks nothing; past the hard limit the search stops
    (the look apart starts once the soft limit has passed, between two structures)."""
    time.sleep(0.2)
    if state.budget.over_hard():
        state.stopped = True


@pytest.mark.timeout(120)
def test_plan_says_the_plan_was_found_apart(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(search_mod, "run_queue", _slowly_never_ranks)
    text = (PRESETS_DIR / "mt3000.yaml").read_text()  # as small_cap(): 3 MB, 0.5 MB reserved
    text = text.replace("value: 20.0e+9", "value: 3.0e+6").replace("value: 0.5e+9", "value: 5.0e+5")
    (tmp_path / "tight.yaml").write_text(text)
    args = ["plan", "--model", "tiny", "--platform", str(tmp_path / "tight.yaml")]
    args += ["--clusters", "4", "--global-batch", "8", "--seq", "128"]
    assert main([*args, "--time-budget", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "memory is tight" in out and "found apart" in out
    assert main([*args, "--time-budget", "1", "--quiet", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] and doc["found_apart"] and doc["cut"] and doc["gap"] >= 0


def _look(req, ev):
    """The look's plan, relaxed, and its candidate (as `search._dive` makes them)."""
    fit = relax(ev, req, find_feasible(req, ev, fastest_first=True), Budget())
    return fit, candidate_of(ev.simulate(fit.plan), fit.plan, fit.family, usable_bytes(req))


@pytest.mark.parametrize("platform", ["mt3000", "a100-80g"])
def test_the_look_is_bettered_on_its_own_structure(platform):
    """The look's plan takes its structure's most memory-saving knobs and recompute; the
    walk of that structure's knob queue (`search._walk`) finds the structure's fastest plan
    that fits: the one the exact search pinned to the structure and family ranks first."""
    req = Request(TINY, small_cap(platform=platform), 8, 16, 128)
    ev = Evaluator(req)
    fit, look = _look(req, ev)
    walked = search_mod._walk(req, ev, fit, look, Budget())
    assert ev.memory(walked.plan).fits
    assert walked.step_time_s < look.step_time_s  # the look's recompute is more than needed
    st = fit.st
    pins = {"pp": st.pp, "dp": st.dp, "micro_batch": st.micro_batch, "layer_split": st.layer_split}
    pinned = search(req.with_(pins=pins, families=(fit.family,)), top=1)
    assert walked.step_time_s == pytest.approx(pinned.best.step_time_s, rel=1e-12)


def test_the_answer_found_apart_is_the_walks(tight, monkeypatch):
    """With the bound-ordered search ranking nothing, the answer found apart is the walk's
    plan, not the look's own."""

    def walk_only(ev, req, st, fam, queue, best, state, prune):
        if best.k != 1:  # the search's own structures (the walk keeps the fastest only)
            return _never_ranks(ev, req, st, fam, queue, best, state, prune)
        return real_run_queue(ev, req, st, fam, queue, best, state, prune)

    monkeypatch.setattr(search_mod, "run_queue", walk_only)
    res = search(tight, budget=Budget(10.0, 30.0))  # the walk: half of the 20 s grace
    ev = Evaluator(tight)
    fit, look = _look(tight, ev)
    walked = search_mod._walk(tight, ev, fit, look, Budget())
    assert res.found_apart and res.ranked[0].plan == walked.plan
    assert res.ranked[0].step_time_s < look.step_time_s


def test_a_walk_that_betters_nothing_answers_the_look(tight, monkeypatch):
    """The walk ranks nothing faster in its time (at a soft limit of 0, it has none): the
    answer is the look's plan, relaxed, as before the walk."""
    monkeypatch.setattr(search_mod, "run_queue", _never_ranks)
    res = search(tight, budget=Budget(0.0, 30.0))
    assert res.found_apart and len(res.ranked) == 1
    _, look = _look(tight, Evaluator(tight))
    assert res.ranked[0].plan == look.plan
