"""Machinery of the tile model (`ratrain.cost.tiling`): the plan record, the platform as the
model sees it, byte tallies, the double-buffered pipeline and the choice among tile sets.

Pure Python (no torch). The model itself is described in `ratrain.cost.tiling`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple

from ratrain.config import DTYPE_BYTES
from ratrain.errors import RatrainError
from ratrain.platforms import Platform, Tier

__all__ = [
    "ACC_BYTES",
    "TIME_SLACK",
    "TilePlan",
    "Hw",
    "Tally",
    "Priced",
    "applies",
    "platform_key",
    "hw_variants",
    "fits",
    "fitting",
    "dma_times",
    "make_plan",
    "select",
    "Shortlist",
    "rank",
    "steps",
    "chunks",
    "ceil_div",
    "sizes",
    "edges",
    "floor_sum",
    "pipeline_s",
    "pipeline_runs_s",
]

# sourced: fp32 accumulation of 16-bit GEMMs and attention, as FlashAttention-2 (Dao 2023)
# keeps its O, m, l and dQ; 4 bytes an element for accumulators, statistics, dQ partials.
ACC_BYTES = 4
# assumed: a planning tolerance, not a hardware figure: plans predicted within 5% of the
# fastest compete on main-memory traffic (about the model's own resolution).
TIME_SLACK = 0.05
# assumed: a search budget: tile sets timed in full, this many by a roofline estimate and
# this many by traffic; the rest are ranked on their closed-form traffic only.
_SHORTLIST = 8


@dataclass(frozen=True)
class TilePlan:
    """Tiles of one kernel on one platform, with the traffic and time they imply."""

    op: str
    """"gemm", "attention" or "attention_backward"."""
    shape: dict[str, int]
    """gemm: m, n, k, bias; attention: batch, heads, kv_heads, seq, head_dim, causal."""
    dtype: str
    leaf: str
    """The compute tier (where the cores read operands)."""
    stage: str | None
    """The staging tier, or None (unstaged: the cores load from main memory)."""
    main: str
    tile: dict[str, int]
    """Per core. gemm: m, n, k (k-step); attention: heads, q (rows), kv (rows)."""
    grid: tuple[int, int]
    """Cores per block: gemm (rows, cols) of the core grid; attention (cores, units per
    core: 2 pairs each causal unit with its mirror in the block). (1, 1) unstaged."""
    stage_step: int
    """gemm: staged k-step; forward: staged kv rows; backward: staged q rows. Unstaged: the
    per-core step (tile k, kv or q)."""
    buffer_bytes: dict[str, int]
    """Per tier, bytes of one copy's buffers (double-buffered operands + accumulators)."""
    bytes_moved: dict[str, int]
    """Per ordered tier pair "src->dst"."""
    moves: dict[str, int]
    """DMA transfers per ordered tier pair."""
    flops: int
    time_s: float
    compute_time_s: float
    """FLOPs / peak of the whole unit."""
    dma_time_s: dict[str, float] = field(default_factory=dict)
    """Per boundary "fast<->slow": moves x latency + bytes / bandwidth (all copies active)."""
    bound: str = "compute"

    @property
    def ddr_bytes(self) -> int:
        """Bytes into and out of main memory."""
        return sum(v for key, v in self.bytes_moved.items() if self.main in key.split("->"))


def steps(lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    """[lo, hi) cut into half-open ranges of `step` (the last may be shorter)."""
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)]


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sizes(dim: int, lo: int = 1, fine: bool = False, hi: int | None = None) -> list[int]:
    """Candidate tile sizes for a dimension: 2^i and 3·2^(i-1) below it (with `fine`, every
    j·2^i for j = 8..15, steps of at most 12.5%), the dimension cut evenly into 2..8 tiles,
    and the dimension itself; none above `hi` (but the dimension, if it is below hi)."""
    if hi is not None and dim > hi:
        return [x for x in sizes(dim, lo, fine) if x <= hi]
    out, v = {dim}, 1
    mults = range(8, 16) if fine else (8, 12)
    while v < dim:
        out.update(x for x in (v, v * 3 // 2) if lo <= x < dim)
        out.update(j * v // 8 for j in mults if v >= 8 and lo <= j * v // 8 < dim)
        v *= 2
    out.update(ceil_div(dim, p) for p in range(2, 9) if ceil_div(dim, p) >= lo)
    return sorted(out)


def edges(dim: int, tile: int) -> list[tuple[int, int]]:
    """(count, size) runs of a dimension cut into tiles: the full ones, then the remainder."""
    return [(c, t) for c, t in ((dim // tile, tile), (int(dim % tile > 0), dim % tile)) if c]


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """Σ_{i<n} floor((a·i + b) / m) for a, b >= 0 in O(log) steps (the AtCoder Library's
    `floor_sum`, a Euclid-like reduction)."""
    total = 0
    while n > 0:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y = a * n + b
        if y < m:
            break
        n, b, m, a = y // m, y % m, a, m
    return total


def pipeline_s(groups: list[tuple[int, float, float]]) -> float:
    """Double-buffered steps, given as runs of (count, dma_s, work_s): the first load, then
    each step's work overlapped with the next step's load."""
    groups = [g for g in groups if g[0] > 0]
    if not groups:
        return 0.0
    t = groups[0][1]
    for i, (count, dma, work) in enumerate(groups):
        nxt = groups[i + 1][1] if i + 1 < len(groups) else 0.0
        t += (count - 1) * max(work, dma) + max(work, nxt)
    return t


def pipeline_runs_s(runs: list[tuple[int, int, float, float]]) -> float:
    """`pipeline_s` of groups given as runs of (repeats, count, dma_s, work_s): `repeats`
    equal groups in a row. The steps are summed one by one, in order, as `pipeline_s` sums
    them (the same float result)."""
    runs = [r for r in runs if r[0] > 0 and r[1] > 0]
    if not runs:
        return 0.0
    t = runs[0][2]
    for i, (rep, count, dma, work) in enumerate(runs):
        nxt = runs[i + 1][2] if i + 1 < len(runs) else 0.0
        step = (count - 1) * max(work, dma)
        same = step + max(work, dma)  # followed by an equal group
        for _ in range(rep - 1):
            t += same
        t += step + max(work, nxt)
    return t


def _path(lo: int, hi: int, tiers: tuple[Tier, ...]) -> list[int]:
    """Tiers whose bandwidth a move from tier lo up to tier hi shares, beyond lo's own port:
    the boundaries between them, and main memory itself (its streaming bandwidth)."""
    return [*range(lo + 1, hi), *([hi] if hi == len(tiers) - 1 else [])]


@dataclass(frozen=True)
class Hw:
    """The platform as the model sees it: tiers (index 0 computes, the last is main memory),
    peak FLOP/s of the unit for the dtype, and the staging tier (an index) or None."""

    tiers: tuple[Tier, ...]
    peak_flops: float
    stage: int | None = None
    # Path figures already worked out, per (kind, args): hashing the tiers on every
    # look-up would cost more than the figures themselves.
    _memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def main(self) -> int:
        return len(self.tiers) - 1

    @property
    def src(self) -> int:
        """Where the cores load streamed operands from."""
        return self.main if self.stage is None else self.stage

    @property
    def cores(self) -> int:
        return self.tiers[0].copies

    @property
    def core_flops(self) -> float:
        return self.peak_flops / self.cores

    def key(self, a: int, b: int) -> str:
        return f"{self.tiers[a].name}->{self.tiers[b].name}"

    def bw(self, lo: int, hi: int, active: int = 1) -> float:
        """Bytes/s one of `active` concurrent copies of tier `lo` gets on the path to `hi`:
        its own port, the boundaries above it (shared), and main memory's streaming
        bandwidth when the path ends there."""
        k = (lo, hi, active)
        if k not in self._memo:
            t = self.tiers
            shared = [t[i].bandwidth_bytes_per_s * t[i].copies / active for i in _path(lo, hi, t)]
            self._memo[k] = min([t[lo].bandwidth_bytes_per_s, *shared])
        return self._memo[k]

    def move_s(self, lo: int, hi: int, nbytes: float, active: int = 1, n: int = 1) -> float:
        """n moves totalling nbytes between tier lo and tier hi, `active` copies at once."""
        return n * self.latency(lo, hi) + nbytes / self.bw(lo, hi, active)

    def latency(self, lo: int, hi: int) -> float:
        k = ("latency", lo, hi)
        if k not in self._memo:
            self._memo[k] = max(t.latency_s for t in self.tiers[lo:hi])
        return self._memo[k]

    def link(self, a: int, b: int) -> tuple[str, float, float, bool]:
        """Of moves from tier a to tier b: (boundary "fast<->slow", bytes/s with all copies
        active, seconds per move, whether main memory is an end)."""
        k = ("link", a, b)
        if k not in self._memo:
            t = self.tiers
            lo, hi = min(a, b), max(a, b)
            bw = min(t[i].bandwidth_bytes_per_s * t[i].copies for i in [lo, *_path(lo, hi, t)])
            # Moves from the copies of tier lo are issued in parallel; their setups overlap.
            latency = max(x.latency_s for x in t[lo:hi]) / t[lo].copies
            name = f"{t[lo].name}<->{t[hi].name}"
            self._memo[k] = (name, bw, latency, self.main in (a, b))
        return self._memo[k]


class Tally:
    """Bytes and moves per ordered tier pair (src, dst), in the order first added."""

    __slots__ = ("hw", "flows")

    def __init__(self, hw: Hw) -> None:
        self.hw = hw
        self.flows: dict[tuple[int, int], list[int]] = {}  # (src, dst) -> [bytes, moves]

    def add(self, src: int, dst: int, nbytes: int, nmoves: int) -> None:
        if nmoves <= 0:
            return
        flow = self.flows.get((src, dst))
        if flow is None:
            self.flows[src, dst] = [nbytes, nmoves]
        else:
            flow[0] += nbytes
            flow[1] += nmoves

    def scale(self, f: int) -> Tally:
        for flow in self.flows.values():
            flow[0] *= f
            flow[1] *= f
        return self

    @property
    def bytes(self) -> dict[str, int]:
        """Per "src->dst" (tier names)."""
        return {self.hw.key(a, b): v for (a, b), (v, _) in self.flows.items()}

    @property
    def moves(self) -> dict[str, int]:
        return {self.hw.key(a, b): v for (a, b), (_, v) in self.flows.items()}

    @property
    def ddr(self) -> int:
        main = self.hw.main
        return sum(v for (a, b), (v, _) in self.flows.items() if main in (a, b))

    @property
    def n_moves(self) -> int:
        return sum(v for _, v in self.flows.values())


class Priced(NamedTuple):
    tally: Tally
    flops: int
    buffers: dict[int, int]


def applies(platform: Platform) -> bool:
    """The tile model applies to platforms that declare on-chip tiers above main memory."""
    return len(platform.tiers) > 1


def platform_key(
    platform: Platform, dtype: str, stage: str | None = "auto"
) -> tuple[tuple[Tier, ...], float, int | str | None]:
    """The hashable part of a platform the model reads: (tiers, peak FLOP/s for dtype, the
    staging choice: "auto", None for unstaged, or a tier index)."""
    if dtype not in DTYPE_BYTES:
        raise RatrainError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    if not applies(platform):
        raise RatrainError(
            f"platform {platform.name} declares no on-chip tier above main memory; "
            "the tile model needs at least two tiers"
        )
    tiers = tuple(platform.tiers)
    if stage not in ("auto", None):
        names = [t.name for t in tiers[1:-1]]
        if stage not in names:
            raise RatrainError(
                f"stage={stage!r} is not a staging tier of {platform.name}; choose one of "
                f"{', '.join(names) or '(none: the platform has one on-chip tier)'}, None or 'auto'"
            )
        stage = 1 + names.index(stage)
    return tiers, float(platform.peak_flops[dtype]), stage


def hw_variants(tiers: tuple[Tier, ...], peak: float, stage: int | str | None = "auto") -> list[Hw]:
    """Unstaged, then staged through each on-chip tier above the compute tier ("auto"), or the
    one variant asked for."""
    if stage != "auto":
        return [Hw(tiers, peak, stage)]
    return [Hw(tiers, peak, None)] + [Hw(tiers, peak, j) for j in range(1, len(tiers) - 1)]


def fits(hw: Hw, buffers: dict[int, int]) -> bool:
    return all(b <= hw.tiers[i].capacity_bytes for i, b in buffers.items())


def fitting(ok, cands: list) -> int:
    """How many of cands (in order) ok() accepts, ok being monotone (true, then false)."""
    lo, hi = 0, len(cands)
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(cands[mid]):
            lo = mid + 1
        else:
            hi = mid
    return lo


def dma_times(hw: Hw, tally: Tally) -> dict[str, float]:
    """Per boundary "fast<->slow": moves x latency + bytes / bandwidth, all copies active."""
    dma: dict[str, float] = {}
    for (a, b), (nbytes, nmoves) in tally.flows.items():
        name, bw, latency, _ = hw.link(a, b)
        dma[name] = dma.get(name, 0.0) + nmoves * latency + nbytes / bw
    return dma


def make_plan(op, shape, dtype, hw: Hw, tile, grid, stage_step, p: Priced, time_s) -> TilePlan:
    dma = dma_times(hw, p.tally)
    compute_s = p.flops / hw.peak_flops
    return TilePlan(
        op=op,
        shape=dict(shape),
        dtype=dtype,
        leaf=hw.tiers[0].name,
        stage=None if hw.stage is None else hw.tiers[hw.stage].name,
        main=hw.tiers[-1].name,
        tile=dict(tile),
        grid=grid,
        stage_step=stage_step,
        buffer_bytes={hw.tiers[i].name: b for i, b in p.buffers.items()},
        bytes_moved=p.tally.bytes,
        moves=p.tally.moves,
        flops=p.flops,
        time_s=time_s,
        compute_time_s=compute_s,
        dma_time_s=dma,
        bound="compute" if compute_s >= max(dma.values(), default=0.0) else "dma",
    )


def rank(hw: Hw, tally: Tally, flops: int) -> tuple[float, int]:
    """(roof_s, ddr_bytes) of a tile set, as `select` ranks them: its roofline estimate
    (compute or its busiest boundary, as `dma_times`) and its main-memory bytes."""
    return max(flops / hw.peak_flops, *dma_times(hw, tally).values()), tally.ddr


class Shortlist:
    """Of the tile sets added with their estimates, the `_SHORTLIST` that a roofline estimate
    ranks fastest and the `_SHORTLIST` moving the fewest main-memory bytes (ties: the other
    estimate, then the staging tier and the tile set), each list in that order."""

    def __init__(self) -> None:
        self.by_roof: list = []  # [((roof_s, ddr, stage, cfg), (roof_s, ddr, hw, cfg))]
        self.by_ddr: list = []  # [((ddr, roof_s, stage, cfg), the same)]

    def add(self, roof_s: float, ddr_bytes: int, hw: Hw, cfg) -> None:
        """A tile set that fits: its roofline estimate (see `rank`) and main-memory bytes."""
        item, stage = (roof_s, ddr_bytes, hw, cfg), hw.stage or 0
        for rows, key in (
            (self.by_roof, (roof_s, ddr_bytes, stage, cfg)),
            (self.by_ddr, (ddr_bytes, roof_s, stage, cfg)),
        ):
            if len(rows) < _SHORTLIST or key < rows[-1][0]:
                bisect.insort(rows, (key, item))
                del rows[_SHORTLIST:]

    def beaten(self, roof_s: float, ddr_bytes: float) -> bool:
        """Whether tile sets estimated at no less than (roof_s, ddr_bytes) would make
        neither list (both full, and both last entries ahead)."""
        if len(self.by_ddr) < _SHORTLIST or len(self.by_roof) < _SHORTLIST:
            return False
        roof, ddr = self.by_roof[-1][1][:2]
        if roof_s < roof or (roof_s == roof and ddr_bytes <= ddr):
            return False
        roof, ddr = self.by_ddr[-1][1][:2]
        return ddr_bytes > ddr or (ddr_bytes == ddr and roof_s > roof)


def select(short: Shortlist, price, expand, timing):
    """Choose a tile set: the least main-memory traffic among those within `TIME_SLACK` of
    the fastest (fewest moves, then time, on ties).

    short: every tile set that fits added, staged ones with their finest staged step, or
    at least every one that could make its lists; price(hw, cfg) -> Priced, or None when
    the buffers do not fit; expand(hw, cfg) -> the coarser staged steps of a base, finest
    first (the same bytes in fewer moves, more buffer); timing(hw, cfg) -> seconds. Only
    the shortlist is priced in full and timed. Returns (hw, cfg, priced, time_s).
    """
    if not short.by_roof:
        raise RatrainError(
            "no tile fits the platform's compute tier; use a platform with larger on-chip "
            "tiers or a smaller head_dim"
        )
    by_roof = [x for _, x in short.by_roof]
    listed = by_roof + [x for _, x in short.by_ddr if x not in by_roof]
    timed = []
    for _, _, hw, cfg in listed:
        p = price(hw, cfg)
        timed.append((timing(hw, cfg), p.tally.ddr, p.tally.n_moves, hw.stage or 0, cfg, hw, p))
    # Coarser staged steps for the fastest few: the same bytes in fewer moves.
    for _, _, _, _, cfg, hw, _ in sorted(timed, key=lambda t: t[0])[: _SHORTLIST // 2]:
        for v in expand(hw, cfg):
            pv = price(hw, v)
            if pv is None:
                break
            timed.append((timing(hw, v), pv.tally.ddr, pv.tally.n_moves, hw.stage or 0, v, hw, pv))
    fastest = min(t[0] for t in timed)
    near = [t for t in timed if t[0] <= fastest * (1 + TIME_SLACK)]
    time_s, _, _, _, cfg, hw, p = min(near, key=lambda t: (t[1], t[2], t[0], t[3], t[4]))
    return hw, cfg, p, time_s
