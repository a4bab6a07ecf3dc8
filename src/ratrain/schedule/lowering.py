"""The three lowerings of a plain 1F1B step: baseline, gpu-style and ratrain (and, in
`ratrain.schedule.fsdp`, the fsdp-pp baseline built from the same passes,
`ratrain.schedule.passes`; `ratrain.schedule.build` dispatches on ``plan.schedule``).

Pure Python (no torch). Each starts from `build_1f1b` and adds the actions of the
training-state lifecycle, with their dependencies, per stage:

- ``baseline`` (Baseline-1F1B, the semantically equivalent reference): after the stage's
  last backward, one GRAD_SYNC of all its units, the global NORM (if ``clip_grad``) and
  OVF (if fp16), one UPDATE of the stage, one VIEW_FETCH refreshing its views.
- ``gpu-style`` (Megatron-LM): gradients in buckets of ``plan.bucket_bytes`` filled in
  backward unit order; GRAD_SYNC(bucket) right after the last microbatch's B of the
  bucket's last unit, so it overlaps the rest of the backward; then as baseline.
- ``ratrain`` (lifecycle): GRAD_SYNC(u) right after the last microbatch's B(u). UPDATE(u)
  and the refresh VIEW_FETCH(u) follow the stage's last backward action, in sync order, so
  each lands on the compute thread after its own sync and never delays a SEND_B that an
  upstream stage waits for; with global checks they also wait for NORM/OVF (exact
  clipping and overflow skipping). Transient views are fetched ``view_lookahead`` uses
  ahead and dropped after a use unless the unit is used again within the lookahead.
  With ``offload_activations`` a microbatch whose F and B are separated by another
  forward pass has OFFLOAD(u, mb) after F(u, mb) and RELOAD(u, mb) `RELOAD_AHEAD_UNITS`
  units ahead of its B; under a split backward, of its B_IN (B_W reads only what B_IN
  keeps, which stays on the device).

All three place RECOMPUTE(u, mb) just before the B(u, mb) that needs it (policy
``plan.recompute_of``), keep persistent views in baseline and gpu-style, and follow the
plan's shard_optimizer, grad_dtype, clip_grad and compute_dtype.

What the simulator needs to cost an action:
- ``action_bytes(action, spec, plan)``: bytes a non-compute action moves (see there),
  and for UPDATE the optimizer's memory traffic; compute FLOPs come from
  `ratrain.models.counts` (`unit_fwd_flops`, `unit_bwd_flops`, `unit_recompute_flops`
  with ``plan.recompute_of``).
- ``schedule.meta``:
  ``microbatches``, ``stage_units`` (tuple of units per stage);
  ``grad_sync``: "all-reduce" | "reduce-scatter" (the GRAD_SYNC collective over dp);
  ``view_fetch``: "cast" (fp32 master -> view on the copy engine) | "all-gather" (of the
  updated shards over dp: a DP_NET collective despite `Op.VIEW_FETCH`'s COPY resource) |
  None (fp32 unsharded: the view is the master, no VIEW_FETCH is emitted);
  ``view_policy``: "persistent" | "transient" (what the schedule does, not what the plan
  asked: baseline and gpu-style are always persistent);
  ``global_checks``: the ops among (GRAD_NORM, OVERFLOW) present on every stage;
  ``buckets`` (gpu-style): per stage, the units of each GRAD_SYNC bucket;
  ``sync_buckets``: per stage, the units of each gradient-sync bucket (`sync_buckets`), the
  same in every lowering: a GRAD_SYNC covers whole sync buckets, and the runtime reduces
  each sync bucket as one flat buffer (one collective), which is what keeps the schedules'
  sums identical.

Zero bubble (``plan.pipeline`` zb-h1, zb-h2, `ratrain.schedule.zerobubble`, or zb-v,
`ratrain.schedule.vshape`, two chunks per stage in a V): the same
three lowerings over the zero-bubble pass order, whose backward is B_IN then a deferred B_W per (unit, mb); every
rule above keyed on "the last B" of a unit reads "the last B_W" (the gradient is complete
only then): GRAD_SYNC after it, UPDATE and the refresh VIEW_FETCH after the sync as above.

Sync buckets (``plan.sync_bucket_bytes`` > 0, unsharded optimizer): ``ratrain`` issues one
GRAD_SYNC per sync bucket after the last B of the bucket's last unit in backward order, and
one UPDATE (and refresh) per bucket; ``gpu-style`` fills its buckets with whole sync buckets.
"""

from __future__ import annotations

from ratrain import deadline
from ratrain.config import SPLIT_PIPELINES, Plan
from ratrain.models.counts import head_unit, is_block, unit_params
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import WEIGHT_VISIT, Action, Op, Resource, Schedule
from ratrain.schedule.onef1b import pass_order, splice
from ratrain.schedule.passes import (
    add_transient_views,
    base_schedule,
    bucket_syncs,
    group_by_grad_bytes,
    last_b_index,
    stage_checks,
)
from ratrain.schedule.zerobubble import pass_order as zb_pass_order
from ratrain.sizes.activations import activation_bytes, boundary_bytes, weight_grad_bytes
from ratrain.sizes.states import (
    ADAM_BYTES_PER_PARAM,
    MASTER_BYTES_PER_PARAM,
    grad_bytes_per_param,
    shard_bytes,
    stored_params,
    view_bytes_per_param,
)

__all__ = [
    "lower_baseline",
    "lower_gpu_style",
    "lower_ratrain",
    "action_bytes",
    "offloaded_mbs",
    "offloaded_of",
    "weight_offloaded_mbs",
    "deferred_weight_mbs",
    "RELOAD_AHEAD_UNITS",
]

RELOAD_AHEAD_UNITS = 2
"""assumed: a RELOAD issued two units' backward ahead of its use has landed by then."""

_SCALAR_BYTES = 4  # fp32 partial norm / overflow flag per stage


def _last_bs(s: int, units, m: int, op: Op = Op.B) -> list[Action]:
    """The last microbatch's B of each unit (B_W under a split backward: it ends the gradient)."""
    return [Action(op, s, (u,), m - 1) for u in units]


def _grad_op(plan: Plan) -> Op:
    """The action that ends a unit's gradient of a microbatch: B, or B_W under a split
    backward (zb-h1, zb-h2, zb-v)."""
    return Op.B_W if plan.split_backward else Op.B


def _stage_tail(sch: Schedule, plan: Plan, s: int, units: tuple[int, ...], syncs: list[Action]):
    """Global checks, one stage-wide UPDATE and one VIEW_FETCH refreshing the views."""
    checks = stage_checks(sch, plan, s, syncs)
    upd = Action(Op.UPDATE, s, units)
    sch.add_dep(upd, *syncs, *checks)
    tail = [*checks, upd]
    if sch.meta["view_fetch"] is not None:
        vf = Action(Op.VIEW_FETCH, s, units)
        sch.add_dep(vf, upd)
        tail.append(vf)
    return tail


def lower_baseline(spec: ModelSpec, plan: Plan) -> Schedule:
    sch = base_schedule(spec, plan, "baseline", "persistent")
    m = plan.microbatches
    for s in range(plan.pp):
        units = sch.meta["stage_units"][s]
        sync = Action(Op.GRAD_SYNC, s, units)
        sch.add_dep(sync, *_last_bs(s, units, m, _grad_op(plan)))
        sch.stages[s] += [sync, *_stage_tail(sch, plan, s, units, [sync])]
    return sch


def _buckets(
    spec: ModelSpec, plan: Plan, units: tuple[int, ...], atoms: list[tuple[int, ...]]
) -> list[tuple[int, ...]]:
    """Sync buckets in backward order, grouped until a bucket holds >= bucket_bytes."""
    return group_by_grad_bytes(spec, plan, units, atoms, plan.bucket_bytes)


def lower_gpu_style(spec: ModelSpec, plan: Plan) -> Schedule:
    sch = base_schedule(spec, plan, "gpu-style", "persistent")
    m = plan.microbatches
    sch.meta["buckets"] = []
    for s, acts in enumerate(sch.stages):
        units = sch.meta["stage_units"][s]
        last_b = last_b_index(acts, m)
        buckets = _buckets(spec, plan, units, sch.meta["sync_buckets"][s])
        after: dict[int, list[Action]] = {}
        syncs = []
        for bucket in buckets:
            sync = Action(Op.GRAD_SYNC, s, bucket)
            sch.add_dep(sync, *_last_bs(s, bucket, m, _grad_op(plan)))
            after[last_b[bucket[0]]] = [sync]
            syncs.append(sync)
        sch.stages[s] = splice(acts, after=after) + _stage_tail(sch, plan, s, units, syncs)
        sch.meta["buckets"].append(buckets)
    return sch


def lower_ratrain(spec: ModelSpec, plan: Plan) -> Schedule:
    view_policy = plan.view_policy if view_bytes_per_param(plan) else "persistent"
    sch = base_schedule(spec, plan, "ratrain", view_policy)
    deadline.check()  # between phases: a planner's deadline (`ratrain.deadline`)
    if plan.offload_activations:
        _add_offload(sch, spec, plan)
        deadline.check()
    if view_policy == "transient":
        add_transient_views(sch, plan.view_lookahead)
        deadline.check()
    m = plan.microbatches
    for s, acts in enumerate(sch.stages):
        after, syncs = bucket_syncs(sch, s, acts, m)
        checks = stage_checks(sch, plan, s, syncs)
        tail = list(checks)
        for sync in syncs:
            upd = Action(Op.UPDATE, s, sync.units)
            sch.add_dep(upd, sync, *checks)
            tail.append(upd)
            if view_policy == "persistent" and sch.meta["view_fetch"] is not None:
                vf = Action(Op.VIEW_FETCH, s, sync.units)
                sch.add_dep(vf, upd)
                tail.append(vf)
        sch.stages[s] = splice(acts, after=after) + tail
    return sch


def offloaded_mbs(pp: int, m: int, s: int, pipeline: str = "1f1b") -> set[int]:
    """Microbatches with another forward pass between their forward and backward passes
    (under a split backward, their input-gradient pass: the weight pass reads only what
    B_IN keeps on the device): the others go straight from F to B, where an offload would
    only add traffic."""
    if pipeline in SPLIT_PIPELINES:
        order = zb_pass_order(pp, m, s, pipeline)
    else:
        order = pass_order(pp, m, s)
    return offloaded_of(order)


def offloaded_of(order: list[tuple[Op, int]]) -> set[int]:
    """`offloaded_mbs` of a 1F1B or zero-bubble pass order, whose forwards run in
    microbatch order (microbatch mb's F is the (mb + 1)-th): one scan."""
    out = set()
    forwards = 0
    f, b, b_in = Op.F, Op.B, Op.B_IN
    for op, mb in order:
        if op is f:
            forwards += 1
        elif (op is b or op is b_in) and forwards > mb + 1:
            out.add(mb)
    return out


def weight_offloaded_mbs(pp: int, m: int, s: int, pipeline: str) -> set[int]:
    """Under a split backward, the microbatches whose weight pass waits behind another
    forward or input-gradient pass: what their B_IN kept for B_W is offloaded meanwhile
    (`WEIGHT_VISIT`). The others run B_W right after B_IN (or after nothing but other
    weight passes), where an offload would only add traffic."""
    if pipeline not in SPLIT_PIPELINES:
        return set()
    return deferred_weight_mbs(zb_pass_order(pp, m, s, pipeline))


def deferred_weight_mbs(order: list[tuple[Op, int]]) -> set[int]:
    """`weight_offloaded_mbs` of a zero-bubble pass order."""
    after_in: dict[int, int] = {}  # mb -> passes other than B_W up to its B_IN's end
    out = set()
    others = 0
    op_in, op_w = Op.B_IN, Op.B_W
    for op, mb in order:
        if op is op_w:
            if others > after_in[mb]:
                out.add(mb)
            continue
        others += 1
        if op is op_in:
            after_in[mb] = others
    return out


def _add_offload(sch: Schedule, spec: ModelSpec, plan: Plan) -> None:
    _add_activation_offload(sch, spec, plan)
    if plan.split_backward:
        _add_weight_offload(sch, spec, plan)


def _add_weight_offload(sch: Schedule, spec: ModelSpec, plan: Plan) -> None:
    """Under a split backward: for each block, and the head (its dlogits, V wide per
    token, are the largest weight-pass state) unless the fused chunked loss runs it whole,
    of a microbatch whose weight pass is deferred behind other passes
    (`weight_offloaded_mbs`): OFFLOAD(u, mb)#1 right after B_IN(u, mb) and RELOAD(u, mb)#1
    before B_W(u, mb), `RELOAD_AHEAD_UNITS` units ahead in the weight pass, and for its
    first units before the compute action that precedes the pass; not where that leaves
    no compute action between the two (a round trip with nothing to gain). The
    embedding's B_W runs whole and keeps only token ids and its output gradient."""
    deps = sch.deps
    for s, acts in enumerate(sch.stages):
        units = sch.meta["stage_units"][s]
        moved = weight_offloaded_mbs(plan.pp, plan.microbatches, s, plan.pipeline)
        if not moved:
            continue
        split = {u for u in units if is_block(spec, u)}
        if not plan.loss_chunk_tokens and head_unit(spec) in units:
            split.add(head_unit(spec))
        bi_at: dict[tuple[int, int], int] = {}
        bw_at: dict[tuple[int, int], int] = {}
        lead: dict[int, int] = {}  # mb -> the compute action before its weight pass
        computes = [0]  # computes[i]: compute actions in acts[:i]
        last_compute = 0
        for i, a in enumerate(acts):
            op = a.op
            if op is Op.B_W and a.mb in moved:
                bw_at[(a.units[0], a.mb)] = i
                lead.setdefault(a.mb, last_compute)
            elif op is Op.B_IN and a.mb in moved:
                bi_at[(a.units[0], a.mb)] = i
            compute = a.resource is Resource.COMPUTE
            if compute:
                last_compute = i
            computes.append(computes[-1] + compute)
        before: dict[int, list[Action]] = {}
        after: dict[int, list[Action]] = {}
        for (u, mb), i in bi_at.items():
            if u not in split:  # the embedding's B_W runs whole; the fused loss keeps nothing
                continue
            ahead = u + RELOAD_AHEAD_UNITS
            at = bw_at[(ahead, mb)] if ahead <= units[-1] else lead[mb]
            if computes[at] == computes[i + 1]:  # back before any compute: only traffic
                continue
            off = Action(Op.OFFLOAD, s, (u,), mb, WEIGHT_VISIT)
            rel = Action(Op.RELOAD, s, (u,), mb, WEIGHT_VISIT)
            deps[off] = (acts[i],)
            deps[rel] = (off,)
            after.setdefault(i, []).append(off)
            before.setdefault(at, []).append(rel)
            sch.add_dep(acts[bw_at[(u, mb)]], rel)
        for lst in before.values():
            lst.sort(key=lambda a: -a.units[0])  # the unit needed first is reloaded first
        sch.stages[s] = splice(acts, before, after)


def _add_activation_offload(sch: Schedule, spec: ModelSpec, plan: Plan) -> None:
    deps = sch.deps
    for s, acts in enumerate(sch.stages):
        units = sch.meta["stage_units"][s]
        offloaded = offloaded_mbs(plan.pp, plan.microbatches, s, plan.pipeline)
        f_at: dict[tuple[int, int], int] = {}
        work_at: dict[tuple[int, int], int] = {}  # where the backward work of (u, mb) starts
        pass_start: dict[int, int] = {}  # mb -> first action of its backward pass
        f, b, b_in, rc, recv_b = Op.F, Op.B, Op.B_IN, Op.RECOMPUTE, Op.RECV_B  # no lookups
        for i, a in enumerate(acts):
            if (mb := a.mb) not in offloaded:
                continue
            op = a.op
            if op is f:
                f_at[(a.units[0], mb)] = i
                continue
            if op is b or op is b_in or op is rc:  # B_W reads only what B_IN kept
                work_at.setdefault((a.units[0], mb), i)
            elif op is not recv_b:
                continue
            if mb not in pass_start:
                pass_start[mb] = i
        before: dict[int, list[Action]] = {}
        after: dict[int, list[Action]] = {}
        for (u, mb), i in f_at.items():
            off, rel = Action(Op.OFFLOAD, s, (u,), mb), Action(Op.RELOAD, s, (u,), mb)
            deps[off] = (acts[i],)
            deps[rel] = (off,)
            after.setdefault(i, []).append(off)
            ahead = u + RELOAD_AHEAD_UNITS
            at = work_at[(ahead, mb)] if ahead <= units[-1] else pass_start[mb]
            before.setdefault(at, []).append(rel)
            sch.add_dep(acts[work_at[(u, mb)]], rel)
        for lst in before.values():
            lst.sort(key=lambda a: -a.units[0])  # the unit needed first is reloaded first
        sch.stages[s] = splice(acts, before, after)


def action_bytes(action: Action, spec: ModelSpec, plan: Plan, *, flash: bool = True) -> int:
    """Bytes an action moves, for the cost models.

    SEND/RECV: one microbatch's boundary hidden states (or gradient), compute dtype.
    GRAD_SYNC: the full gradient of its units in grad_dtype (the collective's input; see
    meta["grad_sync"] for all-reduce vs reduce-scatter). VIEW_FETCH: the full view of its
    units (meta["view_fetch"]: cast or all-gather). OFFLOAD/RELOAD: what (unit, mb) keeps
    under its recompute policy (#1: what its B_IN keeps for B_W, `weight_grad_bytes`). NORM/OVF: one fp32 scalar. UPDATE: the optimizer step's
    memory traffic on this replica: read the gradient, read and write the fp32 master and
    Adam's m and v (shard share when sharded). F/B/RECOMPUTE/VIEW_DROP: 0 (compute is
    costed by FLOPs, see `ratrain.models.counts`).
    """
    op = action.op
    if op in (Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B):
        return boundary_bytes(spec, plan)
    if spec.tied_embeddings:  # the head may share unit 0's matrix on its stage
        stored = stored_params(spec, plan.stage_units(spec, action.stage))
        params = sum(stored[u] for u in action.units)
    else:
        params = sum(unit_params(spec, u) for u in action.units)
    if op is Op.GRAD_SYNC:
        return params * grad_bytes_per_param(plan)
    if op is Op.VIEW_FETCH:
        return params * view_bytes_per_param(plan)
    if op in (Op.OFFLOAD, Op.RELOAD):
        if action.visit == WEIGHT_VISIT:  # what B_IN keeps for B_W
            return sum(weight_grad_bytes(spec, plan, action.unit, flash=flash))
        policy = plan.recompute_of(spec, action.stage, action.unit)
        return activation_bytes(spec, plan, action.unit, policy, flash=flash)
    if op in (Op.GRAD_NORM, Op.OVERFLOW):
        return _SCALAR_BYTES
    if op is Op.UPDATE:
        states = 2 * (MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM)  # read + write
        return shard_bytes(params * (states + grad_bytes_per_param(plan)), plan)
    return 0
