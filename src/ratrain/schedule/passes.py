"""The passes the lowerings share (`ratrain.schedule.lowering`: baseline, gpu-style,
ratrain; `ratrain.schedule.fsdp`: fsdp-pp): the 1F1B base with its meta and recompute,
the global checks, the gradient-sync buckets and their syncs, and the transient views.
`ratrain.schedule.lowering` describes what each lowering builds from them. Pure Python
(no torch).
"""

from __future__ import annotations

from ratrain.config import Plan
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Action, Op, Schedule
from ratrain.schedule.onef1b import build_1f1b, splice
from ratrain.schedule.vshape import build_v
from ratrain.schedule.zerobubble import build_zb
from ratrain.sizes.states import grad_bytes_per_param, stored_params, view_bytes_per_param

__all__ = [
    "add_recompute",
    "add_transient_views",
    "base_schedule",
    "bucket_syncs",
    "global_checks",
    "group_by_grad_bytes",
    "last_b_index",
    "reads_view",
    "stage_checks",
    "sync_buckets",
    "view_uses",
]


def global_checks(plan: Plan) -> tuple[Op, ...]:
    """The global reductions exact semantics need: the gradient norm for clipping, the
    overflow flag for fp16 loss scaling."""
    ops = []
    if plan.clip_grad is not None:
        ops.append(Op.GRAD_NORM)
    if plan.compute_dtype == "fp16":
        ops.append(Op.OVERFLOW)
    return tuple(ops)


def reads_view(a: Action) -> bool:
    """Whether the action reads its unit's parameter view. The embedding's backward does
    not: its weight gradient is a scatter of the incoming gradient by token id. Of a split
    backward, B_IN reads it (dX = dY·W), B_W does not (dW = dYᵀ·X)."""
    return a.op in (Op.F, Op.RECOMPUTE) or (a.op in (Op.B, Op.B_IN) and a.units != (0,))


def base_schedule(spec: ModelSpec, plan: Plan, kind: str, view_policy: str) -> Schedule:
    """The pass order of a lowering `kind`: 1F1B, or with ``plan.pipeline`` zb-h1 or zb-h2
    the zero-bubble one (`ratrain.schedule.zerobubble`), with zb-v or 1f1b-v the V-shaped
    one (two chunks per stage, `ratrain.schedule.vshape`); with the meta every lowering
    sets (see `ratrain.schedule.lowering`) and RECOMPUTE placed (`add_recompute`)."""
    if plan.chunks == 2:
        sch = build_v(spec, plan, kind)
    elif plan.split_backward:
        sch = build_zb(spec, plan, kind)
    else:
        sch = build_1f1b(spec, plan, kind)
    vb = view_bytes_per_param(plan)
    sch.meta.update(
        grad_sync="reduce-scatter" if plan.shard_optimizer else "all-reduce",
        view_fetch=None if vb == 0 else ("all-gather" if plan.shard_optimizer else "cast"),
        view_policy=view_policy,
        global_checks=global_checks(plan),
        sync_buckets=[sync_buckets(spec, plan, s) for s in range(plan.pp)],
    )
    add_recompute(sch, spec, plan)
    return sch


def add_recompute(sch: Schedule, spec: ModelSpec, plan: Plan) -> None:
    """RECOMPUTE(u, mb) just before each B(u, mb) (or B_IN(u, mb), the first pass of a
    split backward that needs the activations) whose unit the plan recomputes."""
    for s, acts in enumerate(sch.stages):
        recomputed = {
            u for u in sch.meta["stage_units"][s] if plan.recompute_of(spec, s, u) != "none"
        }
        if not recomputed:
            continue
        before: dict[int, list[Action]] = {}
        op_b, op_in, op_f, op_rc, get = Op.B, Op.B_IN, Op.F, Op.RECOMPUTE, sch.deps.get
        for i, a in enumerate(acts):
            if (a.op is op_b or a.op is op_in) and a.units[0] in recomputed:
                rc = Action(op_rc, s, a.units, a.mb)
                # Its F: the backward's own first dependency where the builder put it there
                # (the very object in the list, which the simulator resolves by identity).
                f = (get(a) or (None,))[0]
                if (
                    f is None
                    or f.op is not op_f
                    or f.units != a.units
                    or f.mb != a.mb
                    or f.stage != s
                ):
                    f = Action(op_f, s, a.units, a.mb)
                sch.deps[rc] = (f,)
                sch.add_dep(a, rc)
                before[i] = [rc]
        sch.stages[s] = splice(acts, before)


def last_b_index(acts: list[Action], m: int) -> dict[int, int]:
    """Unit -> index of its last microbatch's B (or B_W, which ends a split backward's
    gradient), by one scan (no hashing)."""
    b, bw, last = Op.B, Op.B_W, m - 1
    return {a.units[0]: i for i, a in enumerate(acts) if (a.op is b or a.op is bw) and a.mb == last}


def stage_checks(sch: Schedule, plan: Plan, s: int, syncs: list[Action]) -> list[Action]:
    """Stage `s`'s global checks (`global_checks`), each after all of its `syncs`."""
    out = []
    for op in global_checks(plan):
        g = Action(op, s)
        sch.add_dep(g, *syncs)
        out.append(g)
    return out


def group_by_grad_bytes(
    spec: ModelSpec, plan: Plan, units: tuple[int, ...], parts, min_bytes: int
) -> list[tuple[int, ...]]:
    """`parts` (groups of units, backward order) merged in that order until a group holds
    >= min_bytes of gradient; each group's units ascending."""
    buckets, cur, cur_bytes = [], [], 0
    params = stored_params(spec, units)
    for part in parts:
        cur += part
        cur_bytes += sum(params[u] for u in part) * grad_bytes_per_param(plan)
        if cur_bytes >= min_bytes:
            buckets.append(tuple(sorted(cur)))
            cur, cur_bytes = [], 0
    if cur:
        buckets.append(tuple(sorted(cur)))
    return buckets


def sync_buckets(spec: ModelSpec, plan: Plan, stage: int) -> list[tuple[int, ...]]:
    """The stage's gradient-sync buckets, backward order: units from the last one down,
    grouped until a bucket holds >= ``plan.sync_bucket_bytes`` of gradient (one unit each
    when that is 0, or when the optimizer is sharded: a reduce-scatter of a bucket would
    shard the bucket, not each unit as the optimizer states are)."""
    units = tuple(plan.stage_units(spec, stage))
    singles = [(u,) for u in reversed(units)]
    if plan.sync_bucket_bytes == 0 or plan.shard_optimizer:
        return singles
    return group_by_grad_bytes(spec, plan, units, singles, plan.sync_bucket_bytes)


def bucket_syncs(
    sch: Schedule, s: int, acts: list[Action], m: int
) -> tuple[dict[int, list[Action]], list[Action]]:
    """One GRAD_SYNC per sync bucket of stage `s`, each placed right after the last
    backward of the step of the bucket's last unit in backward order (its lowest), in
    backward order: the actions to splice in after each index, and the syncs."""
    last_b = last_b_index(acts, m)
    after: dict[int, list[Action]] = {}
    syncs = []
    for bucket in sch.meta["sync_buckets"][s]:
        sync = Action(Op.GRAD_SYNC, s, bucket)
        sch.deps[sync] = tuple(acts[last_b[u]] for u in reversed(bucket))
        after.setdefault(last_b[bucket[0]], []).append(sync)
        syncs.append(sync)
    return after, syncs


def view_uses(acts: list[Action]) -> list[tuple[int, int]]:
    """(index, unit) of every action of a stage's list that reads its unit's view: F,
    RECOMPUTE, and B of any unit but the embedding (`reads_view`, inlined: this scan runs
    over every action of the step)."""
    f, rc, b, bi = Op.F, Op.RECOMPUTE, Op.B, Op.B_IN  # locals: no enum class lookups
    return [
        (i, a.units[0])
        for i, a in enumerate(acts)
        if (op := a.op) is f or op is rc or ((op is b or op is bi) and a.units[0] != 0)
    ]


def add_transient_views(sch: Schedule, lookahead: int) -> None:
    """Fetch each view `lookahead` uses ahead of its use, drop it after the use unless the
    next use is close enough that the fetch would follow the drop at once."""
    deps = sch.deps
    for s, acts in enumerate(sch.stages):
        uses = view_uses(acts)
        next_use: list[int | None] = [None] * len(uses)
        seen: dict[int, int] = {}
        for k in range(len(uses) - 1, -1, -1):
            next_use[k] = seen.get(uses[k][1])
            seen[uses[k][1]] = k
        before: dict[int, list[Action]] = {}
        after: dict[int, list[Action]] = {}
        visit: dict[int, int] = {}
        fetched: dict[int, Action] = {}  # unit -> its fetch, until the first use depends on it
        live: set[int] = set()
        vf_op, vd_op, get = Op.VIEW_FETCH, Op.VIEW_DROP, deps.get
        for k, (i, u) in enumerate(uses):
            if u not in live:
                vf = Action(vf_op, s, (u,), None, visit.get(u, 0))
                at = uses[k - lookahead][0] if k - lookahead > 0 else 0
                lst = before.get(at)
                if lst is None:
                    before[at] = [vf]
                else:
                    lst.append(vf)
                live.add(u)
                fetched[u] = vf
            use = acts[i]
            if u in fetched:
                deps[use] = get(use, ()) + (fetched.pop(u),)
            nk = next_use[k]
            if nk is None or nk - lookahead > k + 1:
                v = visit.get(u, 0)
                vd = Action(vd_op, s, (u,), None, v)
                deps[vd] = (use,)
                lst = after.get(i)
                if lst is None:
                    after[i] = [vd]
                else:
                    lst.append(vd)
                live.discard(u)
                visit[u] = v + 1
        sch.stages[s] = splice(acts, before, after)
