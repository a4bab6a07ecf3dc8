"""`find_feasible(fastest_first=True)` works out a candidate's recompute options only when
its turn comes (`feasible._fastest_fit`): its bound without recomputation first, refined
when it is the smallest left. It must confirm the same plan as ordering every candidate by
its refined bound up front (the order before), with fewer memory bounds."""

from __future__ import annotations

import pytest

from ratrain.deadline import Budget
from ratrain.models.presets import get_preset
from ratrain.planner import feasible
from ratrain.planner.evaluate import Evaluator
from ratrain.planner.space import Request
from ratrain.platforms.load import load


def _eager(req: Request):
    """The order before: every candidate's options and refined bound first, then the
    ledger in that order (one family's structures, as `find_feasible` enumerates them)."""
    calls = []
    real = feasible._fastest_fit

    def spy(ev, req_, allowed, ruled, budget, max_replays):
        calls.append(len(allowed))
        eager = []
        for _, n, st, kn, _, fam in allowed:
            if any(feasible.saves(o, kn) for o in ruled.get(st, ())):
                continue
            opts = feasible._opts(req_, st, kn)
            if opts is None:
                ruled.setdefault(st, []).append(kn)
                continue
            eager.append((feasible._bound_s(req_, st, kn, opts, fam), n, st, kn, opts, fam))
        for _, _, st, kn, opts, fam in sorted(eager, key=lambda a: a[:2]):
            found = feasible._confirm(ev, req_, st, kn, opts, fam.per_stage_recompute, budget)
            if found is not None:
                return feasible.Fit(*found, fam.name)
        return None

    feasible._fastest_fit = spy
    try:
        return feasible.find_feasible(req, Evaluator(req), fastest_first=True), calls
    finally:
        feasible._fastest_fit = real


JOBS = [
    ("llama2-70b", "a100-80g", 64, 512, 4096),
    ("llama2-7b", "a100-80g", 6, 48, 4096),
    ("llama2-70b", "mt3000", 96, 4096, 4096),
    ("qwen2.5-32b", "h100-80g", 96, 1024, 4096),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("job", JOBS, ids=[f"{j[0]}-{j[1]}-{j[2]}" for j in JOBS])
def test_the_lazy_order_confirms_the_eager_orders_plan(job, monkeypatch):
    model, platform, clusters, gb, seq = job
    req = Request(get_preset(model), load(platform), clusters, gb, seq)
    want, _ = _eager(req)
    counted = []
    real = feasible.options

    def options(*a, **k):
        counted.append(1)
        return real(*a, **k)

    monkeypatch.setattr(feasible, "options", options)
    got = feasible.find_feasible(req, Evaluator(req), fastest_first=True, budget=Budget())
    assert (got is None) == (want is None)
    if want is not None:
        assert got.plan == want.plan and got.family == want.family
    monkeypatch.setattr(feasible, "options", real)
    # the eager order computes every candidate's options; the lazy one only those whose
    # bound without recomputation is below the fit's
    eager_count = []
    monkeypatch.setattr(feasible, "options", lambda *a, **k: eager_count.append(1) or real(*a, **k))
    _eager(req)
    assert len(counted) <= len(eager_count)
    if job == JOBS[0]:  # 54 of 344 on the 70B job
        assert 4 * len(counted) < len(eager_count)


@pytest.mark.timeout(300)
def test_relax_keeps_a_fitting_plan_with_knobs_that_save_no_more():
    """The look's plan takes the most memory-saving knobs; `relax` trades them for the
    structure's most relaxed combination the bound allows and the ledger confirms (here:
    llama2-70b on 128 h100-80g clusters, the look's offload is dropped), and with no
    replays left, or no fit given knobs, returns the plan it was given."""
    req = Request(get_preset("llama2-70b"), load("h100-80g"), 128, 1024, 4096)
    ev = Evaluator(req)
    fit = feasible.find_feasible(req, ev, fastest_first=True)
    assert fit is not None and fit.kn is not None and fit.plan.offload_activations
    got = feasible.relax(ev, req, fit, Budget())
    assert got.plan != fit.plan and got.st == fit.st
    assert feasible.saves(fit.kn, got.kn) and ev.memory(got.plan).fits
    assert not got.plan.offload_activations
    assert feasible.relax(ev, req, fit, Budget(), replays=0) is fit
    unknown = fit._replace(kn=None)
    assert feasible.relax(ev, req, unknown, Budget()) is unknown
