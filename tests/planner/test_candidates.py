"""The plans a trial measures (`ratrain.planner.candidates`): the search's first stays
first, one plan per structure and schedule, K structures from the ranking, each compared
family's best structure under ratrain's lifecycle, and each compared family's plan itself
under it; no plan twice."""

from __future__ import annotations

import dataclasses

import pytest

from _planner import TINY
from ratrain.config import Plan
from ratrain.planner import Request, search
from ratrain.planner.candidates import (
    family_bests,
    lifecycle_plans,
    lifecycle_variants,
    plan_key,
    select,
    structure_key,
    structure_pins,
    trial_candidates,
)
from ratrain.planner.families import COMPARED_FAMILIES
from ratrain.planner.result import Candidate
from ratrain.platforms import load


def _cand(tps: float, family: str = "ratrain", **plan) -> Candidate:
    p = Plan(global_batch=8, seq=64, **plan)
    return Candidate(p, family, tps, 512 / tps, 0.0, (1,), ({},), 10, p.pp * p.dp)


RANKED = [
    _cand(100.0, pp=2, micro_batch=1, pipeline="zb-h2"),
    _cand(99.9, pp=2, micro_batch=1, pipeline="zb-h2", view_policy="transient"),  # same structure
    _cand(99.0, pp=2, micro_batch=2),
    _cand(98.0, "gpu-style", pp=2, micro_batch=2, schedule="gpu-style"),  # another schedule
    _cand(97.0, pp=1, dp=2, micro_batch=2),
]


def test_the_first_stays_first_and_k_structures_are_taken_once_each():
    got = select(RANKED, 3, {})
    assert [c.source for c in got] == ["#1", "#3", "#4"]
    assert got[0].plan == RANKED[0].plan and got[0].predicted_tokens_per_s == 100.0
    assert len({structure_key(c.plan) for c in got}) == 3
    assert [c.source for c in select(RANKED, 1, {})] == ["#1"]
    assert len(select(RANKED, 10, {})) == 4  # 4 distinct structures in all
    with pytest.raises(ValueError):
        select(RANKED, 0, {})


def test_each_family_structure_is_added_once_and_not_twice():
    variants = {
        "gpu-style": _cand(95.0, pp=4, micro_batch=2),  # a structure not ranked: added
        "zero1-pp": _cand(95.0, pp=4, micro_batch=2),  # the same one again: once
        "fsdp-pp": _cand(99.0, pp=2, micro_batch=2),  # already among the K: not again
        "other": None,  # none fits: nothing
    }
    got = select(RANKED, 2, variants)
    assert [c.source for c in got] == ["#1", "#3", "gpu-style structure"]
    assert got[-1].plan.pp == 4


def test_each_family_plan_is_added_unless_the_same_plan_is_tried_already():
    same_structure = dataclasses.replace(RANKED[0].plan, view_policy="transient")
    plans = {
        "gpu-style": _cand(99.5, **_fields(same_structure)),  # other knobs: added
        "zero1-pp": _cand(99.0, **_fields(RANKED[0].plan)),  # #1 itself: not again
        "fsdp-pp": _cand(40.0, pp=2, micro_batch=2, view_policy="transient"),  # far slower
        "other": None,
    }
    got = select(RANKED, 1, {}, plans)
    assert [c.source for c in got] == ["#1", "gpu-style plan"]
    assert got[1].plan == same_structure
    assert structure_key(got[0].plan) == structure_key(got[1].plan)  # one structure, twice
    assert len({plan_key(c.plan) for c in got}) == len(got)


def _fields(plan: Plan) -> dict:
    return {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)
            if f.name not in ("global_batch", "seq")}  # fmt: skip


def test_a_plan_predicted_far_slower_than_the_first_is_not_tried():
    slow = _cand(49.0, pp=4, micro_batch=1)  # under half the first's 100 tokens/s
    got = select([*RANKED[:1], slow, RANKED[2]], 3, {"gpu-style": _cand(40.0, pp=1)})
    assert [c.source for c in got] == ["#1", "#3"]
    assert select([_cand(10.0)], 2, {})[0].source == "#1"  # the first always


def _request(**pins) -> Request:
    return Request(TINY, load("cpu-local"), 2, 8, 64, pins=pins)


def test_lifecycle_variants_run_each_family_structure_under_ratrain():
    req = _request(compute_dtype="fp32")
    bests = family_bests(req)
    assert set(bests) == set(COMPARED_FAMILIES)
    variants = lifecycle_variants(req, bests)
    assert set(variants) == set(COMPARED_FAMILIES)
    for fam, v in variants.items():
        assert v is not None and v.family == "ratrain" and v.plan.schedule == "ratrain"
        assert structure_pins(v.plan) == structure_pins(bests[fam].plan), fam
    # a request ratrain's lifecycle may not run: no variants
    assert lifecycle_variants(req.with_(families=("gpu-style",)), bests) == {}
    assert lifecycle_variants(_request(schedule="gpu-style"), bests) == {}


def test_lifecycle_plans_run_each_family_plan_itself_under_ratrain():
    req = _request(compute_dtype="fp32")
    bests = family_bests(req)
    plans = lifecycle_plans(req, bests)
    assert set(plans) == set(COMPARED_FAMILIES)
    for fam, v in plans.items():
        assert v is not None and v.family == "ratrain", fam
        assert v.plan == dataclasses.replace(bests[fam].plan, schedule="ratrain"), fam
    assert lifecycle_plans(req.with_(families=("gpu-style",)), bests) == {}


def test_trial_candidates_of_a_search():
    req = _request(compute_dtype="fp32")
    res = search(req, top=8)
    got = trial_candidates(req, res.ranked, 2)
    assert got[0].plan == res.best.plan and got[0].source == "#1"
    ranked = [c for c in got if c.source.startswith("#")]
    assert 1 <= len(ranked) <= 2
    by_structure = [c for c in got if not c.source.endswith(" plan")]
    assert len({structure_key(c.plan) for c in by_structure}) == len(by_structure)
    assert len({plan_key(c.plan) for c in got}) == len(got)
    assert all(c.found is not None for c in got)
