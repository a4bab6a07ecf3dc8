"""Preemption: SIGTERM or SIGINT to `ratrain train` (the local launcher, or torchrun) makes
every rank finish the same step, save, and the job end with one line and exit code 3;
`--resume auto` then continues bit for bit. A second signal aborts at once; nothing is
left running either way."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ratrain.checkpoint import complete_checkpoints, read_meta
from ratrain.cli import main
from ratrain.launch.faults import SAME_REQUEST_S, STOP_EXIT_CODE, StopRequest

STEPS = 120
ARGS = [
    "train", "--pp", "2", "--seq", "16", "--micro-batch", "1", "--global-batch", "4",
    "--dtype", "fp32", "--steps", str(STEPS), "--lr", "3e-3", "--warmup", "2", "--quiet",
    "--threads", "1",
]  # fmt: skip
STOPPED = re.compile(r"stopped by (SIG\w+) at step (\d+); (.*)$", re.MULTILINE)


def _losses(path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def _records(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _start(argv, metrics: Path, torchrun: bool = False) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RATRAIN_FAULT", None)
    head = [sys.executable, "-m", "ratrain"]
    if torchrun:
        head = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "--monitor-interval", "0.2", "-m", "ratrain",
        ]  # fmt: skip
    cmd = [*head, *argv, "--metrics", str(metrics)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _mid_run(p: subprocess.Popen, metrics: Path, after: int = 3) -> None:
    """Wait until the job has logged `after` steps (it is training, well before its end)."""
    end = time.monotonic() + 120
    while _records(metrics) < after:
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < end, "the job did not start training"
        time.sleep(0.02)


def _proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(ppid, state, start time) of a live process, from /proc (no psutil needed)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], fields[19]


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every process below `root`."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _proc_stat(int(d.name))) is not None:
            children.setdefault(st[0], []).append(int(d.name))
    out, todo = {}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if (st := _proc_stat(c)) is not None:
                out[c] = st[2]
                todo.append(c)
    return out


def _left_running(procs: dict[int, str], within_s: float = 10.0) -> list[int]:
    """The recorded processes still running (not zombies, not a reused pid) after a while."""
    end = time.monotonic() + within_s
    while True:
        alive = []
        for pid, start in procs.items():
            st = _proc_stat(pid)
            if st is not None and st[2] == start and st[1] != "Z":
                alive.append(pid)
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)


def _one_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    m = tmp_path_factory.mktemp("u") / "m.jsonl"
    assert main([*ARGS, "--metrics", str(m)]) == 0
    return _losses(m)


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_sigterm_saves_the_step_it_names_and_resume_is_exact(tmp_path, uninterrupted, capfd):
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    argv = [*ARGS, "--save", str(save)]
    p = _start(argv, m)
    _mid_run(p, m)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    took = time.monotonic() - t0
    assert p.returncode == STOP_EXIT_CODE, err
    line = _one_line(err)
    sig, step, rest = STOPPED.search(line).groups()
    step = int(step)
    assert sig == "SIGTERM" and 3 < step < STEPS, line
    ckpt = save / f"step-{step:08d}"
    assert rest == f"checkpoint {ckpt}; continue with --resume auto", line
    assert complete_checkpoints(save) == [ckpt]
    assert read_meta(ckpt)["step"] == step and (save / "latest").read_text().strip() == ckpt.name
    assert sorted(_losses(m)) == list(range(step))  # every step before it logged, no more
    assert took < 60, took  # two steps and one save, here about 2 s
    assert main([*argv, "--resume", "auto", "--metrics", str(m)]) == 0
    assert f"resuming from {ckpt}" in capfd.readouterr().out
    assert _losses(m) == uninterrupted  # bit for bit, fp32


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_ctrl_c_without_save_stops_cleanly_and_leaves_nothing_behind(tmp_path):
    m = tmp_path / "m.jsonl"
    p = _start(ARGS, m)
    _mid_run(p, m)
    tree = _descendants(p.pid)
    assert len(tree) >= 3, tree  # the fork server and the two ranks at least
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == STOP_EXIT_CODE, err
    sig, step, rest = STOPPED.search(_one_line(err)).groups()
    assert sig == "SIGINT" and "no checkpoint (run with --save DIR" in rest
    assert sorted(_losses(m)) == list(range(int(step)))
    assert _left_running(tree) == []


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_second_signal_aborts_at_once(tmp_path):
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    p = _start([*ARGS, "--save", str(save)], m)
    _mid_run(p, m)
    tree = _descendants(p.pid)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 20
    assert p.returncode == 128 + signal.SIGTERM, err
    line = _one_line(err)
    assert "aborted by a second signal after SIGTERM" in line and "ranks killed" in line, line
    assert f"no complete checkpoint in {save} yet" in line, line
    assert complete_checkpoints(save) == []  # `--resume auto` starts afresh
    assert _left_running(tree) == []


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_torchrun_forwards_sigterm_and_ranks_stop_together(tmp_path, uninterrupted):
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    argv = [*ARGS, "--save", str(save), "--timeout", "30"]
    p = _start(argv, m, torchrun=True)
    _mid_run(p, m)
    p.send_signal(signal.SIGTERM)  # torchrun SIGTERMs each worker's process group
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0
    match = STOPPED.search(err)  # rank 0's line, among torchrun's own
    assert match is not None, err[-3000:]
    step = int(match.group(2))
    ckpt = save / f"step-{step:08d}"
    assert match.group(3) == f"checkpoint {ckpt}; continue with --resume auto"
    assert complete_checkpoints(save) == [ckpt]
    assert main([*argv, "--resume", "auto", "--metrics", str(m)]) == 0
    assert _losses(m) == uninterrupted


def test_stop_request_counts_a_repeat_only_after_the_window():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the launcher ignores SIGINT
    stop = StopRequest().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs between bytecodes of the main thread
        assert (stop.signum, stop.repeated) == (signal.SIGTERM, 0)
        os.kill(os.getpid(), signal.SIGINT)  # within the window: the same request
        time.sleep(0.05)
        assert stop.repeated == 0
        time.sleep(SAME_REQUEST_S)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.repeated == signal.SIGINT
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.timeout(60)
def test_a_launched_rank_aborts_on_a_second_signal_even_when_blocked():
    code = (
        "import threading, time\n"
        "from ratrain.launch.faults import StopRequest\n"
        "StopRequest(lambda s: f'aborted by {s}').install()\n"
        "print('ready', flush=True)\n"
        "threading.Event().wait(60)\n"  # the main thread blocked in a wait
        "print('not aborted', flush=True)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    timer = threading.Timer(SAME_REQUEST_S + 0.2, p.send_signal, (signal.SIGTERM,))
    timer.start()
    out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, (out, err)
    assert err.strip() == f"aborted by {int(signal.SIGTERM)}" and "not aborted" not in out


@pytest.mark.timeout(180)
def test_sigterm_to_the_single_process_trainer_is_one_line(tmp_path):
    m = tmp_path / "m.jsonl"
    p = _start(["train", "--pp", "1", "--steps", "100000", "--quiet"], m)
    _mid_run(p, m)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err
    line = _one_line(err)
    assert re.search(r"interrupted by SIGTERM at step \d+; no checkpoints \(run with --save", line)
