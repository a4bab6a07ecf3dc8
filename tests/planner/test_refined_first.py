"""With no plan ranked by `REFINED_FIRST_AT` of the soft limit, the search runs the refined
structure of smallest bound once, out of the heap's order (`search._refined_first`)."""

from __future__ import annotations

import heapq
import importlib
import time

from ratrain.deadline import REFINED_FIRST_AT, Budget
from ratrain.planner.result import Top
from ratrain.planner.structure import State

search_mod = importlib.import_module("ratrain.planner.search")
_Entry, _PEAK, _KERNELS = search_mod._Entry, search_mod._PEAK, search_mod._KERNELS


def _heap() -> list:
    entries = [
        _Entry(10.0, 0, 0, _PEAK, None, None, []),
        _Entry(11.0, 0, 1, _PEAK, None, None, []),
        _Entry(14.0, 0, 2, _KERNELS, None, None, []),
        _Entry(12.5, 0, 3, _KERNELS, None, None, []),
        _Entry(13.0, 0, 4, _PEAK, None, None, []),
        _Entry(12.5, 1, 5, _KERNELS, None, None, []),
    ]
    heapq.heapify(entries)
    return entries


def _state(elapsed_s: float) -> State:
    return State(Budget(1.0, 5.0, start=time.perf_counter() - elapsed_s))


def test_the_smallest_refined_bound_is_run_once_past_its_time():
    tasks, state = _heap(), _state(REFINED_FIRST_AT + 0.2)
    got = search_mod._refined_first(tasks, Top(1), state)
    assert (got.lb, got.seq) == (12.5, 3)  # the smallest refined, ties by family order
    assert sorted(e.seq for e in tasks) == [0, 1, 2, 4, 5]
    assert [heapq.heappop(tasks).lb for _ in range(5)] == [10.0, 11.0, 12.5, 13.0, 14.0]
    assert search_mod._refined_first(_heap(), Top(1), state) is None  # once


def test_not_before_its_time_nor_with_a_plan_nor_with_none_refined():
    tasks = _heap()
    assert search_mod._refined_first(tasks, Top(1), _state(0.0)) is None
    assert len(tasks) == 6
    ranked = Top(1)
    ranked.items.append(object())
    assert search_mod._refined_first(tasks, ranked, _state(REFINED_FIRST_AT + 0.2)) is None
    peaks = [e for e in _heap() if e.level == _PEAK]
    heapq.heapify(peaks)
    assert search_mod._refined_first(peaks, Top(1), _state(REFINED_FIRST_AT + 0.2)) is None
    assert len(peaks) == 3


def test_not_past_the_hard_limit():
    """A look apart that ends past the hard limit (its grace): the search stops, rather
    than refine and deepen a structure it can no longer run."""
    tasks = _heap()
    assert search_mod._refined_first(tasks, Top(1), _state(5.5)) is None
    assert len(tasks) == 6


def test_it_goes_before_a_look_apart_due_at_the_same_time(monkeypatch):
    """Past both `REFINED_FIRST_AT` and `LOOK_APART_LATE` with nothing run come to nothing:
    the refined structure runs first, the look apart after it (where still no plan); a
    search stuck (a structure run came to no plan) looks apart first."""
    from ratrain.deadline import LOOK_APART_LATE

    calls = []
    monkeypatch.setattr(search_mod, "_dive", lambda req, ev, state: calls.append("look"))
    monkeypatch.setattr(
        search_mod, "_deepen", lambda req, entry, state: calls.append(("run", entry.seq))
    )
    monkeypatch.setattr(search_mod, "_refine", lambda *a, **k: None)  # dropped
    late = max(REFINED_FIRST_AT, LOOK_APART_LATE) + 0.1
    for missed, first in ((0, [("run", 3), "look"]), (1, ["look", ("run", 3)])):
        calls.clear()
        state = _state(late)
        state.missed = missed
        search_mod._work(None, None, _heap(), Top(1), state, True, lambda: None)
        assert calls[:2] == first, calls  # then the heap's other refined ones, in order
