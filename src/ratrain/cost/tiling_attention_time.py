"""Time model of the tiled attention, forward and backward (`ratrain.cost.tiling_attention`
describes the kernels; `ratrain.cost.tiling` the model and its vocabulary).

Pure Python (no torch). A staged kernel runs its blocks one after another: per block, the
pipeline of its staged steps, each costing the larger of its DMA and the work of the
block's busiest core, plus the ends (loads and stores of the stationary state). The work of
a step depends on the block only through its units' sizes and their offsets from the
block's first row or key, so it is worked out once per block shape and step pattern and
shared by the timings of one plan (`memo`); steps that every unit sees in full are summed
as runs. The sums are the same, term for term and in the same order, as step by step.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ratrain.cost.tiling_core import (
    ACC_BYTES,
    Hw,
    ceil_div,
    edges,
    pipeline_runs_s,
    pipeline_s,
    steps,
)

__all__ = ["AttnTiling", "fwd_time_s", "bwd_time_s", "fwd_vis"]


@dataclass(frozen=True, order=True)
class AttnTiling:
    """One tiling of the attention kernels (`ratrain.cost.tiling_attention` searches them;
    the timings below read them)."""

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
    costs = {k: cost(k) for k in set(keys)}
    if f == 1:
        return max(costs.values())
    n = len(keys)
    h = n // 2
    pairs = set(zip(keys[:h], keys[: n - h - 1 : -1], strict=True))
    return max([costs[a] + costs[b] for a, b in pairs] + ([costs[keys[h]]] if n % 2 else []))


def fwd_vis(i: int, s: int, br: int, causal: bool) -> int:
    """Kv rows that q tile i sees."""
    return min(s, (i + 1) * br) if causal else s


def fwd_time_s(hw: Hw, b, h, kvh, s, d, e, causal, c: AttnTiling, memo=None) -> float:
    """memo: figures that the timings of one plan share (keyed by what they depend on)."""
    memo = {} if memo is None else memo
    hgroups, nq = (h // kvh) // c.hg, ceil_div(s, c.br)
    if ("fwd rows", c.br) not in memo:  # rows and visible kv rows per q tile
        rows = [min(c.br, s - q * c.br) for q in range(nq)]
        memo["fwd rows", c.br] = rows, [fwd_vis(q, s, c.br, causal) for q in range(nq)]
    rows, vis = memo["fwd rows", c.br]
    ends, core_s = _fwd_unit_costs(hw, d, e, c, memo)
    if hw.stage is None:
        active = min(hw.cores, nq * hgroups * b * kvh)
        per = [ends(r, active) + core_s(r, v, active) for r, v in zip(rows, vis, strict=True)]
        per = [x for x in per for _ in range(hgroups)]  # per unit, q-tile-major
        return max(max(per), sum(per) * b * kvh / hw.cores)
    block, work = _fwd_blocks(c, memo, rows, vis, hgroups, ends, core_s, hw.stage)
    total, n_units = 0.0, nq * hgroups
    for u0 in range(0, n_units, c.block):
        u1 = min(u0 + c.block, n_units)
        q0, q1 = u0 // hgroups, (u1 - 1) // hgroups
        low, end = vis[q0], vis[q1]  # the kv rows its first and last units see
        # Relative to `low`, a block is its phase in the q-tile-major order and its size
        # (but for the last q tile's rows).
        blk = block((u0 % hgroups, u1 - u0) if q1 < nq - 1 else u0, u0, u1, low)
        total += pipeline_runs_s(_fwd_runs(hw, d, e, c, blk, work, low, end)) + blk[3]
    return total * b * kvh


def _fwd_unit_costs(hw: Hw, d, e, c: AttnTiling, memo: dict):
    """The forward's per-unit figures, memoised: `ends(r, active)`, a unit of r rows's
    loads and stores; `core_s(r, v, active)`, one core's pipeline over v kv rows for it."""
    ends_of = memo.setdefault(("fwd ends", hw.stage, c.hg), {})
    step_of = memo.setdefault(("fwd step", hw.stage, c.hg), {})
    core_of = memo.setdefault(("fwd core", hw.stage, c.hg, c.bc), {})

    def ends(r, active):  # Q in; O and the LSE out
        if (r, active) not in ends_of:
            q_in = hw.move_s(0, hw.main, c.hg * r * d * e, active)
            out = hw.move_s(0, hw.main, c.hg * r * (d * e + ACC_BYTES), active, 2)
            ends_of[r, active] = q_in + out
        return ends_of[r, active]

    def step(r, t, active):  # (DMA, work) of a kv step of t rows (K and V in)
        if (r, t, active) not in step_of:
            dma = hw.move_s(0, hw.src, 2 * t * d * e, active, 2)
            step_of[r, t, active] = (dma, 4 * c.hg * r * t * d / hw.core_flops)
        return step_of[r, t, active]

    def core_s(r, v, active):  # one core's pipeline over v kv rows for a unit of r rows
        if (r, v, active) not in core_of:
            groups = [(n, *step(r, t, active)) for n, t in edges(v, c.bc)]
            core_of[r, v, active] = pipeline_s(groups)
        return core_of[r, v, active]

    return ends, core_s


def _fwd_blocks(c: AttnTiling, memo: dict, rows, vis, hgroups: int, ends, core_s, stage):
    """The staged forward's per-block figures, memoised: `block(key, u0, u1, low)` and
    `work(blk, off, width)` (see each)."""
    blocks = memo.setdefault(("fwd blocks", stage, c.hg, c.br, c.bc, c.p, c.f), {})

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
        """(The busiest core over the kv step [off, off + width) (relative to low), how many
        steps of bs rows from there on see the same)."""
        rs, vs, p, _, memo_w = blk
        # kv rows of the step each unit sees: none up to lo, all from hi (vs ascending).
        lo, hi = bisect.bisect_right(vs, off), bisect.bisect_left(vs, off + width)
        mid = tuple(v - off for v in vs[lo:hi])
        if (lo, mid, width) not in memo_w:
            seen = [0] * lo + list(mid) + [width] * (len(vs) - hi)
            keys = list(zip(rs, seen, strict=True))  # no rows: no work (0.0)
            memo_w[lo, mid, width] = _busiest(keys, c.f, lambda k: core_s(k[0], k[1], p))
        # With no unit in part, the same until the next unit's last row comes in.
        same = (vs[lo] - width - off) // c.bs + 1 if lo == hi < len(vs) else 1
        return memo_w[lo, mid, width], same

    return block, work


def _fwd_runs(hw: Hw, d, e, c: AttnTiling, blk, work, low: int, end: int) -> list:
    """A staged block's pipeline runs: kv steps of bs rows up to `end`; those ending by
    `low` every unit sees in full."""
    full, dma = low // c.bs, _kv_dma_s(hw, c.bs, d, e)
    runs, k0 = [(full, 1, dma, work(blk, -c.bs, c.bs)[0])], full * c.bs
    while k0 < end:
        k1 = min(k0 + c.bs, end)
        if k1 <= low:  # the last step, short, that every unit sees in full
            runs.append((1, 1, _kv_dma_s(hw, k1 - k0, d, e), work(blk, k0 - k1, k1 - k0)[0]))
            break
        work_s, same = work(blk, k0 - low, k1 - k0)
        if k1 - k0 < c.bs:
            runs.append((1, 1, _kv_dma_s(hw, k1 - k0, d, e), work_s))
            break
        rep = min(same, (end - k0) // c.bs)
        runs.append((rep, 1, dma, work_s))
        k0 += rep * c.bs
    return runs


def _kv_dma_s(hw: Hw, width, d, e) -> float:
    """A staged forward step: K and V, `width` rows each, into the staging tier."""
    return hw.move_s(hw.stage, hw.main, 2 * width * d * e, 1, 2)


def bwd_time_s(hw: Hw, b, h, kvh, s, d, e, causal, c: AttnTiling, memo=None) -> float:
    """memo: as in `fwd_time_s`."""
    memo = {} if memo is None else memo
    hgroups, nu = (h // kvh) // c.hg, ceil_div(s, c.bc)
    # Δ pre-pass: DMA only, its tiles spread over the cores.
    tiles = hgroups * ceil_div(s, c.br) * b * kvh
    active = min(hw.cores, tiles)
    row_bytes = c.hg * min(c.br, s) * (2 * d * e + ACC_BYTES)
    total = tiles * hw.move_s(0, hw.main, row_bytes, active, 3) / active
    kv_s, core_s = _bwd_unit_costs(hw, d, e, c, memo)
    if hw.stage is None:
        active = min(hw.cores, nu * b * kvh)
        per = [
            kv_s(c1 - c0, active)
            + core_s(c1 - c0, _seen(s, c0, c.br, causal), active, u > 0, hgroups)
            for u, (c0, c1) in enumerate(steps(0, s, c.bc))
        ]
        return total + max(max(per), sum(per) * b * kvh / hw.cores)
    block, work = _bwd_blocks(c, memo, causal, kv_s, core_s, hw.stage)
    dma_s = _bwd_dma(hw, d, e, c, memo)
    for j, u0 in enumerate(range(0, nu, c.block)):
        u1, later = min(u0 + c.block, nu), j > 0
        c_lo, c_hi = u0 * c.bc, (u1 - 1) * c.bc  # first keys of its first and last units
        blk = block(u1 - u0, later, min(s, u1 * c.bc) - c_hi)
        runs = _bwd_runs(s, c, causal, hgroups, blk, work, dma_s, later, c_lo, c_hi)
        total += (pipeline_runs_s(runs) + blk[4]) * b * kvh
    return total


def _bwd_unit_costs(hw: Hw, d, e, c: AttnTiling, memo: dict):
    """The backward's per-unit figures, memoised: `kv_s(t, active)`, a unit of t keys's
    loads and stores; `core_s(t, rows, active, load, reps)`, its pipeline over q steps."""
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

    return kv_s, core_s


def _bwd_blocks(c: AttnTiling, memo: dict, causal: bool, kv_s, core_s, stage):
    """The staged backward's per-block figures, memoised: `block(n, later, t_last)` and
    `work(blk, off, width)` (see each)."""
    blocks = memo.setdefault(("bwd blocks", stage, c.hg, c.br, c.bc, c.p, c.f), {})

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
        """(The busiest core over the q step [off, off + width) (relative to the first key),
        how many steps of bs rows from there on see the same)."""
        ts, rel, loads, p, _, memo_w = blk
        # Rows each unit sees: all up to lo (first keys before off + br), none from hi (those
        # that skip every q step of the step).
        span = ceil_div(width, c.br) * c.br  # the q steps of the step
        lo = bisect.bisect_left(rel, off + c.br) if causal else len(rel)
        hi = bisect.bisect_left(rel, off + span) if causal and width > c.br else lo
        mid = tuple([max(0, width - (r - off) // c.br * c.br) for r in rel[lo:hi]])
        if (lo, mid, width) not in memo_w:
            seen = [width] * lo + list(mid) + [0] * (len(rel) - hi)
            keys = list(zip(ts, seen, loads, strict=True))
            memo_w[lo, mid, width] = _busiest(keys, c.f, lambda k: core_s(k[0], k[1], p, k[2]))
        # With no unit in part, the same until the next unit's first key comes in.
        same = (rel[lo] - span - off) // c.bs + 1 if lo == hi < len(rel) else 1
        return memo_w[lo, mid, width], same

    return block, work


def _bwd_dma(hw: Hw, d, e, c: AttnTiling, memo: dict):
    """`dma_s(width, later)`, memoised: a staged q step in (with dQ partials when later)."""
    dma_of = memo.setdefault(("bwd dma", hw.stage, c.hg), {})

    def dma_s(width, later):
        if (width, later) not in dma_of:
            rows = c.hg * width
            nbytes = rows * (2 * d * e + 2 * ACC_BYTES) + rows * d * ACC_BYTES * (1 + later)
            dma_of[width, later] = hw.move_s(hw.stage, hw.main, nbytes, 1, 5 + later)
        return dma_of[width, later]

    return dma_s


def _bwd_runs(s, c: AttnTiling, causal, hgroups, blk, work, dma_s, later, c_lo, c_hi) -> list:
    """A staged block's pipeline runs over the q steps of bs rows: causal, those ending
    before c_lo are skipped, and those from c_hi - br + 1 on every unit sees in full (all
    of them when not causal)."""
    n_steps = ceil_div(s, c.bs)
    first = c_lo // c.bs if causal else 0
    fast = max(first, ceil_div(c_hi - c.br + 1, c.bs)) if causal else 0
    runs, a0, stop = [], first * c.bs, min(fast * c.bs, s)
    while a0 < stop:
        w = min(a0 + c.bs, s) - a0
        work_s, same = work(blk, a0 - c_lo, w)
        rep = min(same, (stop - a0) // c.bs) if w == c.bs else 1
        runs.append((rep, hgroups, dma_s(w, later), work_s))
        a0 += rep * c.bs
    # Seen in full: relative to c_lo, the step [c_hi - c_lo, +w) (any from there on).
    full = work(blk, c_hi - c_lo, c.bs)[0]
    runs.append((s // c.bs - fast, hgroups, dma_s(c.bs, later), full))
    if s % c.bs and fast < n_steps:
        w = s % c.bs
        runs.append((1, hgroups, dma_s(w, later), work(blk, c_hi - c_lo, w)[0]))
    return runs


def _seen(s: int, c0: int, br: int, causal: bool) -> int:
    """Rows of the q steps (of br rows, aligned at 0) that keys from c0 on see."""
    return max(0, s - max(0, c0 // br) * br) if causal else s
