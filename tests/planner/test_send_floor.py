"""The overheads every knob combination of a structure pays at least
(`structure.floor_overheads`): the least gradient syncs and, per boundary, the least sends.
They go into the structure's bounds before its knobs are bounded (`forced_bound_s`,
`search._structure_bound_s`): with few microbatches on a long sequence, a step is mostly
microbatch 0's round trip through every stage, and its sends are a part of it."""

from __future__ import annotations

import dataclasses
import importlib

from ratrain.models.presets import get_preset
from ratrain.planner import Request
from ratrain.planner.space import family_of, knob_combos, make_plan, structures
from ratrain.planner.structure import (
    State,
    bound_knobs,
    floor_overheads,
    memory_pass,
    send_floor_s,
    unit_times_of,
    zb_pipelines,
)
from ratrain.planner.time_bound import overheads
from ratrain.platforms.load import load

search_mod = importlib.import_module("ratrain.planner.search")


def test_send_floor_is_the_least_send_of_the_knobs_and_lifts_the_bound():
    req = Request(get_preset("llama3.2-1b"), load("h100-80g"), 96, 8, 32768)
    fam = family_of("ratrain")
    st = next(s for s in structures(req, fam) if (s.pp, s.dp, s.micro_batch) == (8, 8, 1))
    kns = memory_pass(req, st, fam, knob_combos(req, fam, st), State())
    fwd, back = send_floor_s(req, st, kns)
    assert len(fwd) == len(back) == st.pp - 1
    sends = [
        overheads(req.spec, make_plan(req, st, kn, ("none",) * st.pp), req.platform) for kn in kns
    ]
    for b in range(st.pp - 1):
        assert fwd[b] == min(o.send_f_s[b] for o in sends)
        assert back[b] == min(o.send_b_s[b] for o in sends)
    assert all(f > 0 for f in fwd)
    m = st.microbatches(req.global_batch)
    assert m == 1
    ut = unit_times_of(req, st, None)
    over = floor_overheads(req, st, kns)
    zb = zb_pipelines(kns)
    with_sends = search_mod._structure_bound_s(st, m, ut, zb, over)
    no_sends = dataclasses.replace(over, send_f_s=(0.0,) * 7, send_b_s=(0.0,) * 7)
    without = search_mod._structure_bound_s(st, m, ut, zb, no_sends)
    assert with_sends > without
    # Still a bound: below every knob combination's own bound with its overheads.
    queue = bound_knobs(req, st, fam, kns, State())
    assert with_sends <= min(q.lb for q in queue) * (1 + 1e-12)


def test_one_stage_sends_nothing():
    req = Request(get_preset("llama3.2-1b"), load("h100-80g"), 8, 64, 2048)
    fam = family_of("ratrain")
    st = next(s for s in structures(req, fam) if s.pp == 1)
    assert send_floor_s(req, st, knob_combos(req, fam, st)) == ((), ())
