"""A linear layer's backward in the layout that 16-bit GEMMs run fast on CPUs without
native 16-bit units.

Autograd's backward of `F.linear` computes the input gradient as dX = dY @ W, both operands
row-major: the "NN" layout. On a CPU whose oneDNN has no bf16/fp16 path (AVX2 only: no
AVX-512-BF16, no AMX), torch's 16-bit GEMM for that layout runs 10-20x slower than for
the others. measured (torch 2.13.0+cpu, AMD EPYC with AVX2, one thread, fastest of 3;
`benchmarks/cpu_half_gemm.py`): bf16 dY @ W at 0.8-2.4 GFLOP/s, where the weight
gradient dYᵀ @ X runs at 15-25 and the forward X @ Wᵀ at 8-10; the speed of the NN layout
also jumps with the shape (power-of-two widths are slowest), so no size curve predicts it.

`HalfLinear` computes the same product as (dYᵀ)ᵀ @ W, with dYᵀ made contiguous first: the
fast "TN" layout, at 16-25 GFLOP/s, for one transient copy of dY (the size of the layer's
output gradient, which the backward holds anyway). The forward and the weight gradient are
autograd's own. The result is the same product accumulated in another order (within one
rounding of the 16-bit result; fp32 is never routed here).

`use_half_linear` says where it applies: 16-bit CPU tensors, with autograd recording, on a
CPU that oneDNN cannot run 16-bit GEMMs on natively (`torch.ops.mkldnn`'s own checks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["HalfLinear", "use_half_linear", "cpu_lacks_half_gemm"]

_HALF = (torch.bfloat16, torch.float16)


def _onednn_lacks(dtype: torch.dtype) -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    name = "_is_mkldnn_bf16_supported" if dtype == torch.bfloat16 else "_is_mkldnn_fp16_supported"
    try:
        return not bool(getattr(ops, name)())
    except (AttributeError, RuntimeError):
        return True  # no way to ask: the TN layout is never slower than NN here


# Asked once, at import (a cached call inside a compiled unit would be traced by dynamo).
_LACKS = {dt: _onednn_lacks(dt) for dt in _HALF}


def cpu_lacks_half_gemm(dtype: torch.dtype) -> bool:
    """True when oneDNN has no native 16-bit GEMM for `dtype` on this CPU (then torch's
    fallback runs the NN layout slowly)."""
    return _LACKS[dtype]


def use_half_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.dtype in _HALF
        and x.device.type == "cpu"
        and torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad)
        and cpu_lacks_half_gemm(x.dtype)
    )


class HalfLinear(torch.autograd.Function):
    """y = x Wᵀ + b; saves what `F.linear`'s autograd saves (x and W)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # (m, n)
        dx = dw = db = None
        if ctx.needs_input_grad[1]:
            dw = g2.t() @ x.reshape(-1, x.shape[-1])  # (n, k): TN, fast as it is
        if ctx.needs_input_grad[0]:
            dx = (g2.t().contiguous().t() @ weight).reshape(x.shape)  # TN instead of NN
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g2.sum(0)
        return dx, dw, db
