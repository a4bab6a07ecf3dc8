"""Non-interleaved 1F1B at layer granularity: the plain schedule every lowering starts from.

Pure Python (no torch). A stage's step is a sequence of *passes*: the forward pass of
microbatch mb runs F(u, mb) over the stage's units in order, the backward pass runs
B(u, mb) in reverse. 1F1B (PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", §2.2) runs on stage s

    warmup   = min(p - s - 1, m) forward passes,
    steady   = m - warmup pairs (one forward pass, one backward pass),
    cooldown = warmup backward passes.

It is legal for any m >= 1 (m < p only widens the bubble) and for p = 1.

A forward pass of mb on stage s is ``RECV_F`` (s > 0), ``F(u, mb)`` for each unit, then
``SEND_F`` (s < p - 1); a backward pass is ``RECV_B`` (s < p - 1), ``B(u, mb)`` in reverse
unit order, then ``SEND_B`` (s > 0). A boundary transfer is named by the unit whose output
(forward) or whose input gradient (backward) crosses it, on both sides of the link:
stage s sends ``SEND_F(mb)@u_last(s)`` and stage s+1 receives ``RECV_F(mb)@u_last(s)``;
stage s sends ``SEND_B(mb)@u_first(s)`` and stage s-1 receives ``RECV_B(mb)@u_first(s)``.
"""

from __future__ import annotations

from collections.abc import Callable

from ratrain.config import Plan
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Action, Op, Schedule

__all__ = ["warmup_passes", "pass_order", "build_1f1b", "splice"]


def warmup_passes(pp: int, m: int, stage: int) -> int:
    """Forward passes a stage runs before its first backward pass."""
    return min(pp - stage - 1, m)


def pass_order(pp: int, m: int, stage: int) -> list[tuple[Op, int]]:
    """The stage's passes in order, as (Op.F or Op.B, microbatch)."""
    w = warmup_passes(pp, m, stage)
    order = [(Op.F, mb) for mb in range(w)]
    for i in range(m - w):
        order += [(Op.F, w + i), (Op.B, i)]
    order += [(Op.B, mb) for mb in range(m - w, m)]
    return order


def _forward_pass(s: int, pp: int, units: range, last_prev: int | None, mb: int, deps: dict):
    acts: list[Action] = []
    prev: Action | None = None
    if s > 0:
        prev = Action(Op.RECV_F, s, (last_prev,), mb)
        deps[prev] = (Action(Op.SEND_F, s - 1, (last_prev,), mb),)
        acts.append(prev)
    op_f = Op.F  # a local: no enum class lookup per unit
    for u in units:
        f = Action(op_f, s, (u,), mb)
        if prev is not None:
            deps[f] = (prev,)
        acts.append(f)
        prev = f
    if s < pp - 1:
        send = Action(Op.SEND_F, s, (units[-1],), mb)
        deps[send] = (prev,)
        acts.append(send)
    return acts


def _backward_pass(
    s: int, pp: int, units: range, first_next: int | None, fwd: list, deps: dict, op_b: Op = Op.B
):
    """RECV_B, `op_b` (B, or ZB's B_IN) over the units in reverse, SEND_B; `fwd`: the forward
    pass of the same microbatch (its F actions are reused)."""
    acts: list[Action] = []
    mb = fwd[0].mb
    op_f = Op.F
    f_of = {a.units[0]: a for a in fwd if a.op is op_f}
    prev: Action | None = None
    if s < pp - 1:
        prev = Action(Op.RECV_B, s, (first_next,), mb)
        deps[prev] = (Action(Op.SEND_B, s + 1, (first_next,), mb),)
        acts.append(prev)
    for u in reversed(units):
        b = Action(op_b, s, (u,), mb)
        f = f_of[u]
        deps[b] = (f,) if prev is None else (f, prev)
        acts.append(b)
        prev = b
    if s > 0:
        send = Action(Op.SEND_B, s, (units[0],), mb)
        deps[send] = (prev,)
        acts.append(send)
    return acts


def _weight_pass(s: int, units: range, mb: int, deps: dict) -> list[Action]:
    """ZB's B_W over the units in reverse; each depends on its B_IN only."""
    acts = []
    for u in reversed(units):
        w = Action(Op.B_W, s, (u,), mb)
        deps[w] = (Action(Op.B_IN, s, (u,), mb),)
        acts.append(w)
    return acts


def build_passes(
    spec: ModelSpec, plan: Plan, kind: str, order: Callable[[int, int, int], list]
) -> Schedule:
    """Compute and stage-boundary transfers of one step, with their dependencies, each
    stage's passes in `order(pp, m, stage)`: (Op.F | Op.B | Op.B_IN | Op.B_W, microbatch)."""
    pp, m = plan.pp, plan.microbatches
    units = [plan.stage_units(spec, s) for s in range(pp)]
    sch = Schedule(stages=[], kind=kind)
    for s in range(pp):
        last_prev = units[s - 1][-1] if s > 0 else None
        first_next = units[s + 1][0] if s < pp - 1 else None
        acts: list[Action] = []
        forward: dict[int, list[Action]] = {}
        for op, mb in order(pp, m, s):
            if op is Op.F:
                forward[mb] = _forward_pass(s, pp, units[s], last_prev, mb, sch.deps)
                acts += forward[mb]
            elif op is Op.B_W:
                acts += _weight_pass(s, units[s], mb, sch.deps)
            else:
                fwd = forward.pop(mb)
                acts += _backward_pass(s, pp, units[s], first_next, fwd, sch.deps, op)
        sch.stages.append(acts)
    sch.meta["microbatches"] = m
    sch.meta["stage_units"] = [tuple(u) for u in units]
    return sch


def build_1f1b(spec: ModelSpec, plan: Plan, kind: str = "1f1b") -> Schedule:
    """Compute and stage-boundary transfers of one 1F1B step, with their dependencies."""
    return build_passes(spec, plan, kind, pass_order)


def splice(
    acts: list[Action],
    before: dict[int, list[Action]] | None = None,
    after: dict[int, list[Action]] | None = None,
) -> list[Action]:
    """A new list with actions inserted before / after the given indices of `acts`, in one
    O(n) pass (lowering passes add many actions; inserting one at a time would be O(n²))."""
    before, after = before or {}, after or {}
    out: list[Action] = []
    prev = 0
    for i in sorted(before.keys() | after.keys()):
        out += acts[prev:i]
        out += before.get(i, ())
        if i < len(acts):
            out.append(acts[i])
            out += after.get(i, ())
        prev = i + 1
    out += acts[prev:]
    return out
