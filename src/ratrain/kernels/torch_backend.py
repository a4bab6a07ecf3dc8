"""The default backend: PyTorch's own GEMM and scaled-dot-product attention.

Backward passes come from autograd, except a 16-bit linear layer's on a CPU without
16-bit GEMM units, whose input gradient takes the GEMM layout that runs fast there
(`ratrain.kernels.cpu_half`). ALiBi is passed to `scaled_dot_product_attention` as
an additive float bias that already carries the causal mask, because SDPA accepts either
`is_causal` or `attn_mask`, not both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ratrain.kernels.base import register_backend
from ratrain.kernels.cpu_half import HalfLinear, use_half_linear

__all__ = ["TorchBackend", "alibi_bias"]

# `enable_gqa` arrived in torch 2.5; older versions get the kv heads repeated instead.
_SDPA_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def alibi_bias(
    slopes: torch.Tensor, seq: int, *, causal: bool = True, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The additive ALiBi score bias slopes[h] * (j - i), with -inf above the diagonal if causal.

    slopes: (nh,). Returns (nh, T, T). Built in fp32, then cast to `dtype` (SDPA wants the
    bias in the query's dtype).
    """
    pos = torch.arange(seq, device=slopes.device, dtype=torch.float32)
    dist = pos[None, :] - pos[:, None]  # (T, T): j - i
    bias = slopes.to(torch.float32)[:, None, None] * dist  # (nh, T, T)
    if causal:
        future = torch.ones(seq, seq, dtype=torch.bool, device=slopes.device).triu(1)
        bias = bias.masked_fill(future, float("-inf"))
    return bias.to(dtype)


class TorchBackend:
    """`ratrain.kernels.base.Backend` on `torch.nn.functional`."""

    name = "torch"

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if use_half_linear(x, weight):  # 16-bit on a CPU without 16-bit GEMM units
            return HalfLinear.apply(x, weight, bias)
        return F.linear(x, weight, bias)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = True,
        alibi_slopes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        n_heads, n_kv_heads = q.shape[1], k.shape[1]
        assert n_heads % n_kv_heads == 0, (n_heads, n_kv_heads)
        kwargs = {}
        if n_kv_heads != n_heads:
            if _SDPA_HAS_GQA:
                kwargs["enable_gqa"] = True
            else:
                rep = n_heads // n_kv_heads
                k = k.repeat_interleave(rep, dim=1)  # (B, nh, T, hs)
                v = v.repeat_interleave(rep, dim=1)
        if alibi_slopes is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kwargs)
        assert alibi_slopes.shape == (n_heads,), (alibi_slopes.shape, n_heads)
        assert q.shape[2] == k.shape[2], "ALiBi bias assumes queries and keys share positions"
        bias = alibi_bias(alibi_slopes.to(q.device), q.shape[2], causal=causal, dtype=q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None], **kwargs)


register_backend("torch", TorchBackend)
