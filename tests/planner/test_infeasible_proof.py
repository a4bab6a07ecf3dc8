"""Infeasible requests are answered from the memory bounds: a structure whose most
memory-saving knob combination holds more model states than a stage can is dropped before
its step-time bound is computed (a request ruled out that way needs no step-time bound at
all), and the explanation under a time budget describes the closest miss by its memory
bound instead of a ledger replay. Checked against the ledger by brute force on small
cases."""

import importlib
import itertools
import random
from dataclasses import replace

import pytest

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner import explain, search
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.families import ALL_FAMILIES
from ratrain.planner.fit import memory_bound, stage_options
from ratrain.planner.saving import dominant, saves
from ratrain.planner.space import (
    Knobs,
    Request,
    family_of,
    knob_combos,
    knobs_key,
    make_plan,
    structures,
)
from ratrain.platforms.load import load
from ratrain.sizes.states import STATE_CLASSES

search_mod = importlib.import_module("ratrain.planner.search")  # the package exports the function

TINY = get_preset("tiny")


def _cap(usable: int, workspace: int = 100_000):
    return replace(load("mt3000"), usable_memory_bytes=usable, workspace_bytes=workspace)


def _ledger_fits(req: Request) -> bool:
    """Whether any plan of the space fits by the ledger: a stage's memory depends on its own
    recompute policy only, so a per-stage family fits where every stage fits under some
    policy, a uniform one where one policy fits every stage."""
    ev = Evaluator(req)
    for name in req.families:
        fam = family_of(name)
        for st in structures(req, fam):
            for kn in knob_combos(req, fam, st):
                fits = {}
                for o in stage_options(max(st.layer_split)):
                    rep = ev.memory(make_plan(req, st, kn, (o,) * st.pp))
                    fits[o] = [p <= rep.limit_bytes for p in rep.peak_bytes]
                if fam.per_stage_recompute:
                    if all(any(f[s] for f in fits.values()) for s in range(st.pp)):
                        return True
                elif any(all(f) for f in fits.values()):
                    return True
    return False


def test_dominant_is_the_first_combination_that_saves_no_less_than_every_other():
    rng = random.Random(0)
    every = [
        Knobs("ratrain", "ratrain", sh, vp, la, cdt, gd, off)
        for sh, (vp, la), cdt, gd, off in itertools.product(
            (False, True),
            (("persistent", 1), ("transient", 1), ("transient", 2)),
            ("fp16", "fp32"),
            ("fp16", "fp32"),
            (False, True),
        )
    ]
    for _ in range(2000):
        kns = rng.sample(every, rng.randint(1, 6))
        if rng.random() < 0.5:  # a list with a dominant combination, in a random place
            cdt = rng.choice(("fp16", "fp32"))
            kns = [replace(kn, compute_dtype=cdt) for kn in kns]
            kns.insert(rng.randrange(len(kns) + 1), replace(kns[0], shard_optimizer=True))
        want = next((a for a in kns if all(saves(a, b) for b in kns)), None)
        assert dominant(kns) == want


def test_knobs_key_decides_the_combinations():
    req = Request(get_preset("llama2-7b"), load("mt3000"), 64, 256, 4096)
    for name in ALL_FAMILIES:
        fam, by_key = family_of(name), {}
        for st in structures(req, fam):
            kns = knob_combos(req, fam, st)
            assert by_key.setdefault(knobs_key(req, st), kns) == kns


@pytest.mark.timeout(120)
def test_a_space_the_bounds_rule_out_is_proved_without_a_step_bound(monkeypatch):
    req = Request(TINY, _cap(1_200_000), 2, 4, 128)
    calls = []
    real = search_mod.step_time_lower_bound_s
    monkeypatch.setattr(
        search_mod, "step_time_lower_bound_s", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    res = search(req, top=1)
    assert not res.feasible and res.memory_replays == 0 and not calls
    assert res.candidates_evaluated == res.candidates_total
    assert res.near is not None and not res.near.measured
    assert not _ledger_fits(req)  # the ledger agrees: nothing fits


@pytest.mark.timeout(120)
@pytest.mark.parametrize("usable", [1_600_000, 2_000_000, 3_000_000])
def test_the_answer_agrees_with_the_ledger_near_the_cap(usable):
    """Caps where some structures are dropped early and others fit (or nearly): the search
    is infeasible exactly when no plan fits by the ledger, and what it ranks fits."""
    req = Request(TINY, _cap(usable), 3, 6, 128)
    res = search(req, top=1)
    assert res.feasible == _ledger_fits(req)
    if res.feasible:
        assert max(res.best.peak_memory_bytes) <= usable_bytes(req)


@pytest.mark.parametrize("name,seq", [("tiny", 128), ("llama2-7b", 1024)])
def test_bound_breakdown_sums_to_the_bound_and_stays_below_the_ledger(name, seq):
    spec = get_preset(name)
    req = Request(spec, load("mt3000"), 8, 16, seq)
    ev = Evaluator(req)
    fam = family_of("ratrain")
    sts = [st for st in structures(req, fam) if st.pp > 1 and st.micro_batch == 1][:3]
    assert sts
    for st in sts:
        for kn in knob_combos(req, fam, st)[::3]:
            for o in ("none", "selective", "first:1", "full"):
                plan = make_plan(req, st, kn, (o,) * st.pp)
                mb = memory_bound(req, plan)
                rep = ev.memory(plan)
                for s in range(st.pp):
                    parts = mb.breakdown(s, o)
                    assert set(parts) <= set(STATE_CLASSES)
                    assert all(v >= 0 for v in parts.values())
                    assert sum(parts.values()) == mb.stage(s, o) <= rep.peak_bytes[s]


def test_explanation_under_a_budget_uses_the_bound_and_without_one_the_ledger():
    req = Request(TINY, _cap(1_200_000), 2, 4, 128)
    res = search(req, top=1)
    near = res.near
    assert not res.feasible and not near.measured
    quick = explain(req, near, budget_s=30.0)
    assert quick.bound and quick.stage == near.worst_stage
    assert quick.peak_bytes == near.peak_bytes[quick.stage] == sum(quick.breakdown.values())
    assert quick.over_bytes > 0 and quick.to_json()["peak_is_lower_bound"] is True
    assert "needs at least" in "\n".join(quick.lines())
    exact = explain(req, near)
    assert not exact.bound and exact.to_json()["peak_is_lower_bound"] is False
    rep = Evaluator(req).memory(near.plan)
    assert exact.peak_bytes == max(rep.peak_bytes)
    # The bound is a lower bound of the ledger's peak on the same stage.
    assert quick.peak_bytes <= rep.peak_bytes[quick.stage]
    assert [c.what for c in quick.changes] == [c.what for c in exact.changes]


def test_a_slow_proof_leaves_the_explanation_less_time():
    from ratrain.deadline import (
        EXPLAIN_BUDGET_FACTOR,
        EXPLAIN_MIN_FACTOR,
        INFEASIBLE_BUDGET_FACTOR,
        explain_budget_s,
    )

    b = 1.2
    assert explain_budget_s(b, 0.0) == pytest.approx(EXPLAIN_BUDGET_FACTOR * b)
    mid = (INFEASIBLE_BUDGET_FACTOR - EXPLAIN_BUDGET_FACTOR) * b + 0.1
    assert explain_budget_s(b, mid) == pytest.approx(INFEASIBLE_BUDGET_FACTOR * b - mid)
    assert explain_budget_s(b, 5.0) == pytest.approx(EXPLAIN_MIN_FACTOR * b)


def test_the_commands_start_up_counts_against_the_infeasible_budget(monkeypatch):
    """Run through `main`, the time before the search (imports, the platform) is spent from
    the answer's budget; run without it, the search's own time is."""
    import time
    from types import SimpleNamespace

    import ratrain.cli
    from ratrain.cli.plan import _budget

    args = SimpleNamespace(time_budget=1.2, gap=0.01)
    monkeypatch.setattr(ratrain.cli, "STARTED_AT", None)
    assert _budget(args).spent_s(0.1) == 0.1
    monkeypatch.setattr(ratrain.cli, "STARTED_AT", time.perf_counter() - 0.5)
    assert 0.5 <= _budget(args).spent_s(0.1) < 5.0


@pytest.mark.parametrize("name,seq", [("tiny", 128), ("llama2-7b", 1024)])
def test_bound_with_held_sends_stays_below_the_ledger_that_holds_them(name, seq):
    """cpu-local's sends are held to the step's end: the bound counts those already made,
    and stays below the ledger's peak replayed as the simulator replays it there."""
    from ratrain.planner.memory_bound import MemoryBound
    from ratrain.schedule import build_schedule
    from ratrain.sim.simulate import platform_ledger

    spec, pl = get_preset(name), load("cpu-local")
    assert pl.sends_held_until_waited
    grew = 0
    for pp, m, sched, rec, off in itertools.product(
        (2, 4), (1, 3, 8), ("gpu-style", "ratrain"), ("none", "full"), (False, True)
    ):
        if sched == "gpu-style" and off:
            continue
        plan = Plan(
            pp=pp,
            dp=1,
            global_batch=m,
            seq=seq,
            schedule=sched,
            recompute=rec,
            view_policy="transient" if sched == "ratrain" else "persistent",
            compute_dtype="fp16",
            grad_dtype="fp16",
            offload_activations=off,
        )
        led = platform_ledger(build_schedule(spec, plan), spec, plan, pl, keep_trace=False)
        held, plain = MemoryBound(spec, plan, sends_held=True), MemoryBound(spec, plan)
        for s, st in enumerate(led.stages):
            lb = held.stage(s, rec)
            assert plain.stage(s, rec) <= lb <= st.peak_bytes, (plan, s, lb, st.peak_bytes)
            assert sum(held.breakdown(s, rec).values()) == lb
            grew += lb > plain.stage(s, rec)
    assert grew


@pytest.mark.timeout(120)
@pytest.mark.parametrize("usable", [2_200_000, 2_500_000])
def test_cpu_local_answers_agree_with_its_ledger(usable):
    pl = replace(load("cpu-local"), usable_memory_bytes=usable, workspace_bytes=100_000)
    req = Request(TINY, pl, 3, 12, 128)
    res = search(req, top=1)
    assert res.feasible == _ledger_fits(req)
    if res.feasible:  # the ranked plan's simulated peaks fit (the simulator holds the sends)
        assert max(res.best.peak_memory_bytes) <= usable_bytes(req)
