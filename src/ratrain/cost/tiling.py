"""Tile planner: tile sizes, data movement and time of GEMM and attention on a tiered platform.

Pure Python (no torch). The tiled backend (`ratrain.kernels.tiled`) executes a `TilePlan`
move by move; the bytes it counts equal `TilePlan.bytes_moved` exactly (tested). This module
holds the public API and the GEMM model; `tiling_attention` the attention models (their time
in `tiling_attention_time`) and `tiling_core` the shared machinery.

The model
---------
A compute unit has on-chip tiers (fastest first; the first is the *compute tier*, where the
cores read their operands: MT-3000's per-core AM) above main memory (the last tier: DDR).
A kernel runs on the ``copies`` of the compute tier (one per core) in one of two shapes:

* **unstaged** (two levels, main -> compute tier): each core owns one unit of work at a time
  and streams its operands straight from main memory; units go to the cores in waves.
* **staged** (three levels, main -> staging tier -> compute tier): a *block* of ``p`` units
  runs on ``p`` cores at once; their stationary state stays in their own compute tier for
  the whole reduction, and the operand panels that all of them read are brought once per
  step into a shared staging tier (MT-3000: GSM or HBSM) and sent on from there to each core.
  Reuse across cores is what staging buys: main memory is read once per block, not per core.

One staging tier at most is used (a deeper chain would not cut main-memory traffic further:
that is set by the block the cores hold). The three operations, stationary state first:

* GEMM C(m, n) = A(m, k)·B(k, n) (+ bias): per core an fp32 C tile (mc x nc); A and B
  streamed in k-steps of kc; a block is a pr x pc grid of cores; staged k-steps of ks.
* attention forward, FlashAttention-2 (Dao 2023, Alg. 1): per core a unit = ``heads`` query
  heads sharing one kv head (GQA) x ``q`` rows: its Q tile, fp32 O, row max m and sum l;
  K and V streamed in steps of ``kv`` rows (staged steps of ``stage_step``), masked tiles
  skipped when causal. Writes O and the log-sum-exp (fp32).
* attention backward (FA-2, Alg. 2): per core a unit = ``kv`` key rows: K, V and fp32
  dK, dV; Q, dO, LSE and Δ streamed in steps of ``heads`` x ``q`` rows (staged panels of
  ``stage_step`` rows); dQ accumulated in fp32 by read-modify-write in main memory (or in
  the staged panel), the last visit writing the final dtype. Probabilities are recomputed
  from the LSE; no s x s tensor exists. A pre-pass computes Δ = rowsum(dO ∘ O).

Causal units do unequal work (a q tile near the start sees few keys), and a block lasts as
long as its busiest core; so a staged causal block may hold two units per core, the i-th
with the mirror (p·2-1-i)-th, which evens the cores' work without more main-memory traffic
(the stationary state per core doubles instead).

Every operand a tier receives has two buffers there (double buffering: the next step's load
overlaps this step's work); accumulators and score scratch have one. A plan fits when each
tier's buffers fit one copy of the tier.

Bytes are counted per ordered tier pair (``"ddr->gsm"``) as the data crosses: operands in
the input dtype, accumulators and statistics in fp32, final results in the input dtype.
FLOPs are matmul FLOPs of the tiles actually computed (2·m·n·k per GEMM; attention counts
whole diagonal tiles, so a causal kernel does a little more than half of s²).

Time: a step costs the larger of its DMA time and its work (compute, or the inner level's
pipeline over the step), summed over steps, plus the first load (fill) and the last store
(drain). A move costs latency + bytes / bandwidth; a path's bandwidth is its narrowest
boundary (`Tier.bandwidth_bytes_per_s` is per copy, to the next slower tier; main memory's
own figure, its streaming bandwidth, caps every path that reaches it), a shared boundary
split evenly among the cores using it; latency is the largest on the path. A core computes
at peak / cores. Blocks run one after another; unstaged units run in waves, taking
max(longest unit, total / cores). `bound` is "compute" when FLOPs / peak is at least the DMA
time of every boundary, else "dma".

Choice: every tile set that fits is ranked by a roofline estimate and by its main-memory
bytes (groups of tile sets that cannot make either list are skipped at once, on bounds of
both), and the best few by either are timed (`tiling_core.select`); among those predicted
within `TIME_SLACK` (5%) of the fastest, the one moving the fewest main-memory bytes is taken
(fewest moves on ties).
Main-memory traffic is the objective because DDR is the resource the rest of a training step
(gradient sync, optimizer updates, offload) competes for; the time constraint keeps it from
buying a few bytes with a slower kernel (tiny k-steps whose DMA setups dominate). With no
DMA latency and the compute tier alone, the chosen GEMM moves within 1.3x of the I/O lower
bound 2mnk/√M (tested).

Not modelled: compute efficiency inside a tile (cores run at peak), element-wise work
(exp, scaling, casts: no FLOPs, no time), on-chip moves of an epilogue (bias add,
normalisation) done in place, broadcast DMA (a panel sent to k cores counts k times),
contention beyond the bandwidth share, races of the dQ read-modify-write (taken as atomic, as
FA-2 does), more than one block at a time in a staged kernel, and ALiBi slopes and masks
(kernel arguments: not moved).
"""

from __future__ import annotations

import bisect
import functools
import math
from typing import NamedTuple

from ratrain.config import DTYPE_BYTES
from ratrain.cost.tiling_attention import plan_attention, plan_attention_backward
from ratrain.cost.tiling_core import (
    ACC_BYTES,
    TIME_SLACK,
    Hw,
    Priced,
    Shortlist,
    Tally,
    TilePlan,
    applies,
    ceil_div,
    chunks,
    edges,
    fits,
    hw_variants,
    make_plan,
    pipeline_s,
    platform_key,
    select,
    sizes,
    steps,
)
from ratrain.errors import RatrainError
from ratrain.platforms import Platform

__all__ = [
    "ACC_BYTES",
    "TIME_SLACK",
    "TilePlan",
    "applies",
    "plan_gemm",
    "plan_attention",
    "plan_attention_backward",
    "gemm_time_s",
    "attention_time_s",
    "gemm_io_lower_bound",
    "steps",
    "chunks",
]


def gemm_io_lower_bound(m: int, n: int, k: int, fast_words: int) -> float:
    """Words any C(m,n) = A(m,k)·B(k,n) must move with a fast memory of `fast_words` words:
    the leading term 2mnk/√M of Smith, Lowery, Langou & van de Geijn, "A Tight I/O Lower
    Bound for Matrix Multiplication" (arXiv:1702.02017, 2019); their full bound is
    2mnk/√M − 2M."""
    return 2.0 * m * n * k / math.sqrt(fast_words)


class _Gemm(NamedTuple):
    mc: int
    nc: int
    kc: int
    pr: int = 1
    pc: int = 1
    ks: int = 0  # staged k-step, a multiple of kc; kc when unstaged


def _buffers(hw: Hw, m, n, k, e, bias, c: _Gemm) -> dict[int, int]:
    mt, nt, kt = min(c.mc, m), min(c.nc, n), min(c.kc, k)
    out = {0: ACC_BYTES * mt * nt + 2 * e * kt * (mt + nt) + (e * nt if bias else 0)}
    if hw.stage is not None:
        bm, bn = min(c.pr * c.mc, m), min(c.pc * c.nc, n)
        out[hw.stage] = 2 * e * min(c.ks, k) * (bm + bn)
    return out


def _tally(hw: Hw, m, n, k, e, bias, c: _Gemm) -> Tally:
    t = Tally(hw)
    tm, tn = ceil_div(m, c.mc), ceil_div(n, c.nc)
    tiles = tm * tn
    if hw.stage is not None:
        bm, bn = c.pr * c.mc, c.pc * c.nc
        blocks = ceil_div(m, bm) * ceil_div(n, bn)
        panels = (m * k * ceil_div(n, bn) + k * n * ceil_div(m, bm)) * e
        t.add(hw.main, hw.stage, panels, 2 * blocks * ceil_div(k, c.ks))
    # Each core reads its A rows once per core column and its B columns once per core row.
    t.add(hw.src, 0, (m * k * tn + k * n * tm) * e, 2 * tiles * ceil_div(k, c.kc))
    if bias:
        t.add(hw.main, 0, n * tm * e, tiles)
    t.add(0, hw.main, m * n * e, tiles)
    return t


def _core_s(hw: Hw, mt, nt, kt, e, kc, active) -> float:
    """One core's pipeline over the k-steps of a k-range kt."""
    return pipeline_s(
        [
            (
                cnt,
                hw.move_s(0, hw.src, (mt + nt) * kk * e, active, 2),
                2 * mt * nt * kk / hw.core_flops,
            )
            for cnt, kk in edges(kt, kc)
        ]
    )


def _time(hw: Hw, m, n, k, e, bias, c: _Gemm) -> float:
    def drain(mt, nt, active):  # bias in, C out
        out = hw.move_s(0, hw.main, mt * nt * e, active)
        return out + (hw.move_s(0, hw.main, nt * e, active) if bias else 0.0)

    if hw.stage is None:
        active = min(hw.cores, ceil_div(m, c.mc) * ceil_div(n, c.nc))
        per = [
            (cm * cn, _core_s(hw, mt, nt, k, e, c.kc, active) + drain(mt, nt, active))
            for cm, mt in edges(m, c.mc)
            for cn, nt in edges(n, c.nc)
        ]
        return max(max(t for _, t in per), sum(cnt * t for cnt, t in per) / hw.cores)
    total = 0.0
    for cm, bm in edges(m, c.pr * c.mc):
        for cn, bn in edges(n, c.pc * c.nc):
            active = ceil_div(bm, c.mc) * ceil_div(bn, c.nc)
            mt, nt = min(c.mc, bm), min(c.nc, bn)
            groups = [
                (
                    cnt,
                    hw.move_s(hw.stage, hw.main, (bm + bn) * kt * e, 1, 2),
                    _core_s(hw, mt, nt, kt, e, c.kc, active),
                )
                for cnt, kt in edges(k, c.ks)
            ]
            total += cm * cn * (pipeline_s(groups) + drain(mt, nt, active))
    return total


@functools.lru_cache(maxsize=4096)
def _grids(cores: int, tm: int, tn: int) -> list[tuple[int, int]]:
    """Maximal core grids (pr x pc <= cores) that the tiles can fill."""
    out = {(pr, min(cores // pr, tn)) for pr in range(1, min(cores, tm) + 1)}
    return sorted(g for g in out if not any(o != g and o[0] >= g[0] and o[1] >= g[1] for o in out))


def _widest_nc(cap_bytes, nsz, m, k, e, bias, mc, kc) -> int | None:
    """The widest C tile (a candidate in nsz, all <= n) whose leaf buffers (see `_buffers`)
    fit cap_bytes: wider never moves more. The buffers grow linearly with the width."""
    mt, kt = min(mc, m), min(kc, k)
    per_col = ACC_BYTES * mt + 2 * e * kt + (e if bias else 0)
    i = bisect.bisect_right(nsz, (cap_bytes - 2 * e * kt * mt) // per_col)
    return nsz[i - 1] if i else None


def _link(hw: Hw, a: int, b: int) -> tuple[float, float]:
    """(seconds per move, bytes/s) of the boundary an "a->b" tally entry crosses."""
    _, bw, latency, _ = hw.link(a, b)
    return latency, bw


def _shortlist(hws: list[Hw], m, n, k, e, bias) -> Shortlist:
    """The base tile sets (see `select`): for each C tile height and k-step the widest C
    tile that fits, unstaged or on each maximal core grid of each staging tier with its
    finest staged step. Their estimates are those of `_tally` and `rank` in closed form,
    summed in the same order (ties read their last bits). Largest tiles first: they set a
    bar early that most of the small ones fall short of as a group."""
    short = Shortlist()
    nsz, cap0 = sizes(n, fine=True), hws[0].tiers[0].capacity_bytes
    ksz, cores = sizes(k, hi=256), hws[0].cores
    compute_s = min(2 * m * n * k / hw.peak_flops for hw in hws)
    for mc in reversed(sizes(m)):
        # A bar for the whole row: no tile set moves fewer bytes than with the widest C
        # tile (that of the shortest k-step) on a grid of all the cores each way.
        nc = _widest_nc(cap0, nsz, m, k, e, bias, mc, ksz[0])
        if nc is None:
            continue
        tm = ceil_div(m, mc)
        gm, gn = ceil_div(m, min(cores, tm) * mc), ceil_div(n, cores * nc)
        ddr_bytes = (m * k * gn + k * n * gm) * e + (n * tm * e if bias else 0) + m * n * e
        if short.beaten(compute_s, ddr_bytes):
            continue
        for kc in reversed(ksz):
            nc = _widest_nc(cap0, nsz, m, k, e, bias, mc, kc)
            if nc is not None:
                for hw in hws:
                    _add(short, hw, m, n, k, e, bias, mc, nc, kc)
    return short


def _add(short: Shortlist, hw: Hw, m, n, k, e, bias, mc, nc, kc):
    """`_shortlist` for one C tile and k-step on one platform variant."""
    tm, tn = ceil_div(m, mc), ceil_div(n, nc)
    tiles, c_bytes, b_bytes = tm * tn, m * n * e, n * tm * e if bias else 0
    a_bytes, a_moves = (m * k * tn + k * n * tm) * e, 2 * tiles * ceil_div(k, kc)
    compute_s = 2 * m * n * k / hw.peak_flops
    lat_m, bw_m = _link(hw, hw.main, 0)
    if hw.stage is None:
        # One "main->0" entry (A, B and the bias), then "0->main" (C).
        nb, nm = a_bytes + b_bytes, a_moves + (tiles if bias else 0)
        d = nm * lat_m + nb / bw_m
        d = d + tiles * lat_m + c_bytes / bw_m
        short.add(max(compute_s, d), nb + c_bytes, hw, _Gemm(mc, nc, kc, 1, 1, kc))
        return
    (lat_s, bw_s), (lat_0, bw_0) = _link(hw, hw.main, hw.stage), _link(hw, hw.stage, 0)
    d_0 = a_moves * lat_0 + a_bytes / bw_0  # "stage->0": A and B
    if bias:  # "main->0" (the bias), then "0->main" (C)
        d_m = tiles * lat_m + b_bytes / bw_m
        d_m = d_m + tiles * lat_m + c_bytes / bw_m
    else:
        d_m = tiles * lat_m + c_bytes / bw_m
    roof_s, ddr_out = max(compute_s, d_0, d_m), b_bytes + c_bytes
    # Panels of a pr x pc grid: (m·k·⌈n/(pc·nc)⌉ + k·n·⌈m/(pr·mc)⌉)·e, at least
    # 2·m·n·k·e / √(pr·pc·mc·nc) (AM-GM), pr·pc <= cores (less a rounding margin).
    panels_lb = 2 * m * n * k * e / math.sqrt(hw.cores * mc * nc) * (1 - 1e-9)
    if short.beaten(roof_s, panels_lb + ddr_out):
        return
    cap, kt2, k_steps = hw.tiers[hw.stage].capacity_bytes, 2 * e * min(kc, k), ceil_div(k, kc)
    for pr, pc in _grids(hw.cores, tm, tn):
        bm, bn = pr * mc, pc * nc
        if kt2 * (min(bm, m) + min(bn, n)) > cap:
            continue
        gm, gn = ceil_div(m, bm), ceil_div(n, bn)
        panels = (m * k * gn + k * n * gm) * e  # "main->stage"
        roof = max(roof_s, 2 * gm * gn * k_steps * lat_s + panels / bw_s)
        if not short.beaten(roof, panels + ddr_out):
            short.add(roof, panels + ddr_out, hw, _Gemm(mc, nc, kc, pr, pc, kc))


def _expand(hw: Hw, c: _Gemm, k: int):
    if hw.stage is None:
        return
    ks = c.ks
    while ks < k:
        ks = min(ks * 2, ceil_div(k, c.kc) * c.kc)
        yield _Gemm(c.mc, c.nc, c.kc, c.pr, c.pc, ks)


@functools.lru_cache(maxsize=1024)
def _plan_gemm(m, n, k, dtype, bias, tiers, peak, stage) -> TilePlan:
    e = DTYPE_BYTES[dtype]

    def price(hw, c):
        buffers = _buffers(hw, m, n, k, e, bias, c)
        if not fits(hw, buffers):
            return None
        return Priced(_tally(hw, m, n, k, e, bias, c), 2 * m * n * k, buffers)

    hw, c, p, time_s = select(
        _shortlist(hw_variants(tiers, peak, stage), m, n, k, e, bias),
        price,
        lambda hw, c: _expand(hw, c, k),
        lambda hw, c: _time(hw, m, n, k, e, bias, c),
    )
    shape = {"m": m, "n": n, "k": k, "bias": int(bias)}
    tile = {"m": min(c.mc, m), "n": min(c.nc, n), "k": min(c.kc, k)}
    return make_plan("gemm", shape, dtype, hw, tile, (c.pr, c.pc), c.ks, p, time_s)


def plan_gemm(
    m: int,
    n: int,
    k: int,
    dtype: str,
    platform: Platform,
    *,
    bias: bool = False,
    stage: str | None = "auto",
) -> TilePlan:
    """Tiles for C(m, n) = A(m, k) @ B(k, n) (+ bias(n)) in `dtype` with fp32 accumulation.
    stage: "auto" (the planner chooses), None (unstaged) or a staging tier's name."""
    if min(m, n, k) <= 0:
        raise RatrainError(f"GEMM dimensions must be positive, got m={m}, n={n}, k={k}")
    return _plan_gemm(m, n, k, dtype, bool(bias), *platform_key(platform, dtype, stage))


def gemm_time_s(m: int, n: int, k: int, dtype: str, platform: Platform) -> tuple[float, str]:
    """(time_s, bound) of the planned GEMM: the hook `ratrain.cost.compute` calls."""
    p = plan_gemm(m, n, k, dtype, platform)
    return p.time_s, p.bound


def attention_time_s(
    batch: int,
    heads: int,
    kv_heads: int,
    seq: int,
    head_dim: int,
    dtype: str,
    platform: Platform,
    *,
    causal: bool,
    backward: bool,
) -> tuple[float, str]:
    """(time_s, bound) of the planned attention: the hook `ratrain.cost.compute` calls."""
    plan = plan_attention_backward if backward else plan_attention
    p = plan(batch, heads, kv_heads, seq, head_dim, dtype, platform, causal=causal)
    return p.time_s, p.bound
