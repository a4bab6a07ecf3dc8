"""The tables `ratrain.planner.memory_bound.MemoryBound` reads: per unit kind, the bytes
each state takes (`unit_tables`); a stage's units as runs of units alike (`Run`, `Layout`);
and a zero-bubble stage's pass profile (`zb_profile`). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ratrain.config import Plan
from ratrain.models import counts
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Op
from ratrain.schedule.lowering import deferred_weight_mbs
from ratrain.schedule.zerobubble import inflight_limit, order_of
from ratrain.sizes.activations import (
    activation_bytes,
    backward_workspace_bytes,
    boundary_bytes,
    weight_grad_bytes,
)

__all__ = ["Layout", "Run", "unit_tables", "zb_profile"]


@lru_cache(maxsize=4096)
def zb_profile(pp: int, m: int, w: int, pipeline: str) -> tuple[tuple[int, bool, bool], ...]:
    """Per input-gradient pass mb of a zero-bubble stage with warm-up w (in its pass order,
    `ratrain.schedule.zerobubble.pass_order`), as B_IN(., mb) starts: the microbatches
    whose B_IN pass has run and whose B_W pass has not, whether some B_W pass has run, and
    whether mb's own weight pass waits behind another pass (with offload, what its B_IN
    keeps then leaves the device: `ratrain.schedule.lowering.weight_offloaded_mbs`)."""
    order = order_of(m, w, inflight_limit(pp, w, pipeline))
    deferred = deferred_weight_mbs(order)
    out, done_in, done_w = [], 0, 0
    for op, _ in order:
        if op is Op.B_IN:
            out.append((done_in - done_w, done_w > 0, done_in in deferred))
            done_in += 1
        elif op is Op.B_W:
            done_w += 1
    return tuple(out)


def unit_tables(spec: ModelSpec, plan: Plan, kinds: dict[str, int], eager: bool) -> tuple:
    """Per unit kind: the activations kept under each policy, the backward workspace and
    the parameters; the boundary bytes; and per unit kind what a split backward keeps from
    B_IN to B_W, (inputs, out_grads) (memoised by `MemoryBound`)."""
    keep = {
        (k, p): activation_bytes(spec, plan, u, p, flash=True, eager_kernels=eager)
        for k, u in kinds.items()
        for p in ("none", "selective", "full")
    }
    bws = {
        k: backward_workspace_bytes(spec, plan, u, flash=True, eager_kernels=eager)
        for k, u in kinds.items()
    }
    params = {k: counts.unit_params(spec, u) for k, u in kinds.items()}
    wgrad = {k: weight_grad_bytes(spec, plan, u) for k, u in kinds.items()}
    return keep, bws, params, boundary_bytes(spec, plan), wgrad


@dataclass(frozen=True)
class Run:
    """Units alike on a stage, in the stage's order: `count` units of `kind` under `policy`,
    and what the bound reads of the units before the run."""

    kind: str
    """emb, block or head."""
    policy: str
    count: int
    start: int
    """Its first unit's index on the stage."""
    keep: int
    """One unit's kept activations for one microbatch under `policy`."""
    keep_below: int
    """The same, summed over the units before the run."""
    params_below: int
    """The parameters of the units before the run."""
    w_below: int
    """zb-h1: what one microbatch's B_IN pass leaves for its B_W pass, summed over the
    units before the run (0 otherwise)."""


@dataclass(frozen=True)
class Layout:
    """A stage's units for `MemoryBound`: its runs of units alike (`Run`), the static
    bytes (states and persistent views), the views among them, one microbatch's keep over
    the stage, every gradient's bytes, and `at`: the units (index, run, index in the run)
    where what a backward pass holds can be largest. Under zb-h1 also what one
    microbatch's B_IN pass leaves for its B_W pass over the stage (`total_w`), and every
    gradient's bytes (`zb_grads`, which exist from the stage's first B_W)."""

    runs: tuple[Run, ...]
    static: int
    views: int
    total_keep: int
    all_grads: int
    at: tuple[tuple[int, int, int], ...]
    total_w: int
    zb_grads: int

    def below(self, u: int) -> int:
        """Keep of the units before unit u."""
        for run in self.runs:
            if u <= run.start + run.count:
                return run.keep_below + (u - run.start) * run.keep
        return self.total_keep
