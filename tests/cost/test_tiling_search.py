"""The tile planner's search shortcuts against the plain search they replace: the pruned,
closed-form shortlists equal the shortlists of every tile set priced in full, and the
memoised attention time models equal a step-by-step reference, to the last bit."""

import heapq
import random

import pytest

from _platforms import KIB, THREE, make_platform
from ratrain.cost import tiling, tiling_attention, tiling_core
from ratrain.cost.tiling import _buffers, _Gemm, _grids, _tally
from ratrain.cost.tiling_attention import _divisors, _model
from ratrain.cost.tiling_attention_time import AttnTiling, _pairs, bwd_time_s, fwd_time_s, fwd_vis
from ratrain.cost.tiling_core import (
    ACC_BYTES,
    Hw,
    ceil_div,
    chunks,
    edges,
    fits,
    hw_variants,
    pipeline_runs_s,
    pipeline_s,
    platform_key,
    rank,
    sizes,
    steps,
)
from ratrain.platforms import Tier
from ratrain.platforms.load import load

FOLD = make_platform(
    [
        Tier("l1", 32 * KIB, 50e9, 0.0, 4),
        Tier("l2", 128 * KIB, 40e9, 0.0, 1),
        Tier("mem", 10**9, 10e9, 0.0, 1),
    ]
)
MT3000 = load("mt3000")


def _lists(ranked):
    """The shortlists of `tiling_core.Shortlist`, from every tile set ranked."""
    roof = heapq.nsmallest(8, ranked, key=lambda x: (x[0], x[1], x[2].stage or 0, x[3]))
    ddr = heapq.nsmallest(8, ranked, key=lambda x: (x[1], x[0], x[2].stage or 0, x[3]))
    return roof, ddr


def _got(short):
    return [x for _, x in short.by_roof], [x for _, x in short.by_ddr]


# --- GEMM ------------------------------------------------------------------------------------


def _every_gemm(hws, m, n, k, e, bias):
    """Every base tile set, the widest C tile by trying each width, priced by its tally."""
    leaf, out = Hw(hws[0].tiers, hws[0].peak_flops), []
    for mc in sizes(m):
        for kc in sizes(k, hi=256):
            ok = [
                nc
                for nc in sizes(n, fine=True)
                if fits(leaf, _buffers(leaf, m, nc, kc, e, bias, _Gemm(mc, nc, kc)))
            ]
            if not ok:
                continue
            nc = max(ok)
            for hw in hws:
                grids = [(1, 1)] if hw.stage is None else _grids(hw.cores, -(-m // mc), -(-n // nc))
                for pr, pc in grids:
                    c = _Gemm(mc, nc, kc, pr, pc, kc)
                    if fits(hw, _buffers(hw, m, n, k, e, bias, c)):
                        out.append(
                            (*rank(hw, _tally(hw, m, n, k, e, bias, c), 2 * m * n * k), hw, c)
                        )
    return out


@pytest.mark.parametrize(
    "platform,m,n,k,dtype,bias",
    [
        (THREE, 50, 70, 90, "fp16", False),
        (THREE, 67, 33, 129, "fp32", True),
        (THREE, 300, 200, 1000, "bf16", False),
        (MT3000, 64, 96, 80, "fp16", False),
        (MT3000, 1000, 700, 2048, "bf16", True),
        (MT3000, 4096, 1024, 4096, "bf16", False),
    ],
)
def test_gemm_shortlist_equals_pricing_every_tile_set(platform, m, n, k, dtype, bias):
    tiers, peak, stage = platform_key(platform, dtype)
    hws, e = hw_variants(tiers, peak, stage), tiling.DTYPE_BYTES[dtype]
    want = _lists(_every_gemm(hws, m, n, k, e, bias))
    assert _got(tiling._shortlist(hws, m, n, k, e, bias)) == want
    assert len(want[0]) == len(want[1]) == 8


# --- attention -------------------------------------------------------------------------------


def _every_attention(op, b, h, kvh, s, d, e, causal, hws):
    """Every candidate, each kv tile tried, priced by its tally."""
    g = h // kvh
    buffers, tally, _, inner, units = _model(op, s, g)
    sz, out = sizes(s, lo=min(s, 8)), []
    for hg in _divisors(g):
        for br in sz:
            for bc in sz:
                base = AttnTiling(hg, br, bc, 0)
                for hw in hws:
                    for f in (1, 2) if causal and hw.stage is not None else (1,):
                        p = 1 if hw.stage is None else min(hw.cores, ceil_div(units(base), f))
                        c = AttnTiling(hg, br, bc, inner(base), p, f)
                        if fits(hw, buffers(hw, s, d, e, c)):
                            out.append(
                                (*rank(hw, *tally(hw, b, h, kvh, s, d, e, causal, c)), hw, c)
                            )
    return out


ATTN = [  # platform, batch, heads, kv_heads, seq, head_dim, causal
    (THREE, 1, 2, 2, 45, 16, True),
    (THREE, 2, 4, 2, 75, 16, False),
    (FOLD, 1, 2, 1, 190, 16, True),
    (MT3000, 1, 8, 2, 700, 64, True),
    (MT3000, 2, 4, 4, 513, 128, False),
]


@pytest.mark.parametrize("op", ["attention", "attention_backward"])
@pytest.mark.parametrize("platform,b,h,kvh,s,d,causal", ATTN)
def test_attention_shortlist_equals_pricing_every_candidate(op, platform, b, h, kvh, s, d, causal):
    tiers, peak, stage = platform_key(platform, "fp16")
    hws = hw_variants(tiers, peak, stage)
    want = _lists(_every_attention(op, b, h, kvh, s, d, 2, causal, hws))
    assert _got(tiling_attention._shortlist(op, b, h, kvh, s, d, 2, causal, hws)) == want


def test_forward_rows_rank_no_worse_with_a_wider_kv_tile():
    """What lets `_shortlist` drop the rest of a forward row at once: the same bytes and
    FLOPs whatever the kv tile, and a roofline estimate that never grows with it."""
    tiers, peak, stage = platform_key(MT3000, "bf16")
    hws, (b, h, kvh, s, d) = hw_variants(tiers, peak, stage), (2, 8, 2, 1000, 64)
    buffers, tally, _, inner, units = _model("attention", s, h // kvh)
    rows = list(
        tiling_attention._rows(
            hws, s, h // kvh, lambda hw, c: buffers(hw, s, d, 2, c), inner, units, True
        )
    )
    assert len(rows) > 50
    for hw, cfgs in rows:
        priced = [tally(hw, b, h, kvh, s, d, 2, True, c) for c in cfgs]
        assert len({(t.ddr, flops) for t, flops in priced}) == 1, cfgs
        roofs = [rank(hw, *p)[0] for p in priced]
        assert roofs == sorted(roofs, reverse=True), cfgs


# --- time models -----------------------------------------------------------------------------


def _ref_fwd_time(hw, b, h, kvh, s, d, e, causal, c):
    """The forward time model step by step (each block, each kv step, each core)."""
    units = [
        (a1 - a0, fwd_vis(i, s, c.br, causal))
        for i, (a0, a1) in enumerate(steps(0, s, c.br))
        for _ in range((h // kvh) // c.hg)
    ]

    def ends(r, active):
        q_in = hw.move_s(0, hw.main, c.hg * r * d * e, active)
        return q_in + hw.move_s(0, hw.main, c.hg * r * (d * e + ACC_BYTES), active, 2)

    def core_s(r, v, active):
        groups = [
            (
                n,
                hw.move_s(0, hw.src, 2 * t * d * e, active, 2),
                4 * c.hg * r * t * d / hw.core_flops,
            )
            for n, t in edges(v, c.bc)
        ]
        return pipeline_s(groups)

    if hw.stage is None:
        active = min(hw.cores, len(units) * b * kvh)
        per = [ends(r, active) + core_s(r, v, active) for r, v in units]
        return max(max(per), sum(per) * b * kvh / hw.cores)
    total = 0.0
    for blk in chunks(units, c.block):
        pairs = [tuple(blk[i] for i in ids) for ids in _pairs(len(blk), c.f)]
        end, p = max(v for _, v in blk), len(pairs)
        groups = []
        for k0, k1 in steps(0, end, c.bs):
            work = max(
                sum(core_s(r, min(k1, v) - k0, p) for r, v in pair if v > k0) for pair in pairs
            )
            groups.append((1, hw.move_s(hw.stage, hw.main, 2 * (k1 - k0) * d * e, 1, 2), work))
        total += pipeline_s(groups) + max(sum(ends(r, p) for r, _ in pair) for pair in pairs)
    return total * b * kvh


def _ref_bwd_time(hw, b, h, kvh, s, d, e, causal, c):
    """The backward time model step by step (each block, each q step, each core)."""
    hgroups, units = (h // kvh) // c.hg, steps(0, s, c.bc)
    tiles = hgroups * ceil_div(s, c.br) * b * kvh
    active = min(hw.cores, tiles)
    row_bytes = c.hg * min(c.br, s) * (2 * d * e + ACC_BYTES)
    total = tiles * hw.move_s(0, hw.main, row_bytes, active, 3) / active

    def kv_s(t, active):
        return 2 * hw.move_s(0, hw.main, 2 * t * d * e, active, 2)

    def core_s(t, rows, active, load, reps=1):
        groups = []
        for n, r in edges(rows, c.br):
            q = c.hg * r
            nbytes = q * (2 * d * e + 2 * ACC_BYTES) + q * d * ACC_BYTES * (1 + load)
            dma = hw.move_s(0, hw.src, nbytes, active, 5 + load)
            groups.append((n * reps, dma, 10 * q * t * d / hw.core_flops))
        return pipeline_s(groups)

    def seen(a0, a1, c0):
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
        p, groups = len(pairs), []
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


@pytest.mark.parametrize("fwd", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("platform", [THREE, MT3000])
def test_attention_time_models_equal_the_step_by_step_sums(fwd, causal, platform):
    """Random tile sets, one memo per shape as a plan shares it, ragged edges included."""
    rng = random.Random(7)
    tiers, peak, _ = platform_key(platform, "fp16")
    timing, ref = (fwd_time_s, _ref_fwd_time) if fwd else (bwd_time_s, _ref_bwd_time)
    for b, h, kvh, s, d in [(1, 4, 2, 150, 16), (2, 8, 2, 333, 32), (1, 2, 2, 64, 16)]:
        memo = {}
        for _ in range(30):
            hw = Hw(tiers, peak, rng.choice([None, *range(1, len(tiers) - 1)]))
            hg = rng.choice(_divisors(h // kvh))
            br, bc = (rng.choice([rng.randint(4, 16), rng.randint(1, s // 2)]) for _ in "qk")
            inner = bc if fwd else br
            units = (h // kvh) // hg * ceil_div(s, br) if fwd else ceil_div(s, bc)
            f = rng.choice([1, 2]) if causal and hw.stage is not None else 1
            p = 1 if hw.stage is None else min(hw.cores, ceil_div(units, f))
            bs = inner * rng.choice([1, 2, 3, 8]) if hw.stage is not None else inner
            c = AttnTiling(hg, br, bc, bs, p, f)
            args = (hw, b, h, kvh, s, d, 2, causal, c)
            assert timing(*args, memo) == ref(*args), c


def test_pipeline_runs_equal_the_groups_one_by_one():
    rng = random.Random(3)
    for _ in range(200):
        runs = [
            (rng.randint(0, 4), rng.randint(0, 3), rng.random(), rng.random())
            for _ in range(rng.randint(0, 5))
        ]
        groups = [(cnt, dma, work) for rep, cnt, dma, work in runs for _ in range(rep)]
        assert pipeline_runs_s(runs) == pipeline_s(groups)


def test_shortlist_keeps_the_first_of_each_order():
    short = tiling_core.Shortlist()
    hw = Hw(MT3000.tiers, 1.0)
    items = [(float(i % 7), 100 - i, hw, (i,)) for i in range(30)]
    for roof_s, ddr, h_, cfg in items:
        short.add(roof_s, ddr, h_, cfg)
    assert _got(short) == _lists(items)
    assert short.beaten(7.0, 200) and not short.beaten(0.0, 0)
