"""With no plan ranked yet, the search runs the knob queue of the structure it pops past the
memory pass, instead of bounding structure after structure's knobs first: on a wide-DP job
whose knob bounds (syncs, fetches) sit above the structures' own bounds, refining a level
at a time bounded 41 structures' knobs (3.3 s on the 2-core machine) before it ran one."""

import importlib

import pytest

from ratrain.deadline import Budget
from ratrain.models.presets import get_preset
from ratrain.planner import Request
from ratrain.platforms.load import load

search_mod = importlib.import_module("ratrain.planner.search")


class _FirstRun(Exception):
    pass


def test_the_first_knob_queue_runs_after_few_knob_bounds(monkeypatch):
    req = Request(get_preset("llama3.2-1b"), load("h100-80g"), 1000, 128, 2048)
    bounded = []
    real_bound = search_mod.bound_knobs

    def count(*args, **kwargs):
        bounded.append(args[1])
        return real_bound(*args, **kwargs)

    def first_run(*args, **kwargs):
        raise _FirstRun

    monkeypatch.setattr(search_mod, "bound_knobs", count)
    monkeypatch.setattr(search_mod, "run_queue", first_run)
    with pytest.raises(_FirstRun):
        search_mod.search(req, budget=Budget(None, None))  # no clock: no look apart
    # One structure's knobs bounded, then run (a level at a time: 41).
    assert len(bounded) <= 3, len(bounded)
