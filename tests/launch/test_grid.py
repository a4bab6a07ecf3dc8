"""The process grid, the local launcher and the communication layer."""

from __future__ import annotations

import time

import pytest
import torch

from ratrain.errors import RatrainError
from ratrain.launch.grid import ParallelGrid, Rendezvous, rank_layout, rendezvous_from_env
from ratrain.launch.spawn import free_port, spawn
from ratrain.runtime.comm import Comm


def test_rank_layout_is_replica_major():
    assert rank_layout(pp=2, dp=3) == [[0, 1], [2, 3], [4, 5]]
    g = ParallelGrid(pp=2, dp=3, rank=3, world_size=6, device=torch.device("cpu"))
    assert (g.stage, g.replica) == (1, 1)
    assert g.prev_rank == 2 and g.next_rank is None and g.is_last_stage
    assert g.dp_ranks == [1, 3, 5]


def test_world_size_must_match_grid():
    with pytest.raises(RatrainError, match=r"world size 3 != pp x dp = 2 x 2"):
        ParallelGrid(pp=2, dp=2, rank=0, world_size=3, device=torch.device("cpu"))


def test_rendezvous_from_torchrun_and_slurm_env():
    torchrun = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "1234",
    }
    assert rendezvous_from_env(torchrun) == Rendezvous(3, 4, 1, "h0", 1234)
    slurm = {"SLURM_PROCID": "2", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "MASTER_ADDR": "n1"}
    assert rendezvous_from_env(slurm) == Rendezvous(2, 8, 2, "n1", 29500)
    assert rendezvous_from_env({}) is None
    with pytest.raises(RatrainError, match="MASTER_ADDR"):
        rendezvous_from_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(RatrainError, match="outside a world"):
        rendezvous_from_env({"RANK": "5", "WORLD_SIZE": "2", "MASTER_ADDR": "x"})


def _exchange(rdzv: Rendezvous, pp: int, dp: int) -> dict:
    grid = ParallelGrid.init(pp, dp, rdzv, device="cpu", timeout_s=30)
    try:
        comm = Comm(grid)
        x = torch.full((3,), float(grid.rank))
        hs = []
        if not grid.is_last_stage:
            hs.append(comm.send_activation(x, mb=0))
        got = torch.full((3,), -1.0)
        if not grid.is_first_stage:
            hs.append(comm.recv_activation(got, mb=0))
        s = x.clone()
        hs.append(comm.dp_all_reduce(s))
        shard = torch.empty(1)
        full = torch.arange(float(dp)) + grid.replica
        hs.append(comm.dp_reduce_scatter(shard, full))
        everyone, h = comm.world_all_gather(torch.tensor([float(grid.rank)]))
        hs.append(h)
        for h in hs:
            h.wait()
        return {
            "got": got[0].item(),
            "sum": s[0].item(),
            "shard": shard.item(),
            "all": everyone.flatten().tolist(),
        }
    finally:
        grid.destroy()


@pytest.mark.dist
@pytest.mark.timeout(90)
def test_spawned_grid_exchanges_over_p2p_dp_and_world():
    out = spawn(_exchange, 4, 2, 2, deadline_s=80)
    # rank = replica * pp + stage
    assert [o["got"] for o in out] == [-1.0, 0.0, -1.0, 2.0]
    assert [o["sum"] for o in out] == [2.0, 4.0, 2.0, 4.0]  # 0+2 and 1+3
    # replica r holds [r, r+1]; the sum is [1, 3]; replica r keeps element r
    assert [o["shard"] for o in out] == [1.0, 1.0, 3.0, 3.0]
    assert all(o["all"] == [0.0, 1.0, 2.0, 3.0] for o in out)


def _raise_user_error(rdzv: Rendezvous) -> None:
    if rdzv.rank == 1:
        raise RatrainError("rank one says no")
    time.sleep(60)  # the launcher must stop this rank once rank 1 has failed


@pytest.mark.dist
@pytest.mark.timeout(60)
def test_user_error_in_a_rank_is_one_line_and_stops_the_others():
    t0 = time.monotonic()
    with pytest.raises(RatrainError, match="^rank one says no$"):
        spawn(_raise_user_error, 2, deadline_s=50)
    assert time.monotonic() - t0 < 40


@pytest.mark.timeout(60)
def test_unreachable_rendezvous_is_a_clear_error():
    rdzv = Rendezvous(1, 2, 1, "127.0.0.1", free_port())  # nobody serves this port
    t0 = time.monotonic()
    with pytest.raises(RatrainError, match="rendezvous at 127.0.0.1:.* failed"):
        ParallelGrid.init(1, 2, rdzv, device="cpu", timeout_s=2)
    assert time.monotonic() - t0 < 30


_SLEEPER = """
import os, time
from ratrain.launch.spawn import spawn

def rank(rdzv, out_dir):
    tmp = os.path.join(out_dir, f"tmp{rdzv.rank}")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, os.path.join(out_dir, f"pid{rdzv.rank}"))
    time.sleep(600)

def main(out_dir):
    spawn(rank, 2, out_dir)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may never be reaped in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(90)
def test_ranks_exit_when_the_launcher_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    (tmp_path / "sleeper.py").write_text(_SLEEPER)
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import sys, sleeper; sleeper.main(sys.argv[1])", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": path},
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("pid*"))) < 2:
            assert launcher.poll() is None, "the launcher ended before its ranks started"
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
        assert all(_running(p) for p in pids)
        launcher.kill()  # SIGKILL: no chance to stop its ranks itself
        launcher.wait()
        deadline = time.monotonic() + 15
        while any(_running(p) for p in pids):
            assert time.monotonic() < deadline, "ranks outlived their killed launcher"
            time.sleep(0.2)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for p in pids:
            if _running(p):
                os.kill(p, signal.SIGKILL)
