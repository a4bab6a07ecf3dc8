"""Explicit memory for the tiled backend: buffers placed in named tiers, moves between them,
and the counters of bytes, moves and FLOPs.

Every byte a tiled kernel reads or writes goes through `Engine.move`, from a tensor said to
live in one tier into a buffer (or a slice of main memory) said to live in another; the
engine counts it under "src->dst". Buffers are allocated per tier and per copy of the tier
(one copy per core) and may not exceed the tier's capacity, so a plan that does not fit a
platform fails loudly instead of silently using more on-chip memory than the chip has.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ratrain.errors import RatrainError
from ratrain.platforms import Tier

__all__ = ["TrafficCounter", "Engine", "DTYPE_NAMES", "dtype_name"]

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in DTYPE_NAMES:
        raise RatrainError(
            f"the tiled backend runs fp16, bf16 or fp32 tensors, got {t.dtype}; cast the inputs"
        )
    return DTYPE_NAMES[t.dtype]


class TrafficCounter:
    """Bytes and DMA moves per ordered tier pair ("ddr->gsm"), and FLOPs, since the last reset."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.bytes_moved: dict[str, int] = {}
        self.moves: dict[str, int] = {}
        self.flops = 0

    def add_move(self, key: str, nbytes: int) -> None:
        self.bytes_moved[key] = self.bytes_moved.get(key, 0) + nbytes
        self.moves[key] = self.moves.get(key, 0) + 1

    def snapshot(self) -> dict:
        return {
            "bytes_moved": dict(self.bytes_moved),
            "moves": dict(self.moves),
            "flops": self.flops,
        }


class Engine:
    """Buffers in the tiers of one compute unit, and the moves between them."""

    def __init__(self, tiers: tuple[Tier, ...], counter: TrafficCounter | None = None) -> None:
        self.tiers = {t.name: t for t in tiers}
        self.counter = counter if counter is not None else TrafficCounter()
        self._in_use: dict[tuple[str, int], int] = {}
        self.peak_bytes: dict[str, int] = {}
        """Per tier, the most bytes one copy held at once since the last `reset_peak`."""
        self._scopes: list[list[tuple[tuple[str, int], int]]] = []

    def reset_peak(self) -> None:
        self.peak_bytes = {}

    def alloc(
        self, tier: str, shape: tuple[int, ...], dtype: torch.dtype, copy: int = 0
    ) -> torch.Tensor:
        """A buffer in copy `copy` of `tier`, held until the enclosing `scope` ends."""
        assert self._scopes, "allocate inside Engine.scope()"
        t = self.tiers[tier]
        if not 0 <= copy < t.copies:
            raise RatrainError(f"tier {tier} has {t.copies} copies; the plan asks for copy {copy}")
        buf = torch.empty(shape, dtype=dtype)
        nbytes = buf.numel() * buf.element_size()
        key = (tier, copy)
        used = self._in_use.get(key, 0) + nbytes
        if used > t.capacity_bytes:
            raise RatrainError(
                f"buffers need {used} bytes in tier {tier}, which holds {t.capacity_bytes}; "
                "the tile plan does not fit this platform (plan it for this platform)"
            )
        self._in_use[key] = used
        self.peak_bytes[tier] = max(self.peak_bytes.get(tier, 0), used)
        self._scopes[-1].append((key, nbytes))
        return buf

    @contextmanager
    def scope(self) -> Iterator[None]:
        """Buffers allocated inside are released (in the accounting) when it ends."""
        self._scopes.append([])
        try:
            yield
        finally:
            for key, nbytes in self._scopes.pop():
                self._in_use[key] -= nbytes

    def move(
        self, src: torch.Tensor, src_tier: str, dst: torch.Tensor, dst_tier: str
    ) -> torch.Tensor:
        """Copy src (in src_tier) into dst (in dst_tier), casting to dst's dtype; count the
        bytes as they arrive."""
        assert src.shape == dst.shape, (src.shape, dst.shape)
        dst.copy_(src)
        self.counter.add_move(f"{src_tier}->{dst_tier}", dst.numel() * dst.element_size())
        return dst

    def add_flops(self, n: int) -> None:
        self.counter.flops += n
