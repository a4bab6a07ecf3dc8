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

__all__ = [
    "warmup_passes",
    "pass_order",
    "build_1f1b",
    "build_passes",
    "build_chunk_passes",
    "splice",
]


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


def _forward_pass(s: int, units: range, owner: dict, head: int, mb: int, deps: dict):
    """RECV_F (where the unit before the chunk is on another stage), F over the chunk's
    units, SEND_F (where the unit after it is on another stage)."""
    acts: list[Action] = []
    prev: Action | None = None
    first, last = units[0], units[-1]
    if first > 0:
        if owner[first - 1] != s:
            prev = Action(Op.RECV_F, s, (first - 1,), mb)
            deps[prev] = (Action(Op.SEND_F, owner[first - 1], (first - 1,), mb),)
            acts.append(prev)
        else:  # the previous chunk is this stage's too (the tip of a V)
            prev = Action(Op.F, s, (first - 1,), mb)
    op_f = Op.F  # a local: no enum class lookup per unit
    for u in units:
        f = Action(op_f, s, (u,), mb)
        if prev is not None:
            deps[f] = (prev,)
        acts.append(f)
        prev = f
    if last < head and owner[last + 1] != s:
        send = Action(Op.SEND_F, s, (last,), mb)
        deps[send] = (prev,)
        acts.append(send)
    return acts


def _backward_pass(
    s: int, units: range, owner: dict, head: int, fwd: list, deps: dict, op_b: Op = Op.B
):
    """RECV_B (where the unit after the chunk is on another stage), `op_b` (B, or ZB's
    B_IN) over the chunk's units in reverse, each after its F, SEND_B (where the unit
    before it is on another stage); `fwd`: the chunk's forward pass of the same
    microbatch (its F actions are reused: the simulator resolves deps by identity first)."""
    acts: list[Action] = []
    mb = fwd[0].mb
    op_f = Op.F
    f_of = {a.units[0]: a for a in fwd if a.op is op_f}
    prev: Action | None = None
    first, last = units[0], units[-1]
    if last < head:
        if owner[last + 1] != s:
            prev = Action(Op.RECV_B, s, (last + 1,), mb)
            deps[prev] = (Action(Op.SEND_B, owner[last + 1], (last + 1,), mb),)
            acts.append(prev)
        else:  # the next chunk is this stage's too (the tip of a V)
            prev = Action(op_b, s, (last + 1,), mb)
    for u in reversed(units):
        b = Action(op_b, s, (u,), mb)
        f = f_of[u]
        deps[b] = (f,) if prev is None else (f, prev)
        acts.append(b)
        prev = b
    if first > 0 and owner[first - 1] != s:
        send = Action(Op.SEND_B, s, (first,), mb)
        deps[send] = (prev,)
        acts.append(send)
    return acts


def _weight_pass(
    s: int, units: range, mb: int, deps: dict, inputs: dict[int, Action] | None = None
) -> list[Action]:
    """ZB's B_W over the units in reverse; each depends on its B_IN only (`inputs`: the
    B_IN actions of the stage's list by unit, reused as the dependency: the simulator
    resolves deps by identity first)."""
    acts = []
    op_w, op_in = Op.B_W, Op.B_IN
    for u in reversed(units):
        w = Action(op_w, s, (u,), mb)
        b_in = inputs.get(u) if inputs is not None else None
        deps[w] = (b_in if b_in is not None else Action(op_in, s, (u,), mb),)
        acts.append(w)
    return acts


def build_passes(
    spec: ModelSpec, plan: Plan, kind: str, order: Callable[[int, int, int], list]
) -> Schedule:
    """Compute and stage-boundary transfers of one step, with their dependencies, each
    stage's passes in `order(pp, m, stage)`: (Op.F | Op.B | Op.B_IN | Op.B_W, microbatch)."""
    pp, m = plan.pp, plan.microbatches
    orders = [[(op, s, mb) for op, mb in order(pp, m, s)] for s in range(pp)]
    return build_chunk_passes(spec, plan, kind, orders)


def build_chunk_passes(
    spec: ModelSpec, plan: Plan, kind: str, orders: list[list[tuple[Op, int, int]]]
) -> Schedule:
    """Compute and stage-boundary transfers of one step, with their dependencies, stage s's
    passes in `orders[s]`: (Op.F | Op.B | Op.B_IN | Op.B_W, chunk, microbatch), over the
    chunk's units (`Plan.chunk_units`: one chunk per stage, or two in a V). A transfer
    crosses each point where the next unit is on another stage."""
    n_chunks = plan.pp * plan.chunks
    chunk_units = [plan.chunk_units(spec, c) for c in range(n_chunks)]
    owner = plan.stage_of_unit(spec)
    head = spec.n_layers + 1
    sch = Schedule(stages=[], kind=kind)
    deps = sch.deps
    for s, order in enumerate(orders):
        acts: list[Action] = []
        forward: dict[tuple[int, int], list[Action]] = {}
        inputs: dict[tuple[int, int], dict[int, Action]] = {}  # B_IN by unit, until its B_W
        for op, c, mb in order:
            units = chunk_units[c]
            if op is Op.F:
                forward[(c, mb)] = _forward_pass(s, units, owner, head, mb, deps)
                acts += forward[(c, mb)]
            elif op is Op.B_W:
                acts += _weight_pass(s, units, mb, deps, inputs.pop((c, mb), None))
            else:
                fwd = forward.pop((c, mb))
                back = _backward_pass(s, units, owner, head, fwd, deps, op)
                if op is Op.B_IN:
                    inputs[(c, mb)] = {a.units[0]: a for a in back if a.op is op}
                acts += back
        sch.stages.append(acts)
    sch.meta["microbatches"] = plan.microbatches
    sch.meta["stage_units"] = [tuple(plan.stage_units(spec, s)) for s in range(plan.pp)]
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
