"""Bucketed gradient syncs in the runtime: the buckets share one gradient buffer and the
measured peak stays close to the ledger's, on 4 local gloo ranks (pp=2 x dp=2) of the tiny
model. That Baseline-1F1B, gpu-style and RATrain stay bit-identical with them (compiled
units, the chunked loss) is checked in `test_runtime_throughput.py`'s compiled launch."""

from __future__ import annotations

import pytest

import _runtime as harness
from ratrain.config import Plan, TrainConfig
from ratrain.memory import replay
from ratrain.models.presets import get_preset
from ratrain.schedule import build_schedule
from ratrain.schedule.passes import sync_buckets
from ratrain.train.job import Launch, Outputs, RankResult

pytestmark = pytest.mark.dist

SPEC = get_preset("tiny")
PLAN = Plan(
    pp=2,
    dp=2,
    micro_batch=1,
    global_batch=6,
    seq=16,
    compute_dtype="fp32",
    model="tiny",
    sync_bucket_bytes=200_000,  # blocks 1+2 and 3+4 share a bucket (tiny's blocks: 180 KiB)
    loss_chunk_tokens=5,
)
CFG = TrainConfig(steps=6, warmup_steps=2)


def _source(plan: Plan, cfg: TrainConfig):
    return harness.source(SPEC, plan, cfg)


def _run(plan: Plan, cfg: TrainConfig, variants, **kw) -> list[RankResult]:
    return harness.run(SPEC, plan, cfg, variants, **kw)


_losses, _max_rel = harness.losses, harness.max_rel


def test_plan_coalesces_the_tiny_blocks():
    assert any(len(b) > 1 for s in range(PLAN.pp) for b in sync_buckets(SPEC, PLAN, s))


@pytest.mark.timeout(300)
def test_bucketed_peak_memory_close_to_ledger():
    plan = PLAN.replace(micro_batch=2, global_batch=8, seq=64, loss_chunk_tokens=None)
    cfg = TrainConfig(steps=1, warmup_steps=1)
    variants = [(k, {"schedule": k}) for k in ("baseline", "ratrain")]
    outputs = Outputs(measure_memory=True)
    res = _run(plan, cfg, variants, timeout_s=60, deadline_s=240, outputs=outputs)
    for kind in ("baseline", "ratrain"):
        p = plan.replace(schedule=kind)
        ledger = replay(build_schedule(SPEC, p), SPEC, p)
        for r in res:
            measured = r.runs[kind].peak_bytes
            predicted = ledger.stages[r.stage].peak_bytes
            assert abs(predicted - measured) <= 0.10 * measured, (kind, r.rank, predicted, measured)


def test_bucket_units_share_one_gradient_buffer():
    import torch

    from ratrain.runtime.stage import StageModel

    model = StageModel(SPEC, PLAN, CFG, 0, 0, torch.device("cpu"))
    assert model.sync_buckets == [(1, 2), (0,)]
    model.prepare_grads(2)  # the bucket's first backward allocates both units' gradients
    buf = model.bucket_grad((1, 2))
    g1, g2 = model.units[1].grad, model.units[2].grad
    assert g1.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    assert g2.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    assert g1.numel() + g2.numel() == buf.numel() and model.units[0].grad is None
    g2.fill_(1.0)
    assert buf[g1.numel() :].eq(1.0).all() and buf[: g1.numel()].eq(0.0).all()
    model.release_grads(1)
    assert model.bucket_grad((1, 2)) is buf  # still held by unit 2
    model.release_grads(2)
    with pytest.raises(AssertionError):
        model.bucket_grad((1, 2))


def test_cores_of_an_equal_share_each_then_mixed_stages():
    from ratrain.train.job import cores_of

    assert [cores_of(r, 2, 2, [0, 1]) for r in range(2)] == [{0}, {1}]
    assert [cores_of(r, 2, 2, [4, 5, 6, 7]) for r in range(2)] == [{4, 5}, {6, 7}]
    # 4 ranks (pp=2 x dp=2) on 2 cores: each core runs one stage-0 and one stage-1 rank
    assert [cores_of(r, 4, 2, [0, 1]) for r in range(4)] == [{0}, {1}, {1}, {0}]


@pytest.mark.timeout(120)
def test_pinned_ranks_train_the_same():
    plan = PLAN.replace(dp=1, global_batch=2, sync_bucket_bytes=0, loss_chunk_tokens=None)
    cfg = TrainConfig(steps=2, warmup_steps=1)
    pinned = _run(plan, cfg, [("ratrain", {})], launch=Launch(pin_cores=True))
    free = _run(plan, cfg, [("ratrain", {})])
    assert _losses(pinned, "ratrain") == _losses(free, "ratrain")
