"""`ratrain plan` keeps to its time budget when no plan fits yet, and an infeasible
request's explanation says what it could not check in time."""

import time

import pytest

from ratrain.cli import main
from ratrain.models.presets import get_preset
from ratrain.planner import Request, explain, search
from ratrain.platforms.load import load


@pytest.mark.timeout(60)
def test_no_fit_within_the_budget_is_said_not_claimed_infeasible(capsys):
    t0 = time.perf_counter()
    rc = main(
        ["plan", "--model", "llama2-70b", "--clusters", "64", "--quiet", "--time-budget", "0.001"]
    )
    wall_s = time.perf_counter() - t0
    assert rc == 2
    text = capsys.readouterr().out
    assert "no plan found to fit" in text and "structures not examined" in text
    assert "no plan fits" not in text and "cheapest change" not in text
    assert wall_s < 10  # a budget of 1 ms: one structure's work at most, not the search


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
