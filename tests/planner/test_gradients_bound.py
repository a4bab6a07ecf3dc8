"""The states a step of two or more microbatches holds at once (`gradients_bound_of`:
master, Adam, every full gradient, the persistent views) rule a structure out before its
`MemoryBound` is built (`structure.states_overflow`). It stays under the ledger's peak of
every stage, over families, pass orders, dtypes, views and tied embeddings; it overflows
where the states without the gradients fit (llama3-405b on 1000 mt3000 clusters: the
infeasible answer's memory pass went from 0.6 s to under 0.1 s)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner import structure
from ratrain.planner.evaluate import usable_bytes
from ratrain.planner.families import FAMILIES
from ratrain.planner.memory_bound import gradients_bound_of, persistent_lower_bound_bytes
from ratrain.planner.space import Request, Structure, knob_combos
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.schedule.views import transient_views_of
from ratrain.sim.simulate import platform_ledger
from ratrain.sizes.states import grad_bytes_per_param, shards, view_bytes_per_param

_CASES = list(
    itertools.product(
        ("llama2-7b", "llama3.2-1b"),
        ("ratrain", "gpu-style", "fsdp-pp"),
        ("1f1b", "zb-h1"),
        ((1, 2), (3, 2), (4, 5)),
    )
)


@pytest.mark.parametrize("model, schedule, pipeline, shape", _CASES)
def test_below_the_ledger_on_every_stage(model, schedule, pipeline, shape):
    spec, pf = get_preset(model), load("a100-80g")
    pp, m = shape
    ours = schedule == "ratrain"
    for views, grad in (("persistent", "fp32"), ("transient", "bf16")):
        if views == "transient" and not ours:
            continue
        plan = Plan(
            pp=pp,
            dp=2,
            micro_batch=1,
            global_batch=2 * m,
            seq=256,
            schedule=schedule,
            view_policy=views,
            shard_optimizer=schedule == "fsdp-pp" or grad == "bf16",
            compute_dtype="bf16",
            grad_dtype=grad,
            offload_activations=ours,
            pipeline=pipeline if schedule != "fsdp-pp" else "1f1b",
            model=spec.name,
        )
        led = platform_ledger(build_schedule(spec, plan), spec, plan, pf, keep_trace=False)
        vbp = 0 if transient_views_of(plan.schedule, views) else view_bytes_per_param(plan)
        got = gradients_bound_of(
            spec, plan.blocks_per_stage(spec), shards(plan), grad_bytes_per_param(plan), vbp
        )
        for s in range(pp):
            assert got[s] <= led.stages[s].peak_bytes, (plan, s)
        assert max(got) > max(persistent_lower_bound_bytes(spec, plan))


def test_rules_out_a_structure_before_its_memory_bound(monkeypatch):
    """A cap between the states alone and the states with every gradient: the structure's
    knobs are ruled out as states misses, no stage bound computed."""
    spec, pf = get_preset("llama2-7b"), load("a100-80g")
    st = Structure(2, 1, 1, (16, 16))
    fam = FAMILIES["gpu-style"]
    probe = Request(spec, pf, 2, 8, 1024)
    kn = next(k for k in knob_combos(probe, fam, st) if not k.shard_optimizer)
    states = max(structure.states_lower_bound_bytes(probe, st, kn))
    with_grads = max(structure.gradients_lower_bound_bytes(probe, st, fam, kn))
    assert with_grads > states
    usable = (states + with_grads) // 2 + pf.workspace_bytes + pf.headroom_bytes
    capped = replace(pf, usable_memory_bytes=usable)
    req = Request(spec, capped, 2, 8, 1024)
    limit = usable_bytes(req)
    assert states <= limit < with_grads

    def no_bound(*args, **kwargs):
        raise AssertionError("a stage bound was computed")

    monkeypatch.setattr(structure, "first_overflow_bytes", no_bound)
    state = structure.State()
    assert structure.ruled_out(req, st, fam, kn, limit, state)
    assert state.misses and state.misses[-1].states_only
