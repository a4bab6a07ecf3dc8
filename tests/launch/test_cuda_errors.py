"""The CUDA path's failure modes say what they need in one line (RatrainError, exit 2):
no CUDA device, no NCCL in torch, more local ranks than devices."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from ratrain.errors import RatrainError
from ratrain.launch import grid
from ratrain.launch.grid import SHARE_DEVICE_ENV, check_cuda


def _fake_cuda(monkeypatch, devices: int, nccl: bool = True) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)


def test_no_cuda(monkeypatch):
    _fake_cuda(monkeypatch, 0)
    with pytest.raises(RatrainError, match="no CUDA device is visible; use --device cpu"):
        check_cuda()


def test_no_nccl(monkeypatch):
    _fake_cuda(monkeypatch, 1, nccl=False)
    with pytest.raises(RatrainError, match="needs NCCL .* use --device cpu"):
        check_cuda(1, 2)


def test_more_ranks_than_devices(monkeypatch):
    _fake_cuda(monkeypatch, 1)
    monkeypatch.delenv(SHARE_DEVICE_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(RatrainError) as e:
        check_cuda(2, 2)
    msg = str(e.value)
    assert "\n" not in msg
    assert "2 ranks on this node need 2 CUDA devices" in msg and "1 is visible" in msg
    assert "CUDA_VISIBLE_DEVICES=0" in msg and "launch at most 1 ranks per node" in msg
    check_cuda(1, 2)  # one local rank of a two-node job: fine
    monkeypatch.setenv(SHARE_DEVICE_ENV, "1")  # the probe's override
    check_cuda(2, 2)


def test_pick_device_per_local_rank(monkeypatch):
    _fake_cuda(monkeypatch, 2)
    assert grid._pick_device(1, "cuda", 4) == torch.device("cuda", 1)
    assert grid._pick_device(3, "cpu", 4) == torch.device("cpu")
    monkeypatch.delenv(SHARE_DEVICE_ENV, raising=False)
    with pytest.raises(RatrainError, match="3 ranks on this node need 3 CUDA devices"):
        grid._pick_device(2, "cuda", 4)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "cmd",
    [
        ["train", "--device", "cuda", "--steps", "1"],
        ["train", "--device", "cuda", "--pp", "1", "--steps", "1"],
        ["verify", "--device", "cuda", "--steps", "1"],
        ["calibrate", "--device", "cuda", "--quick", "-o", "p.yaml"],
    ],
)
def test_device_cuda_without_cuda_is_one_line(cmd, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "ratrain", *cmd],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=tmp_path,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "CUDA" in lines[0] and "error" in lines[0]
