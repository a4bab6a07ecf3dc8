"""Bytes per parameter of the model states (master weights, Adam states, view, gradient).

Pure Python (no torch). Mixed-precision Adam (Micikevicius et al. 2018; Rajbhandari et al.
2020, "ZeRO", §3.1): per parameter an fp32 master copy (4 B), Adam's m and v in fp32
(8 B), a compute-dtype view the forward and backward read (2 B for bf16/fp16), and a
gradient in `plan.grad_dtype` (4 B fp32 by default, 2 B for bf16/fp16). With
`plan.shard_optimizer` the master and Adam states are split over the dp replicas.
"""

from __future__ import annotations

from collections.abc import Iterable

from ratrain.config import DTYPE_BYTES, Plan
from ratrain.models.counts import head_unit, unit_params
from ratrain.models.spec import ModelSpec

__all__ = [
    "STATE_CLASSES",
    "MASTER_BYTES_PER_PARAM",
    "ADAM_BYTES_PER_PARAM",
    "view_bytes_per_param",
    "grad_bytes_per_param",
    "shards",
    "shard_bytes",
    "stored_params",
]

STATE_CLASSES = ("master", "optimizer", "view", "grad", "activation", "comm_buffer", "workspace")

MASTER_BYTES_PER_PARAM = 4  # fp32 master weights
ADAM_BYTES_PER_PARAM = 8  # fp32 exp_avg + exp_avg_sq


def view_bytes_per_param(plan: Plan) -> int:
    """The compute-dtype view. fp32 without sharding: the view *is* the master (0 extra);
    fp32 with sharding: the gathered full fp32 weights (4 B)."""
    if plan.compute_dtype == "fp32" and not plan.shard_optimizer:
        return 0
    return DTYPE_BYTES[plan.compute_dtype]


def grad_bytes_per_param(plan: Plan) -> int:
    return DTYPE_BYTES[plan.grad_dtype]


def shards(plan: Plan) -> int:
    """How many ways the master weights and Adam states are split (1: not sharded)."""
    return plan.dp if plan.shard_optimizer else 1


def shard_bytes(nbytes: int, plan: Plan) -> int:
    """One replica's share of `nbytes` split over `shards(plan)` (rounded up)."""
    return -(-nbytes // shards(plan))


def stored_params(spec: ModelSpec, units: Iterable[int]) -> dict[int, int]:
    """Parameters a stage stores per unit. With tied embeddings and the embedding and head
    on one stage, the matrix is stored once, in unit 0 (as `LlamaModel` shares it)."""
    params = {u: unit_params(spec, u) for u in units}
    head = head_unit(spec)
    if spec.tied_embeddings and 0 in params and head in params:
        params[head] -= spec.vocab * spec.hidden
    return params
