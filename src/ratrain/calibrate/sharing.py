"""How fast one rank computes when k ranks share the node, measured with the runtime's work.

(And, for each k >= 2 and b < k, how fast the b ranks that compute go while the other
k - b wait in a blocked gloo receive, the way the executor's walk waits:
`compute.shared_rank_speed`, read by processor sharing instead of its formula.)

For each rank count k (1, 2, 4, ... up to `nproc`), `ratrain.runtime.launch.spawn` starts k
ranks with the launcher's own thread policy (cores // k threads each, at least one) and
every rank runs the model's own `Block` forward and backward (`ratrain.models.llama`, a
calibration shape) over and over for the same wall-clock window, all starting together
after a barrier. The speed of a rank is the time one iteration takes on one thread alone
over the time it takes there; the one-thread time is measured by rank 0 alone (the others
waiting in a barrier) right before each window, so that the machine's drift between the
two does not enter the ratio (a reference measured once, minutes apart from the windows,
moved every rank speed, and so every prediction, by the VM's drift: ±15-35% here). So
the table holds what the cost model's `compute_speed` needs, measured rather than derived from one GEMM's
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


def _one_thread_window(block, x, window_s: float) -> float:
    """Seconds per iteration on one thread (the curves' speed), the caller's threads kept."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _seconds_per_iteration(block, x, window_s, sync=False)
    finally:
        torch.set_num_threads(saved)


def _paired_windows(block, x, window_s: float, windows: int) -> tuple[list[float], list[float]]:
    """(reference, shared): per window, first rank 0 alone on one thread (the others wait in
    a barrier) for the reference window, then every rank together with the launcher's
    threads. The reference is taken right before each shared window, so the machine's drift
    over the minutes calibration takes (±15% on the 2-core reference VM) does not enter the
    ratio of the two. The reference list is empty on the other ranks."""
    refs, shared = [], []
    for _ in range(windows):
        if dist.get_rank() == 0:
            refs.append(_one_thread_window(block, x, window_s))
        shared.append(_seconds_per_iteration(block, x, window_s, sync=True))
    return refs, shared


def _shared_windows(block, x, window_s: float, windows: int, busy: int) -> list[float | None]:
    """The first `busy` ranks compute for each window while the others wait for them in a
    blocked receive from rank 0 (`irecv(...).wait()`: the runtime's `Handle.wait` on a gloo
    work, which is how the executor's walk waits on a RECV or a collective). Seconds per
    iteration of this rank in each window (None on a waiting rank), each preceded by a
    reference window of rank 0 alone on one thread (`_paired_windows`); the references are
    appended after the windows on rank 0."""
    rank, world = dist.get_rank(), dist.get_world_size()
    token = torch.zeros(1)
    out: list[float | None] = []
    refs: list[float] = []
    for _ in range(windows):
        if rank == 0:
            refs.append(_one_thread_window(block, x, window_s))
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
    return out + refs


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
    with_sync: bool = False,
    windows: int = 1,
    shared_window_s: float = 0.0,
) -> dict:
    grid = ParallelGrid.init(1, rdzv.world_size, rdzv, device="cpu")
    try:
        block = build_unit(_SPEC, 1)
        x = torch.randn(_MB, _SEQ, _SPEC.hidden, requires_grad=True)
        out = {"threads": torch.get_num_threads()}
        # one thread on a core of its own (the curves' speed), beside each shared window
        out["ref_w"], out["w"] = _paired_windows(block, x, window_s, windows)
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
    "spreads": {k: max/min - 1 of the window speeds}}. Each figure is the median over
    `windows` windows of the speed in that window: one thread alone measured right before
    it, over the ranks' mean time in it."""
    window_s = 0.5 if quick else 1.0
    shared_s = 0.3 if quick else 0.8
    out, shared = [], []
    spreads = {}
    per_byte = None
    for k in rank_counts(nproc):
        if progress:
            progress.step(f"{k} rank(s) sharing the cores")
        res = spawn(
            _rank, k, window_s, k == 2, windows, shared_s if k > 1 else 0.0,
            deadline_s=300,
        )  # fmt: skip
        refs = res[0]["ref_w"]
        speeds = [refs[i] / (sum(r["w"][i] for r in res) / len(res)) for i in range(windows)]
        spreads[k] = max(speeds) / min(speeds) - 1
        mean_s = sum(r["s"] for r in res) / len(res)
        out.append((k, statistics.median(speeds), res[0]["threads"]))
        for b in range(k - 1, 0, -1):
            b_refs = res[0]["shared"][b][windows:]
            busy = [[r["shared"][b][i] for r in res[:b]] for i in range(windows)]
            b_speeds = [b_refs[i] / (sum(w) / len(w)) for i, w in enumerate(busy)]
            spread = max(b_speeds) / min(b_speeds) - 1
            shared.append((k, b, statistics.median(b_speeds), spread))
        if k == 2:
            extra_s = sum(r["sync_s"] for r in res) / len(res) - mean_s
            per_byte = max(extra_s, 0.0) / SYNC_BYTES
    return {
        "rank_speed": out,
        "shared_rank_speed": shared,
        "collective_compute_s_per_byte": per_byte,
        "spreads": spreads,
    }
