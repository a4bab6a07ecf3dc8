"""Faults on the emulated cluster: a node lost and a link down end the other nodes within
`--peer-timeout` with one line naming the lost node; a save onto a full disk keeps the
previous checkpoint, which `--resume auto` continues bit for bit. The heartbeat's verdicts
are tested without a cluster. The long cases (every fault, both layouts, with their
timings): benchmarks/cluster_faults.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ratrain.checkpoint import complete_checkpoints
from ratrain.launch.emulate import EmulatedNetwork, torchrun_argv, unavailable
from ratrain.launch.peers import LEFT, PeerWatch, Where, describe_ranks, peer_address

WHY = unavailable()
cluster = pytest.mark.skipif(WHY is not None, reason=WHY or "")

# -- the heartbeat's verdicts, no cluster ---------------------------------------------------
WHERE = {0: Where("0", "10.0.0.1"), 1: Where("0", "10.0.0.1"),
         2: Where("1", "10.0.0.2"), 3: Where("1", "10.0.0.2")}  # fmt: skip


def test_lost_ranks_are_named_by_node_when_the_whole_node_is_gone():
    assert describe_ranks([2, 3], WHERE) == "node 1 (10.0.0.2; ranks 2, 3)"
    assert describe_ranks([3], WHERE) == "rank 3 (node 1, 10.0.0.2)"
    assert (
        describe_ranks([1, 2, 3], WHERE)
        == "rank 1 (node 0, 10.0.0.1) and node 1 (10.0.0.2; ranks 2, 3)"
    )
    assert peer_address("Connection closed by peer [10.0.0.2]:4567. This is") == "10.0.0.2"
    assert peer_address("Timed out waiting 60000ms for recv") is None


def _watch(lost_after_s: float = 10.0) -> PeerWatch:
    w = PeerWatch(None, 0, 4, WHERE[0], lost_after_s, report=print, store_addr="10.0.0.1:29500")
    w.where = dict(WHERE)
    return w


def test_a_peer_silent_past_the_bound_is_lost_and_one_that_left_is_not():
    w = _watch()
    t = w.last_ok
    w._note([5, 5, 5, 5])
    seen = list(w.changed)
    w._note([6, 5, 5, 5 + LEFT])  # only a moved counter counts as a beat
    assert w.changed[1:3] == seen[1:3] and w.changed[3] >= seen[3]
    # rank 1 beat just now, rank 2 last 10.5 s ago, rank 3 left on purpose (silent after)
    w.changed = [t, t + 10, t, t]
    w.last_ok = t + 10
    assert w.verdict(t + 9.5) is None
    said = w.verdict(t + 10.5)
    assert said == "lost rank 2 (node 1, 10.0.0.2): no heartbeat for 10 s", said
    w.changed[1] = t  # ranks 1 and 2 silent: not a whole node, each named
    assert w.verdict(t + 10.5).startswith("lost rank 1 (node 0, 10.0.0.1) and rank 2 (node 1")


def test_the_store_out_of_reach_past_the_bound_is_said_as_such():
    w = _watch()
    assert "lost contact with the job's store at 10.0.0.1:29500" in w.verdict(w.last_ok + 10.5)
    assert w.verdict(w.last_ok + 9.5) is None


def test_a_fault_before_the_peers_are_known_still_names_the_lost_one():
    """A collective fails within the job's first beat, before this rank has read where its
    peers are: the beats `suspects` waits for read that, and the silent peer is named (it
    answered None at once, and the line said only "a peer rank may have died")."""
    import threading

    w = PeerWatch(None, 0, 4, WHERE[0], 10.0, report=print, store_addr="10.0.0.1:29500")
    w.period_s = 0.05
    assert not w.where

    def beats() -> None:  # what the beat thread does: where, then every counter each beat
        time.sleep(2 * w.period_s)  # the failure comes first
        w.where = dict(WHERE)
        for k in range(1, 20):
            w._note([k, k, k, 1])  # rank 3 beat once, then stopped
            w.last_ok = time.monotonic()
            time.sleep(w.period_s)

    t = threading.Thread(target=beats)
    t.start()
    try:
        said = w.suspects("Connection reset by peer")
    finally:
        t.join()
    assert said == "lost rank 3 (node 1, 10.0.0.2)", said


# -- on the emulated cluster --------------------------------------------------------------
def _netns(prefix: str) -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [x.split()[0] for x in r.stdout.splitlines() if x.startswith(prefix)]


def _train(save: Path, metrics: Path, steps: int, *extra: str) -> list[str]:
    return [
        "-m", "ratrain", "train", "--pp", "2", "--seq", "16", "--micro-batch", "1",
        "--global-batch", "2", "--steps", str(steps), "--dtype", "fp32", "--quiet",
        "--threads", "1", "--save", str(save), "--save-every", "5", "--metrics", str(metrics),
        *extra,
    ]  # fmt: skip


def _steps_logged(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def _mid_run(run, metrics: Path, steps: int = 8) -> None:
    end = time.monotonic() + 120
    while _steps_logged(metrics) < steps:
        assert run.running(), run.output(0)[-3000:]
        assert time.monotonic() < end
        time.sleep(0.05)


def _error_lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith("ratrain train: error:")]


LOST = re.compile(
    r"rank 0 lost (.*?)(: no heartbeat for \S+ s)?( during a checkpoint save)? at step (\d+); (.*)$"
)


@contextmanager
def _cluster(nodes: int):
    net = EmulatedNetwork(nodes, 200)
    try:
        with net:
            yield net
    finally:
        assert not _netns(net.prefix)


@cluster
@pytest.mark.dist
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["node", pytest.param("link", marks=pytest.mark.slow)])
def test_a_lost_node_ends_the_others_within_the_bound_in_one_line(tmp_path, fault):
    """2 nodes x 1 rank: node 1 killed (its kernel closes the connections: seen at once) or
    its link down for good (nothing is closed: the heartbeat's bound)."""
    save, m = tmp_path / "ck", tmp_path / "m.jsonl"
    bound_s = 6.0
    cmd = torchrun_argv(2, 1, 29500, *_train(save, m, 400, "--peer-timeout", f"{bound_s:g}"))
    with _cluster(2) as net:
        run = net.start_on_nodes(cmd, env={"OMP_NUM_THREADS": "1"})
        _mid_run(run, m)
        t0 = time.monotonic()
        if fault == "node":
            net.kill_node(1)
        else:
            net.set_link(1, up=False)
        res = run.wait(timeout_s=60)
        took = res[0].exited_at - t0
    assert res[0].returncode == 1, res[0].output[-3000:]
    lines = _error_lines(res[0].output)
    assert len(lines) == 1, res[0].output[-3000:]
    lost, waited, _saving, step, rest = LOST.search(lines[0]).groups()
    assert lost == "node 1 (10.213.0.2; rank 1)", lines[0]
    assert (waited is not None) == (fault == "link"), lines[0]
    assert int(step) >= 7
    assert rest.startswith(f"last complete checkpoint {complete_checkpoints(save)[-1]}"), rest
    print(f"{fault}: node 0 exited {took:.1f} s after the fault (--peer-timeout {bound_s:g})")
    assert took < bound_s + 20, took  # the bound, a few beats, the teardown (2 shared cores)
    if fault == "link":
        assert took > bound_s - 1, took  # not before the bound: the link may come back
        assert "lost contact with the job's store" in "".join(_error_lines(res[1].output))


def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


@contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@cluster
@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_full_disk_on_the_cluster_keeps_the_previous_checkpoint_and_resume_is_exact(tmp_path):
    """A tmpfs that holds two checkpoints of the tiny model (2.6 MiB each), not three."""
    m, ref = tmp_path / "m.jsonl", tmp_path / "ref.jsonl"
    steps = 20
    r = subprocess.run([sys.executable, *_train(tmp_path / "ref-ck", ref, steps)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    with _tmpfs(tmp_path / "disk", "7m") as disk, _cluster(2) as net:
        save = disk / "ck"
        cmd = torchrun_argv(2, 1, 29500, *_train(save, m, steps))
        res = net.run_on_nodes(cmd, env={"OMP_NUM_THREADS": "1"}, timeout_s=120)
        assert [x.returncode for x in res] == [1, 1], res[0].output[-3000:]
        line = _error_lines(res[0].output)[0]
        assert "no space left on the device saving checkpoint" in line, line
        assert line.endswith(
            f"last complete checkpoint {save / 'step-00000010'} (continue from it with "
            "--resume auto)"
        ), line
        assert [d.name for d in complete_checkpoints(save)] == ["step-00000005", "step-00000010"]
        assert (save / "latest").read_text().strip() == "step-00000010"
        assert not list(save.glob(".tmp-*"))  # the partial save was removed
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        cmd = torchrun_argv(2, 1, 29500, *_train(save, m, steps, "--resume", "auto"))
        res = net.run_on_nodes(cmd, env={"OMP_NUM_THREADS": "1"}, timeout_s=120)
        assert [x.returncode for x in res] == [0, 0], res[0].output[-3000:]
        assert "resuming from" in res[0].output and "step-00000010" in res[0].output
    assert _losses(m) == _losses(ref)  # bit for bit, fp32
