"""A rank killed for real (SIGKILL from inside, via the RATRAIN_FAULT hook): one line naming
the rank, the step and the last checkpoint; a kill during a save leaves the previous
checkpoint loadable; torchrun --max-restarts 1 resumes by itself with the same fp32 losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
    r = _ratrain([*ARGS, "--metrics", str(m)])
    assert r.returncode == 0, r.stderr
    return _losses(m)


@pytest.mark.timeout(300)
def test_kill_during_save_keeps_previous_checkpoint_and_resume_is_exact(tmp_path, uninterrupted):
    save = tmp_path / "ck"
    r = _ratrain([*ARGS, "--save", str(save), "--save-every", "2"], fault="1:4:save")
    assert r.returncode == 1
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert "rank 1 was killed (SIGKILL) at step 3" in err
    assert "last complete checkpoint" in err and "step-00000002" in err
    assert (save / "latest").read_text().strip() == "step-00000002"
    assert (save / ".tmp-step-00000004").is_dir()  # the killed save, never published
    m = tmp_path / "r.jsonl"
    r = _ratrain([*ARGS, "--save", str(save), "--resume", "auto", "--metrics", str(m)])
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stdout and "step-00000002" in r.stdout
    assert _losses(m) == {k: v for k, v in uninterrupted.items() if k >= 2}  # bit for bit
    assert not list(save.glob(".tmp-*"))


@pytest.mark.timeout(300)
def test_killed_rank_is_one_line_without_checkpoints(tmp_path):
    r = _ratrain(ARGS, fault="3:1")
    assert r.returncode == 1
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert "rank 3 was killed (SIGKILL) at step 1; no checkpoints" in err


@pytest.mark.timeout(300)
def test_torchrun_restart_resumes_and_matches(tmp_path, uninterrupted):
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    argv = [*ARGS, "--save", str(save), "--save-every", "2", "--metrics", str(m), "--timeout", "30"]
    r = _ratrain(argv, fault="2:3", torchrun=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    # The restarted attempt resumed from step 2 by itself and wrote steps 2..5.
    assert _losses(m) == {k: v for k, v in uninterrupted.items() if k >= 2}
    assert (save / "latest").read_text().strip() == "step-00000006"
