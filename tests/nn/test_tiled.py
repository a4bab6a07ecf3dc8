"""The tiled backend: numerics against torch (matmul, scaled_dot_product_attention and
autograd), bytes/moves/FLOPs counted equal to the planner's prediction, buffers within the
tiers, and attention backward memory linear in the sequence length (no s x s tensor)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from _platforms import KIB, THREE, make_platform
from ratrain.cost.tiling import plan_attention, plan_attention_backward, plan_gemm
from ratrain.errors import RatrainError
from ratrain.kernels import get_backend
from ratrain.kernels.tiled import TiledBackend
from ratrain.kernels.torch_backend import TorchBackend
from ratrain.platforms import Tier

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# Max error relative to the largest reference value: a few ulps of the output dtype.
TOL = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 2e-5}


TWO = make_platform([Tier("l1", 12 * KIB, 50e9, 1e-6, 2), Tier("mem", 10**9, 10e9, 1e-6, 1)])


def _close(got, want, dtype):
    err = (got.float() - want.float()).abs().max() / want.float().abs().max()
    assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]}"


def _assert_counted_as_planned(backend, plan):
    c = backend.counter
    assert c.bytes_moved == plan.bytes_moved
    assert c.moves == plan.moves
    assert c.flops == plan.flops
    for tier, nbytes in plan.buffer_bytes.items():
        assert backend.engine.peak_bytes[tier] == nbytes, tier


def _run(backend, plan, fn):
    backend.counter.reset()
    backend.engine.reset_peak()
    out = fn()
    _assert_counted_as_planned(backend, plan)
    return out


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("stage", [None, "l2"])
@pytest.mark.parametrize("m,n,k,bias", [(50, 70, 90, False), (67, 33, 129, True)])
def test_gemm_matches_torch_and_the_plan(dtype, stage, m, n, k, bias):
    torch.manual_seed(0)
    dt = DTYPES[dtype]
    a, b = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
    bb = torch.randn(n, dtype=dt) if bias else None
    plan = plan_gemm(m, n, k, dtype, THREE, bias=bias, stage=stage)
    assert plan.stage == stage and (plan.tile["m"] < m or plan.tile["n"] < n)
    be = TiledBackend(THREE)
    c = _run(be, plan, lambda: be.gemm(a, b, bias=bb, plan=plan))
    want = a.float() @ b.float() + (bb.float() if bias else 0)
    _close(c, want, dtype)
    _close(c, torch.matmul(a, b) + (bb if bias else 0), dtype)


def _reference(q, k, v, causal, slopes):
    """fp32 SDPA (the torch backend) on fp32 copies, with autograd."""
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out = TorchBackend().attention(*leaves, causal=causal, alibi_slopes=slopes)
    return out, leaves


ATTN = [  # batch, heads, kv_heads, seq, head_dim, causal, alibi
    (1, 2, 2, 45, 16, True, False),
    (2, 4, 2, 75, 16, False, True),
    (1, 4, 1, 70, 8, True, True),
]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("platform,stage", [(TWO, None), (THREE, "l2"), (THREE, None)])
@pytest.mark.parametrize("b,h,kvh,s,d,causal,alibi", ATTN)
def test_attention_forward_backward_match_sdpa_and_the_plan(
    dtype, platform, stage, b, h, kvh, s, d, causal, alibi
):
    torch.manual_seed(1)
    dt = DTYPES[dtype]
    q, k, v = (torch.randn(b, x, s, d, dtype=dt) for x in (h, kvh, kvh))
    slopes = torch.tensor([2 ** (-8 * (i + 1) / h) for i in range(h)]) if alibi else None
    be = TiledBackend(platform)
    fwd = plan_attention(b, h, kvh, s, d, dtype, platform, causal=causal, stage=stage)
    bwd = plan_attention_backward(b, h, kvh, s, d, dtype, platform, causal=causal, stage=stage)
    assert min(fwd.tile["q"], fwd.tile["kv"]) < s and min(bwd.tile["q"], bwd.tile["kv"]) < s

    out, lse = _run(
        be, fwd, lambda: be.attention_forward(q, k, v, causal=causal, alibi_slopes=slopes, plan=fwd)
    )
    ref, leaves = _reference(q, k, v, causal, slopes)
    _close(out, ref, dtype)

    dout = torch.randn(b, h, s, d)
    ref.backward(dout)
    grads = _run(
        be,
        bwd,
        lambda: be.attention_backward(
            q, k, v, out, lse, dout.to(dt), causal=causal, alibi_slopes=slopes, plan=bwd
        ),
    )
    for got, leaf in zip(grads, leaves, strict=True):
        _close(got, leaf.grad, dtype)


# Without DMA latency, causal staged plans put two units on a core (a short one with a long one).
FOLD = make_platform(
    [
        Tier("l1", 32 * KIB, 50e9, 0.0, 4),
        Tier("l2", 128 * KIB, 40e9, 0.0, 1),
        Tier("mem", 10**9, 10e9, 0.0, 1),
    ]
)


@pytest.mark.parametrize("b,h,kvh,s,d", [(1, 2, 1, 190, 16), (1, 2, 2, 150, 16)])
def test_two_units_per_core_match_sdpa_and_the_plan(b, h, kvh, s, d):
    torch.manual_seed(3)
    q, k, v = (torch.randn(b, x, s, d, dtype=torch.float16) for x in (h, kvh, kvh))
    fwd = plan_attention(b, h, kvh, s, d, "fp16", FOLD, causal=True)
    bwd = plan_attention_backward(b, h, kvh, s, d, "fp16", FOLD, causal=True)
    assert fwd.grid[1] == 2 and bwd.grid[1] == 2 and fwd.stage == bwd.stage == "l2"
    be = TiledBackend(FOLD)
    out, lse = _run(be, fwd, lambda: be.attention_forward(q, k, v, causal=True, plan=fwd))
    ref, leaves = _reference(q, k, v, True, None)
    _close(out, ref, "fp16")
    dout = torch.randn(b, h, s, d)
    ref.backward(dout)
    grads = _run(be, bwd, lambda: be.attention_backward(q, k, v, out, lse, dout.half(), plan=bwd))
    for got, leaf in zip(grads, leaves, strict=True):
        _close(got, leaf.grad, "fp16")


def test_autograd_through_the_backend_interface():
    """linear and attention as a model calls them: outputs and gradients of every input."""
    torch.manual_seed(2)
    be = get_backend(TiledBackend(THREE))
    x = torch.randn(2, 9, 40, dtype=torch.float16, requires_grad=True)
    w = torch.randn(24, 40, dtype=torch.float16, requires_grad=True)
    bias = torch.randn(24, dtype=torch.float16, requires_grad=True)
    y = be.linear(x, w, bias)
    y.float().square().sum().backward()
    flops_fwd_bwd = be.counter.flops
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, bias))
    yr = torch.nn.functional.linear(xr, wr, br)
    yr.square().sum().backward()
    _close(y, yr, "fp16")
    for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (bias.grad, br.grad)):
        _close(got, want, "fp16")
    assert flops_fwd_bwd == 3 * 2 * 18 * 24 * 40  # Y, dX and dW all tiled

    q = torch.randn(2, 4, 33, 16, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 33, 16, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 2, 33, 16, dtype=torch.bfloat16, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    o = be.attention(q, k, v, causal=True, alibi_slopes=slopes)
    do = torch.randn_like(o, dtype=torch.float32)
    o.float().backward(do)
    ref, leaves = _reference(q, k, v, True, slopes)
    ref.backward(do)
    _close(o, ref, "bf16")
    for got, leaf in zip((q.grad, k.grad, v.grad), leaves, strict=True):
        _close(got, leaf.grad, "bf16")


def test_backend_casts_to_its_compute_dtype():
    be = TiledBackend(TWO, dtype="bf16")
    x, w = torch.randn(10, 32), torch.randn(16, 32)
    y = be.linear(x, w)
    assert y.dtype == torch.float32
    _close(y, x @ w.t(), "bf16")
    assert be.counter.bytes_moved["mem->l1"] > 0


def test_default_platform_is_mt3000_and_counts_match():
    be = get_backend("tiled")
    assert be.platform.name == "mt3000"
    a, b = torch.randn(64, 80, dtype=torch.float16), torch.randn(80, 96, dtype=torch.float16)
    plan = plan_gemm(64, 96, 80, "fp16", be.platform)
    _run(be, plan, lambda: be.gemm(a, b))
    q, k = (
        torch.randn(1, 4, 64, 32, dtype=torch.float16),
        torch.randn(1, 2, 64, 32, dtype=torch.float16),
    )
    plan = plan_attention(1, 4, 2, 64, 32, "fp16", be.platform)
    _run(be, plan, lambda: be.attention_forward(q, k, k, plan=plan))


def test_wrong_plans_are_refused():
    a, b = torch.randn(50, 90, dtype=torch.float16), torch.randn(90, 70, dtype=torch.float16)
    with pytest.raises(RatrainError, match="plan is for"):
        TiledBackend(THREE).gemm(a, b[:, :60], plan=plan_gemm(50, 70, 90, "fp16", THREE))
    with pytest.raises(RatrainError, match="fp32"):
        TiledBackend(THREE).gemm(a, b, plan=plan_gemm(50, 70, 90, "fp32", THREE))
    big = make_platform([Tier("l1", 256 * KIB, 50e9, 1e-6, 1), Tier("mem", 10**9, 10e9, 1e-6, 1)])
    with pytest.raises(RatrainError, match="does not fit"):
        TiledBackend(TWO).gemm(a, b, plan=plan_gemm(50, 70, 90, "fp16", big))
    with pytest.raises(RatrainError, match="fp16, bf16 or fp32"):
        TiledBackend(TWO).gemm(a.double(), b.double())


class _LargestTensor(TorchDispatchMode):
    """Records the largest numel of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def _attention_backward_footprint(s):
    platform = make_platform(
        [Tier("l1", 32 * KIB, 50e9, 1e-6, 2), Tier("mem", 10**9, 10e9, 1e-6, 1)]
    )
    plan = plan_attention_backward(1, 2, 2, s, 16, "fp16", platform, causal=True)
    assert max(plan.tile["q"], plan.tile["kv"]) < 128  # tiles smaller than the shorter run
    be = TiledBackend(platform)
    q, k, v = (torch.randn(1, 2, s, 16, dtype=torch.float16) for _ in range(3))
    out, lse = be.attention_forward(q, k, v, causal=True)
    be.engine.reset_peak()
    with _LargestTensor() as mode:
        grads = be.attention_backward(
            q, k, v, out, lse, torch.randn_like(out), causal=True, plan=plan
        )
    assert all(torch.isfinite(g).all() for g in grads)
    return be.engine.peak_bytes, mode.numel, platform


def test_attention_backward_memory_is_linear_in_sequence_length():
    small, numel_small, platform = _attention_backward_footprint(128)
    large, numel_large, _ = _attention_backward_footprint(256)
    # Main memory: dQ (dtype and fp32 partials), dK, dV and Δ, all proportional to s.
    assert large["mem"] == 2 * small["mem"]
    # On chip: tiles only, within the tier whatever the length.
    assert max(small["l1"], large["l1"]) <= platform.tiers[0].capacity_bytes
    # No tensor of s x s elements, not even transiently inside torch ops.
    assert numel_small < 128 * 128 and numel_large < 256 * 256
    print(f"attention backward peak bytes: s=128 {small}, s=256 {large}")


def test_the_largest_tensor_probe_sees_a_full_score_matrix():
    """The probe above is not vacuous: naive attention trips it."""
    q = torch.randn(1, 2, 128, 16)
    with _LargestTensor() as mode:
        torch.softmax(q @ q.transpose(-1, -2), dim=-1)
    assert mode.numel >= 128 * 128


@pytest.mark.parametrize("preset", ["tiny", "tiny-alibi", "tiny-qwen"])
def test_a_model_block_on_the_tiled_backend_matches_the_torch_backend(preset):
    """The model's own Block (GQA, ALiBi, qkv bias) with every GEMM and attention tiled."""
    from ratrain.models.presets import get_preset
    from ratrain.nn.llama import Block

    spec = get_preset(preset)
    ref, tiled = Block(spec, "torch", 0), Block(spec, TiledBackend(THREE), 0)
    tiled.load_state_dict(ref.state_dict())
    x = torch.randn(2, 40, spec.hidden)
    x_ref, x_tiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_tiled = ref(x_ref), tiled(x_tiled)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y_tiled.backward(dy)
    _close(y_tiled, y_ref, "fp32")
    _close(x_tiled.grad, x_ref.grad, "fp32")
    for (name, p_ref), p_tiled in zip(ref.named_parameters(), tiled.parameters(), strict=True):
        assert torch.allclose(p_tiled.grad, p_ref.grad, rtol=1e-4, atol=1e-5), name
