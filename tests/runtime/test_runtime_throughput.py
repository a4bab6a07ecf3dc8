"""Throughput features of the runtime keep its exactness: compiled block units, the fused
chunked loss and bucketed gradient syncs (with them, Baseline-1F1B, gpu-style and RATrain
bit-identical in fp32), on 4 local gloo ranks (pp=2 x dp=2) of the tiny model."""

from __future__ import annotations

import math

import pytest

import _runtime as harness
from ratrain.config import Plan, TrainConfig
from ratrain.launch.toolchain import cxx_compiler
from ratrain.models.presets import get_preset
from ratrain.train.job import Launch, RankResult
from ratrain.train.reference import ReferenceTrainer

pytestmark = pytest.mark.dist

SPEC = get_preset("tiny")
PLAN = Plan(pp=2, dp=2, micro_batch=1, global_batch=6, seq=16, compute_dtype="fp32", model="tiny")
CFG = TrainConfig(steps=8, warmup_steps=2)


def _source(plan: Plan, cfg: TrainConfig):
    return harness.source(SPEC, plan, cfg)


def _run(plan: Plan, variants, **kw) -> list[RankResult]:
    return harness.run(SPEC, plan, CFG, variants, **kw)


_losses, _max_rel = harness.losses, harness.max_rel


VARIANTS = [
    (f"{kind}-{clip}", {"schedule": kind, "clip_grad": 1.0 if clip == "clip" else None})
    for clip in ("clip", "noclip")
    for kind in ("baseline", "ratrain")
]


@pytest.fixture(scope="module")
def eager_chunked():
    return _run(PLAN.replace(loss_chunk_tokens=5), VARIANTS)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("clip", ["clip", "noclip"])
def test_chunked_loss_runtime_bitwise_across_schedules_and_near_reference(eager_chunked, clip):
    ratrain = _losses(eager_chunked, f"ratrain-{clip}")
    assert ratrain == _losses(eager_chunked, f"baseline-{clip}")
    assert all(math.isfinite(x) for x in ratrain)
    plan = PLAN.replace(clip_grad=1.0 if clip == "clip" else None)
    ref = ReferenceTrainer(SPEC, plan, CFG, _source(plan, CFG)()).train()
    assert _max_rel(ratrain, ref) <= 1e-5


# Compiled units under the lifecycle's other mechanisms: sharded masters with transient
# views (storage dropped and refilled), full recompute (the no-grad compiled forward),
# offloaded checkpoints.
# Bucketed gradient syncs (`sync_bucket_bytes`: the tiny model's blocks 1+2 and 3+4 share a
# bucket, `tests/runtime/test_runtime_buckets.py`), gpu-style with its own buckets.
BUCKETED = [
    (f"{kind}-bucketed", {"schedule": kind, "clip_grad": 1.0, "sync_bucket_bytes": 200_000, **kw})
    for kind, kw in (("baseline", {}), ("ratrain", {}), ("gpu-style", {"bucket_bytes": 300_000}))
]

LIFECYCLE = {
    "clip_grad": None,
    "shard_optimizer": True,
    "view_policy": "transient",
    "recompute": "full",
    "offload_activations": True,
}


@pytest.mark.timeout(600)
@pytest.mark.skipif(cxx_compiler() is None, reason="CPU inductor needs a C++ compiler")
def test_compiled_units_equal_eager_and_bitwise_across_schedules(eager_chunked):
    lifecycle = [(f"{k}-lifecycle", {"schedule": k, **LIFECYCLE}) for k in ("baseline", "ratrain")]
    plan = PLAN.replace(loss_chunk_tokens=5)
    # One launch (the compile is most of its time) for the bucketed syncs too.
    compiled = _run(plan, VARIANTS + lifecycle + BUCKETED, launch=Launch(compile_units=True))
    assert any(r.runs["ratrain-clip"].compile_s > 0 for r in compiled)
    ratrain = _losses(compiled, "ratrain-bucketed")
    assert all(math.isfinite(x) for x in ratrain)
    assert ratrain == _losses(compiled, "baseline-bucketed")  # bit for bit
    assert ratrain == _losses(compiled, "gpu-style-bucketed")
    # other buffers, other collectives: the same model to fp32 rounding
    assert _max_rel(ratrain, _losses(compiled, "ratrain-clip")) <= 1e-5
    bucketed = plan.replace(clip_grad=1.0, sync_bucket_bytes=200_000)
    ref = ReferenceTrainer(SPEC, bucketed, CFG, _source(bucketed, CFG)()).train()
    assert _max_rel(ratrain, ref) <= 1e-5
    for clip in ("clip", "noclip"):
        ratrain = _losses(compiled, f"ratrain-{clip}")
        assert ratrain == _losses(compiled, f"baseline-{clip}")  # bit for bit
        assert _max_rel(ratrain, _losses(eager_chunked, f"ratrain-{clip}")) <= 1e-6
    ratrain = _losses(compiled, "ratrain-lifecycle")
    assert ratrain == _losses(compiled, "baseline-lifecycle")
    ref_plan = plan.replace(**LIFECYCLE)
    ref = ReferenceTrainer(SPEC, ref_plan, CFG, _source(ref_plan, CFG)()).train()
    assert _max_rel(ratrain, ref) <= 1e-5
