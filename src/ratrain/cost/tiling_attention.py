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

import bisect
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
    edges,
    fits,
    fitting,
    floor_sum,
    hw_variants,
    make_plan,
    pipeline_runs_s,
    pipeline_s,
    platform_key,
    rank,
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


def _busiest(keys: list, f: int, cost) -> float:
    """The work of a block's busiest core: per core (as `_pairs` assigns the units), the sum
    of cost(keys[i]) over its units, in their order. Units with equal keys cost the same, so
    each distinct core is costed once."""
    if f == 1:
        return max(cost(k) for k in set(keys))
    n = len(keys)
    h = n // 2
    costs = [cost(a) + cost(b) for a, b in set(zip(keys[:h], keys[: n - h - 1 : -1], strict=True))]
    if n % 2:
        costs.append(cost(keys[h]))
    return max(costs)


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


@functools.lru_cache(maxsize=4096)
def _fwd_block_ends(s, g, hg, br, block, causal) -> tuple[int, ...]:
    """Per block, the kv rows its units see (the last unit, q-tile-major order, sees most)."""
    units = (g // hg) * ceil_div(s, br)
    last = [min((j + 1) * block, units) - 1 for j in range(ceil_div(units, block))]
    return tuple(_fwd_vis(u // (g // hg), s, br, causal) for u in last)


def _fwd_tally(hw: Hw, b, h, kvh, s, d, e, causal, c: _Attn) -> tuple[Tally, int]:
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


def _fwd_time(hw: Hw, b, h, kvh, s, d, e, causal, c: _Attn, memo=None) -> float:
    """memo: figures that the timings of one plan share (keyed by what they depend on)."""
    memo = {} if memo is None else memo
    hgroups, nq = (h // kvh) // c.hg, ceil_div(s, c.br)
    if ("fwd rows", c.br) not in memo:  # rows and visible kv rows per q tile
        rows = [min(c.br, s - q * c.br) for q in range(nq)]
        memo["fwd rows", c.br] = rows, [_fwd_vis(q, s, c.br, causal) for q in range(nq)]
    rows, vis = memo["fwd rows", c.br]
    ends_of = memo.setdefault(("fwd ends", hw.stage, c.hg), {})
    step_of = memo.setdefault(("fwd step", hw.stage, c.hg), {})
    core_of = memo.setdefault(("fwd core", hw.stage, c.hg, c.bc), {})

    def ends(r, active):  # Q in; O and the LSE out
        if (r, active) not in ends_of:
            q_in = hw.move_s(0, hw.main, c.hg * r * d * e, active)
            out = hw.move_s(0, hw.main, c.hg * r * (d * e + ACC_BYTES), active, 2)
            ends_of[r, active] = q_in + out
        return ends_of[r, active]

    def step(r, t, active):  # (count, DMA, work) of a kv step of t rows (K and V in)
        if (r, t, active) not in step_of:
            dma = hw.move_s(0, hw.src, 2 * t * d * e, active, 2)
            step_of[r, t, active] = (dma, 4 * c.hg * r * t * d / hw.core_flops)
        return step_of[r, t, active]

    def core_s(r, v, active):  # one core's pipeline over v kv rows for a unit of r rows
        if (r, v, active) not in core_of:
            groups = [(n, *step(r, t, active)) for n, t in edges(v, c.bc)]
            core_of[r, v, active] = pipeline_s(groups)
        return core_of[r, v, active]

    if hw.stage is None:
        active = min(hw.cores, nq * hgroups * b * kvh)
        per = [ends(r, active) + core_s(r, v, active) for r, v in zip(rows, vis, strict=True)]
        per = [x for x in per for _ in range(hgroups)]  # per unit, q-tile-major
        return max(max(per), sum(per) * b * kvh / hw.cores)

    def block(key, u0, u1, low):
        """(rows, visible rows - low per unit, cores, the busiest core's ends, work memo)."""
        if key not in blocks:
            rs = [rows[u // hgroups] for u in range(u0, u1)]
            vs = [vis[u // hgroups] - low for u in range(u0, u1)]
            pairs = _pairs(u1 - u0, c.f)
            p = len(pairs)
            busy = max(sum(ends(rs[i], p) for i in pair) for pair in pairs)
            blocks[key] = (rs, vs, p, busy, {})
        return blocks[key]

    def work(blk, off, width):
        """Busiest core over the kv step [off, off + width) (relative to low)."""
        rs, vs, p, _, memo_w = blk
        # kv rows of the step each unit sees: none up to lo, all from hi (vs ascending).
        lo, hi = bisect.bisect_right(vs, off), bisect.bisect_left(vs, off + width)
        mid = tuple(v - off for v in vs[lo:hi])
        if (lo, mid, width) not in memo_w:
            seen = [0] * lo + list(mid) + [width] * (len(vs) - hi)
            keys = list(zip(rs, seen, strict=True))  # no rows: no work (0.0)
            memo_w[lo, mid, width] = _busiest(keys, c.f, lambda k: core_s(k[0], k[1], p))
        return memo_w[lo, mid, width]

    blocks = memo.setdefault(("fwd blocks", hw.stage, c.hg, c.br, c.bc, c.p, c.f), {})
    total, n_units = 0.0, nq * hgroups
    for u0 in range(0, n_units, c.block):
        u1 = min(u0 + c.block, n_units)
        q0, q1 = u0 // hgroups, (u1 - 1) // hgroups
        low, end = vis[q0], vis[q1]  # the kv rows its first and last units see
        # Relative to `low`, a block is its phase in the q-tile-major order and its size
        # (but for the last q tile's rows).
        blk = block((u0 % hgroups, u1 - u0) if q1 < nq - 1 else u0, u0, u1, low)
        # kv steps of bs rows up to `end`; those ending by `low` every unit sees in full.
        full = low // c.bs
        runs = [(full, 1, _kv_dma_s(hw, c.bs, d, e), work(blk, -c.bs, c.bs))]
        for k0 in range(full * c.bs, end, c.bs):
            k1 = min(k0 + c.bs, end)
            off = k0 - low if k1 > low else -(k1 - k0)
            runs.append((1, 1, _kv_dma_s(hw, k1 - k0, d, e), work(blk, off, k1 - k0)))
        total += pipeline_runs_s(runs) + blk[3]
    return total * b * kvh


def _kv_dma_s(hw: Hw, width, d, e) -> float:
    """A staged forward step: K and V, `width` rows each, into the staging tier."""
    return hw.move_s(hw.stage, hw.main, 2 * width * d * e, 1, 2)


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


def _bwd_tally(hw: Hw, b, h, kvh, s, d, e, causal, c: _Attn) -> tuple[Tally, int]:
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


def _bwd_time(hw: Hw, b, h, kvh, s, d, e, causal, c: _Attn, memo=None) -> float:
    """memo: as in `_fwd_time`."""
    memo = {} if memo is None else memo
    hgroups, nu = (h // kvh) // c.hg, ceil_div(s, c.bc)
    # Δ pre-pass: DMA only, its tiles spread over the cores.
    tiles = hgroups * ceil_div(s, c.br) * b * kvh
    active = min(hw.cores, tiles)
    row_bytes = c.hg * min(c.br, s) * (2 * d * e + ACC_BYTES)
    total = tiles * hw.move_s(0, hw.main, row_bytes, active, 3) / active
    step_of = memo.setdefault(("bwd step", hw.stage, c.hg), {})
    core_of = memo.setdefault(("bwd core", hw.stage, c.hg, c.br), {})

    def kv_s(t, active):  # K, V in; dK, dV out
        return 2 * hw.move_s(0, hw.main, 2 * t * d * e, active, 2)

    def step(t, r, active, load):  # (DMA, work) of a q step of r rows for t keys
        if (t, r, active, load) not in step_of:
            rows = c.hg * r  # Q, dO, LSE, Δ and dQ (out, and in when load) per row
            nbytes = rows * (2 * d * e + 2 * ACC_BYTES) + rows * d * ACC_BYTES * (1 + load)
            dma = hw.move_s(0, hw.src, nbytes, active, 5 + load)
            step_of[t, r, active, load] = (dma, 10 * rows * t * d / hw.core_flops)
        return step_of[t, r, active, load]

    def core_s(t, rows, active, load, reps=1):
        """A unit of t keys over the q steps of `rows` rows (cut at br), `reps` times."""
        key = (t, rows, active, load, reps)
        if key not in core_of:
            groups = [(n * reps, *step(t, r, active, load)) for n, r in edges(rows, c.br)]
            core_of[key] = pipeline_s(groups)
        return core_of[key]

    if hw.stage is None:
        active = min(hw.cores, nu * b * kvh)
        per = [
            kv_s(c1 - c0, active)
            + core_s(c1 - c0, _seen(s, c0, c.br, causal), active, u > 0, hgroups)
            for u, (c0, c1) in enumerate(steps(0, s, c.bc))
        ]
        return total + max(max(per), sum(per) * b * kvh / hw.cores)

    def block(n, later, t_last):
        """(keys per unit, first keys relative to the block's, dQ loads, cores, busiest end,
        work memo) of a block of n units, the last t_last keys long."""
        if (n, later, t_last) not in blocks:
            ts, rel = [c.bc] * (n - 1) + [t_last], [i * c.bc for i in range(n)]
            loads = [later or i > 0 for i in range(n)]  # dQ loaded (all but unit 0)
            pairs = _pairs(n, c.f)
            p = len(pairs)
            busy = max(sum(kv_s(ts[i], p) for i in pair) for pair in pairs)
            blocks[n, later, t_last] = (ts, rel, loads, p, busy, {})
        return blocks[n, later, t_last]

    def work(blk, off, width):
        """Busiest core over the q step [off, off + width) (relative to the first key)."""
        ts, rel, loads, p, _, memo_w = blk
        # Rows each unit sees: all up to lo (first keys before off + br), none from hi (those
        # that skip every q step of the step).
        lo = bisect.bisect_left(rel, off + c.br) if causal else len(rel)
        hi = bisect.bisect_left(rel, off + ceil_div(width, c.br) * c.br) if causal else lo
        mid = tuple(max(0, width - (r - off) // c.br * c.br) for r in rel[lo:hi])
        if (lo, mid, width) not in memo_w:
            seen = [width] * lo + list(mid) + [0] * (len(rel) - hi)
            keys = list(zip(ts, seen, loads, strict=True))
            memo_w[lo, mid, width] = _busiest(keys, c.f, lambda k: core_s(k[0], k[1], p, k[2]))
        return memo_w[lo, mid, width]

    def dma_s(width, later):  # a staged q step in (with dQ partials when later)
        rows = c.hg * width
        nbytes = rows * (2 * d * e + 2 * ACC_BYTES) + rows * d * ACC_BYTES * (1 + later)
        return hw.move_s(hw.stage, hw.main, nbytes, 1, 5 + later)

    blocks = memo.setdefault(("bwd blocks", hw.stage, c.hg, c.br, c.bc, c.p, c.f), {})
    n_steps = ceil_div(s, c.bs)
    for j, u0 in enumerate(range(0, nu, c.block)):
        u1, later = min(u0 + c.block, nu), j > 0
        c_lo, c_hi = u0 * c.bc, (u1 - 1) * c.bc  # first keys of its first and last units
        blk = block(u1 - u0, later, min(s, u1 * c.bc) - c_hi)
        # q steps of bs rows: causal, those ending before c_lo are skipped, and those from
        # c_hi - br + 1 on every unit sees in full (all of them when not causal).
        first = c_lo // c.bs if causal else 0
        fast = max(first, ceil_div(c_hi - c.br + 1, c.bs)) if causal else 0
        runs = []
        for a0 in range(first * c.bs, min(fast, n_steps) * c.bs, c.bs):
            w = min(a0 + c.bs, s) - a0
            runs.append((1, hgroups, dma_s(w, later), work(blk, a0 - c_lo, w)))
        # Seen in full: relative to c_lo, the step [c_hi - c_lo, +w) (any from there on).
        runs.append((s // c.bs - fast, hgroups, dma_s(c.bs, later), work(blk, c_hi - c_lo, c.bs)))
        if s % c.bs and fast < n_steps:
            w = s % c.bs
            runs.append((1, hgroups, dma_s(w, later), work(blk, c_hi - c_lo, w)))
        total += (pipeline_runs_s(runs) + blk[4]) * b * kvh
    return total


def _seen(s: int, c0: int, br: int, causal: bool) -> int:
    """Rows of the q steps (of br rows, aligned at 0) that keys from c0 on see."""
    return max(0, s - max(0, c0 // br) * br) if causal else s


# --- choice ----------------------------------------------------------------------------------


def _bases(hws: list[Hw], s, g, buffers, inner, units, causal):
    """(hw, cfg) candidates that fit, with the finest staged step; inner(cfg) is the per-core
    step the staged step is a multiple of, units(cfg) the units of one kv head. Staged blocks
    may pair units on a core when causal (their work differs). The buffers grow with the kv
    tile (bc), so the kv tiles that fit are the smallest few."""
    sz = sizes(s, lo=min(s, 8))
    for hg in _divisors(g):
        for br in sz:
            for hw in hws:
                for f in (1, 2) if causal and hw.stage is not None else (1,):

                    def cfg(bc, hg=hg, br=br, hw=hw, f=f):
                        base = _Attn(hg, br, bc, 0)
                        p = 1 if hw.stage is None else min(hw.cores, ceil_div(units(base), f))
                        return _Attn(hg, br, bc, inner(base), p, f)

                    n = fitting(lambda bc, hw=hw, cfg=cfg: fits(hw, buffers(hw, cfg(bc))), sz)
                    yield from ((hw, cfg(bc)) for bc in sz[:n])


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
        buf = buffers(hw, s, d, e, c)
        return Priced(*tally(hw, b, h, kvh, s, d, e, causal, c), buf) if fits(hw, buf) else None

    hws, memo = hw_variants(tiers, peak, stage), {}
    bases = _bases(hws, s, g, lambda hw, c: buffers(hw, s, d, e, c), inner, units, causal)
    ranked = []
    for hw, c in bases:
        ranked.append((*rank(hw, *tally(hw, b, h, kvh, s, d, e, causal, c)), hw, c))
    hw, c, p, time_s = select(
        ranked,
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
