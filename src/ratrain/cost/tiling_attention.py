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

from ratrain.config import DTYPE_BYTES
from ratrain.cost.tiling_attention_time import AttnTiling, bwd_time_s, fwd_time_s, fwd_vis
from ratrain.cost.tiling_core import (
    ACC_BYTES,
    Hw,
    Priced,
    Shortlist,
    Tally,
    TilePlan,
    ceil_div,
    fits,
    fitting,
    floor_sum,
    hw_variants,
    make_plan,
    platform_key,
    rank,
    select,
    sizes,
)
from ratrain.errors import RatrainError
from ratrain.platforms import Platform

__all__ = ["plan_attention", "plan_attention_backward"]


def _divisors(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0]


# --- forward ---------------------------------------------------------------------------------


def _fwd_buffers(hw: Hw, s, d, e, c: AttnTiling) -> dict[int, int]:
    r, t = c.hg * min(c.br, s), min(c.bc, s)
    # Q (x2) in dtype; fp32 O, m, l and the score tile; K and V (x2 each).
    out = {0: c.f * (2 * r * d * e + ACC_BYTES * r * (d + 2 + t) + 4 * t * d * e)}
    if hw.stage is not None:
        out[hw.stage] = 4 * min(c.bs, s) * d * e
    return out


@functools.lru_cache(maxsize=4096)
def _fwd_block_ends(s, g, hg, br, block, causal) -> tuple[int, ...]:
    """Per block, the kv rows its units see (the last unit, q-tile-major order, sees most)."""
    units = (g // hg) * ceil_div(s, br)
    last = [min((j + 1) * block, units) - 1 for j in range(ceil_div(units, block))]
    return tuple(fwd_vis(u // (g // hg), s, br, causal) for u in last)


def _fwd_tally(hw: Hw, b, h, kvh, s, d, e, causal, c: AttnTiling) -> tuple[Tally, int]:
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
        ends = _fwd_block_ends(s, g, c.hg, c.br, c.block, causal)
        t.add(hw.main, hw.stage, 2 * sum(ends) * d * e, 2 * sum([-(-x // c.bs) for x in ends]))
    t.add(hw.src, 0, 2 * hgroups * vis * d * e, 2 * hgroups * nsub)  # K, V
    return t.scale(b * kvh), 4 * d * g * rv * b * kvh


# --- backward --------------------------------------------------------------------------------


def _bwd_buffers(hw: Hw, s, d, e, c: AttnTiling) -> dict[int, int]:
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


def _bwd_tally(hw: Hw, b, h, kvh, s, d, e, causal, c: AttnTiling) -> tuple[Tally, int]:
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
    return t.scale(b * kvh), flops * b * kvh


# --- choice ----------------------------------------------------------------------------------


def _rows(hws: list[Hw], s, g, buffers, inner, units, causal):
    """The candidates that fit, with the finest staged step, as rows (hw, [cfg]) that differ
    in the kv tile (bc) alone, smallest first; inner(cfg) is the per-core step the staged
    step is a multiple of, units(cfg) the units of one kv head. Staged blocks may pair units
    on a core when causal (their work differs). The buffers grow with bc, so the kv tiles
    that fit are the smallest few. Larger head groups (less traffic) and smaller q tiles
    (less work wasted in diagonal tiles) first: good ones early make a bar the rest miss."""
    sz = sizes(s, lo=min(s, 8))
    for hg in reversed(_divisors(g)):
        for br in sz:
            for hw in hws:
                for f in (1, 2) if causal and hw.stage is not None else (1,):

                    def cfg(bc, hg=hg, br=br, hw=hw, f=f):
                        base = AttnTiling(hg, br, bc, 0)
                        p = 1 if hw.stage is None else min(hw.cores, ceil_div(units(base), f))
                        return AttnTiling(hg, br, bc, inner(base), p, f)

                    n = fitting(lambda bc, hw=hw, cfg=cfg: fits(hw, buffers(hw, cfg(bc))), sz)
                    if n:
                        yield hw, [cfg(bc) for bc in sz[:n]]


def _expand(hw: Hw, c: AttnTiling, s: int, step: int):
    if hw.stage is None:
        return
    bs = c.bs
    while bs < s:
        bs = min(bs * 2, ceil_div(s, step) * step)
        yield AttnTiling(c.hg, c.br, c.bc, bs, c.p, c.f)


def _model(op, s, g):
    """(buffers, tally, timing, inner, units) of "attention" or "attention_backward"; inner
    and units as in `_rows`."""
    if op == "attention":
        inner, units = (lambda c: c.bc), (lambda c: (g // c.hg) * ceil_div(s, c.br))
        return _fwd_buffers, _fwd_tally, fwd_time_s, inner, units
    inner, units = (lambda c: c.br), (lambda c: ceil_div(s, c.bc))
    return _bwd_buffers, _bwd_tally, bwd_time_s, inner, units


def _shortlist(op, b, h, kvh, s, d, e, causal, hws: list[Hw]) -> Shortlist:
    """The candidates of `_rows`, ranked (see `select`), but those that cannot make the
    lists. A forward row moves the same bytes in the same FLOPs whatever its kv tile, and
    fewer moves (so no more time at any boundary) the wider the tile: widest first, it ends
    at the first that cannot."""
    buffers, tally, _, inner, units = _model(op, s, h // kvh)
    short = Shortlist()
    rows = _rows(hws, s, h // kvh, lambda hw, c: buffers(hw, s, d, e, c), inner, units, causal)
    for hw, cfgs in rows:
        if op == "attention":
            for c in reversed(cfgs):
                roof_s, ddr = rank(hw, *tally(hw, b, h, kvh, s, d, e, causal, c))
                if short.beaten(roof_s, ddr):
                    break
                short.add(roof_s, ddr, hw, c)
            continue
        for c in cfgs:
            t, flops = tally(hw, b, h, kvh, s, d, e, causal, c)
            if not short.beaten(flops / hw.peak_flops, t.ddr):  # no faster than compute
                short.add(*rank(hw, t, flops), hw, c)
    return short


@functools.lru_cache(maxsize=512)
def _plan(op, b, h, kvh, s, d, dtype, causal, tiers, peak, stage) -> TilePlan:
    e = DTYPE_BYTES[dtype]
    buffers, tally, timing, inner, _ = _model(op, s, h // kvh)

    def price(hw, c):
        buf = buffers(hw, s, d, e, c)
        return Priced(*tally(hw, b, h, kvh, s, d, e, causal, c), buf) if fits(hw, buf) else None

    hws, memo = hw_variants(tiers, peak, stage), {}
    hw, c, p, time_s = select(
        _shortlist(op, b, h, kvh, s, d, e, causal, hws),
        price,
        lambda hw, c: _expand(hw, c, s, inner(c)),
        lambda hw, c: timing(hw, b, h, kvh, s, d, e, causal, c, memo),
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
