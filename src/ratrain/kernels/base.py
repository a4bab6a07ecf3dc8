"""The backend interface and its registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Backend", "REGISTRY", "register_backend"]


@runtime_checkable
class Backend(Protocol):
    name: str

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """y = x @ weightᵀ + bias. x: (..., k), weight: (n, k) -> (..., n)."""
        ...

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = True,
        alibi_slopes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scaled dot-product attention with scale 1/sqrt(head_dim).

        q: (B, nh, T, hs); k, v: (B, nkv, T, hs) with nkv dividing nh (GQA: query head i
        reads kv head i // (nh // nkv)). alibi_slopes: (nh,) or None; when given, the score
        of query i for key j gets slopes[h] * (j - i) added before the softmax.
        Returns (B, nh, T, hs).
        """
        ...


REGISTRY: dict[str, Callable[[], Backend]] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    REGISTRY[name] = factory
