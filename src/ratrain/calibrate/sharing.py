"""How fast one rank computes when k ranks share the node, measured with the runtime's work.

(And, for each k >= 2 and b < k, how fast the b ranks that compute go while the other
k - b wait in a blocked gloo receive, the way the executor's walk waits, with the busy set
moving on after each burst of computing as a pipeline's does, for a shortest, a short and
a long burst: `compute.shared_rank_speed`, read by processor sharing instead of its formula. And,
for the rank counts whose ranks run several threads, the speed at 128 and 512 tokens per
microbatch as well: `compute.rank_speed_tokens`.)

For each rank count k (1, 2, 4, ... up to `nproc`), `ratrain.launch.spawn.spawn` starts k
ranks with the launcher's own thread policy (cores // k threads each, at least one) and
every rank runs the model's own `Block` forward and backward (`ratrain.nn.llama`, a
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

import math
import statistics
import time

import torch
import torch.distributed as dist

from ratrain.launch.grid import ParallelGrid, Rendezvous
from ratrain.launch.spawn import _threads_per_rank, spawn
from ratrain.models.spec import ModelSpec
from ratrain.nn.llama import build_unit
from ratrain.runtime.comm import Comm

__all__ = ["rank_counts", "measure_rank_speed", "SYNC_BYTES"]

SYNC_BYTES = 16 * 2**20
"""derived: about one block's fp32 gradient at the grid's widths (4M parameters)."""

_SPEC = ModelSpec(
    name="calib-share", n_layers=1, hidden=384, n_heads=6, n_kv_heads=6, ffn=1024, vocab=256
)
_MB, _SEQ = 2, 128
_TOKEN_MBS = (1, 4)
"""Microbatch sizes a rank of several threads is also measured at, beside _MB."""


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
    return _loop_s(_iteration, block, x, window_s, sync)


def _one_thread_window(block, x, window_s: float, fn=None) -> float:
    """Seconds per call of fn(block, x) (default: an iteration) on one thread (the curves'
    speed), the caller's threads kept."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _loop_s(fn or _iteration, block, x, window_s)
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


def _forward(block, x):
    block(x)  # autograd records the graph, as the runtime's F does; dropped at once


def _forward_quarter(block, x):
    block(x[:, : x.shape[1] // 4])  # a quarter of the tokens: a small microbatch's forward


_KINDS = {"Fq": _forward_quarter, "F": _forward, "FB": _iteration}
"""What a busy rank runs between waits in the ring windows: a shortest burst (the forward of
a quarter of the tokens, ~4 ms on one thread of the 2-core machine: a block's action at a
small microbatch), a short one (the forward, ~15 ms) and a long one (forward and backward,
~40 ms). Speeds fall with the burst (4 ranks on 2 cores, one computing: 0.77, 0.88 and
0.98 of one thread alone at these three, 3 windows each); below the shortest measured
burst the table is held (`ratrain.cost.sharing`), so it reaches down to what plans of
small microbatches run."""


def _loop_s(fn, block, x, window_s: float, sync: bool = False) -> float:
    """Seconds per call of fn(block, x), called until window_s has passed (at least 2);
    with `sync`, every rank starts together after a barrier that follows the warm-up."""
    fn(block, x)  # warm-up
    if sync:
        dist.barrier()
    n, t0 = 0, time.perf_counter()
    while True:
        fn(block, x)
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= window_s and n >= 2:
            return elapsed / n


def _ring(fn, block, x, hops: int, busy: int) -> list[float]:
    """`busy` tokens go round the ranks; a rank holding one runs fn once, then passes it on
    (an isend to the next rank) and waits for the next in a blocked receive (irecv().wait(),
    the runtime's wait): b ranks compute at any moment, and the busy set moves on after
    every burst, the way a pipeline's does. Each token makes `hops` bursts. Seconds of each
    burst this rank ran."""
    rank, world = dist.get_rank(), dist.get_world_size()
    visits = sum(1 for j in range(busy) for h in range(hops) if (j + h) % world == rank)
    holds = rank < busy
    bufs = [torch.zeros(1) for _ in range(visits - holds)]
    sends, out, posted = [], [], 0
    dist.barrier()
    pending = dist.irecv(bufs[0], src=(rank - 1) % world) if bufs else None
    token = torch.zeros(1)
    for _ in range(visits):
        if not holds:
            pending.wait()
            token, posted = bufs[posted], posted + 1
            if posted < len(bufs):  # posted ahead: a token may come while this one runs
                pending = dist.irecv(bufs[posted], src=(rank - 1) % world)
        holds = False
        t0 = time.perf_counter()
        fn(block, x)
        out.append(time.perf_counter() - t0)
        if token.item() + 1 < hops:
            sends.append(dist.isend(token + 1, (rank + 1) % world))
    for h in sends:
        h.wait()
    dist.barrier()
    return out


def _ring_windows(block, x, window_s: float, windows: int, busy: int) -> dict:
    """Per burst kind, per window: rank 0's one-thread seconds per burst (the others waiting
    in a barrier), broadcast, then the ring (`_ring`) for about window_s. {kind: [(one
    thread's seconds, [this rank's burst seconds])]}."""
    world = dist.get_world_size()
    out = {}
    for kind, fn in _KINDS.items():
        rows = []
        for _ in range(windows):
            ref = torch.zeros(1, dtype=torch.float64)
            if dist.get_rank() == 0:
                ref[0] = _one_thread_window(block, x, window_s, fn)
            dist.broadcast(ref, 0)
            hops = max(world + 2, math.ceil(window_s / ref.item()) + world)
            rows.append((ref.item(), _ring(fn, block, x, hops, busy)))
        out[kind] = rows
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
    with_sync: bool = False,
    windows: int = 1,
    shared_window_s: float = 0.0,
    with_tokens: bool = False,
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
                b: _ring_windows(block, x, shared_window_s, windows, b)
                for b in range(rdzv.world_size - 1, 0, -1)
            }
        if with_tokens:  # a rank of several threads: its speed per microbatch size
            out["tokens"] = {
                mb: _paired_windows(
                    block,
                    torch.randn(mb, _SEQ, _SPEC.hidden, requires_grad=True),
                    window_s,
                    windows,
                )
                for mb in _TOKEN_MBS
            }
        # The window ends at different times on different ranks; wait so that no rank's
        # window ran while the others had already stopped.
        dist.barrier()
        return out
    finally:
        grid.destroy()


def _speeds(refs: list[float], runs: list[list[float]]) -> list[float]:
    """Per window: one thread alone's seconds over the mean of the ranks' seconds in it."""
    return [ref / statistics.mean(run) for ref, run in zip(refs, runs, strict=True)]


def measure_rank_speed(nproc: int, quick: bool, progress=None, windows: int = 1) -> dict:
    """{"rank_speed": [(ranks k, speed of one rank relative to one thread alone, threads
    per rank)], "rank_speed_tokens": [(k, tokens per microbatch, speed)] for the k whose
    ranks run several threads, "shared_rank_speed": [(w, b, speed of each of the b busy
    ranks while w - b wait, one thread's seconds per burst, spread)],
    "collective_compute_s_per_byte": float | None (None: nproc < 2), "spreads": {k: max/min
    - 1 of the window speeds}}. Each figure is the median over `windows` windows of the
    speed in that window: one thread alone measured right before it, over the ranks' mean
    time in it."""
    window_s = 0.5 if quick else 1.0
    shared_s = 0.3 if quick else 0.8
    out, shared, tokens = [], [], []
    spreads = {}
    per_byte = None
    for k in rank_counts(nproc):
        if progress:
            progress.step(f"{k} rank(s) sharing the cores")
        threaded = _threads_per_rank(k) > 1
        res = spawn(
            _rank, k, window_s, k == 2, windows, shared_s if k > 1 else 0.0, threaded,
            deadline_s=300,
        )  # fmt: skip
        per_window = [[r["w"][i] for r in res] for i in range(windows)]
        speeds = _speeds(res[0]["ref_w"], per_window)
        spreads[k] = max(speeds) / min(speeds) - 1
        mean_s = sum(r["s"] for r in res) / len(res)
        out.append((k, statistics.median(speeds), res[0]["threads"]))
        if threaded:
            for mb in sorted((*_TOKEN_MBS, _MB)):
                if mb == _MB:
                    tokens.append((k, mb * _SEQ, statistics.median(speeds)))
                    continue
                runs = [[r["tokens"][mb][1][i] for r in res] for i in range(windows)]
                sp = _speeds(res[0]["tokens"][mb][0], runs)
                tokens.append((k, mb * _SEQ, statistics.median(sp)))
        for b in range(k - 1, 0, -1):
            for kind in _KINDS:
                rows = [r["shared"][b][kind] for r in res]
                refs = [ref for ref, _ in rows[0]]
                bursts = [[t for row in rows for t in row[i][1]] for i in range(windows)]
                b_speeds = _speeds(refs, bursts)
                spread = max(b_speeds) / min(b_speeds) - 1
                burst_s = statistics.median(refs)
                shared.append((k, b, statistics.median(b_speeds), burst_s, spread))
        if k == 2:
            extra_s = sum(r["sync_s"] for r in res) / len(res) - mean_s
            per_byte = max(extra_s, 0.0) / SYNC_BYTES
    return {
        "rank_speed": out,
        "rank_speed_tokens": tokens,
        "shared_rank_speed": shared,
        "collective_compute_s_per_byte": per_byte,
        "spreads": spreads,
    }
