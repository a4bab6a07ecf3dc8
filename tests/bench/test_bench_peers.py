"""The peer systems' own knobs (`ratrain.bench.peers`), run as `ratrain bench cluster` runs
them (`ratrain.bench.peer_rank`) on local ranks: DP wrappings and activation checkpointing
change the memory, never the maths; a bad config is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ratrain.bench.peer_rank import config_for, run_local
from ratrain.bench.peers import deepspeed_available
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset

SPEC = get_preset("tiny")
# micro-batch 4: enough activations per block for checkpointing to show in the peak
PLAN = Plan(
    pp=2,
    dp=2,
    micro_batch=4,
    global_batch=32,
    seq=16,
    compute_dtype="fp32",
    clip_grad=None,
    model="tiny",
)
CFG = TrainConfig(steps=3, warmup_steps=1)
RTOL = 1e-5

VARIANTS = {
    "allreduce": {},
    "ddp": {"dp_wrap": "ddp"},
    "fsdp2": {"dp_wrap": "fsdp2"},
    # the other layout too: the data follow the replica, not the rank
    "ac": {"activation_checkpoint": True, "layout": "pp-inner"},
}


@pytest.fixture(scope="module")
def torch_runs() -> dict[str, list[dict]]:
    return {
        name: run_local(
            config_for("torch-1f1b", SPEC, PLAN, CFG, measure=True, **knobs), deadline_s=120
        )
        for name, knobs in VARIANTS.items()
    }


def _losses(ranks: list[dict]) -> dict[int, list[float]]:
    """replica -> every step's loss, from the ranks of the last stage."""
    return {r["replica"]: r["losses"] for r in ranks if r["stage"] == PLAN.pp - 1}


def _first_stage_peak(ranks: list[dict]) -> int:
    return max(r["peak"] for r in ranks if r["stage"] == 0)


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= RTOL * abs(y) for x, y in zip(a, b, strict=True))


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_dp_wraps_and_checkpointing_train_the_same(torch_runs):
    ref = _losses(torch_runs["allreduce"])
    assert sorted(ref) == [0, 1] and all(len(v) == CFG.steps for v in ref.values())
    assert ref[0] != ref[1]  # the replicas see different data
    for name, ranks in torch_runs.items():
        got = _losses(ranks)
        assert sorted(got) == [0, 1], name
        for replica in ref:
            assert _close(got[replica], ref[replica]), (name, replica, got, ref)
        assert all(r["losses"] is None for r in ranks if r["stage"] != PLAN.pp - 1)


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_checkpointing_and_sharding_lower_the_peak(torch_runs):
    peak = {name: _first_stage_peak(ranks) for name, ranks in torch_runs.items()}
    assert all(p > 0 for p in peak.values()), peak
    assert peak["ac"] < peak["allreduce"], peak
    assert peak["fsdp2"] < peak["ddp"], peak


def test_ddp_with_a_zero_bubble_schedule_is_refused_before_any_rank():
    config = config_for("torch-1f1b", SPEC, PLAN, CFG)
    with pytest.raises(RatrainError, match="dp_wrap ddp cannot run torch-zbv"):
        run_local(config | {"system": "torch-zbv", "dp_wrap": "ddp"})
    with pytest.raises(RatrainError, match="zero_stage does not apply to torch-1f1b"):
        config_for("torch-1f1b", SPEC, PLAN, CFG, zero_stage=1)


@pytest.mark.timeout(60)
def test_bad_config_is_one_line_and_exit_2(tmp_path):
    config = config_for("torch-1f1b", SPEC, PLAN, CFG) | {"dp_wrap": "zero3"}
    path = tmp_path / "peer.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run(
        [sys.executable, "-m", "ratrain.bench.peer_rank", str(path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "dp_wrap must be one of" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed")
def test_deepspeed_zero_1_trains_as_zero_0():
    plan = PLAN.replace(micro_batch=1, global_batch=8)
    losses = {}
    for stage in (0, 1):
        ranks = run_local(config_for("deepspeed", SPEC, plan, CFG, zero_stage=stage), 200)
        losses[stage] = [r["losses"] for r in ranks if r["stage"] == plan.pp - 1]
    assert len(losses[0]) == plan.dp and all(len(v) == CFG.steps for v in losses[0])
    for a, b in zip(losses[1], losses[0], strict=True):
        assert _close(a, b), losses
