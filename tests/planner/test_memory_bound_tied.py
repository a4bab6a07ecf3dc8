"""A stage that holds both the embedding and the head of a model with tied embeddings
stores the shared matrix once (`ratrain.sizes.states.stored_params`, as the ledger counts
it). The memory bounds counted it twice: llama3.2-1b in one stage was bounded 20% over
the ledger's peak, so the search could rule out a plan that fits."""

from __future__ import annotations

import pytest

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner.memory_bound import MemoryBound, persistent_lower_bound_bytes
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.sim.simulate import platform_ledger


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h1"])
@pytest.mark.parametrize("schedule", ["ratrain", "gpu-style"])
@pytest.mark.parametrize("m", [1, 3])
def test_one_stage_of_a_tied_model_is_bounded_below_the_ledger(pipeline, schedule, m):
    spec = get_preset("llama3.2-1b")
    assert spec.tied_embeddings
    pf = load("a100-80g")
    for rec in ("none", "full"):
        plan = Plan(
            pp=1,
            dp=1,
            micro_batch=1,
            global_batch=m,
            seq=512,
            schedule=schedule,
            compute_dtype="bf16",
            pipeline=pipeline,
            recompute=(rec,),
            model=spec.name,
        )
        led = platform_ledger(build_schedule(spec, plan), spec, plan, pf, keep_trace=False)
        peak = led.stages[0].peak_bytes
        bound = MemoryBound(spec, plan)
        assert persistent_lower_bound_bytes(spec, plan)[0] <= peak
        assert 0.99 * peak <= bound.stage(0, rec) <= peak, (rec, bound.stage(0, rec) / peak)
        assert sum(bound.breakdown(0, rec).values()) == bound.stage(0, rec)
