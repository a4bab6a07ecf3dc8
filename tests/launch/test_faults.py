"""A rank killed for real (SIGKILL from inside, via the RATRAIN_FAULT hook): one line naming
the rank, the step and the last checkpoint; a kill during a save leaves the previous
checkpoint loadable; torchrun --max-restarts 1 resumes by itself with the same fp32 losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ratrain.cli import main

pytestmark = pytest.mark.dist

ARGS = [
    "train", "--pp", "2", "--dp", "2", "--seq", "16", "--micro-batch", "1",
    "--global-batch", "6", "--dtype", "fp32", "--shard-optimizer", "--steps", "6",
    "--lr", "3e-3", "--warmup", "2", "--quiet", "--threads", "1",
]  # fmt: skip


def _ratrain(argv, fault=None, timeout=150, torchrun=False):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RATRAIN_FAULT", None)
    if fault:
        env["RATRAIN_FAULT"] = fault
    head = [sys.executable, "-m", "ratrain"]
    if torchrun:
        head = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "4", "--max-restarts", "1", "--monitor-interval", "0.5", "-m", "ratrain",
        ]  # fmt: skip
    return subprocess.run([*head, *argv], env=env, capture_output=True, text=True, timeout=timeout)


def _losses(path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    m = tmp_path_factory.mktemp("u") / "m.jsonl"
    assert main([*ARGS, "--metrics", str(m)]) == 0
    return _losses(m)


def _fails_in_one_line(capfd, monkeypatch, argv, fault) -> str:
    # In process: the spawned ranks are real processes; the hook reaches them in the Job.
    monkeypatch.setenv("RATRAIN_FAULT", fault)
    t0 = time.monotonic()
    assert main(argv) == 1
    assert time.monotonic() - t0 < 60  # no hang: the others are stopped at once
    monkeypatch.delenv("RATRAIN_FAULT")
    err = capfd.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.timeout(300)
def test_kill_during_save_keeps_previous_checkpoint_and_resume_is_exact(
    tmp_path, uninterrupted, capfd, monkeypatch
):
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    argv = [*ARGS, "--save", str(save), "--save-every", "2", "--metrics", str(m)]
    err = _fails_in_one_line(capfd, monkeypatch, argv, "1:4:save")
    assert "rank 1 was killed (SIGKILL) at step 3" in err
    assert "last complete checkpoint" in err and "step-00000002" in err
    assert (save / "latest").read_text().strip() == "step-00000002"
    assert (save / ".tmp-step-00000004").is_dir()  # the killed save, never published
    assert main([*argv, "--resume", "auto"]) == 0
    out = capfd.readouterr().out
    assert "resuming from" in out and "step-00000002" in out
    assert _losses(m) == uninterrupted  # steps 0-1 from the first run, 2-5 resumed: bit for bit
    assert not list(save.glob(".tmp-*"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "fault, said",
    [
        ("3:1", "rank 3 was killed (SIGKILL) at step 1; no checkpoints"),
        ("2:2:step-raise", "rank 2 failed (RuntimeError: injected fault on rank 2 at step 2)"),
    ],
)
def test_dying_or_failing_rank_is_one_line(capfd, monkeypatch, fault, said):
    assert said in _fails_in_one_line(capfd, monkeypatch, ARGS, fault)


@pytest.mark.timeout(300)
def test_torchrun_restart_resumes_and_matches(tmp_path, uninterrupted):
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    argv = [*ARGS, "--save", str(save), "--save-every", "2", "--metrics", str(m), "--timeout", "30"]
    r = _ratrain(argv, fault="2:3", torchrun=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    # The restarted attempt resumed from step 2 by itself and continued the metrics file.
    assert _losses(m) == uninterrupted
    assert (save / "latest").read_text().strip() == "step-00000006"
