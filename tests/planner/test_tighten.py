"""`search._tighten` after a cut: a head whose kernel times are not known yet (a tile
model: 0.12-0.16 s per micro-batch size on mt3000) goes through its memory pass first, so a
structure none of whose knobs fit leaves the floor without them; the kernel model runs only
with `TILE_MODEL_S` of the tightening left."""

from __future__ import annotations

import importlib

import pytest

from ratrain.deadline import Budget
from ratrain.models.presets import get_preset
from ratrain.planner import Request
from ratrain.planner.structure import State, memory_pass
from ratrain.platforms import load

S = importlib.import_module("ratrain.planner.search")  # the name is shadowed by the function


@pytest.fixture(scope="module")
def heads():
    """llama2-70b over 1000 mt3000 clusters (8192 x 2048): a first-level structure that
    does not fit (4 sequences per microbatch) and one that does (the answer's pp=31)."""
    req = Request(get_preset("llama2-70b"), load("mt3000"), 1000, 8192, 2048)
    tasks, _ = S._tasks(req, ("ratrain",), State())
    peak = [e for e in tasks if e.level == S._PEAK and not e.passed]
    misses = [
        e
        for e in peak
        if e.st.micro_batch == 4 and not memory_pass(req, e.st, e.fam, e.kns, State())
    ]
    fits = [e for e in peak if e.st.pp == 31 and e.st.micro_batch == 1]
    fits = [e for e in fits if memory_pass(req, e.st, e.fam, e.kns, State())]
    return req, misses[0], fits[0]


def _unknown(monkeypatch):
    # As if no micro-batch size's kernel times were known yet.
    monkeypatch.setattr(S, "unit_times_cheap", lambda *a: False)


def test_a_head_that_does_not_fit_leaves_the_floor_without_kernel_times(heads, monkeypatch):
    req, miss, fit = heads
    _unknown(monkeypatch)
    above = fit._replace(level=S._KNOBS, lb=miss.lb * 1.5, queue=[])
    tasks = [miss, above]
    # It used to stop at the miss: a floor a third under the next bound.
    assert S._tighten(req, tasks, Budget(10.0)) == above.lb
    assert tasks == [above]


def test_a_head_that_fits_gets_its_kernel_times_only_with_time_for_them(heads, monkeypatch):
    req, _, fit = heads
    _unknown(monkeypatch)
    tasks = [fit]
    assert S._tighten(req, tasks, Budget(S.TILE_MODEL_S / 2)) == fit.lb
    (left,) = tasks
    assert left.level == S._PEAK and left.passed  # its memory pass is done, kept for later
    tasks = [left]
    floor = S._tighten(req, tasks, Budget(30.0))
    assert tasks[0].level == S._KNOBS and floor == tasks[0].lb >= fit.lb
