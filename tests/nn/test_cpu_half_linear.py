"""The 16-bit CPU linear layer (`ratrain.kernels.cpu_half`): the same gradients as autograd's
`F.linear`, to within the 16-bit rounding of a reordered fp32 accumulation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ratrain.kernels import get_backend
from ratrain.kernels.cpu_half import HalfLinear, use_half_linear


def _grads(fn, x, w, b):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    y = fn(x, w, b)
    g = torch.linspace(-1, 1, y.numel(), dtype=torch.float32).reshape(y.shape).to(y.dtype)
    y.backward(g)
    return y, x.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(2, 16, 24), (37, 24)])
def test_half_linear_matches_autograd(dtype, bias, shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen).to(dtype)
    w = torch.randn(40, 24, generator=gen).to(dtype)
    b = torch.randn(40, generator=gen).to(dtype) if bias else None
    ref = _grads(F.linear, x, w, b)
    got = _grads(HalfLinear.apply, x, w, b)
    assert torch.equal(got[0], ref[0])  # the forward is F.linear itself
    assert torch.equal(got[2], ref[2])  # so is the weight gradient's layout
    if bias:
        assert torch.allclose(got[3].float(), ref[3].float(), rtol=1e-2, atol=1e-2)
    # The input gradient in fp64 from the same 16-bit operands: both within 16-bit rounding.
    g = torch.linspace(-1, 1, ref[0].numel()).reshape(ref[0].shape).to(dtype)
    exact = (g.double().reshape(-1, 40) @ w.double()).reshape(x.shape)
    eps = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    scale = exact.abs().max().item()
    for dx in (got[1], ref[1]):
        assert dx.shape == x.shape and dx.dtype == dtype
        assert (dx.double() - exact).abs().max().item() <= 2 * eps * scale


def test_half_linear_only_where_it_applies():
    w = torch.randn(8, 4, dtype=torch.bfloat16, requires_grad=True)
    assert not use_half_linear(torch.randn(3, 4, requires_grad=True), w.float())  # fp32
    with torch.no_grad():
        assert not use_half_linear(torch.randn(3, 4, dtype=torch.bfloat16), w)  # no autograd
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    assert not use_half_linear(x, w.detach())  # nothing needs a gradient


def test_backend_linear_routes_half_cpu(monkeypatch):
    """The torch backend's linear takes the 16-bit path where it applies, and its gradients
    equal the path's own."""
    import ratrain.kernels.cpu_half as cpu_half

    monkeypatch.setattr(cpu_half, "cpu_lacks_half_gemm", lambda dtype: True)
    be = get_backend("torch")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 24, generator=gen).to(torch.bfloat16)
    w = torch.randn(40, 24, generator=gen).to(torch.bfloat16)
    got = _grads(lambda x, w, b: be.linear(x, w, b), x, w, None)
    want = _grads(HalfLinear.apply, x, w, None)
    for a, b in zip(got, want, strict=True):
        assert a is b is None or torch.equal(a, b)
    xr = x.detach().requires_grad_()
    assert be.linear(xr, w).grad_fn.name().startswith("HalfLinear")


def test_half_linear_under_checkpoint():
    """Recomputation (torch.utils.checkpoint) replays the same forward and gives the same
    gradients."""
    from torch.utils.checkpoint import checkpoint

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 24, generator=gen).to(torch.bfloat16)
    w = torch.randn(40, 24, generator=gen).to(torch.bfloat16)
    plain = _grads(HalfLinear.apply, x, w, None)
    ckpt = _grads(
        lambda x, w, b: checkpoint(HalfLinear.apply, x, w, b, use_reentrant=False), x, w, None
    )
    for a, b in zip(plain[:3], ckpt[:3], strict=True):
        assert torch.equal(a, b)
