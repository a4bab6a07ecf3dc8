"""How fast one rank computes when k ranks share the node, measured with the runtime's work.

(And, for each k >= 2 and b < k, how fast the b ranks that compute go while the other
k - b wait in a blocked gloo receive, the way the executor's walk waits:
`compute.shared_rank_speed`, read by processor sharing instead of its formula.)

For each rank count k (1, 2, 4, ... up to `nproc`), `ratrain.runtime.launch.spawn` starts k
ranks with the launcher's own thread policy (cores // k threads each, at least one) and
every rank runs the model's own `Block` forward and backward (`ratrain.models.llama`, a
calibration shape) over and over for the same wall-clock window, all starting together
after a barrier. The speed of a rank is the time one iteration takes on one thread alone
(measured first, in the k = 1 run) over the time it takes there. So the table holds what
the cost model's `compute_speed` needs, measured rather than derived from one GEMM's
thread scaling: memory-bound kernels, dispatch and the ranks' contention for the cores
and the memory bus are in it.

And what a collective's CPU work takes from compute (on a CPU, gloo's threads run on the
cores the ranks compute on): the k = 2 ranks, one DP group, run the same loop again with
one asynchronous `Comm.dp_all_reduce` of a gradient-sized buffer issued at the start of
each iteration and waited at its end, as the executor overlaps a SYNC with the next
backward; the extra time per iteration over the bytes all-reduced is the compute time a
byte of collective costs (`compute.collective_compute_s_per_byte`).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ratrain.models.llama import build_unit
from ratrain.models.spec import ModelSpec
from ratrain.runtime.comm import Comm
from ratrain.runtime.grid import ParallelGrid, Rendezvous
from ratrain.runtime.launch import spawn

__all__ = ["rank_counts", "measure_rank_speed", "SYNC_BYTES"]

SYNC_BYTES = 16 * 2**20
"""derived: about one block's fp32 gradient at the grid's widths (4M parameters)."""

_SPEC = ModelSpec(
    name="calib-share", n_layers=1, hidden=384, n_heads=6, n_kv_heads=6, ffn=1024, vocab=256
)
_MB, _SEQ = 2, 128


def rank_counts(nproc: int) -> list[int]:
    """1, 2, 3, 4 (what plans on a small node use: 3 ranks is a pp=3 plan), then powers of
    two up to nproc, and nproc itself."""
    out = set(range(1, min(nproc, 4) + 1))
    k = 8
    while k < nproc:
        out.add(k)
        k *= 2
    return sorted(out | {nproc})


def _iteration(block, x):
    y = block(x)
    y.backward(torch.ones_like(y))
    x.grad = None
    for p in block.parameters():
        p.grad = None


def _seconds_per_iteration(block, x, window_s: float, sync: bool) -> float:
    _iteration(block, x)  # warm-up
    if sync:
        dist.barrier()
    n, t0 = 0, time.perf_counter()
    while True:
        _iteration(block, x)
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= window_s and n >= 2:
            return elapsed / n


def _windows(block, x, window_s: float, windows: int, sync: bool) -> list[float]:
    """Seconds per iteration in each of `windows` windows (every rank starts each window
    together after a barrier when `sync`)."""
    return [_seconds_per_iteration(block, x, window_s, sync) for _ in range(windows)]


def _shared_windows(block, x, window_s: float, windows: int, busy: int) -> list[float | None]:
    """The first `busy` ranks compute for each window while the others wait for them in a
    blocked receive from rank 0 (`irecv(...).wait()`: the runtime's `Handle.wait` on a gloo
    work, which is how the executor's walk waits on a RECV or a collective). Seconds per
    iteration of this rank in each window (None on a waiting rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    token = torch.zeros(1)
    out: list[float | None] = []
    for _ in range(windows):
        dist.barrier()
        if rank < busy:
            out.append(_seconds_per_iteration(block, x, window_s, sync=False))
            if rank == 0:  # released when rank 0's window ends (the others' ends are near)
                for r in range(busy, world):
                    dist.send(token, r)
        else:
            dist.irecv(token, src=0).wait()
            out.append(None)
    dist.barrier()
    return out


def _seconds_with_sync(block, x, iterations: int, comm: Comm, buf: torch.Tensor) -> float:
    """Seconds per iteration with an all-reduce in flight beside each. Every rank runs the
    same count (agreed beforehand): collectives must match one for one."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iterations):
        handle = comm.dp_all_reduce(buf)
        _iteration(block, x)
        handle.wait()
    return (time.perf_counter() - t0) / iterations


def _rank(
    rdzv: Rendezvous,
    window_s: float,
    reference: bool,
    with_sync: bool = False,
    windows: int = 1,
    shared_window_s: float = 0.0,
) -> dict:
    grid = ParallelGrid.init(1, rdzv.world_size, rdzv, device="cpu")
    try:
        block = build_unit(_SPEC, 1)
        x = torch.randn(_MB, _SEQ, _SPEC.hidden, requires_grad=True)
        out = {"threads": torch.get_num_threads()}
        if reference:  # one thread on a core of its own: the curves' speed
            saved = torch.get_num_threads()
            torch.set_num_threads(1)
            out["one_thread_w"] = _windows(block, x, window_s, windows, sync=False)
            torch.set_num_threads(saved)
        out["w"] = _windows(block, x, window_s, windows, sync=True)
        out["s"] = statistics.median(out["w"])
        if with_sync:
            n = torch.tensor([max(2, int(window_s / out["s"]))])
            dist.all_reduce(n, op=dist.ReduceOp.MIN)
            buf = torch.ones(SYNC_BYTES // 4)
            out["sync_s"] = _seconds_with_sync(block, x, int(n.item()), Comm(grid), buf)
        if shared_window_s > 0:  # b = w - 1 ... 1 busy while the rest wait
            out["shared"] = {
                b: _shared_windows(block, x, shared_window_s, windows, b)
                for b in range(rdzv.world_size - 1, 0, -1)
            }
        # The window ends at different times on different ranks; wait so that no rank's
        # window ran while the others had already stopped.
        dist.barrier()
        return out
    finally:
        grid.destroy()


def measure_rank_speed(nproc: int, quick: bool, progress=None, windows: int = 1) -> dict:
    """{"rank_speed": [(ranks k, speed of one rank relative to one thread alone, threads
    per rank)], "shared_rank_speed": [(w, b, speed of each of the b busy ranks while w - b
    wait, spread)], "collective_compute_s_per_byte": float | None (None: nproc < 2),
    "spreads": {k: max/min - 1 of the ranks' mean time over the windows}}. Each figure is
    the median of `windows` consecutive windows."""
    window_s = 0.5 if quick else 1.0
    shared_s = 0.3 if quick else 0.8
    ref = None
    out, shared = [], []
    spreads = {}
    per_byte = None
    for k in rank_counts(nproc):
        if progress:
            progress.step(f"{k} rank(s) sharing the cores")
        res = spawn(
            _rank, k, window_s, k == 1, k == 2, windows, shared_s if k > 1 else 0.0,
            deadline_s=300,
        )  # fmt: skip
        if k == 1:
            ref = statistics.median(res[0]["one_thread_w"])
        per_window = [sum(r["w"][i] for r in res) / len(res) for i in range(windows)]
        spreads[k] = max(per_window) / min(per_window) - 1
        mean_s = sum(r["s"] for r in res) / len(res)
        out.append((k, ref / mean_s, res[0]["threads"]))
        for b in range(k - 1, 0, -1):
            busy = [[r["shared"][b][i] for r in res[:b]] for i in range(windows)]
            speeds = [ref / (sum(w) / len(w)) for w in busy]
            shared.append((k, b, statistics.median(speeds), max(speeds) / min(speeds) - 1))
        if k == 2:
            extra_s = sum(r["sync_s"] for r in res) / len(res) - mean_s
            per_byte = max(extra_s, 0.0) / SYNC_BYTES
    return {
        "rank_speed": out,
        "shared_rank_speed": shared,
        "collective_compute_s_per_byte": per_byte,
        "spreads": spreads,
    }
