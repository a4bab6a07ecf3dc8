"""The zero-bubble pass profile in closed form (`ZbProfile`) against the pass order it
describes (`zb_profile`, read off `ratrain.schedule.zerobubble.order_of`), and the memory
bound that reads only its few moments against the same bound reading every moment where
the profile changes."""

from __future__ import annotations

import itertools

import pytest

from _planner import TINY, small_cap
from ratrain.planner import memory_tables
from ratrain.planner.memory_bound import MemoryBound
from ratrain.planner.memory_tables import ZbProfile, zb_profile, zb_profile_of
from ratrain.planner.space import Request, family_of, knob_combos, make_plan, structures
from ratrain.schedule.lowering import deferred_weight_mbs
from ratrain.schedule.zerobubble import order_of, warmup

CASES = [
    (pipe, pp, m, s)
    for pipe in ("zb-h1", "zb-h2")
    for pp in range(1, 9)
    for m in (1, 2, 3, 5, 8, 13, 31)
    for s in range(pp)
]


def _changes(ref: tuple) -> set[int]:
    """The moments the scan over the profile takes: each microbatch whose profile differs
    from the one before, and that one."""
    return {j for i in range(1, len(ref)) if ref[i] != ref[i - 1] for j in (i - 1, i)}


@pytest.mark.parametrize("pipe, pp, m, s", CASES)
def test_closed_form_is_the_pass_orders_profile(pipe, pp, m, s):
    w = warmup(pp, m, s, pipe)
    ref = zb_profile(pp, m, w, pipe)
    z = zb_profile_of(pp, m, w, pipe)
    assert tuple(z.at(mb) for mb in range(m)) == ref
    # Its moments are some of the scan's: none is added where nothing changes.
    assert z.moments() <= _changes(ref)


def test_deferred_weight_passes_in_one_scan():
    for m, w, limit in itertools.product(range(1, 12), range(0, 6), range(1, 9)):
        if w > m or limit < w + 1:
            continue
        order = order_of(m, w, limit)
        bi = {mb: i for i, (op, mb) in enumerate(order) if op.name == "B_IN"}
        bw = {mb: i for i, (op, mb) in enumerate(order) if op.name == "B_W"}
        slow = {mb for mb in bi if any(op.name != "B_W" for op, _ in order[bi[mb] + 1 : bw[mb]])}
        assert deferred_weight_mbs(order) == slow
        assert {mb for mb in range(m) if ZbProfile(m, w, limit).deferred(mb)} == slow


def _every_change(self: ZbProfile) -> set[int]:
    return _changes(tuple(self.at(mb) for mb in range(self.m)))


@pytest.mark.parametrize("held", [False, True])
def test_the_bound_from_the_few_moments_equals_the_full_scans(monkeypatch, held):
    req = Request(TINY, small_cap(), 8, 32, 128, families=("ratrain", "gpu-style"))
    compared = 0
    for name in req.families:
        fam = family_of(name)
        for st in structures(req, fam):
            for kn in knob_combos(req, fam, st):
                if kn.pipeline not in ("zb-h1", "zb-h2"):
                    continue
                plan = make_plan(req, st, kn, ("none",) * st.pp)
                b = MemoryBound(req.spec, plan, held)
                keys = [b.stage_key(s) for s in range(plan.pp)]
                pols = ("none", "selective", "full")
                few = [b._stage(*k, p) for k in keys for p in pols]
                with monkeypatch.context() as mp:
                    mp.setattr(memory_tables.ZbProfile, "moments", _every_change)
                    every = [b._stage(*k, p) for k in keys for p in pols]
                assert few == every, (plan.pp, plan.microbatches, kn)
                compared += 1
    assert compared > 20
