"""`ratrain plan` keeps to its time budget when no plan fits yet, and an infeasible
request's explanation says what it could not check in time."""

import time
from dataclasses import replace

import pytest

from ratrain.cli import main
from ratrain.models.presets import get_preset
from ratrain.planner import Request, explain, search
from ratrain.planner.evaluate import Evaluator
from ratrain.platforms.load import load


@pytest.mark.timeout(60)
def test_no_fit_within_the_budget_is_said_not_claimed_infeasible(capsys):
    """llama2-70b on 64 a100-80g clusters fits (the exact search finds 21.5k tokens/s):
    with a budget of 1 ms no plan is found, and the answer says it does not know."""
    t0 = time.perf_counter()
    argv = ["plan", "--model", "llama2-70b", "--platform", "a100-80g", "--clusters", "64"]
    rc = main([*argv, "--quiet", "--time-budget", "0.001"])
    wall_s = time.perf_counter() - t0
    assert rc == 2
    text = capsys.readouterr().out
    assert "unknown whether a plan fits" in text and "structures were not examined" in text
    assert "--time-budget 0" in text
    assert "no plan fits" not in text and "cheapest change" not in text
    assert wall_s < 10  # a budget of 1 ms: one structure's work at most, not the search


@pytest.mark.timeout(60)
def test_a_job_the_states_rule_out_is_refused_with_the_proof_at_any_budget(capsys):
    """llama2-70b on 64 mt3000 clusters (1,024 x 4,096) fits no plan (the exact search says
    so): every structure's states with its full gradients overflow a stage
    (`structure.states_overflow`), which the search checks as it gathers the structures,
    before any budget applies."""
    argv = ["plan", "--model", "llama2-70b", "--platform", "mt3000", "--clusters", "64"]
    rc = main([*argv, "--quiet", "--time-budget", "0.001"])
    assert rc == 2
    text = capsys.readouterr().out
    assert "no plan fits" in text and "unknown whether" not in text


@pytest.mark.timeout(120)
def test_explanation_out_of_time_says_what_it_did_not_check():
    req = Request(get_preset("llama2-70b"), load("mt3000"), 8, 1024, 4096)
    res = search(req, top=1)
    assert not res.feasible and not res.unfinished and res.near is not None
    ex = explain(req, res.near, budget_s=0.0)
    assert ex.unexamined is None and ex.over_bytes > 0
    assert not ex.changes
    assert "more clusters: not checked within the time budget" in ex.note
    assert "a shorter sequence: not checked within the time budget" in ex.note


class _SlowToSimulate(Evaluator):
    """An evaluator whose every simulation looks long: a search with a budget stops before
    the next one as soon as a plan is ranked (the path a deep pipeline takes)."""

    @property
    def last_simulate_s(self) -> float:
        return 1e9 if self.n_simulated else 0.0

    @last_simulate_s.setter
    def last_simulate_s(self, value: float) -> None:
        pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["mt3000", "a100-80g"])
def test_every_cut_floor_bounds_the_optimum(platform):
    pl = replace(load(platform), usable_memory_bytes=3_000_000, workspace_bytes=500_000)
    cases = 0
    for clusters, gb in ((4, 8), (8, 16), (4, 4)):
        req = Request(get_preset("tiny"), pl, clusters, gb, 128)
        exact = search(req, top=1)
        if not exact.feasible:
            continue
        for budget, ev in ((0.0, None), (1e-4, None), (1e-4, _SlowToSimulate(req))):
            cut = search(req, top=1, time_budget_s=budget, evaluator=ev)
            assert cut.ranked and cut.best.step_time_s >= exact.best.step_time_s
            if cut.cut:
                assert cut.floor_step_s <= exact.best.step_time_s * (1 + 1e-12)
                cases += 1
    assert cases


def test_knob_bounds_stop_at_the_budget_and_leave_the_heap_as_it_was(monkeypatch):
    """A deep structure's knob bounds take up to a second: past the soft limit they raise
    `OutOfTime`, and tightening the floor puts the structure back with its bound."""
    import heapq
    import importlib

    from ratrain.deadline import Budget, OutOfTime
    from ratrain.planner.space import family_of, knob_combos, structures
    from ratrain.planner.structure import State, bound_knobs

    sm = importlib.import_module("ratrain.planner.search")
    req = Request(get_preset("llama2-7b"), load("a100-80g"), 16, 64, 4096)
    fam = family_of("ratrain")
    st = next(iter(structures(req, fam)))
    kns = knob_combos(req, fam, st)
    with pytest.raises(OutOfTime):
        bound_knobs(req, st, fam, kns, State(), budget=Budget(0.0))
    assert bound_knobs(req, st, fam, kns, State(), budget=Budget(60.0))
    tasks, _ = sm._tasks(req, req.families, State())
    entry = heapq.heappop(tasks)
    heapq.heappush(tasks, entry._replace(level=sm._KERNELS))  # its knob bounds come next
    before = sorted(tasks)

    calls = []

    def out_of_time(*args, budget=None):
        calls.append(budget)
        raise OutOfTime

    monkeypatch.setattr(sm, "bound_knobs", out_of_time)
    tightening = Budget(60.0)
    assert sm._tighten(req, tasks, tightening) == before[0].lb
    assert sorted(tasks) == before and calls == [tightening]
