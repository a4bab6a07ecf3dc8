"""The distributed runtime: Baseline-1F1B and RATrain from one executor, against the
reference trainer, on 4 local gloo ranks (pp=2 x dp=2) of the tiny model."""

from __future__ import annotations

import json
import math

import pytest

import _runtime as harness
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.memory import replay
from ratrain.models.presets import get_preset
from ratrain.schedule import build_schedule
from ratrain.train.job import Job, MemoryCap, Outputs, RankResult, check_fits, run_job
from ratrain.train.reference import ReferenceTrainer

pytestmark = pytest.mark.dist

SPEC = get_preset("tiny")
PLAN = Plan(pp=2, dp=2, micro_batch=1, global_batch=6, seq=16, compute_dtype="fp32", model="tiny")
CFG = TrainConfig(steps=50, warmup_steps=5)


def _source(plan: Plan, cfg: TrainConfig):
    return harness.source(SPEC, plan, cfg)


def _job(plan: Plan, cfg: TrainConfig, variants, **kw) -> Job:
    return harness.job(SPEC, plan, cfg, variants, timeout_s=60, deadline_s=240, **kw)


_losses, _max_rel = harness.losses, harness.max_rel


def _reference(plan: Plan, cfg: TrainConfig) -> list[float]:
    return ReferenceTrainer(SPEC, plan, cfg, _source(plan, cfg)()).train()


@pytest.fixture(scope="module")
def fp32_runs() -> list[RankResult]:
    variants = [
        (f"{kind}-{clip}", {"schedule": kind, "clip_grad": 1.0 if clip == "clip" else None})
        for clip in ("clip", "noclip")
        for kind in ("baseline", "ratrain")
    ]
    return run_job(_job(PLAN, CFG, variants))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("clip", ["clip", "noclip"])
def test_fp32_ratrain_equals_baseline_bitwise_and_reference(fp32_runs, clip):
    ratrain = _losses(fp32_runs, f"ratrain-{clip}")
    baseline = _losses(fp32_runs, f"baseline-{clip}")
    assert len(ratrain) == CFG.steps and all(math.isfinite(x) for x in ratrain)
    assert ratrain == baseline  # bit for bit, every step
    ref = _reference(PLAN.replace(clip_grad=1.0 if clip == "clip" else None), CFG)
    assert _max_rel(ratrain, ref) <= 1e-5
    assert ratrain[-1] < ratrain[0] - 0.3  # it trains


@pytest.mark.timeout(120)
def test_microbatches_fewer_than_stages(tmp_path):
    plan = Plan(
        pp=4, dp=1, micro_batch=1, global_batch=2, seq=16, compute_dtype="fp32", model="tiny"
    )
    cfg = TrainConfig(steps=4, warmup_steps=1)
    variants = [(k, {"schedule": k}) for k in ("baseline", "gpu-style", "ratrain")]
    outputs = Outputs(trace_path=str(tmp_path / "step.json"), trace_steps=(2,))
    job = _job(plan, cfg, variants, outputs=outputs)
    res = run_job(job)
    assert plan.microbatches < plan.pp
    assert _losses(res, "ratrain") == _losses(res, "baseline") == _losses(res, "gpu-style")
    assert _max_rel(_losses(res, "ratrain"), _reference(plan, cfg)) <= 1e-5
    # the measured step, in the simulator's trace format and the IR's names
    events = json.loads((tmp_path / "step.ratrain.json").read_text())["traceEvents"]
    done = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in done} == {0, 1, 2, 3}
    assert {"0F0@0", "3B1@5", "3SYNC@5", "0UPD@0", "1RECV_F1@1", "2SEND_B0@3"} <= {
        e["name"] for e in done
    }


LIFECYCLE = {
    # bf16 views fetched per use and all-gathered from optimizer shards, full recompute on
    # stage 0 with its checkpoints offloaded, gradient-norm clipping
    "bf16-transient-sharded-recompute-offload": dict(
        compute_dtype="bf16",
        view_policy="transient",
        view_lookahead=2,
        shard_optimizer=True,
        recompute=("full", "none"),
        offload_activations=True,
    ),
    # fp16: a loss scale so large that the first steps overflow and are skipped
    "fp16-overflow-skips": dict(compute_dtype="fp16", recompute="selective"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(LIFECYCLE))
def test_lifecycle_options_match_reference(name):
    plan = PLAN.replace(**LIFECYCLE[name])
    cfg = TrainConfig(steps=4, warmup_steps=1, loss_scale_init=2.0**20)
    variants = [(k, {"schedule": k}) for k in ("baseline", "ratrain")]
    res = run_job(_job(plan, cfg, variants))
    ratrain = _losses(res, "ratrain")
    assert ratrain == _losses(res, "baseline")
    assert _max_rel(ratrain, _reference(plan, cfg)) <= 1e-5
    if plan.compute_dtype == "fp16":
        (records,) = [r.runs["ratrain"].records for r in res if r.runs["ratrain"].records]
        skipped = [r["skipped"] for r in records]
        assert skipped == [True, True, False, False], skipped  # overflow skips, then recovery


@pytest.mark.timeout(180)
def test_peak_memory_ratrain_not_above_baseline_and_ledger_close():
    # activations about half of the peak, so the ledger's activation model is exercised
    plan = PLAN.replace(micro_batch=2, global_batch=8, seq=64, clip_grad=1.0)
    cfg = TrainConfig(steps=1, warmup_steps=1)
    variants = [
        (f"{kind}-{dt}", {"schedule": kind, "compute_dtype": dt, "view_policy": vp})
        for dt, vp in (("fp32", "persistent"), ("bf16", "transient"))
        for kind in ("baseline", "ratrain")
    ]
    res = run_job(_job(plan, cfg, variants, outputs=Outputs(measure_memory=True)))
    for r in res:
        for dt in ("fp32", "bf16"):
            assert r.runs[f"ratrain-{dt}"].peak_bytes <= r.runs[f"baseline-{dt}"].peak_bytes
        # transient views: RATrain keeps only the views in use
        assert r.runs["ratrain-bf16"].peak_bytes < r.runs["baseline-bf16"].peak_bytes
    for kind in ("baseline", "ratrain"):
        p = plan.replace(schedule=kind)
        ledger = replay(build_schedule(SPEC, p), SPEC, p)
        for r in res:
            measured = r.runs[f"{kind}-fp32"].peak_bytes
            predicted = ledger.stages[r.stage].peak_bytes
            assert abs(predicted - measured) <= 0.10 * measured, (kind, r.rank, predicted, measured)


def test_plan_for_another_model_is_refused():
    with pytest.raises(RatrainError, match="plan is for model 'llama2-7b', not 'tiny'"):
        run_job(_job(PLAN.replace(model="llama2-7b"), CFG, []))


def test_plan_over_the_declared_memory_is_refused():
    with pytest.raises(RatrainError, match=r"plan does not fit: stage \d needs .* GiB"):
        run_job(_job(PLAN, CFG, [], memory_cap=MemoryCap(2**20, "a 1 MiB test cap")))
    check_fits(SPEC, PLAN, 2**30)  # fits a GiB


def _single_rank_losses(plan: Plan, cfg: TrainConfig) -> list[float]:
    """One rank, no process group: pp = dp = 1 needs no communication."""
    import torch

    from ratrain.data.base import Batches
    from ratrain.launch.grid import ParallelGrid
    from ratrain.runtime.comm import Comm
    from ratrain.runtime.executor import StageExecutor
    from ratrain.runtime.stage import StageModel

    grid = ParallelGrid(1, 1, 0, 1, torch.device("cpu"))
    model = StageModel(SPEC, plan, cfg, 0, 0, grid.device)
    sch = build_schedule(SPEC, plan)
    batches = Batches.from_plan(_source(plan, cfg)(), plan)
    ex = StageExecutor(grid, Comm(grid), model, sch, batches, SPEC, plan, cfg)
    out = []
    for k in range(cfg.steps):
        losses = ex.step(k).losses
        out.append(sum(losses) / len(losses))
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_single_rank_executor_matches_reference(dtype):
    plan = Plan(micro_batch=1, global_batch=3, seq=16, compute_dtype=dtype, model="tiny")
    cfg = TrainConfig(steps=4, warmup_steps=1)
    ratrain = _single_rank_losses(plan.replace(schedule="ratrain"), cfg)
    assert ratrain == _single_rank_losses(plan.replace(schedule="baseline"), cfg)
    assert _max_rel(ratrain, _reference(plan, cfg)) <= 1e-5


def test_live_bytes_counts_storages_once_and_follows_resizes():
    import torch

    from ratrain.observe.memory import LiveBytes, resize_storage

    with LiveBytes() as mem:
        a = torch.zeros(1000)  # 4000 B
        view = a[10:20].view(2, 5)  # a view: no new storage
        b = a * 2  # 4000 B
        assert mem.live_bytes == 8000
        del b
        assert mem.live_bytes == 4000 and mem.peak_bytes == 8000
        resize_storage(a, 0)  # a dropped parameter view
        assert mem.live_bytes == 0
        resize_storage(a, 4000)
        assert mem.live_bytes == 4000
        del view
