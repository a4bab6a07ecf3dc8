"""The plan's schema (`ratrain.schema`): every knob described once, and what is made from it.

- plan files written before the schema still load, and are written back byte for byte;
- the flags, the pins, the planner's `Knobs` and `Structure` and the memory bound's key
  are the schema's;
- the one memory-saving order (`ratrain.planner.saving`) is true of the memory bound: a
  combination that `saves` over another never has a larger bound on any stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from pathlib import Path

import pytest

from ratrain.cli.common import add_plan_args
from ratrain.config import Plan, load_plan, save_plan
from ratrain.models.presets import get_preset
from ratrain.planner.fit import memory_bound, structure_bound
from ratrain.planner.memory_bound import MemoryBound
from ratrain.planner.saving import dominant, saves, saving_order
from ratrain.planner.space import (
    Knobs,
    Request,
    Structure,
    family_of,
    knob_combos,
    make_plan,
    parse_pins,
    structures,
)
from ratrain.platforms.load import load
from ratrain.schema import GROUPS, knob_fields, knob_of, pinnable, search_fields

PLANS = Path(__file__).parent / "fixtures" / "plans"


@pytest.mark.parametrize("path", sorted(PLANS.iterdir()), ids=lambda p: p.name)
def test_plan_files_written_before_the_schema_load_and_write_back_the_same(path, tmp_path):
    plan, extras = load_plan(path)
    out = tmp_path / path.name
    save_plan(plan, out, **extras)
    assert out.read_text() == path.read_text()


def test_every_plan_field_has_its_knob_in_a_known_group():
    names = [f.name for f in dataclasses.fields(Plan)]
    assert [f.name for f in knob_fields(Plan)] == names
    for f in knob_fields(Plan):
        k = knob_of(f)
        assert k.group in GROUPS, f.name
        if k.flag is None:  # no flag: nothing of the flag's is described
            assert k.help is None and k.cli == "value", f.name
        if k.cli == "choice":
            assert f.default in k.choices, f.name


def test_the_plan_flags_are_the_schema_s():
    p = argparse.ArgumentParser()
    add_plan_args(p)
    flags = {a.dest: a.option_strings[0] for a in p._actions if a.option_strings}
    for f in knob_fields(Plan):
        assert flags.get(f.name) == knob_of(f).flag, f.name


@pytest.mark.parametrize("name", pinnable(Plan))
def test_every_pinnable_field_reads_back_from_its_text(name):
    plan = Plan(
        pp=2,
        global_batch=8,
        layer_split=(1, 1),
        recompute=("full", "none"),
        loss_chunk_tokens=64,
        shard_optimizer=True,
        offload_activations=True,
        view_policy="transient",
        schedule="fsdp-pp",
    )
    value = getattr(plan, name)
    text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
    assert parse_pins([f"{name}={text}"])[name] == value


def test_knobs_and_structure_are_the_fields_the_search_varies():
    assert [f.name for f in dataclasses.fields(Knobs)] == ["family"] + [
        f.name for f in search_fields(Plan, "knob")
    ]
    assert [f.name for f in dataclasses.fields(Structure)] == [
        f.name for f in search_fields(Plan, "structure")
    ]


def _request(n_clusters: int = 8) -> Request:
    return Request(get_preset("tiny"), load("mt3000"), n_clusters, 32, 128)


def test_a_structure_s_bound_is_its_plan_s_bound():
    """`structure_bound` finds the bound that `memory_bound` made for the plan of the same
    structure and knobs: the two build one key (`MemoryBound.key`)."""
    req = _request()
    for name in ("ratrain", "fsdp-pp", "gpu-style"):
        fam = family_of(name)
        for st in structures(req, fam):
            for kn in knob_combos(req, fam, st):
                plan = make_plan(req, st, kn, ("full",) * st.pp)
                assert structure_bound(req, st, kn) is memory_bound(req, plan)


def _all_knobs(req: Request, st) -> list:
    out = []
    for name in ("ratrain", "gpu-style", "zero1-pp", "fsdp-pp"):
        out += knob_combos(req, family_of(name), st)
    return out


def test_what_saves_by_the_order_holds_no_more_by_the_memory_bound():
    req = _request()
    st = next(s for s in structures(req, family_of("ratrain")) if s.pp == 2 and s.dp > 1)
    kns = _all_knobs(req, st)
    bounds = {}
    for kn in kns:
        mb = memory_bound(req, make_plan(req, st, kn, ("full",) * st.pp))
        bounds[kn] = [mb.stage(s, o) for s in range(st.pp) for o in ("none", "selective", "full")]
    pairs = 0
    for a, b in itertools.product(kns, kns):
        if saves(a, b):
            pairs += 1
            assert all(x <= y for x, y in zip(bounds[a], bounds[b], strict=True)), (a, b)
    assert pairs > len(kns)  # more than each with itself


def test_the_dominant_combination_comes_first_in_the_saving_order():
    req = _request()
    for name in ("ratrain", "gpu-style", "fsdp-pp"):
        for st in structures(req, family_of(name)):
            kns = knob_combos(req, family_of(name), st)
            lead = dominant(kns)
            if lead is not None:
                assert saving_order(lead) == min(map(saving_order, kns)), (name, st)


def test_memory_bound_key_reads_the_fields_the_schema_marks():
    plan = Plan(pp=2, dp=2, global_batch=8, model="tiny")
    key = MemoryBound.key(plan)
    # A field the bound does not read leaves the key as it is; one it reads changes it.
    assert MemoryBound.key(plan.replace(rank_layout="dp-inner", bucket_bytes=2**20)) == key
    assert MemoryBound.key(plan.replace(grad_dtype="bf16")) != key
    # the clip: whether the syncs wait for a global check after the last weight pass
    assert MemoryBound.key(plan.replace(clip_grad=None)) != key
    assert MemoryBound.key(plan.replace(view_policy="transient")) != key


def test_a_field_s_file_name_is_the_schema_s(tmp_path, monkeypatch):
    """A field whose `Knob.yaml` names it otherwise is written and read under that name."""
    import ratrain.config as config

    monkeypatch.setattr(config, "_FILE_NAMES", {"view_lookahead": "prefetch_depth"})
    monkeypatch.setattr(config, "_FIELD_NAMES", {"prefetch_depth": "view_lookahead"})
    plan = Plan(view_policy="transient", view_lookahead=3)
    save_plan(plan, tmp_path / "p.yaml")
    text = (tmp_path / "p.yaml").read_text()
    assert "prefetch_depth: 3" in text and "view_lookahead" not in text
    assert load_plan(tmp_path / "p.yaml")[0] == plan
