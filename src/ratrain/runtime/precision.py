"""Compute dtypes and fp16 dynamic loss scaling.

fp16 has a narrow exponent range, so the loss is multiplied by a scale S before backward
and the gradients divided by S before the update (Micikevicius et al. 2018, "Mixed
Precision Training"). The scale follows the usual dynamic rule (as in
`torch.amp.GradScaler` and Megatron): when any gradient is inf or nan the step is skipped
and S is multiplied by `backoff` (0.5); after `growth_interval` consecutive good steps S
is multiplied by `growth` (2). fp32 and bf16 need no scaling (S = 1, never skip).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ratrain.errors import RatrainError

__all__ = ["TORCH_DTYPES", "torch_dtype", "LossScaler"]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise RatrainError(
            f"dtype must be one of {', '.join(TORCH_DTYPES)}, got {name!r}"
        ) from None


@dataclass
class LossScaler:
    """Dynamic loss scale. `enabled=False` (fp32/bf16) keeps scale 1.0 and never skips."""

    enabled: bool
    scale: float = 2.0**16
    growth_interval: int = 1000
    backoff: float = 0.5
    growth: float = 2.0
    good_steps: int = 0
    """Consecutive steps without overflow since the scale last changed."""

    def __post_init__(self) -> None:
        if not self.enabled:
            self.scale = 1.0
        if not self.scale > 0 or self.growth_interval <= 0:
            raise RatrainError("loss scale must be positive and its growth interval >= 1")

    @classmethod
    def for_dtype(cls, dtype: str, init_scale: float = 2.0**16, growth_interval: int = 1000):
        return cls(dtype == "fp16", init_scale, growth_interval)

    def update(self, overflow: bool) -> None:
        """After a step: back off on overflow (the step was skipped), else maybe grow."""
        if not self.enabled:
            assert not overflow, "overflow without loss scaling: the caller must not skip"
            return
        if overflow:
            self.scale *= self.backoff
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth
            self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
