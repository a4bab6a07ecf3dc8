"""AdamW on fp32 master weights, one tensor at a time, and global gradient-norm clipping.

The update is element-wise and takes every scalar as an argument, so applying it per
layer (as the lifecycle schedule does, UPDATE(l) by UPDATE(l)) or to all layers at once
gives bit-identical weights. Its operations and their order are those of
`torch.optim.AdamW`'s single-tensor path (`foreach=False`), so it also matches torch.

Weight decay rule: decoupled decay (Loshchilov & Hutter 2019, "Decoupled Weight Decay
Regularization") on matrices only, i.e. tensors with ndim >= 2 (linear weights, the
embedding and the head); RMSNorm weights and biases (ndim 1) are not decayed. This is
nanoGPT's rule.

Global norm, and why it is the same on every pipeline layout: each gradient tensor's
squared norm is summed in fp64 (`sq_norm`); a unit's value is the exact (`math.fsum`) sum
of its tensors' values, and the total is the exact sum of the units' values. An exact sum
does not depend on order, so stages may combine their units' sums in any order (or
all-gather them) and every rank gets the same total, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ratrain.sizes.workspace import ADAMW_CHUNK_ELEMS

__all__ = [
    "decays",
    "adamw_step_",
    "sq_norm",
    "unit_sq_norm",
    "clip_coefficient",
    "CLIP_EPS",
]

CLIP_EPS = 1e-6
"""Added to the norm before dividing, as in `torch.nn.utils.clip_grad_norm_`."""


def decays(param: torch.Tensor) -> bool:
    """Whether weight decay applies: matrices yes, vectors (norm weights, biases) no."""
    return param.ndim >= 2


@torch.no_grad()
def adamw_step_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    grad_scale: float = 1.0,
) -> None:
    """One AdamW step of one fp32 tensor, in place. `step` counts from 1 (bias correction).

    `grad` is multiplied by `grad_scale` first (the clip coefficient divided by the fp16
    loss scale); `weight_decay` is applied as given, so pass 0.0 for tensors `decays` rejects.

    Contiguous tensors are walked in slices of `ADAMW_CHUNK_ELEMS` elements: every
    operation is element-wise, so the result is the same bit for bit, and the temporaries
    (sqrt(v), its quotient, a scaled gradient) are a slice's size rather than the tensor's
    (16 MiB for a 8192 x 512 embedding), which a step's allocator then need not keep.
    """
    assert param.dtype == exp_avg.dtype == exp_avg_sq.dtype == torch.float32
    assert step >= 1, step
    n = param.numel()
    tensors = (param, grad, exp_avg, exp_avg_sq)
    if n <= ADAMW_CHUNK_ELEMS or not all(t.is_contiguous() for t in tensors):
        _adamw_slice_(*tensors, step, lr, beta1, beta2, eps, weight_decay, grad_scale)
        return
    flat = [t.view(-1) for t in tensors]
    for i in range(0, n, ADAMW_CHUNK_ELEMS):
        part = [t[i : i + ADAMW_CHUNK_ELEMS] for t in flat]
        _adamw_slice_(*part, step, lr, beta1, beta2, eps, weight_decay, grad_scale)


def _adamw_slice_(
    param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, grad_scale
) -> None:
    grad = grad.float()
    if grad_scale != 1.0:
        grad = grad * grad_scale
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


@torch.no_grad()
def sq_norm(grad: torch.Tensor) -> float:
    """The squared L2 norm of one tensor, summed in fp64 (inf or nan if any element is)."""
    return float(torch.sum(torch.square(grad.to(torch.float64))))


def unit_sq_norm(grads: Iterable[torch.Tensor]) -> float:
    """The squared norm of a unit's gradients: the exact sum of the per-tensor fp64 sums."""
    return math.fsum(sq_norm(g) for g in grads)


def clip_coefficient(unit_sq_norms: Iterable[float], max_norm: float | None) -> tuple[float, float]:
    """(total_norm, coef) from the per-unit squared norms, like `clip_grad_norm_`.

    total_norm = sqrt(exact sum); coef = max_norm / (total_norm + 1e-6), clamped to 1.0
    (1.0 when `max_norm` is None: no clipping). A non-finite total (fp16 overflow) gives a
    non-finite norm; the caller skips the step.
    """
    total = math.fsum(unit_sq_norms)
    total_norm = math.sqrt(total) if math.isfinite(total) else math.inf
    if max_norm is None or not math.isfinite(total_norm):
        return total_norm, 1.0
    return total_norm, min(max_norm / (total_norm + CLIP_EPS), 1.0)
