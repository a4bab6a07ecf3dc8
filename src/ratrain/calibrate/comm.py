"""Communication measurements over torch.distributed, through the runtime's `Comm`.

Spawns `nproc` local ranks (`ratrain.launch.spawn.spawn`, as `ratrain train` does) and
times, for each message size, with every rank taking part at once (as in a step):

- p2p: a ping-pong between the two stages of each pipeline (`send_activation` /
  `recv_grad` of a pp=2 grid); half a round trip is one message;
- collectives: `dp_all_reduce`, `dp_reduce_scatter`, `dp_all_gather` at each DP group
  size n that divides nproc (grids pp = nproc/n x dp = n, so groups run side by side);
- the issue cost of one asynchronous send and one all-reduce (the walk's share of a SEND
  or SYNC action);
- whether a send reports completion to a poll once the receiver has its data, or only
  when waited (gloo's isend): the executor frees a SEND's buffer when its poll finds it
  complete, so on such a backend every SEND buffer of a step lives to the step's end.

Each size's time is the median over repetitions of the slowest rank's time; α and the
bandwidth come from a least-squares line through (bytes, seconds)
(`ratrain.calibrate.fit.fit_alpha_beta`, when the platform file is built).
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
import torch.distributed as dist

from ratrain.launch.grid import ParallelGrid, Rendezvous
from ratrain.launch.spawn import spawn
from ratrain.runtime.comm import Comm

__all__ = ["measure_comm"]

_SIZES = (4_096, 262_144, 4_194_304, 16_777_216)
_SIZES_QUICK = (4_096, 1_048_576, 8_388_608)


def _slowest(dt: float) -> float:
    t = torch.tensor([dt], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(_slowest(time.perf_counter() - t0))
    return statistics.median(times)


def _collective(comm: Comm, kind: str, full: torch.Tensor, shard: torch.Tensor) -> None:
    if kind == "all_reduce":
        comm.dp_all_reduce(full).wait()
    elif kind == "reduce_scatter":
        comm.dp_reduce_scatter(shard, full).wait()
    else:
        comm.dp_all_gather(full, shard).wait()


def _send_polls_complete(comm: Comm, g: ParallelGrid, buf: torch.Tensor) -> bool:
    """Whether stage 0's isend reports `is_completed()` after stage 1 has received it
    (and a grace period), without being waited: what the executor's poll sees."""
    seen = torch.zeros(1, dtype=torch.float64)
    if g.stage == 0:
        h = comm.send_activation(buf, 2)
        dist.barrier()  # stage 1 has received
        time.sleep(0.05)
        seen[0] = 1.0 if h.is_completed() else 0.0
        h.wait()
    else:
        comm.recv_activation(buf, 2).wait()
        dist.barrier()
        seen[0] = 1.0
    dist.all_reduce(seen, op=dist.ReduceOp.MIN)
    return bool(seen.item() > 0)


def _rank(rdzv: Rendezvous, sizes: tuple[int, ...], reps: int, device: str | None) -> dict:
    n_world = rdzv.world_size
    out: dict = {"p2p": [], "collectives": {}, "issue_s": {}}
    grid = ParallelGrid.init(1, n_world, rdzv, device=device)
    try:
        dev = grid.device
        if n_world >= 2 and n_world % 2 == 0:
            g2 = ParallelGrid.init(2, n_world // 2, rdzv, device=device)
            comm = Comm(g2)
            for size in sizes:
                buf = torch.zeros(size // 4, device=dev)

                def ping(comm=comm, buf=buf, g=g2):
                    if g.stage == 0:
                        comm.send_activation(buf, 0).wait()
                        comm.recv_grad(buf, 0).wait()
                    else:
                        comm.recv_activation(buf, 0).wait()
                        comm.send_grad(buf, 0).wait()

                out["p2p"].append((size, _timed(ping, reps) / 2))
            small = torch.zeros(16, device=dev)
            t_issue = []
            for _ in range(reps * 4):
                dist.barrier()
                t0 = time.perf_counter()
                h = (
                    comm.send_activation(small, 1)
                    if g2.stage == 0
                    else comm.recv_activation(small, 1)
                )
                t_issue.append(time.perf_counter() - t0)
                h.wait()
            out["issue_s"]["p2p"] = statistics.median(t_issue)
            out["send_polls_complete"] = _send_polls_complete(comm, g2, small)
        for n in [d for d in range(2, n_world + 1) if n_world % d == 0]:
            g = ParallelGrid.init(n_world // n, n, rdzv, device=device)
            comm = Comm(g)
            for kind in ("all_reduce", "reduce_scatter", "all_gather"):
                pts = []
                for size in sizes:
                    full = torch.ones(size // 4, device=dev)
                    shard = torch.ones(size // 4 // n, device=dev)
                    op = functools.partial(_collective, comm, kind, full, shard)
                    pts.append((size, _timed(op, reps)))
                out["collectives"].setdefault(kind, []).append((n, pts))
            if n == 2:
                t_issue = []
                buf = torch.ones(16, device=dev)
                for _ in range(reps * 4):
                    dist.barrier()
                    t0 = time.perf_counter()
                    h = comm.dp_all_reduce(buf)
                    t_issue.append(time.perf_counter() - t0)
                    h.wait()
                out["issue_s"]["collective"] = statistics.median(t_issue)
        return out
    finally:
        grid.destroy()


def measure_comm(nproc: int, quick: bool, device: str | None, deadline_s: float = 600) -> dict:
    """{"p2p": [(bytes, s)], "collectives": {kind: [(n, [(bytes, s)])]}, "issue_s": {...}}
    from rank 0 of `nproc` spawned ranks."""
    sizes, reps = (_SIZES_QUICK, 5) if quick else (_SIZES, 11)
    return spawn(_rank, nproc, sizes, reps, device, deadline_s=deadline_s)[0]
