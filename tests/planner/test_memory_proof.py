"""The memory proof first (`search._memory_proof`): structures go through the memory pass,
the smallest model-state bound first, until one may fit, before any step-time bound. The
answers equal those of the lazy order it replaced (every structure's memory pass when it
reaches the top of the heap), on feasible and infeasible requests; a request none fits is
answered without a single step-time bound."""

import importlib
from dataclasses import replace

import pytest

from ratrain.models.presets import get_preset
from ratrain.planner import search
from ratrain.planner.space import Request
from ratrain.platforms.load import load

search_mod = importlib.import_module("ratrain.planner.search")  # the package exports the function

TINY = get_preset("tiny")


def _capped(name: str, usable: int):
    return replace(load(name), usable_memory_bytes=usable, workspace_bytes=100_000)


def _requests(exhaustive: bool):
    """Caps around the edge of what fits (tiny on 4 clusters needs about 1.6-1.9 MB)."""
    caps = (1_000_000, 1_600_000, 1_800_000) if exhaustive else (1_500_000, 1_600_000, 1_900_000)
    for platform in ("mt3000", "a100-80g", "cpu-local"):
        for usable in caps:
            yield Request(TINY, _capped(platform, usable), 4, 8, 128)


def _answer(res, exhaustive: bool) -> tuple:
    near = res.near
    return (
        res.feasible,
        [(c.family, c.plan, c.step_time_s, c.peak_memory_bytes) for c in res.ranked],
        res.candidates_total,
        # A feasible search may now have bounded a structure it later prunes.
        res.candidates_evaluated if exhaustive or not res.feasible else None,
        # Among equally near misses, the one described may differ (ties are met in the
        # proof's order): the overflow may not.
        None if near is None else (near.over_bytes, near.measured),
    )


@pytest.mark.parametrize("prune", [True, False])
def test_the_memory_proof_first_gives_the_lazy_order_answers(monkeypatch, prune):
    reqs = list(_requests(exhaustive=not prune))
    new = [_answer(search(r, top=3, prune=prune), not prune) for r in reqs]
    monkeypatch.setattr(search_mod, "_memory_proof", lambda req, entries, state: {})
    old = [_answer(search(r, top=3, prune=prune), not prune) for r in reqs]
    assert new == old
    feasible = sum(a[0] for a in new)
    assert 0 < feasible < len(new)  # both kinds of request are compared


def test_an_infeasible_request_needs_no_step_time_bound(monkeypatch):
    def no_bound(*args, **kwargs):
        raise AssertionError("a step-time bound was computed")

    monkeypatch.setattr(search_mod, "step_time_lower_bound_s", no_bound)
    monkeypatch.setattr(search_mod, "plain_bounds_s", no_bound)
    # Ruled out by the fuller per-stage bound, not by the model states alone.
    req = Request(get_preset("qwen2.5-32b"), load("cpu-local"), 256, 1024, 4096)
    res = search(req)
    assert not res.feasible and res.near is not None
    assert res.candidates_evaluated == res.candidates_total
    # A feasible one needs them.
    with pytest.raises(AssertionError, match="step-time bound"):
        search(Request(TINY, _capped("mt3000", 10**9), 4, 8, 128))
