"""The memory bound of a zero-bubble stage that offloads, at two blocks a stage: while
the input-gradient pass of the stage's first unit runs, the ledger also holds what a
deferred weight pass right after reloads ahead (`lowering._add_weight_offload`) and, in
the cool-down with views prefetched, the view of the unit the next backward pass reads
first. Without them the bound sat 3-7% under the ledger on such stages, and the search
replayed plans the bound could have ruled out (llama2-70b on 96 mt3000 clusters: eight
replays, 2 s). `MemoryBound.reload_moments` are checked against every change they stand
for."""

from __future__ import annotations

import itertools

import pytest

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner.memory_bound import MemoryBound
from ratrain.planner.memory_tables import ZbProfile
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.sim.simulate import platform_ledger


@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize("views", ["transient", "persistent"])
def test_two_block_stages_are_bounded_within_one_percent(pipeline, views):
    spec, pf = get_preset("llama2-7b"), load("mt3000")
    pp, m = 16, 10
    plan = Plan(
        pp=pp,
        dp=2,
        micro_batch=1,
        global_batch=2 * m,
        seq=512,
        schedule="ratrain",
        view_policy=views,
        shard_optimizer=True,
        compute_dtype="fp16",
        offload_activations=True,
        pipeline=pipeline,
        recompute=("first:1",) * pp,
        model=spec.name,
    )
    led = platform_ledger(build_schedule(spec, plan), spec, plan, pf, keep_trace=False)
    bound = MemoryBound(spec, plan)
    for s in range(1, pp - 1):  # two blocks each, neither the embedding nor the head
        peak, got = led.stages[s].peak_bytes, bound.stage(s, "first:1")
        assert 0.99 * peak <= got <= peak, (s, got, peak)


def _switch(z: ZbProfile, mb: int) -> bool:
    after = z.weight_pass_after(mb)  # `reloads_after`, spelt out
    return after is not None and z.deferred(after)


def test_reload_moments_take_every_change():
    for m, w, limit in itertools.product(range(1, 30), range(0, 9), range(1, 20)):
        if w > m or limit < w + 1:
            continue
        z = ZbProfile(m, w, limit)
        changes = {j for i in range(1, m) if _switch(z, i) != _switch(z, i - 1) for j in (i - 1, i)}
        assert changes <= z.reload_moments(), (m, w, limit)
