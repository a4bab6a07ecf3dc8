"""Tile model of attention, forward and backward (FlashAttention-2 style), on tiered memory.

Pure Python (no torch). The model and its vocabulary are described in `ratrain.cost.tiling`;
the tiled backend's executors (`ratrain.kernels.tiled_attention`) follow the loops that the
tallies below count in closed form.

Forward, per (batch, kv head): units are (q tile, head group) pairs in q-tile-major order,
``heads`` query heads x ``q`` rows each; a unit sees kv rows [0, a1) when causal (a1: its
last row + 1), all of them otherwise. Blocks are runs of ``p`` x ``f`` consecutive units;
with ``f`` = 2 core i runs the block's i-th and (n-1-i)-th units (causal balance).

Backward, per (batch, kv head): units are kv tiles of ``kv`` rows; q steps of ``heads`` x
``q`` rows aligned at 0; a unit starting at key c0 sees the q steps whose last row is >= c0
when causal; blocks and pairs as in the forward. Staged q panels of ``stage_step`` rows (a
multiple of ``q``) are loaded once per block. dQ: the first unit (keys from 0, which every row sees) starts it from zero; the
last visit of a q step or panel writes the dtype, the others fp32 partial sums.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ratrain.config import DTYPE_BYTES
from ratrain.cost.tiling_core import (
    ACC_BYTES,
    Hw,
    Priced,
    Tally,
    TilePlan,
    ceil_div,
    chunks,
    edges,
    fits,
    floor_sum,
    hw_variants,
    make_plan,
    pipeline_s,
    platform_key,
    roof_s,
    select,
    sizes,
    steps,
)
from ratrain.errors import RatrainError
from ratrain.platforms import Platform

__all__ = ["plan_attention", "plan_attention_backward"]


@dataclass(frozen=True, order=True)
class _Attn:
    hg: int  # query heads per unit (forward) or per q step (backward), dividing the group
    br: int  # q rows per unit (forward) or per q step (backward)
    bc: int  # kv rows per step (forward) or per unit (backward)
    bs: int  # staged step, a multiple of bc (forward) or br (backward); that step if unstaged
    p: int = 1  # cores per block
    f: int = 1  # units per core in a block (2: a causal unit paired with its mirror)

    @property
    def block(self) -> int:
        return self.p * self.f


def _pairs(n: int, f: int) -> list[list[int]]:
    """The units (indices in a block of n) each core runs: one each, or with f = 2 the i-th
    with the (n-1-i)-th, so that a short causal unit and a long one share a core."""
    if f == 1:
        return [[i] for i in range(n)]
    return [sorted({i, n - 1 - i}) for i in range(ceil_div(n, 2))]


def _divisors(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0]


# --- forward ---------------------------------------------------------------------------------


def _fwd_buffers(hw: Hw, s, d, e, c: _Attn) -> dict[int, int]:
    r, t = c.hg * min(c.br, s), min(c.bc, s)
    # Q (x2) in dtype; fp32 O, m, l and the score tile; K and V (x2 each).
    out = {0: c.f * (2 * r * d * e + ACC_BYTES * r * (d + 2 + t) + 4 * t * d * e)}
    if hw.stage is not None:
        out[hw.stage] = 4 * min(c.bs, s) * d * e
    return out


def _fwd_vis(i: int, s: int, br: int, causal: bool) -> int:
    """Kv rows that q tile i sees."""
    return min(s, (i + 1) * br) if causal else s


def _fwd_block_ends(s, g, c: _Attn, causal) -> list[int]:
    """Per block, the kv rows its units see (the last unit, q-tile-major order, sees most)."""
    units = (g // c.hg) * ceil_div(s, c.br)
    last = [min((j + 1) * c.block, units) - 1 for j in range(ceil_div(units, c.block))]
    return [_fwd_vis(u // (g // c.hg), s, c.br, causal) for u in last]


def _fwd_tally(hw: Hw, b, h, kvh, s, d, e, causal, c: _Attn) -> Priced:
    g = h // kvh
    hgroups, nq = g // c.hg, ceil_div(s, c.br)
    r_last = s - (nq - 1) * c.br
    if causal:  # q tile i sees min(s, (i+1)·br) kv rows
        vis = c.br * (nq - 1) * nq // 2 + s
        nsub = floor_sum(nq - 1, c.bc, c.br, c.br + c.bc - 1) + ceil_div(s, c.bc)
        rv = c.br * c.br * (nq - 1) * nq // 2 + r_last * s  # Σ rows x visible rows
    else:
        vis, nsub, rv = nq * s, nq * ceil_div(s, c.bc), s * s
    t = Tally(hw)
    t.add(hw.main, 0, g * s * d * e, hgroups * nq)  # Q
    t.add(0, hw.main, g * s * (d * e + ACC_BYTES), 2 * hgroups * nq)  # O and the LSE
    if hw.stage is not None:
        ends = _fwd_block_ends(s, g, c, causal)
        t.add(hw.main, hw.stage, 2 * sum(ends) * d * e, 2 * sum(ceil_div(x, c.bs) for x in ends))
    t.add(hw.src, 0, 2 * hgroups * vis * d * e, 2 * hgroups * nsub)  # K, V
    buffers = _fwd_buffers(hw, s, d, e, c)
    return Priced(t.scale(b * kvh), 4 * d * g * rv * b * kvh, buffers)


def _fwd_core_s(hw: Hw, r, v, c: _Attn, d, e, active) -> float:
    """One core's pipeline over v kv rows (steps of bc) for a unit of r rows."""
    groups = [
        (n, hw.move_s(0, hw.src, 2 * t * d * e, active, 2), 4 * c.hg * r * t * d / hw.core_flops)
        for n, t in edges(v, c.bc)
    ]
    return pipeline_s(groups)


def _fwd_time(hw: Hw, b, h, kvh, s, d, e, causal, c: _Attn) -> float:
    g = h // kvh
    units = [
        (a1 - a0, _fwd_vis(i, s, c.br, causal))
        for i, (a0, a1) in enumerate(steps(0, s, c.br))
        for _ in range(g // c.hg)
    ]

    def ends(r, active):  # Q in; O and the LSE out
        q_in = hw.move_s(0, hw.main, c.hg * r * d * e, active)
        return q_in + hw.move_s(0, hw.main, c.hg * r * (d * e + ACC_BYTES), active, 2)

    @functools.cache
    def core_s(r, v, active):
        return _fwd_core_s(hw, r, v, c, d, e, active)

    if hw.stage is None:
        active = min(hw.cores, len(units) * b * kvh)
        per = [ends(r, active) + core_s(r, v, active) for r, v in units]
        return max(max(per), sum(per) * b * kvh / hw.cores)
    total = 0.0
    for blk in chunks(units, c.block):
        pairs = [tuple(blk[i] for i in ids) for ids in _pairs(len(blk), c.f)]
        end, p, pairs = max(v for _, v in blk), len(pairs), set(pairs)
        groups = []
        for k0, k1 in steps(0, end, c.bs):
            work = max(
                sum(core_s(r, min(k1, v) - k0, p) for r, v in pair if v > k0) for pair in pairs
            )
            groups.append((1, hw.move_s(hw.stage, hw.main, 2 * (k1 - k0) * d * e, 1, 2), work))
        total += pipeline_s(groups) + max(sum(ends(r, p) for r, _ in pair) for pair in pairs)
    return total * b * kvh


# --- backward --------------------------------------------------------------------------------


def _bwd_buffers(hw: Hw, s, d, e, c: _Attn) -> dict[int, int]:
    r, t = c.hg * min(c.br, s), min(c.bc, s)
    kv = 4 * t * d * e + 2 * ACC_BYTES * t * d  # K, V (x2) and fp32 dK, dV
    stream = 4 * r * d * e + 4 * ACC_BYTES * r + 2 * ACC_BYTES * r * d  # Q, dO, LSE, Δ, dQ (x2)
    out = {0: c.f * (kv + stream + 2 * ACC_BYTES * r * t)}  # + the P and dS tiles
    if hw.stage is not None:
        pr = c.hg * min(c.bs, s)
        out[hw.stage] = 4 * pr * d * e + 4 * ACC_BYTES * pr + 2 * ACC_BYTES * pr * d
    return out


def _bwd_sums(s: int, step: int, starts: int, stride: int, causal: bool) -> tuple[int, int]:
    """Σ over key offsets c0 = j·stride, j < starts, of (rows, steps) of the q steps of size
    `step` (aligned at 0) whose last row is >= c0: all of them unless causal."""
    n = ceil_div(s, step)
    skipped = floor_sum(starts, step, stride, 0) if causal else 0
    return starts * s - skipped * step, starts * n - skipped


def _bwd_tally(hw: Hw, b, h, kvh, s, d, e, causal, c: _Attn) -> Priced:
    g = h // kvh
    hgroups = g // c.hg
    nu, nr = ceil_div(s, c.bc), ceil_div(s, c.br)
    row_in = 2 * d * e + 2 * ACC_BYTES  # Q, dO, LSE, Δ per row and head
    dq = d * ACC_BYTES
    t = Tally(hw)
    t.add(hw.main, 0, 2 * g * s * d * e, 2 * hgroups * nr)  # Δ pre-pass: O, dO in
    t.add(0, hw.main, g * s * ACC_BYTES, hgroups * nr)  # Δ out
    t.add(hw.main, 0, 2 * s * d * e, 2 * nu)  # K, V
    t.add(0, hw.main, 2 * s * d * e, 2 * nu)  # dK, dV
    rows, n = _bwd_sums(s, c.br, nu, c.bc, causal)  # over the units
    t.add(hw.src, 0, g * rows * row_in, 4 * hgroups * n)
    t.add(hw.src, 0, g * (rows - s) * dq, hgroups * (n - nr))  # dQ in, but for unit 0
    if hw.stage is None:
        vis, n_vis, step = rows, n, c.br
    else:
        t.add(0, hw.stage, g * rows * dq, hgroups * n)
        vis, n_vis = _bwd_sums(s, c.bs, ceil_div(nu, c.block), c.block * c.bc, causal)  # blocks
        step, n_pan = c.bs, ceil_div(s, c.bs)
        t.add(hw.main, hw.stage, g * vis * row_in, 4 * hgroups * n_vis)
        t.add(hw.main, hw.stage, g * (vis - s) * dq, hgroups * (n_vis - n_pan))
    # dQ out to main memory: one dtype store per q step (its last visit), fp32 otherwise.
    n_step = ceil_div(s, step)
    t.add(hw.src if hw.stage is not None else 0, hw.main, g * s * d * e, hgroups * n_step)
    t.add(
        hw.src if hw.stage is not None else 0,
        hw.main,
        g * (vis - s) * dq,
        hgroups * (n_vis - n_step),
    )
    # FLOPs: 5 tile GEMMs of 2·rows·kv·d each (S, dP, dV, dK, dQ) over the visible steps.
    t_last = s - (nu - 1) * c.bc
    rows_last = s - ((nu - 1) * c.bc // c.br) * c.br if causal else s
    flops = 10 * d * g * (c.bc * rows - (c.bc - t_last) * rows_last)
    return Priced(t.scale(b * kvh), flops * b * kvh, _bwd_buffers(hw, s, d, e, c))


def _bwd_core_s(hw: Hw, c: _Attn, d, e, t, sub, active, dq_load: bool) -> float:
    """One core's pipeline over q steps `sub` = [(count, rows)] for a unit of t kv rows."""
    groups = []
    for n, r in sub:
        rows = c.hg * r
        nbytes = rows * (2 * d * e + 2 * ACC_BYTES) + rows * d * ACC_BYTES * (1 + dq_load)
        dma = hw.move_s(0, hw.src, nbytes, active, 5 + dq_load)
        groups.append((n, dma, 10 * rows * t * d / hw.core_flops))
    return pipeline_s(groups)


def _bwd_time(hw: Hw, b, h, kvh, s, d, e, causal, c: _Attn) -> float:
    hgroups = (h // kvh) // c.hg
    units = steps(0, s, c.bc)
    # Δ pre-pass: DMA only, its tiles spread over the cores.
    tiles = hgroups * ceil_div(s, c.br) * b * kvh
    active = min(hw.cores, tiles)
    row_bytes = c.hg * min(c.br, s) * (2 * d * e + ACC_BYTES)
    total = tiles * hw.move_s(0, hw.main, row_bytes, active, 3) / active

    def kv_s(t, active):  # K, V in; dK, dV out
        return 2 * hw.move_s(0, hw.main, 2 * t * d * e, active, 2)

    @functools.cache
    def core_s(t, rows, active, load, reps=1):
        """A unit of t keys over the q steps of `rows` rows (cut at br), `reps` times."""
        sub = [(n * reps, r) for n, r in edges(rows, c.br)]
        return _bwd_core_s(hw, c, d, e, t, sub, active, load)

    def seen(a0, a1, c0):  # rows of the q steps of [a0, a1) that keys from c0 on see
        skip = max(0, (c0 - a0) // c.br) if causal else 0
        return max(0, a1 - a0 - skip * c.br)

    if hw.stage is None:
        active = min(hw.cores, len(units) * b * kvh)
        per = [
            kv_s(c1 - c0, active) + core_s(c1 - c0, seen(0, s, c0), active, u > 0, hgroups)
            for u, (c0, c1) in enumerate(units)
        ]
        return total + max(max(per), sum(per) * b * kvh / hw.cores)
    for j, blk in enumerate(chunks(units, c.block)):
        pairs, c_lo = _pairs(len(blk), c.f), blk[0][0]
        p = len(pairs)
        groups = []
        for a0, a1 in steps(0, s, c.bs):
            if causal and a1 - 1 < c_lo:
                continue
            rows = c.hg * (a1 - a0)
            nbytes = rows * (2 * d * e + 2 * ACC_BYTES) + rows * d * ACC_BYTES * (1 + (j > 0))
            dma = hw.move_s(hw.stage, hw.main, nbytes, 1, 5 + (j > 0))
            work = max(
                sum(
                    core_s(blk[i][1] - blk[i][0], seen(a0, a1, blk[i][0]), p, j > 0 or i > 0)
                    for i in pair
                )
                for pair in pairs
            )
            groups.append((hgroups, dma, work))
        ends = max(sum(kv_s(blk[i][1] - blk[i][0], p) for i in pair) for pair in pairs)
        total += (pipeline_s(groups) + ends) * b * kvh
    return total


# --- choice ----------------------------------------------------------------------------------


def _bases(hws: list[Hw], s, g, buffers, inner, units, causal):
    """(hw, cfg) candidates that fit, with the finest staged step; inner(cfg) is the per-core
    step the staged step is a multiple of, units(cfg) the units of one kv head. Staged blocks
    may pair units on a core when causal (their work differs)."""
    sz = sizes(s, lo=min(s, 8))
    for hg in _divisors(g):
        for br in sz:
            for bc in sz:
                base = _Attn(hg, br, bc, 0)
                step = inner(base)
                for hw in hws:
                    for f in (1, 2) if causal and hw.stage is not None else (1,):
                        p = 1 if hw.stage is None else min(hw.cores, ceil_div(units(base), f))
                        cfg = _Attn(hg, br, bc, step, p, f)
                        if fits(hw, buffers(hw, cfg)):
                            yield hw, cfg


def _expand(hw: Hw, c: _Attn, s: int, step: int):
    if hw.stage is None:
        return
    bs = c.bs
    while bs < s:
        bs = min(bs * 2, ceil_div(s, step) * step)
        yield _Attn(c.hg, c.br, c.bc, bs, c.p, c.f)


@functools.lru_cache(maxsize=512)
def _plan(op, b, h, kvh, s, d, dtype, causal, tiers, peak, stage) -> TilePlan:
    e, g = DTYPE_BYTES[dtype], h // kvh
    fwd = op == "attention"
    buffers = _fwd_buffers if fwd else _bwd_buffers
    tally = _fwd_tally if fwd else _bwd_tally
    timing = _fwd_time if fwd else _bwd_time
    if fwd:
        inner, units = (lambda c: c.bc), (lambda c: (g // c.hg) * ceil_div(s, c.br))
    else:
        inner, units = (lambda c: c.br), (lambda c: ceil_div(s, c.bc))

    def price(hw, c):
        if not fits(hw, buffers(hw, s, d, e, c)):
            return None
        return tally(hw, b, h, kvh, s, d, e, causal, c)

    hws = hw_variants(tiers, peak, stage)
    bases = _bases(hws, s, g, lambda hw, c: buffers(hw, s, d, e, c), inner, units, causal)
    ranked = []
    for hw, c in bases:
        p = tally(hw, b, h, kvh, s, d, e, causal, c)
        ranked.append((roof_s(hw, p), p.tally.ddr, hw, c))
    hw, c, p, time_s = select(
        ranked,
        price,
        lambda hw, c: _expand(hw, c, s, inner(c)),
        lambda hw, c: timing(hw, b, h, kvh, s, d, e, causal, c),
    )
    shape = {"batch": b, "heads": h, "kv_heads": kvh, "seq": s, "head_dim": d}
    shape["causal"] = int(causal)
    tile = {"heads": c.hg, "q": min(c.br, s), "kv": min(c.bc, s)}
    return make_plan(op, shape, dtype, hw, tile, (c.p, c.f), c.bs, p, time_s)


def _entry(op, batch, heads, kv_heads, seq, head_dim, dtype, platform, causal, stage) -> TilePlan:
    if min(batch, heads, kv_heads, seq, head_dim) <= 0 or heads % kv_heads:
        raise RatrainError(
            f"attention needs positive sizes and kv_heads dividing heads, got batch={batch}, "
            f"heads={heads}, kv_heads={kv_heads}, seq={seq}, head_dim={head_dim}"
        )
    key = platform_key(platform, dtype, stage)
    return _plan(op, batch, heads, kv_heads, seq, head_dim, dtype, bool(causal), *key)


def plan_attention(
    batch: int,
    heads: int,
    kv_heads: int,
    seq: int,
    head_dim: int,
    dtype: str,
    platform: Platform,
    *,
    causal: bool = True,
    stage: str | None = "auto",
) -> TilePlan:
    """Tiles for the attention forward (FlashAttention-2 style; GQA when kv_heads < heads).
    stage: "auto" (the planner chooses), None (unstaged) or a staging tier's name."""
    args = (batch, heads, kv_heads, seq, head_dim, dtype, platform, causal, stage)
    return _entry("attention", *args)


def plan_attention_backward(
    batch: int,
    heads: int,
    kv_heads: int,
    seq: int,
    head_dim: int,
    dtype: str,
    platform: Platform,
    *,
    causal: bool = True,
    stage: str | None = "auto",
) -> TilePlan:
    """Tiles for the attention backward (FlashAttention-2 style, P recomputed from the LSE).
    stage: as in `plan_attention`."""
    args = (batch, heads, kv_heads, seq, head_dim, dtype, platform, causal, stage)
    return _entry("attention_backward", *args)
