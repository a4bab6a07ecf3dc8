"""The learning-rate schedule: linear warmup, then cosine decay to `min_lr` (as in nanoGPT).

A pure function of the step, so every stage and replica computes the same value locally.
Steps count from 0; the optimizer step of training step k uses `lr_at(k, cfg)`.
"""

from __future__ import annotations

import math

from ratrain.config import TrainConfig

__all__ = ["lr_at"]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """lr * (step + 1) / (warmup + 1) while warming up, then a cosine from lr (at the end of
    the warmup) to min_lr (at `cfg.steps`), and min_lr after that."""
    assert step >= 0, step
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    decay_steps = cfg.steps - cfg.warmup_steps
    if step >= cfg.steps or decay_steps <= 0:
        return cfg.min_lr
    ratio = (step - cfg.warmup_steps) / decay_steps  # in [0, 1)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)
