"""The tile planner (pure): fit, traffic against the matmul I/O lower bound, FLOPs, time
model sanity, the compute-cost hook. Its exactness against execution is in test_tiled.py."""

import math
import subprocess
import sys

import pytest

from _platforms import make_platform
from ratrain.cost import tiling
from ratrain.cost.tiling import (
    gemm_io_lower_bound,
    plan_attention,
    plan_attention_backward,
    plan_gemm,
)
from ratrain.errors import RatrainError
from ratrain.platforms import Tier
from ratrain.platforms.load import load


def _platform(tiers, peak=1e12, name="test"):
    return make_platform(tiers, peak, name, usable_bytes=10**12)


def _two_level(fast_bytes, peak=1e12):
    # No DMA latency: the I/O model of the lower bound counts words, not transfers.
    return _platform(
        [Tier("fast", fast_bytes, 50e9, 0.0, 1), Tier("mem", 10**12, 10e9, 0.0, 1)], peak
    )


MT3000 = load("mt3000")


def test_pure_layer_does_not_import_torch():
    code = "import sys, ratrain.cost.tiling; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "shape", [(1024, 1024, 1024), (1000, 700, 2048), (4096, 4096, 4096), (300, 5000, 1000)]
)
@pytest.mark.parametrize("fast_bytes", [64 * 1024, 256 * 1024])
def test_gemm_ddr_traffic_within_1_3x_of_the_io_lower_bound(shape, fast_bytes):
    """Smith et al. 2019 (arXiv:1702.02017): any matmul moves >= 2mnk/√M − 2M words with a
    fast memory of M words. fp32: one word = one element, M = S/4, accumulators included."""
    m, n, k = shape
    plan = plan_gemm(m, n, k, "fp32", _two_level(fast_bytes))
    words, fast_words = plan.ddr_bytes / 4, fast_bytes // 4
    bound = gemm_io_lower_bound(m, n, k, fast_words)
    assert words >= bound - 2 * fast_words  # the model cannot beat a lower bound
    assert words <= 1.3 * bound, words / bound


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(1000, 700, 2048), (4096, 4096, 4096)])
def test_gemm_ddr_traffic_half_precision_against_the_bound(dtype, shape):
    """With 2-byte inputs the memory could hold S/2 elements (the valid bound), but an fp32
    accumulator element takes 4 bytes: an output-stationary tile holds S/4 of them, so the
    traffic sits near √2 x the S/2 bound and within 1.3x of the bound counted in accumulator
    words (S/4)."""
    m, n, k = shape
    fast = 64 * 1024
    words = plan_gemm(m, n, k, dtype, _two_level(fast)).ddr_bytes / 2
    assert words >= gemm_io_lower_bound(m, n, k, fast // 2) - fast
    assert words <= 1.3 * math.sqrt(2) * gemm_io_lower_bound(m, n, k, fast // 2)
    assert words <= 1.3 * gemm_io_lower_bound(m, n, k, fast // 4)


def test_plans_fit_every_tier_with_double_buffering():
    p = _platform(
        [
            Tier("l1", 16 * 1024, 50e9, 1e-6, 4),
            Tier("l2", 96 * 1024, 40e9, 1e-6, 1),
            Tier("mem", 10**9, 10e9, 1e-6, 1),
        ]
    )
    plans = [
        plan_gemm(200, 130, 300, "fp16", p, bias=True),
        plan_gemm(200, 130, 300, "fp16", p, stage="l2"),
        plan_attention(2, 8, 2, 100, 16, "bf16", p),
        plan_attention_backward(2, 8, 2, 100, 16, "bf16", p, stage="l2"),
    ]
    caps = {t.name: t.capacity_bytes for t in p.tiers}
    for plan in plans:
        assert plan.buffer_bytes, plan
        for tier, nbytes in plan.buffer_bytes.items():
            assert 0 < nbytes <= caps[tier], (plan.op, tier, nbytes)
    # The leaf of an unstaged GEMM: fp32 C tile, two A and two B tiles, the bias slice.
    g = plan_gemm(200, 130, 300, "fp16", p, bias=True, stage=None)
    mc, nc, kc = g.tile["m"], g.tile["n"], g.tile["k"]
    assert g.buffer_bytes == {"l1": 4 * mc * nc + 2 * 2 * kc * (mc + nc) + 2 * nc}


def test_flops_follow_the_tiles_computed():
    p = _platform([Tier("l1", 32 * 1024, 50e9, 1e-6, 2), Tier("mem", 10**9, 10e9, 1e-6, 1)])
    assert plan_gemm(70, 50, 90, "fp16", p).flops == 2 * 70 * 50 * 90
    b, h, kv, s, d = 2, 4, 2, 96, 16
    full = 4 * b * h * s * s * d
    assert plan_attention(b, h, kv, s, d, "fp16", p, causal=False).flops == full
    assert plan_attention_backward(b, h, kv, s, d, "fp16", p, causal=False).flops == 2.5 * full
    causal = plan_attention(b, h, kv, s, d, "fp16", p, causal=True).flops
    assert full / 2 < causal < full  # masked tiles skipped, diagonal tiles done whole


def test_main_memory_traffic_of_unstaged_gemm_is_the_blocked_formula():
    p = _platform([Tier("l1", 64 * 1024, 50e9, 0.0, 1), Tier("mem", 10**9, 10e9, 0.0, 1)])
    m, n, k = 300, 200, 100
    plan = plan_gemm(m, n, k, "fp16", p)
    mc, nc = plan.tile["m"], plan.tile["n"]
    reads = (m * k * math.ceil(n / nc) + k * n * math.ceil(m / mc)) * 2
    assert plan.bytes_moved == {"mem->l1": reads, "l1->mem": m * n * 2}


def test_staging_cuts_main_memory_traffic_on_mt3000():
    """Staged panels are read from DDR once per block of 24 cores, not once per core."""
    staged = plan_gemm(4096, 4096, 4096, "fp16", MT3000, stage="gsm")
    unstaged = plan_gemm(4096, 4096, 4096, "fp16", MT3000, stage=None)
    assert staged.ddr_bytes < unstaged.ddr_bytes / 2
    assert staged.grid[0] * staged.grid[1] > 1
    auto = plan_gemm(4096, 4096, 4096, "fp16", MT3000)
    assert auto.time_s <= 1.05 * min(staged.time_s, unstaged.time_s)


def test_time_is_bounded_below_by_compute_and_labelled():
    for plan in (
        plan_gemm(4096, 11008, 4096, "fp16", MT3000),
        plan_attention(1, 32, 32, 2048, 128, "fp16", MT3000),
        plan_attention_backward(1, 32, 8, 2048, 128, "bf16", MT3000),
    ):
        assert plan.time_s >= plan.compute_time_s > 0
        assert plan.bound in ("compute", "dma")
        worst = max(plan.dma_time_s.values())
        assert plan.bound == ("compute" if plan.compute_time_s >= worst else "dma")


def test_time_model_limits():
    """Starved of bandwidth a GEMM takes its DDR bytes / bandwidth; with bandwidth to spare,
    its FLOPs / peak (plus fill and drain)."""
    m = n = k = 1024
    slow = plan_gemm(m, n, k, "fp16", _two_level(256 * 1024, peak=1e15))
    assert slow.bound == "dma"
    assert slow.time_s == pytest.approx(slow.ddr_bytes / 10e9, rel=0.05)
    fast_mem = [Tier("fast", 256 * 1024, 1e15, 0.0, 1), Tier("mem", 10**12, 1e15, 0.0, 1)]
    fast = plan_gemm(m, n, k, "fp16", _platform(fast_mem, peak=1e9))
    assert fast.bound == "compute"
    assert fast.time_s == pytest.approx(2 * m * n * k / 1e9, rel=0.01)


def test_gqa_shares_kv_traffic():
    """Query heads of one kv head share its K/V tiles: fewer kv heads, less traffic."""
    p = _platform(
        [
            Tier("l1", 64 * 1024, 50e9, 0.0, 4),
            Tier("l2", 512 * 1024, 50e9, 0.0, 1),
            Tier("mem", 10**9, 10e9, 0.0, 1),
        ]
    )
    mha = plan_attention(1, 8, 8, 512, 32, "fp16", p)
    gqa = plan_attention(1, 8, 1, 512, 32, "fp16", p)
    assert gqa.ddr_bytes < mha.ddr_bytes


def test_user_mistakes_are_one_line_errors():
    flat = _platform([Tier("dram", 10**9, 10e9, 0.0, 1)])
    with pytest.raises(RatrainError, match="on-chip tier"):
        plan_gemm(8, 8, 8, "fp16", flat)
    with pytest.raises(RatrainError, match="dtype"):
        plan_gemm(8, 8, 8, "fp8", MT3000)
    with pytest.raises(RatrainError, match="staging tier"):
        plan_gemm(8, 8, 8, "fp16", MT3000, stage="am")
    with pytest.raises(RatrainError, match="kv_heads"):
        plan_attention(1, 6, 4, 16, 8, "fp16", MT3000)
    tiny = _platform([Tier("l1", 256, 1e9, 0.0, 1), Tier("mem", 10**9, 1e9, 0.0, 1)])
    with pytest.raises(RatrainError, match="no tile fits"):
        plan_attention(1, 1, 1, 64, 64, "fp16", tiny)
    assert not tiling.applies(flat) and tiling.applies(MT3000)


def test_compute_cost_hook_uses_the_tile_model_on_mt3000():
    compute = pytest.importorskip("ratrain.cost.compute")
    t, bound = compute.gemm_time_s(4096, 4096, 4096, "fp16", MT3000)
    assert bound in ("compute", "dma")
    assert t == plan_gemm(4096, 4096, 4096, "fp16", MT3000).time_s
    t, bound = compute.attention_time_s(
        1, 32, 32, 1024, 128, "fp16", MT3000, causal=True, backward=True
    )
    assert bound in ("compute", "dma") and t > 0
    _, bound = compute.gemm_time_s(4096, 4096, 4096, "fp16", load("a100-80g"))
    assert bound == "flat"
