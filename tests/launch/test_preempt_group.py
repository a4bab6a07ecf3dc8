"""SIGTERM to the whole process group of `ratrain train` (`timeout -s TERM`, `kill -TERM --
-PGID`, a scheduler that signals every process of the job) stops as cleanly as SIGTERM to
the launcher alone: every rank finishes the same step, the job saves it and exits 3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from test_preempt import ARGS, STEPS, STOPPED, _losses, _mid_run, _one_line

from ratrain.checkpoint import complete_checkpoints, read_meta
from ratrain.launch.faults import STOP_EXIT_CODE


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_sigterm_to_the_process_group_saves_the_step_it_names(tmp_path):
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RATRAIN_FAULT", None)
    cmd = [sys.executable, "-m", "ratrain", *ARGS, "--save", str(save), "--save-every", "1000"]
    p = subprocess.Popen(
        [*cmd, "--metrics", str(m)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the launcher, fork server, ranks
    )
    try:
        _mid_run(p, m)
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGTERM)
        _, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == STOP_EXIT_CODE, err
    sig, step, rest = STOPPED.search(_one_line(err)).groups()
    step = int(step)
    assert sig == "SIGTERM" and 3 <= step < STEPS, err
    ckpt = save / f"step-{step:08d}"
    assert rest == f"checkpoint {ckpt}; continue with --resume auto", err
    assert complete_checkpoints(save) == [ckpt]
    assert read_meta(ckpt)["step"] == step
    assert sorted(_losses(m)) == list(range(step))  # every step before it logged, no more
    assert time.monotonic() - t0 < 60
