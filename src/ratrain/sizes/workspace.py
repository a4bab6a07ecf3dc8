"""Transient bytes of the end-of-step global checks the runtime runs eagerly, per unit.

Pure Python (no torch). Counted by the ledger with `eager_kernels` only: a fused kernel
(a GPU's multi-tensor norm, an in-register finiteness check) keeps none of these.

- GRAD_NORM (`ratrain.runtime.optim.sq_norm`): each gradient tensor's squared norm is
  summed in fp64, ``sum(square(grad.to(float64)))``, one tensor at a time, so the cast
  copy and its square (8 B per element each) exist at once for the largest tensor of the
  stage (its shard's slice when the optimizer is sharded). On a stage holding the
  embedding that is 16·V·h bytes, more than the AdamW step's 12·V·h: in a Baseline-1F1B
  step, where every gradient of the stage is live until the stage-wide UPDATE, the NORM is
  the stage's peak.
- OVERFLOW (`StageModel.has_nonfinite`): ``isfinite(flat).all()`` over a unit's flat
  gradient (its shard when sharded) makes a 1 B/element bool tensor of the whole buffer.

And what the runtime holds for the whole step, whatever the kernels:

- the token ids of each microbatch (`StageExecutor._tokens` caches them until the step
  ends), on a stage with the embedding or the head: `ratrain.data.base` splits an int64
  (b, seq + 1) window into inputs and targets; with b = 1 both are views of it, else two
  (b, seq) copies (`held_token_bytes`);
- the fp64 bookkeeping vectors of the global reductions: the NORM's per-unit squared
  norms and their all-gathered table, and the step log's lagged all-gather of (peak, RSS,
  time, m losses) (`bookkeeping_bytes`). A few hundred bytes, counted so that "never
  under the measured peak" holds on toy models too.
"""

from __future__ import annotations

from ratrain.config import Plan
from ratrain.models.counts import head_unit, unit_params
from ratrain.models.spec import ModelSpec

__all__ = [
    "ADAMW_CHUNK_ELEMS",
    "largest_tensor_elems",
    "norm_workspace_bytes",
    "overflow_workspace_bytes",
    "held_token_bytes",
    "bookkeeping_bytes",
]

FP64_BYTES = 8
"""derived: `sq_norm` casts to torch.float64 before squaring."""
INT64_BYTES = 8
"""derived: token ids are torch.int64 (`ratrain.data.base._split`)."""
BOOL_BYTES = 1
"""derived: torch.isfinite returns a torch.bool tensor, one byte per element."""


ADAMW_CHUNK_ELEMS = 2**18
"""assumed: the runtime's AdamW step (`ratrain.runtime.optim.adamw_step_`) walks a tensor
in slices of this many elements (1 MiB of fp32), so its temporaries are at most this
size whatever the model's largest tensor; a multiple of every SIMD width, so each element
takes the same (vectorised) code path as in one whole-tensor call, and large enough that
the slices' own overhead is small against their element work."""


def largest_tensor_elems(spec: ModelSpec, plan: Plan, unit: int) -> int:
    """Elements of the unit's largest parameter tensor (capped at its shard, sharded)."""
    h = spec.hidden
    largest = h * (spec.vocab if unit in (0, head_unit(spec)) else max(spec.ffn, h))
    if plan.shard_optimizer and plan.dp > 1:
        largest = min(largest, -(-unit_params(spec, unit) // plan.dp))
    return largest


def norm_workspace_bytes(spec: ModelSpec, plan: Plan, unit: int) -> int:
    """The fp64 copy and its square of the unit's largest gradient tensor."""
    return 2 * FP64_BYTES * largest_tensor_elems(spec, plan, unit)


def overflow_workspace_bytes(spec: ModelSpec, plan: Plan, unit: int) -> int:
    """The bool mask of the unit's whole flat gradient (its shard, sharded)."""
    n = unit_params(spec, unit)
    if plan.shard_optimizer and plan.dp > 1:
        n = -(-n // plan.dp)
    return BOOL_BYTES * n


def held_token_bytes(plan: Plan) -> int:
    """Token ids of one microbatch, held from its first use to the end of the step."""
    b, s = plan.micro_batch, plan.seq
    return INT64_BYTES * ((s + 1) if b == 1 else 2 * b * s)


def bookkeeping_bytes(spec: ModelSpec, plan: Plan) -> int:
    """The NORM's per-unit fp64 vector and its (world, units) table, and the step log's
    (world, 3 + m) table and its own row, all fp64."""
    world = plan.pp * plan.dp
    return FP64_BYTES * (1 + world) * ((spec.n_layers + 2) + (3 + plan.microbatches))
