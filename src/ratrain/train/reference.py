"""The reference trainer: one process, no pipeline, the ground truth for every other mode.

One step k, for a plan with dp replicas of m microbatches each:

1. the compute-dtype model runs forward and backward on each of the dp * m microbatches of
   the global batch, in replica-major order (`Batches`), with loss * S / (dp * m) (S the
   fp16 loss scale, else 1), so the gradient is that of the global-batch mean loss;
2. each microbatch's gradients are added to fp32 accumulators (`plan.grad_dtype`);
3. the global squared norm is summed per unit, in fp64, exactly (`runtime.optim`); a
   non-finite norm is an fp16 overflow: the step is skipped and S halved;
4. AdamW updates the fp32 master weights with gradients scaled by clip_coef / S, at
   lr_at(k); the compute-dtype copy is refreshed from the masters.

`evaluate(batches)`: the held-out loss, forward only, in the pipeline evaluation's order.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ratrain.config import Plan, TrainConfig
from ratrain.data.base import Batches, TokenSource
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.nn.llama import LlamaModel, cross_entropy
from ratrain.observe.metrics import JsonlWriter
from ratrain.runtime.lr import lr_at
from ratrain.runtime.optim import adamw_step_, clip_coefficient, decays, unit_sq_norm
from ratrain.runtime.precision import LossScaler, torch_dtype

__all__ = ["ReferenceTrainer", "StepStats"]


@dataclass
class StepStats:
    step: int
    loss: float
    """Mean next-token loss over the global batch (unscaled)."""
    lr: float
    grad_norm: float
    """Global gradient norm before clipping (inf when the step overflowed)."""
    tokens_per_s: float
    step_time_s: float
    loss_scale: float | None = None
    """fp16 only: the scale the step ran with."""
    skipped: bool = False
    """fp16 only: the step overflowed and was skipped."""

    def record(self) -> dict:
        d = asdict(self)
        if d["loss_scale"] is None:
            del d["loss_scale"], d["skipped"]
        return d


class ReferenceTrainer:
    """Plain gradient accumulation over the global batch; fp32 masters; AdamW; clipping."""

    def __init__(
        self,
        spec: ModelSpec,
        plan: Plan,
        cfg: TrainConfig,
        source: TokenSource,
        *,
        backend: str = "torch",
        metrics: JsonlWriter | None = None,
    ):
        plan.check_for(spec)
        if source.vocab > spec.vocab:
            raise RatrainError(
                f"data vocab {source.vocab} exceeds {spec.name}'s vocab {spec.vocab}"
            )
        self.spec, self.plan, self.cfg, self.metrics = spec, plan, cfg, metrics
        self.batches = Batches.from_plan(source, plan)
        self.master = LlamaModel(spec, backend, seed=cfg.seed)  # fp32 master weights
        dtype = torch_dtype(plan.compute_dtype)
        self.model = self.master if dtype == torch.float32 else copy.deepcopy(self.master).to(dtype)
        # Parameters in `named_parameters` order (a tied weight once, in unit 0).
        self.masters = list(self.master.parameters())
        self.views = list(self.model.parameters())
        grad_dtype = torch_dtype(plan.grad_dtype)
        self.grads = [torch.zeros_like(p, dtype=grad_dtype) for p in self.masters]
        self.exp_avg = [torch.zeros_like(p) for p in self.masters]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.masters]
        self.unit_params = _unit_param_indices(self.master)
        self.scaler = LossScaler.for_dtype(
            plan.compute_dtype, cfg.loss_scale_init, cfg.loss_scale_window
        )
        self.updates = 0  # optimizer steps taken (skipped steps do not count)

    def train(self, on_step: Callable[[StepStats], None] | None = None) -> list[float]:
        """Run steps 0 .. cfg.steps - 1; returns the per-step losses."""
        losses = []
        for step in range(self.cfg.steps):
            stats = self.train_step(step)
            losses.append(stats.loss)
            if self.metrics is not None:
                self.metrics.write(stats.record())
            if on_step is not None:
                on_step(stats)
        return losses

    def train_step(self, step: int) -> StepStats:
        t0 = time.perf_counter()
        lr = lr_at(step, self.cfg)
        loss_scale = self.scaler.scale
        loss = self._accumulate(step, loss_scale)
        unit_sq = [unit_sq_norm(self.grads[i] for i in idx) for idx in self.unit_params]
        # S is a power of two, so dividing the squared norms by S^2 is exact.
        grad_norm, coef = clip_coefficient(
            [s / loss_scale**2 for s in unit_sq], self.plan.clip_grad
        )
        overflow = not math.isfinite(grad_norm)
        if overflow and not self.scaler.enabled:
            raise RatrainError(
                f"non-finite gradients at step {step} (loss {loss:.4g}): training diverged; "
                "lower --lr or use --dtype fp32"
            )
        if not overflow:
            self._update(lr, coef / loss_scale)
        self.scaler.update(overflow)
        for g in self.grads:
            g.zero_()
        dt = time.perf_counter() - t0
        fp16 = self.scaler.enabled
        return StepStats(
            step=step,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            tokens_per_s=self.batches.global_batch * self.plan.seq / dt,
            step_time_s=dt,
            loss_scale=loss_scale if fp16 else None,
            skipped=overflow if fp16 else False,
        )

    def _accumulate(self, step: int, loss_scale: float) -> float:
        """Forward and backward over the global batch; returns its mean loss."""
        n_micro = self.plan.dp * self.plan.microbatches
        loss_sum = 0.0
        for r in range(self.plan.dp):
            for mb in range(self.plan.microbatches):
                inputs, targets = self.batches.batch(step, mb, r)
                loss = cross_entropy(self.model(inputs), targets)
                (loss * (loss_scale / n_micro)).backward()
                loss_sum += loss.item()
                for g, p in zip(self.grads, self.views, strict=True):
                    g.add_(p.grad.to(g.dtype))
                    p.grad = None
        return loss_sum / n_micro

    @torch.no_grad()
    def evaluate(self, batches: Batches) -> float:
        """The held-out loss of the current weights on `batches` (e.g.
        `ratrain.train.job.eval_batches`): forward only over its step 0, replica-major in
        microbatch order, each microbatch's mean loss times its tokens summed in fp64, over
        the tokens; the order and sums of the pipeline's evaluation. Changes no state."""
        total, tokens = 0.0, 0
        for r in range(batches.dp):
            for mb in range(batches.microbatches):
                inputs, targets = batches.batch(0, mb, r)
                total += cross_entropy(self.model(inputs), targets).item() * targets.numel()
                tokens += targets.numel()
        return total / tokens

    @torch.no_grad()
    def _update(self, lr: float, grad_scale: float) -> None:
        self.updates += 1
        c = self.cfg
        for i, p in enumerate(self.masters):
            adamw_step_(
                p,
                self.grads[i],
                self.exp_avg[i],
                self.exp_avg_sq[i],
                step=self.updates,
                lr=lr,
                beta1=c.beta1,
                beta2=c.beta2,
                eps=c.eps,
                weight_decay=c.weight_decay if decays(p) else 0.0,
                grad_scale=grad_scale,
            )
            if self.views[i] is not p:
                self.views[i].copy_(p)


def _unit_param_indices(model: LlamaModel) -> list[list[int]]:
    """For each unit in order, the indices (into `model.parameters()`) of the tensors it owns."""
    index = {id(p): i for i, p in enumerate(model.parameters())}
    seen: set[int] = set()
    out = []
    for unit in model.units:
        own = [index[id(p)] for p in unit.parameters() if id(p) not in seen]
        seen.update(id(p) for p in unit.parameters())
        out.append(own)
    assert sorted(i for u in out for i in u) == list(range(len(index)))
    return out
