"""A pipeline stage's training states, unit by unit: master weights, optimizer states,
parameter view, gradient.

Each unit the stage owns is built alone (`ratrain.nn.llama.build_unit`, the same
values as inside `LlamaModel`) and keeps, as the ledger describes (`ratrain.memory`):

- master weights, fp32: the module's own parameters when the view *is* the master (fp32
  without sharding); separate tensors otherwise; with `shard_optimizer` one flat fp32
  shard holding this replica's 1/dp of the unit's flattened parameters;
- AdamW states (m, v), fp32, shaped like the masters (so sharded too);
- the parameter view, compute dtype: what the module's parameters point to while it is
  live (`VIEW_FETCH` casts or all-gathers it, `VIEW_DROP` releases it);
- the gradient: one flat buffer per unit in `grad_dtype`, allocated at the unit's first
  backward of the step and freed after its update (sharded: the reduce-scattered shard is
  kept and the full buffer freed once the sync has landed). The units of a sync bucket
  (`ratrain.schedule.passes.sync_buckets`) have their flat buffers side by side in one
  bucket buffer, allocated at the bucket's first backward and freed with its last unit's
  gradient, so a bucket's sync is one collective on it, with no copy.

Optimizer work is described by *segments*: (master, m, v, grad, decay) slices that the
element-wise AdamW of `ratrain.runtime.optim` updates one by one; unsharded, one segment
per parameter, exactly the tensors the reference trainer updates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.nn.llama import build_unit
from ratrain.observe.memory import resize_storage
from ratrain.runtime.optim import adamw_step_, decays, unit_sq_norm
from ratrain.runtime.precision import torch_dtype
from ratrain.schedule.passes import sync_buckets as plan_sync_buckets

__all__ = ["Segment", "UnitState", "StageModel", "check_tied"]


@dataclass
class Segment:
    """A slice of one parameter's optimizer state; `grad` is filled in when its sync lands."""

    master: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    decay: bool
    grad_slice: tuple[int, int]
    """(start, end) in the unit's flat gradient (sharded: in the shard)."""
    shape: tuple[int, ...]


@dataclass
class UnitState:
    unit: int
    module: nn.Module
    params: list[nn.Parameter]
    """The parameters this unit owns, module order (a tied weight belongs to unit 0)."""
    offsets: list[int]
    numel: int
    padded: int
    """Flat length rounded up to a multiple of dp (sharding)."""
    segments: list[Segment] = field(default_factory=list)
    master_shard: torch.Tensor | None = None
    view_flat: torch.Tensor | None = None
    """The compute-dtype view the parameters point into (None when the view is the master)."""
    grad: torch.Tensor | None = None
    """Flat gradient of the step (grad_dtype, `padded` long), None outside its lifetime."""
    grad_shard: torch.Tensor | None = None
    slots: list[torch.Tensor] = field(default_factory=list)
    """Per owned parameter, its view of `grad` (valid while `grad` is)."""
    module_params: list[nn.Parameter] = field(default_factory=list)
    """Every parameter the module uses (a tied head's includes unit 0's weight)."""


class StageModel:
    """The units of one stage and their training states."""

    def __init__(
        self,
        spec: ModelSpec,
        plan: Plan,
        cfg: TrainConfig,
        stage: int,
        replica: int,
        device: torch.device,
        backend: str = "torch",
    ):
        self.spec, self.plan, self.cfg = spec, plan, cfg
        self.stage, self.replica, self.device = stage, replica, device
        self.dtype = torch_dtype(plan.compute_dtype)
        self.grad_dtype = torch_dtype(plan.grad_dtype)
        self.sharded = plan.shard_optimizer and plan.dp > 1
        self.view_is_master = self.dtype == torch.float32 and not self.sharded
        self.unit_ids = list(plan.stage_units(spec, stage))
        check_tied(spec, plan)
        modules = {u: build_unit(spec, u, backend, seed=cfg.seed).to(device) for u in self.unit_ids}
        head = spec.n_layers + 1
        if spec.tied_embeddings and 0 in modules:  # it holds the head too (checked)
            modules[head].weight = modules[0].weight  # shared, as LlamaModel does
        self.units: dict[int, UnitState] = {}
        seen: set[int] = set()
        for u in self.unit_ids:
            own = [p for p in modules[u].parameters() if id(p) not in seen]
            seen.update(id(p) for p in modules[u].parameters())
            self.units[u] = self._init_unit(u, modules[u], own)
        # Gradients arrive per parameter object; a tied weight's go to its owner (unit 0).
        self._owner = {
            id(p): (st, i) for st in self.units.values() for i, p in enumerate(st.params)
        }
        self._install_hooks()
        self.sync_buckets = [tuple(b) for b in plan_sync_buckets(spec, plan, stage)]
        self._bucket_of = {u: b for b in self.sync_buckets for u in b}
        self._bucket_grad: dict[tuple[int, ...], torch.Tensor] = {}

    # -- construction ---------------------------------------------------------------------
    def _init_unit(self, u: int, module: nn.Module, params: list[nn.Parameter]) -> UnitState:
        offsets, n = [], 0
        for p in params:
            offsets.append(n)
            n += p.numel()
        dp = self.plan.dp if self.sharded else 1
        st = UnitState(u, module, params, offsets, n, -(-n // dp) * dp)
        st.module_params = list(module.parameters())
        if self.sharded:
            self._init_sharded(st)
        else:
            self._init_unsharded(st)
        return st

    def _init_unsharded(self, st: UnitState) -> None:
        for p, off in zip(st.params, st.offsets, strict=True):
            master = p.data if self.view_is_master else p.data.clone()
            st.segments.append(
                Segment(
                    master,
                    torch.zeros_like(master),
                    torch.zeros_like(master),
                    decays(p),
                    (off, off + p.numel()),
                    tuple(p.shape),
                )
            )
        if not self.view_is_master:
            self._init_view(st, [seg.master.view(-1) for seg in st.segments])

    def _init_sharded(self, st: UnitState) -> None:
        full = torch.zeros(st.padded, dtype=torch.float32, device=self.device)
        for p, off in zip(st.params, st.offsets, strict=True):
            full[off : off + p.numel()].copy_(p.data.view(-1))
        n = st.padded // self.plan.dp
        lo = self.replica * n
        st.master_shard = full[lo : lo + n].clone()
        exp_avg, exp_avg_sq = torch.zeros_like(st.master_shard), torch.zeros_like(st.master_shard)
        for p, off in zip(st.params, st.offsets, strict=True):
            a, b = max(off, lo), min(off + p.numel(), lo + n)
            if a < b:  # the part of this parameter in this replica's shard
                s = slice(a - lo, b - lo)
                st.segments.append(
                    Segment(
                        st.master_shard[s],
                        exp_avg[s],
                        exp_avg_sq[s],
                        decays(p),
                        (a - lo, b - lo),
                        (b - a,),
                    )
                )
        self._init_view(
            st, [full[off : off + p.numel()] for p, off in zip(st.params, st.offsets, strict=True)]
        )

    def _init_view(self, st: UnitState, values: list[torch.Tensor]) -> None:
        """One flat compute-dtype buffer per unit; the parameters become views into it for
        good. Dropping the view frees the buffer's storage (resize to 0) and fetching
        re-grows and refills it, so tensors autograd saved (e.g. a weight's transpose) see
        the refilled values, as FSDP2 does with its unsharded parameters."""
        st.view_flat = torch.zeros(st.padded, dtype=self.dtype, device=self.device)
        for p, off, v in zip(st.params, st.offsets, values, strict=True):
            view = st.view_flat[off : off + p.numel()]
            view.copy_(v)
            p.data = view.view(p.shape)

    # -- views ----------------------------------------------------------------------------
    def view_live(self, u: int) -> bool:
        st = self.units[u]
        return st.view_flat is None or st.view_flat.untyped_storage().nbytes() > 0

    def _regrow(self, st: UnitState) -> None:
        if st.view_flat.untyped_storage().nbytes() == 0:
            resize_storage(st.view_flat, st.padded * st.view_flat.element_size())

    @torch.no_grad()
    def cast_view(self, u: int) -> None:
        """(Re)fill the compute-dtype view from the fp32 masters (unsharded)."""
        st = self.units[u]
        if self.view_is_master:
            return
        self._regrow(st)
        for p, seg in zip(st.params, st.segments, strict=True):
            p.data.copy_(seg.master)

    def shard_view(self, u: int) -> torch.Tensor:
        """Sharded: this replica's updated shard in the compute dtype (all-gather input)."""
        return self.units[u].master_shard.to(self.dtype)

    def gather_target(self, u: int) -> torch.Tensor:
        """Sharded: the unit's view buffer, re-grown, for the all-gather to fill."""
        st = self.units[u]
        self._regrow(st)
        return st.view_flat

    def drop_view(self, u: int) -> None:
        st = self.units[u]
        if not self.view_is_master and self.view_live(u):
            resize_storage(st.view_flat, 0)

    # -- gradients ------------------------------------------------------------------------
    def _grad_slot(self, p: nn.Parameter) -> torch.Tensor:
        """The parameter's slot in its owner's flat gradient (allocated on first use)."""
        st, i = self._owner[id(p)]
        if st.grad is None:
            self._alloc_bucket(self._bucket_of[st.unit])
        return st.slots[i]

    def _alloc_bucket(self, bucket: tuple[int, ...]) -> None:
        """One zeroed buffer for the bucket; each unit's flat gradient is a slice of it."""
        sts = [self.units[u] for u in bucket]
        assert all(st.grad is None for st in sts), f"bucket {bucket} allocated twice in a step"
        buf = torch.zeros(sum(st.padded for st in sts), dtype=self.grad_dtype, device=self.device)
        start = 0
        for st in sts:
            st.grad = buf[start : start + st.padded]
            start += st.padded
            st.slots = [
                st.grad[off : off + q.numel()].view(q.shape)
                for q, off in zip(st.params, st.offsets, strict=True)
            ]
        self._bucket_grad[bucket] = buf

    def bucket_grad(self, bucket: tuple[int, ...]) -> torch.Tensor:
        """The bucket's gradient buffer (its units' flat gradients, ascending)."""
        buf = self._bucket_grad.get(bucket)
        assert buf is not None, f"bucket {bucket} synced before any backward"
        return buf

    def _release_bucket(self, u: int) -> None:
        bucket = self._bucket_of[u]
        if all(self.units[v].grad is None for v in bucket):
            self._bucket_grad.pop(bucket, None)

    def prepare_grads(self, u: int) -> None:
        """Before a backward of unit u: its parameters' gradients go straight into their
        owners' flat buffers (allocated, zeroed, at the first backward of the step).

        Same dtype: `.grad` is a view of the slot, and autograd accumulates into it in place
        (0 + g1 + g2 ..., the reference trainer's sums). Otherwise a post-accumulate hook
        adds each compute-dtype `.grad` into the slot and frees it (`_accumulate_hook`)."""
        for p in self.units[u].module_params:
            slot = self._grad_slot(p)
            if p.dtype == self.grad_dtype and p.grad is None:
                p.grad = slot

    def _accumulate_hook(self, p: nn.Parameter) -> None:
        with torch.no_grad():
            self._grad_slot(p).add_(
                p.grad
            )  # fp32 += bf16 casts exactly, as `g.add_(p.grad.to(g.dtype))`
        p.grad = None

    def _install_hooks(self) -> None:
        for st in self.units.values():
            for p in st.params:
                if p.dtype != self.grad_dtype:
                    p.register_post_accumulate_grad_hook(self._accumulate_hook)

    def grad_views(self, u: int) -> list[torch.Tensor]:
        """The unit's synced gradient, one tensor per segment (parameter shapes unsharded)."""
        st = self.units[u]
        flat = st.grad_shard if self.sharded else st.grad
        return [
            flat[a:b].view(seg.shape) for seg, (a, b) in ((s, s.grad_slice) for s in st.segments)
        ]

    def sq_norm(self, u: int) -> float:
        """Squared norm of the unit's synced gradient (this replica's shard when sharded)."""
        return unit_sq_norm(self.grad_views(u))

    def has_nonfinite(self, u: int) -> bool:
        st = self.units[u]
        flat = st.grad_shard if self.sharded else st.grad
        return bool(not torch.isfinite(flat).all())

    def new_grad_shard(self, u: int) -> torch.Tensor:
        st = self.units[u]
        st.grad_shard = torch.empty(
            st.padded // self.plan.dp, dtype=self.grad_dtype, device=self.device
        )
        return st.grad_shard

    def release_full_grad(self, u: int) -> None:
        """Sharded: once the reduce-scatter has landed only the shard is needed."""
        if self.sharded:
            self.units[u].grad = None
            self.units[u].slots = []
            for p in self.units[u].params:
                p.grad = None
            self._release_bucket(u)

    @torch.no_grad()
    def update(self, u: int, *, step: int, lr: float, grad_scale: float) -> None:
        """AdamW on the unit's masters (its shard when sharded) with its synced gradient."""
        c = self.cfg
        for seg, g in zip(self.units[u].segments, self.grad_views(u), strict=True):
            adamw_step_(
                seg.master,
                g,
                seg.exp_avg,
                seg.exp_avg_sq,
                step=step,
                lr=lr,
                beta1=c.beta1,
                beta2=c.beta2,
                eps=c.eps,
                weight_decay=c.weight_decay if seg.decay else 0.0,
                grad_scale=grad_scale,
            )

    def release_grads(self, u: int) -> None:
        st = self.units[u]
        st.grad = None
        st.grad_shard = None
        st.slots = []
        for p in st.params:
            p.grad = None
        self._release_bucket(u)

    def modules(self) -> dict[int, nn.Module]:
        return {u: st.module for u, st in self.units.items()}

    def state_tensors(self) -> list[torch.Tensor]:
        """Every persistent tensor (masters, optimizer states, views), for memory tracking."""
        out: list[torch.Tensor] = []
        for st in self.units.values():
            out += [p.data for p in st.params] if st.view_flat is None else [st.view_flat]
            for seg in st.segments:
                out += [seg.master, seg.exp_avg, seg.exp_avg_sq]
        return out


def check_tied(spec: ModelSpec, plan: Plan) -> None:
    """RatrainError for the tied-embedding layouts the runtime does not support."""
    if not spec.tied_embeddings:
        return
    owner = plan.stage_of_unit(spec)
    if owner[0] != owner[spec.n_layers + 1]:
        raise RatrainError(
            f"{spec.name} ties its embedding and head, which pp={plan.pp} places on different "
            "stages; use --pp 1, or a V-shaped pipeline (--pipeline zb-v or 1f1b-v), which "
            "holds both on stage 0"
        )
    if plan.view_policy == "transient" or plan.shard_optimizer:
        raise RatrainError(
            f"{spec.name} ties its embedding and head; use persistent views and no optimizer "
            "sharding for tied models"
        )
