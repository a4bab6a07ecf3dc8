"""The tiled backend: GEMM and attention executed tile by tile through explicit buffers sized
for a platform's memory tiers, counting the bytes moved between each pair of tiers.

It runs on CPU in PyTorch; speed is not its purpose. What it gives is numerics of fp16/bf16
kernels with fp32 accumulation (FlashAttention-2-style attention, forward and backward),
and data movement that can be checked: for a `TilePlan` from `ratrain.cost.tiling`, the
bytes counted in `backend.counter` equal `plan.bytes_moved` exactly.

    backend = TiledBackend("mt3000")               # or a Platform; dtype="bf16" to cast
    y = backend.linear(x, w)                        # autograd: dX and dW are tiled GEMMs too
    o = backend.attention(q, k, v, causal=True)     # autograd: the tiled FA-2 backward
    backend.counter.bytes_moved                     # {"ddr->gsm": ..., "gsm->am": ..., ...}

Not tiled (and not counted): the bias gradient (a column sum) and dtype casts on entry.
"""

from __future__ import annotations

import torch

from ratrain.cost.tiling import (
    TilePlan,
    plan_attention,
    plan_attention_backward,
    plan_gemm,
)
from ratrain.errors import RatrainError
from ratrain.kernels.base import register_backend
from ratrain.kernels.tiled_attention import run_attention_backward, run_attention_forward
from ratrain.kernels.tiled_engine import DTYPE_NAMES, Engine, TrafficCounter, dtype_name
from ratrain.kernels.tiled_gemm import run_gemm
from ratrain.platforms import Platform

__all__ = ["TiledBackend"]

_TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


class TiledBackend:
    """`ratrain.kernels.base.Backend` with explicit tiers; see the module docstring."""

    name = "tiled"

    def __init__(self, platform: Platform | str | None = None, *, dtype: str | None = None):
        """platform: a `Platform` or a preset name (default "mt3000"), loaded on first use.
        dtype: "fp16", "bf16" or "fp32" to cast inputs to (outputs are cast back); None runs
        in the inputs' dtype."""
        if dtype is not None and dtype not in _TORCH_DTYPES:
            raise RatrainError(f"unknown dtype {dtype!r}; choose one of fp16, bf16, fp32")
        self._platform = platform
        self.dtype = dtype
        self.counter = TrafficCounter()
        self._engine: Engine | None = None

    @property
    def platform(self) -> Platform:
        if not isinstance(self._platform, Platform):
            from ratrain.platforms.load import load

            self._platform = load(self._platform or "mt3000")
        return self._platform

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine(tuple(self.platform.tiers), self.counter)
        return self._engine

    # --- the kernels, with an explicit plan or one planned for this platform ----------------

    def gemm(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        plan: TilePlan | None = None,
    ) -> torch.Tensor:
        """C = A (m, k) @ B (k, n) (+ bias), no autograd."""
        if plan is None:
            m, k = a.shape
            plan = plan_gemm(m, b.shape[1], k, dtype_name(a), self.platform, bias=bias is not None)
        return run_gemm(self.engine, plan, a, b, bias)

    def attention_forward(self, q, k, v, *, causal=True, alibi_slopes=None, plan=None):
        """(O, LSE) of the attention, no autograd. q: (B, H, S, D); k, v: (B, KV, S, D)."""
        if plan is None:
            plan = plan_attention(*_attn_shape(q, k), dtype_name(q), self.platform, causal=causal)
        return run_attention_forward(
            self.engine, plan, q, k, v, causal=causal, slopes=_slopes(alibi_slopes)
        )

    def attention_backward(
        self, q, k, v, out, lse, dout, *, causal=True, alibi_slopes=None, plan=None
    ):
        """(dq, dk, dv) from the forward's inputs, O and LSE, and dO."""
        if plan is None:
            plan = plan_attention_backward(
                *_attn_shape(q, k), dtype_name(q), self.platform, causal=causal
            )
        return run_attention_backward(
            self.engine, plan, q, k, v, out, lse, dout, causal=causal, slopes=_slopes(alibi_slopes)
        )

    # --- the Backend interface (autograd) ----------------------------------------------------

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """y = x @ weightᵀ + bias. x: (..., k), weight: (n, k) -> (..., n)."""
        dt = _TORCH_DTYPES[self.dtype] if self.dtype else x.dtype
        x2 = x.reshape(-1, x.shape[-1]).to(dt)  # (m, k)
        b = None if bias is None else bias.to(dt)
        y = _LinearFn.apply(x2, weight.to(dt), b, self)
        return y.reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = True,
        alibi_slopes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if q.shape[1] % k.shape[1] or k.shape != v.shape or q.shape[2] != k.shape[2]:
            raise RatrainError(
                f"attention wants q (B, H, S, D) and k, v (B, KV, S, D) with KV dividing H, "
                f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
            )
        dt = _TORCH_DTYPES[self.dtype] if self.dtype else q.dtype
        out = _AttentionFn.apply(q.to(dt), k.to(dt), v.to(dt), alibi_slopes, causal, self)
        return out.to(q.dtype)


def _attn_shape(q: torch.Tensor, k: torch.Tensor) -> tuple[int, int, int, int, int]:
    b, h, s, d = q.shape
    return b, h, k.shape[1], s, d


def _slopes(alibi_slopes: torch.Tensor | None) -> torch.Tensor | None:
    # Per-head scalars, kernel arguments: not moved through the tiers.
    return None if alibi_slopes is None else alibi_slopes.detach().to(torch.float32)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, backend: TiledBackend):
        ctx.save_for_backward(x, weight)
        ctx.backend, ctx.has_bias = backend, bias is not None
        return backend.gemm(x, weight.t(), bias=bias)  # (m, k) @ (k, n)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        be = ctx.backend
        dy = dy.to(x.dtype)
        dx = be.gemm(dy, weight) if ctx.needs_input_grad[0] else None  # (m, n) @ (n, k)
        dw = be.gemm(dy.t(), x) if ctx.needs_input_grad[1] else None  # (n, m) @ (m, k)
        db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.float().sum(0).to(dy.dtype)
        return dx, dw, db, None


class _AttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, slopes, causal: bool, backend: TiledBackend):
        out, lse = backend.attention_forward(q, k, v, causal=causal, alibi_slopes=slopes)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.slopes, ctx.causal, ctx.backend = slopes, causal, backend
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.backend.attention_backward(
            q, k, v, out, lse, dout.to(q.dtype), causal=ctx.causal, alibi_slopes=ctx.slopes
        )
        return dq, dk, dv, None, None, None


register_backend("tiled", TiledBackend)
