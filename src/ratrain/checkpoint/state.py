"""A stage's training state as a DCP state dict keyed by global parameter names.

Keys do not mention ranks, stages or replicas, so any plan can load any checkpoint of the
same model (DCP matches keys and reshards):

    model/units.{u}.{name}            fp32 master weight, full parameter shape
    optim/exp_avg/units.{u}.{name}    AdamW first moment, full shape
    optim/exp_avg_sq/units.{u}.{name} AdamW second moment, full shape

`units.{u}.{name}` is the `LlamaModel` state-dict name (`ratrain.nn.hf_weights` maps
it to Hugging Face's). Unsharded stages hand DCP their own tensors (saved and loaded in
place). With a sharded optimizer (ZeRO-1) each replica owns a flat slice of a unit; the
slices are all-gathered over the replicas into full tensors for the save (DCP writes each
replicated key once) and, on load, read as full tensors and sliced (`StageIO.apply`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ratrain.runtime.stage import StageModel, UnitState

__all__ = ["param_names", "StageIO"]

_KINDS = ("model", "optim/exp_avg", "optim/exp_avg_sq")


def param_names(st: UnitState) -> list[str]:
    """Global names of the parameters a unit owns, in `st.params` order."""
    by_id = {id(p): n for n, p in st.module.named_parameters()}
    return [f"units.{st.unit}.{by_id[id(p)]}" for p in st.params]


class StageIO:
    """Builds the tensors a stage saves, and puts loaded ones back."""

    def __init__(self, model: StageModel, dp_group=None):
        self.model = model
        self.dp_group = dp_group

    def keys(self) -> list[str]:
        return [
            f"{kind}/{name}"
            for st in self.model.units.values()
            for name in param_names(st)
            for kind in _KINDS
        ]

    # -- save -----------------------------------------------------------------------------
    @torch.no_grad()
    def tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for st in self.model.units.values():
            names = param_names(st)
            if self.model.sharded:
                full = [self._gather_flat(st, i) for i in range(3)]
                for kind, flat in zip(_KINDS, full, strict=True):
                    for name, p, off in zip(names, st.params, st.offsets, strict=True):
                        out[f"{kind}/{name}"] = flat[off : off + p.numel()].view(p.shape)
            else:
                for name, seg in zip(names, st.segments, strict=True):
                    out[f"model/{name}"] = seg.master
                    out[f"optim/exp_avg/{name}"] = seg.exp_avg
                    out[f"optim/exp_avg_sq/{name}"] = seg.exp_avg_sq
        return {k: v.cpu() for k, v in out.items()}

    def _gather_flat(self, st: UnitState, which: int) -> torch.Tensor:
        """The full flat fp32 master (0), exp_avg (1) or exp_avg_sq (2) of a sharded unit."""
        shard = self._shard(st, which)
        parts = [torch.empty_like(shard) for _ in range(self.model.plan.dp)]
        dist.all_gather(parts, shard, group=self.dp_group)
        return torch.cat(parts)

    def _shard(self, st: UnitState, which: int) -> torch.Tensor:
        if which == 0:
            return st.master_shard
        # The segments are views of one flat moment buffer per unit; rebuild it in order.
        n = st.padded // self.model.plan.dp
        flat = torch.zeros(n, dtype=torch.float32, device=st.master_shard.device)
        for seg in st.segments:
            a, b = seg.grad_slice
            flat[a:b] = (seg.exp_avg if which == 1 else seg.exp_avg_sq).reshape(-1)
        return flat

    # -- load -----------------------------------------------------------------------------
    def empty(self) -> dict[str, torch.Tensor]:
        """Full-shape fp32 CPU tensors for every key of this stage, for DCP to fill."""
        out = {}
        for st in self.model.units.values():
            for name, p in zip(param_names(st), st.params, strict=True):
                for kind in _KINDS:
                    out[f"{kind}/{name}"] = torch.empty(p.shape, dtype=torch.float32)
        return out

    @torch.no_grad()
    def apply(self, loaded: dict[str, torch.Tensor]) -> None:
        """Copy loaded full tensors into the stage's masters, moments and views. Without
        `optim/` keys (weights only) the moments are left as they are."""
        m = self.model
        for st in m.units.values():
            names = param_names(st)
            if m.sharded:
                self._apply_sharded(st, names, loaded)
                continue
            for name, p, seg in zip(names, st.params, st.segments, strict=True):
                seg.master.copy_(loaded[f"model/{name}"])
                if f"optim/exp_avg/{name}" in loaded:  # absent: weights only (HF import)
                    seg.exp_avg.copy_(loaded[f"optim/exp_avg/{name}"])
                    seg.exp_avg_sq.copy_(loaded[f"optim/exp_avg_sq/{name}"])
                if not m.view_is_master:
                    m._regrow(st)
                    p.data.copy_(seg.master)

    @torch.no_grad()
    def refresh_views(self) -> None:
        """Unsharded, after DCP loaded into `tensors()` in place: recast the views."""
        m = self.model
        for st in m.units.values():
            if not m.view_is_master:
                m._regrow(st)
                for p, seg in zip(st.params, st.segments, strict=True):
                    p.data.copy_(seg.master)

    def _apply_sharded(self, st: UnitState, names: list[str], loaded: dict) -> None:
        m = self.model
        n = st.padded // m.plan.dp
        lo = m.replica * n
        kinds = [k for k in _KINDS if f"{k}/{names[0]}" in loaded]
        flat = {kind: torch.zeros(st.padded, dtype=torch.float32) for kind in kinds}
        for kind in kinds:
            for name, p, off in zip(names, st.params, st.offsets, strict=True):
                flat[kind][off : off + p.numel()] = loaded[f"{kind}/{name}"].reshape(-1)
        st.master_shard.copy_(flat["model"][lo : lo + n])
        for seg in st.segments if "optim/exp_avg" in flat else ():
            a, b = seg.grad_slice
            seg.exp_avg.copy_(flat["optim/exp_avg"][lo + a : lo + b].view(seg.shape))
            seg.exp_avg_sq.copy_(flat["optim/exp_avg_sq"][lo + a : lo + b].view(seg.shape))
        m._regrow(st)
        st.view_flat.copy_(flat["model"].to(st.view_flat.dtype))
