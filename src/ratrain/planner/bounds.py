"""Cheap lower bounds on a candidate's step time and memory, from the same cost model and
the same state sizes the simulator and the ledger use.

Step time. The simulator replays one step from a cold start; every compute action (F, B,
RECOMPUTE, UPDATE) of a stage runs on that stage's one compute resource. A stage's first
forward needs microbatch 0's forwards on every earlier stage and their sends; the last
microbatch's backward must then flow back through every earlier stage. With f, b, r the
forward, backward and recompute seconds of one microbatch on a stage, m microbatches,
p_f / p_b the boundary sends forward / backward and u the optimizer step, for every s:

    end of stage 0's last B  ≥  Σ_{r<s} (f_r + p_f,r) + m·(f_s + b_s + r_s) + Σ_{r<s} (b_r + p_b,r)
    step                     ≥  Σ_{r<s} (f_r + p_f,r) + m·(f_s + b_s + r_s) + u_s

and after stage 0's last backward (the embedding's) its gradient sync still runs, then the
optimizer step that waits for it: with global checks (clipping, fp16 overflow) every
stage's UPDATE waits for them, so for all of its units. Views, offload, the other
collectives and any contention only add. `tests/test_planner.py` checks the bound against
the simulator and that pruning with it never drops the plan exhaustive search picks.

Memory: `MemoryBound`, a lower bound on each stage's ledger peak. Pure Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

from ratrain.config import SPLIT_PIPELINES, Plan
from ratrain.cost.model import CostModel
from ratrain.models import counts
from ratrain.models.spec import ModelSpec
from ratrain.planner.cache import Memo
from ratrain.platforms import Platform
from ratrain.schedule.ir import Action, Op, Resource
from ratrain.schedule.lowering import RELOAD_AHEAD_UNITS, deferred_weight_mbs, offloaded_mbs
from ratrain.schedule.passes import global_checks
from ratrain.schedule.views import prefetched_views_of, transient_views_of
from ratrain.schedule.zerobubble import inflight_limit, order_of, warmup
from ratrain.schema import bound_fields
from ratrain.sizes.activations import (
    activation_bytes,
    backward_workspace_bytes,
    boundary_bytes,
    weight_grad_bytes,
)
from ratrain.sizes.states import (
    ADAM_BYTES_PER_PARAM,
    MASTER_BYTES_PER_PARAM,
    grad_bytes_per_param,
    shards,
    view_bytes_per_param,
)

__all__ = [
    "UnitTimes",
    "unit_times",
    "unit_times_known",
    "lowest_unit_times",
    "peak_unit_times",
    "stage_times",
    "recompute_time_s",
    "step_time_lower_bound_s",
    "Overheads",
    "StageLoad",
    "overheads",
    "persistent_bound_of",
    "persistent_lower_bound_bytes",
    "MemoryBound",
]


@dataclass(frozen=True)
class UnitTimes:
    """Per-microbatch compute times of the three kinds of unit (seconds)."""

    f_emb: float
    b_emb: float
    f_block: float
    b_block: float
    f_head: float
    b_head: float
    rc_full: float
    """Recomputing one block's forward."""
    rc_selective: float
    """Recomputing one block's attention core."""
    bi_emb: float = 0.0
    bi_block: float = 0.0
    bi_head: float = 0.0
    """The input-gradient halves (B_IN) of a split backward (`pipeline: zb-h1`): what the
    gradient sent back waits for. 0.0 (no more than the truth) where not computed."""
    bw_emb: float = 0.0
    bw_block: float = 0.0
    bw_head: float = 0.0
    """Its weight-gradient halves (B_W). B_IN + B_W is not B's time on every platform (a
    calibrated one times B as measured, the halves from its kernels)."""


_UNIT_TIMES: Memo[tuple[Platform, UnitTimes]] = Memo(None)
"""(platform, times) by model, id(platform) and shape: the platform, kept, tells a reused id."""


def unit_times(
    spec: ModelSpec,
    platform: Platform,
    micro_batch: int,
    seq: int,
    dtype: str,
    loss_chunk_tokens: int | None = None,
) -> UnitTimes:
    """Compute times per unit kind (cached per model, platform, microbatch shape and loss:
    the fused chunked loss moves the head's work from B into F, `ratrain.cost.compute`)."""
    key = (spec, id(platform), micro_batch, seq, dtype, loss_chunk_tokens)
    hit = _UNIT_TIMES.get(key)
    if hit is not None and hit[0] is platform:
        return hit[1]
    ut = _unit_times(spec, platform, micro_batch, seq, dtype, loss_chunk_tokens)
    _UNIT_TIMES.put(key, (platform, ut))
    return ut


def unit_times_known(
    spec: ModelSpec,
    platform: Platform,
    micro_batch: int,
    seq: int,
    dtype: str,
    loss_chunk_tokens: int | None = None,
) -> bool:
    """Whether `unit_times` has these in its cache (no kernel model to run)."""
    hit = _UNIT_TIMES.get((spec, id(platform), micro_batch, seq, dtype, loss_chunk_tokens))
    return hit is not None and hit[0] is platform


def lowest_unit_times(times: list[UnitTimes]) -> UnitTimes:
    """Each field's smallest over `times` (one per loss variant a structure's knobs try): a
    step-time bound is no larger at any smaller unit time, so this bounds every variant."""
    if len(times) == 1:
        return times[0]
    return UnitTimes(
        **{f.name: min(getattr(t, f.name) for t in times) for f in dataclasses.fields(UnitTimes)}
    )


def _unit_times(
    spec: ModelSpec,
    platform: Platform,
    micro_batch: int,
    seq: int,
    dtype: str,
    loss_chunk_tokens: int | None = None,
) -> UnitTimes:
    plan = Plan(
        micro_batch=micro_batch,
        global_batch=micro_batch,
        seq=seq,
        compute_dtype=dtype,
        loss_chunk_tokens=loss_chunk_tokens,
    )
    cm = CostModel(spec, plan, platform)
    emb, head = counts.embedding_unit(spec), counts.head_unit(spec)

    def t(op: Op, unit: int) -> float:
        return cm.time_s(Action(op, 0, (unit,), 0))

    full = CostModel(spec, plan.replace(recompute="full"), platform)
    sel = CostModel(spec, plan.replace(recompute="selective"), platform)
    rc = Action(Op.RECOMPUTE, 0, (1,), 0)
    return UnitTimes(
        f_emb=t(Op.F, emb),
        b_emb=t(Op.B, emb),
        f_block=t(Op.F, 1),
        b_block=t(Op.B, 1),
        f_head=t(Op.F, head),
        b_head=t(Op.B, head),
        rc_full=full.time_s(rc),
        rc_selective=sel.time_s(rc),
        bi_emb=t(Op.B_IN, emb),
        bi_block=t(Op.B_IN, 1),
        bi_head=t(Op.B_IN, head),
        bw_emb=t(Op.B_W, emb),
        bw_block=t(Op.B_W, 1),
        bw_head=t(Op.B_W, head),
    )


def peak_unit_times(
    spec: ModelSpec,
    platform: Platform,
    micro_batch: int,
    seq: int,
    dtype: str,
    loss_chunk_tokens: int | None = None,
) -> UnitTimes:
    """Compute times at the dtype's peak FLOP/s: no kernel model is faster (assumed: a
    kernel never beats its unit's peak), so these bound `unit_times` from below at no
    kernel-model cost. Memory-bound passes (the embedding) count as free."""
    from ratrain.cost.compute import unit_kernels

    peak = platform.peak_flops[dtype]

    def t(unit: int, kind: str) -> float:
        ks = unit_kernels(
            spec, unit, micro_batch, seq, kind, dtype=dtype, loss_chunk_tokens=loss_chunk_tokens
        )
        return sum(k.flops for k in ks) / peak

    head = counts.head_unit(spec)
    return UnitTimes(
        f_emb=0.0,
        b_emb=0.0,
        f_block=t(1, "F"),
        b_block=t(1, "B"),
        f_head=t(head, "F"),
        b_head=t(head, "B"),
        rc_full=t(1, "RC:full"),
        rc_selective=t(1, "RC:selective"),
        bi_block=t(1, "BI"),
        bi_head=t(head, "BI"),
        bw_block=t(1, "BW"),
        bw_head=t(head, "BW"),
    )


def _per_stage(split: tuple[int, ...], block: float, emb: float, head: float) -> list[float]:
    """Seconds of one microbatch on each stage: its blocks', plus the embedding's on the
    first stage and the head's on the last."""
    last = len(split) - 1
    return [
        n * block + (emb if s == 0 else 0.0) + (head if s == last else 0.0)
        for s, n in enumerate(split)
    ]


def stage_times(split: tuple[int, ...], ut: UnitTimes) -> list[tuple[float, float]]:
    """(forward, backward) seconds of one microbatch on each stage."""
    fwd = _per_stage(split, ut.f_block, ut.f_emb, ut.f_head)
    return list(zip(fwd, _per_stage(split, ut.b_block, ut.b_emb, ut.b_head), strict=True))


def recompute_time_s(policy: str, n_blocks: int, ut: UnitTimes) -> float:
    """Recompute seconds of one microbatch on a stage of `n_blocks` blocks under `policy`."""
    if policy == "none":
        return 0.0
    if policy == "selective":
        return n_blocks * ut.rc_selective
    if policy == "full":
        return n_blocks * ut.rc_full
    k = int(policy.split(":", 1)[1])  # first:K
    return min(k, n_blocks) * ut.rc_full


@dataclass(frozen=True)
class Overheads:
    """The knob-dependent terms of the step-time bound (seconds)."""

    update_s: tuple[float, ...]
    """Per stage: its optimizer step as one stage-wide UPDATE (no more than per unit)."""
    send_f_s: tuple[float, ...]
    """Per boundary s -> s+1: one microbatch's activation."""
    send_b_s: tuple[float, ...]
    """Per boundary s+1 -> s: one microbatch's gradient."""
    tail_s: float
    """After stage 0's last backward: its last gradient sync and the update that waits."""
    start_s: float = 0.0
    """Before stage 0's first forward: fetching the embedding's transient view."""
    forward_pass_s: tuple[float, ...] = ()
    """Per stage (or empty): fetch time that one microbatch's forward pass waits for before
    its last-fetched block's F, when every use fetches its view (`_fetched_forward_s`)."""
    loads: tuple[StageLoad, ...] = ()
    """Per stage (or empty): work the step surely puts on its non-compute resources
    (`StageLoad`). A resource runs its actions one at a time, so the step lasts at least
    as long as its busiest one is busy."""

    @staticmethod
    def none(pp: int) -> Overheads:
        return Overheads((0.0,) * pp, (0.0,) * (pp - 1), (0.0,) * (pp - 1), 0.0)


def overheads(spec: ModelSpec, plan: Plan, platform: Platform) -> Overheads:
    """The bound's overheads for `plan` (its recompute field is not read)."""
    # At the fastest any rank computes (alone on its node under processor sharing), so
    # that the UPDATE times stay bounds where the simulator shares cores.
    cm = CostModel(spec, plan, platform, speed="peak")
    units = [tuple(plan.stage_units(spec, s)) for s in range(plan.pp)]
    upd = tuple(cm.time_s(Action(Op.UPDATE, s, units[s])) for s in range(plan.pp))
    send_f = tuple(cm.time_s(Action(Op.SEND_F, s, (units[s][-1],), 0)) for s in range(plan.pp - 1))
    send_b = tuple(
        cm.time_s(Action(Op.SEND_B, s + 1, (units[s + 1][0],), 0)) for s in range(plan.pp - 1)
    )
    # Stage 0's last sync covers the embedding: alone (ratrain), in the last bucket
    # (gpu-style: no less than alone), or with the whole stage (baseline).
    last_sync = units[0] if plan.schedule == "baseline" else (0,)
    sync = cm.time_s(Action(Op.GRAD_SYNC, 0, last_sync))
    if global_checks(plan):
        after = max(upd)
    elif plan.schedule == "ratrain":
        after = cm.time_s(Action(Op.UPDATE, 0, (0,)))
    else:
        after = upd[0]
    # Transient views are not held between steps: the first forward waits for its fetch.
    transient = _transient_views(plan)
    start = (
        cm.time_s(Action(Op.VIEW_FETCH, 0, (0,)))
        if transient and view_bytes_per_param(plan)
        else 0.0
    )
    # Views fetched per use: ratrain's transient views, fsdp-pp resharding after each use
    # (without resharding, fsdp-pp gathers a view once per step).
    per_use = plan.view_policy == "transient" and plan.schedule in ("ratrain", "fsdp-pp")
    fwd = (
        _fetched_forward_s(spec, plan, cm, units) if per_use and view_bytes_per_param(plan) else ()
    )
    load = _stage_loads(spec, plan, platform, cm, units, fwd)
    return Overheads(upd, send_f, send_b, sync + after, start, fwd, load)


@lru_cache(maxsize=4096)
def _offloaded_count(pp: int, m: int, s: int, pipeline: str) -> int:
    """Microbatches stage `s` offloads: the lowering's own choice."""
    return len(offloaded_mbs(pp, m, s, pipeline))


@dataclass(frozen=True)
class StageLoad:
    """One stage's non-compute work that its recompute policy leaves (seconds): with
    offload, each offloaded microbatch's OFFLOAD and RELOAD of every unit (`_add_offload`);
    with views fetched per use, the forward passes' fetches `_fetched_forward_s` counts, on
    the copy engine (a cast) or the DP network (an all-gather)."""

    offloaded_mbs: int
    other_units_s: float
    """One microbatch's offload round trip of the stage's non-block units (never recomputed)."""
    block_s: tuple[tuple[str, float], ...]
    """One block's round trip per policy (none, selective, full)."""
    n_blocks: int
    fetch_copy_s: float
    fetch_other_s: float

    def blocks_s(self, policy: str) -> float:
        t = dict(self.block_s)
        if policy.startswith("first:"):
            k = min(int(policy.split(":", 1)[1]), self.n_blocks)
            return k * t["full"] + (self.n_blocks - k) * t["none"]
        return self.n_blocks * t[policy]

    def busiest_s(self, policies) -> float:
        """The busiest resource's work, at least, under any of `policies`."""
        off = 0.0
        if self.offloaded_mbs:
            least = min(self.blocks_s(p) for p in policies)
            off = self.offloaded_mbs * (self.other_units_s + least)
        return max(off + self.fetch_copy_s, self.fetch_other_s)


def _stage_loads(spec, plan: Plan, platform, cm: CostModel, units, fetched) -> tuple:
    if not plan.offload_activations and not fetched:
        return ()
    m = plan.microbatches
    models = {
        pol: CostModel(spec, plan.replace(recompute=(pol,) * plan.pp), platform)
        for pol in (("none", "selective", "full") if plan.offload_activations else ())
    }
    out = []
    for s in range(plan.pp):
        copy_s = other_s = 0.0
        if fetched and fetched[s]:
            vf = Action(Op.VIEW_FETCH, s, (units[s][-1],))
            if cm.resource(vf) is Resource.COPY:  # where OFFLOAD and RELOAD run too
                copy_s = m * fetched[s]
            else:
                other_s = m * fetched[s]
        blocks = [u for u in units[s] if counts.is_block(spec, u)]
        others = [u for u in units[s] if not counts.is_block(spec, u)]
        if models:
            n_off = _offloaded_count(plan.pp, m, s, plan.pipeline)
            other_units = sum(_round_trip_s(models["none"], s, u) for u in others)
            alike = {counts.unit_params(spec, u): u for u in blocks}
            block = tuple(
                (pol, min((_round_trip_s(c, s, u) for u in alike.values()), default=0.0))
                for pol, c in models.items()
            )
        else:
            n_off, other_units, block = 0, 0.0, ()
        out.append(StageLoad(n_off, other_units, block, len(blocks), copy_s, other_s))
    return tuple(out)


def _round_trip_s(cm: CostModel, s: int, u: int) -> float:
    return cm.time_s(Action(Op.OFFLOAD, s, (u,), 0)) + cm.time_s(Action(Op.RELOAD, s, (u,), 0))


def _fetched_forward_s(spec: ModelSpec, plan: Plan, cm: CostModel, units) -> tuple[float, ...]:
    """Per stage, fetch seconds within one forward pass: the pass's span (from its first
    F's start to its last F's end) is at least these plus one block's F, when views are
    fetched per use, `view_lookahead` (L) uses ahead
    (`add_transient_views`: ratrain's transient views, fsdp-pp resharding after use).

    The fetch for the pass's use k is placed before use k - L, and the stage's walk issues
    it only after every compute action before that point has ended: for k >= L + 1, after
    the pass's first F has started. Each such use is a block's F whose view was dropped
    after its previous use (in the previous forward pass, at least n >= L + 2 uses back, or
    in a backward pass, at least k + 1 >= L + 2 back): its fetch is really issued. Those
    n - L - 1 fetches of the pass's n blocks run one at a time on the stage's fetch
    resource (DP network or copy engine), so the last of them ends no earlier than the
    first F's start plus their total time, and the block that waits for it still runs its
    F after that."""
    l_ahead = plan.view_lookahead
    out = []
    for s in range(plan.pp):
        blocks = [u for u in units[s] if counts.is_block(spec, u)]
        c = len(blocks) - l_ahead - 1
        if c <= 0:
            out.append(0.0)
            continue
        # A fetch's time depends on the unit through its parameter count only.
        alike = {counts.unit_params(spec, u): u for u in blocks}
        fetch = min(cm.time_s(Action(Op.VIEW_FETCH, s, (u,))) for u in alike.values())
        out.append(c * fetch)
    return tuple(out)


def _transient_views(plan: Plan) -> bool:
    """Whether views live only from a VIEW_FETCH to a VIEW_DROP within the step: ratrain's
    transient views, and fsdp-pp's under either resharding policy."""
    return transient_views_of(plan.schedule, plan.view_policy)


def step_time_lower_bound_s(
    split: tuple[int, ...],
    microbatches: int,
    ut: UnitTimes,
    recompute: tuple[str, ...] | None = None,
    over: Overheads | None = None,
    load_policies: tuple | None = None,
    pipeline: str = "1f1b",
) -> float:
    """The bound above; no recompute and no overheads when not given. `load_policies`
    (per stage, the recompute policies left) bounds the resource loads below all of them;
    by default they are `recompute`'s.

    With `pipeline` zb-h1 or zb-h2 (`ratrain.schedule.zerobubble`), a bound of the split
    backward's step (a search bounding several pipelines takes the smallest): its own
    warm-up (zb-h2's is longer: the first backward waits for more forwards); the gradient a
    stage sends back waits for the input-gradient passes (B_IN) alone, the weight passes (B_W) may follow the last of them, so
    the paths back (microbatch 0's round trip, the last microbatch's drain to stage 0)
    count B_IN's seconds, and a stage s > 0 is only known to have run its forwards and
    input-gradient passes when the last gradient leaves it. Every stage still runs all its
    compute (its backward as B_IN's and B_W's seconds), and stage 0's last action is
    B_W(embedding, m - 1), which its last sync and update wait for. RECOMPUTE(u, mb) runs
    just before B_IN(u, mb), so its seconds are on those paths as they are on B's under
    1F1B (less the first of a pass, which may run while the stage waits for the gradient)."""
    m, pp = microbatches, len(split)
    zb = pipeline in SPLIT_PIPELINES
    over = over or Overheads.none(pp)
    fb = stage_times(split, ut)
    if zb:
        ins, ws = _split_times(split, ut)
        fb = [(f, bi + bw) for (f, _), bi, bw in zip(fb, ins, ws, strict=True)]
    if over.forward_pass_s:  # a pass that waits for its fetches lasts longer than its F's
        fb = [
            (max(f, x + ut.f_block) if x else f, b)
            for (f, b), x in zip(fb, over.forward_pass_s, strict=True)
        ]
    rc = [recompute_time_s(recompute[s], split[s], ut) if recompute else 0.0 for s in range(pp)]
    # The first RECOMPUTE of a backward pass needs only its forward, so it may run while
    # the stage waits for the gradient: count one block's recomputation less on the paths.
    rcp = [max(0.0, r - (ut.rc_full if r else 0.0)) for r in rc]
    sf = (*over.send_f_s, 0.0)  # sf[s]: s -> s+1
    sb = (0.0, *over.send_b_s)  # sb[s]: s -> s-1
    # What a gradient sent back waits for on each stage: B, or B_IN under zb-h1.
    back = ins if zb else [b for _, b in fb]
    # Microbatch 0's round trip from stage s: forward to the last stage and back to s + 1.
    trip = [0.0] * pp
    for s in range(pp - 2, -1, -1):
        f1 = fb[s + 1][0]
        trip[s] = trip[s + 1] + sf[s] + f1 + back[s + 1] + rcp[s + 1] + sb[s + 1]
    best = last_b0 = drain = 0.0
    fill = over.start_s
    for s, (f, b) in enumerate(fb):
        r = rc[s]
        w = warmup(pp, m, s, pipeline)
        # Its first backward needs w + 1 forwards of its own and microbatch 0's round trip.
        first_b = fill + max((w + 1) * f, f + trip[s])
        end_b = max(fill + m * (f + b + r), first_b + (m - w - 1) * f + m * (b + r) - (r - rcp[s]))
        if zb and s > 0:  # its last gradient sent back: after its forwards and B_IN's only
            bi = back[s]
            last_in = max(
                fill + m * (f + bi + r), first_b + (m - w - 1) * f + m * (bi + r) - (r - rcp[s])
            )
            last_b0 = max(last_b0, last_in + drain)
        else:
            last_b0 = max(last_b0, end_b + drain)
        best = max(best, end_b + over.update_s[s])
        if over.loads:
            pols = load_policies[s] if load_policies else (recompute[s] if recompute else "full",)
            best = max(best, over.loads[s].busiest_s(pols))
        fill += f + sf[s]
        drain += back[s] + rcp[s] + (sb[s + 1] if s + 1 < pp else 0.0)
    return max(best, last_b0 + over.tail_s)


def _split_times(split: tuple[int, ...], ut: UnitTimes) -> tuple[list[float], list[float]]:
    """(B_IN, B_W) seconds of one microbatch on each stage (`stage_times`' backward, split)."""
    return (
        _per_stage(split, ut.bi_block, ut.bi_emb, ut.bi_head),
        _per_stage(split, ut.bw_block, ut.bw_emb, ut.bw_head),
    )


def persistent_lower_bound_bytes(spec: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """Per stage, bytes no schedule goes below: the fp32 master weights and Adam states of
    all its units (their shard, when sharded) are held through the step, and at some time
    the largest unit's view (while its forward runs) or its full gradient (from its first
    backward) exists on top of them."""
    most = max(view_bytes_per_param(plan), grad_bytes_per_param(plan))
    return persistent_bound_of(spec, plan.blocks_per_stage(spec), shards(plan), most)


def persistent_bound_of(
    spec: ModelSpec, split: tuple[int, ...], n_shards: int, most_bytes_per_param: int
) -> tuple[int, ...]:
    """`persistent_lower_bound_bytes` from what it reads of a plan: the layer split, the
    shard count and the wider of the view and gradient bytes per parameter (the search
    bounds structures with it before it builds their plans)."""
    key = (spec, split, n_shards, most_bytes_per_param)
    return _PERSISTENT.get_or(key, _persistent, spec, split, n_shards, most_bytes_per_param)


_PERSISTENT: Memo[tuple[int, ...]] = Memo(100_000)
"""`persistent_bound_of` by its arguments."""


def _persistent(spec: ModelSpec, split: tuple[int, ...], n_shards: int, most: int):
    per_param = MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM
    every = _unit_params(spec)
    prefix, peak = _unit_prefix(spec)
    out, start, pp = [], 1, len(split)
    for s in range(pp):  # the units of stage s, as `Plan.stage_units` has them
        lo, hi = (0 if s == 0 else start), (len(every) if s == pp - 1 else start + split[s])
        start += split[s]
        # The largest unit: the blocks share one size, so the largest of the range is
        # among its ends and one block.
        largest = max(every[lo], every[hi - 1], peak if hi - lo > 2 else 0)
        out.append((prefix[hi] - prefix[lo]) * per_param // n_shards + largest * most)
    return tuple(out)


@lru_cache(maxsize=64)
def _unit_prefix(spec: ModelSpec) -> tuple[tuple[int, ...], int]:
    """Prefix sums of the units' parameters, and the largest block's (blocks are one size:
    asserted)."""
    every = _unit_params(spec)
    blocks = set(every[1:-1])
    assert len(blocks) <= 1, "blocks of one model hold the same parameters"
    prefix = [0]
    for n in every:
        prefix.append(prefix[-1] + n)
    return tuple(prefix), max(blocks, default=0)


@lru_cache(maxsize=64)
def _unit_params(spec: ModelSpec) -> tuple[int, ...]:
    """Every unit's parameters, by unit (embedding, blocks, head)."""
    return tuple(counts.unit_params(spec, u) for u in range(spec.n_layers + 2))


_STAGE_MEMO: Memo[int] = Memo(200_000)
"""`MemoryBound.stage` by what it reads (`MemoryBound._share`) and the stage's key."""
_TABLES: Memo[tuple] = Memo(1024)
"""`MemoryBound`'s per-unit activation, workspace and parameter tables, by what they read."""


@lru_cache(maxsize=4096)
def _zb_profile(pp: int, m: int, w: int, pipeline: str) -> tuple[tuple[int, bool, bool], ...]:
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


def _unit_tables(spec: ModelSpec, plan: Plan, kinds: dict[str, int], eager: bool) -> tuple:
    """Per unit kind: the activations kept under each policy, the backward workspace and
    the parameters; the boundary bytes; and per unit kind what a split backward keeps from
    B_IN to B_W, (inputs, out_grads) (`_TABLES`)."""
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
class _Layout:
    """A stage's units for `MemoryBound`: runs of units alike (kind, policy, count), the
    static bytes (states and persistent views), the views among them, one microbatch's
    keep over the stage, every gradient's bytes, and per run its first unit and the keep
    and parameters below it; `at`: the units (index, run, index in the run) where what a
    backward pass holds can be largest. Under zb-h1 also what one microbatch's B_IN pass
    leaves for its B_W pass over the stage, the same below each run, and every gradient's
    bytes (which exist from the stage's first B_W)."""

    runs: list
    static: int
    views: int
    total_keep: int
    all_grads: int
    keeps: list
    starts: list
    below0: list
    met0: list
    at: list
    total_w: int = 0
    w_below0: list = field(default_factory=lambda: [0])
    zb_grads: int = 0

    def below(self, u: int) -> int:
        """Keep of the units before unit u."""
        for r, (_, _, c) in enumerate(self.runs):
            if u <= self.starts[r] + c:
                return self.below0[r] + (u - self.starts[r]) * self.keeps[r]
        return self.below0[-1]


_BOUND_FIELDS = bound_fields(Plan)


class MemoryBound:
    """A lower bound on each stage's ledger peak under a recompute policy, from moments of
    its 1F1B walk (one plan's knobs; the plan's own recompute field is not read).

    The stage runs w = min(pp - s - 1, m) forward passes before its first backward pass
    (`ratrain.schedule.zerobubble.warmup`: twice as many under zb-h2).
    While B(u, mb) runs, the ledger holds at least: the master and Adam states and the
    persistent views; the view of u if views are transient; the activations of every other
    microbatch whose forward pass is done and whose backward pass is not, and mb's own for
    the units its backward has not reached (u and below); what RECOMPUTE(u, mb) restored;
    the backward workspace; and the gradients of the units the backward has met, all of
    them from the second backward pass on (gradients live from a unit's first B to the
    UPDATE after its last). In flight: min(w + 1, m) microbatches at mb = 0 and
    min(w + 1, m - 1) at mb = 1. Offloaded microbatches count for nothing. With
    `sends_held`, the buffers of the sends already made (one per finished forward pass
    unless the stage is the last, one per finished backward pass unless it is the first),
    and the last backward pass is a moment too (all m forward sends and m - 1 backward
    sends held, on top of its own activations and all the gradients); otherwise comm
    buffers, and other transient bytes, only add. With `eager_kernels`, the activations
    and backward workspaces of the runtime's eager kernels, as the ledger counts them on
    such a platform (`Platform.eager_kernels`).

    Under `pipeline` zb-h1 the same moments are B_IN(u, mb)'s (`ratrain.schedule.
    zerobubble`: 1F1B's warm-up and steady pairing of F and B_IN, so as many microbatches
    in flight, each holding its kept activations until its B_IN; zb-h2: the same with its
    own, longer, warm-up w, which the stage key carries; RECOMPUTE(u, mb) runs
    just before B_IN(u, mb); B_IN holds B's workspace). What differs is what the backward
    leaves: B_IN(u, mb) adds u's output gradients as it starts, and from its end to its
    B_W each (u, mb) keeps what the weight pass needs (`weight_grad_bytes`, whatever the
    policy: recompute rebuilt it before B_IN). So at B_IN(u, mb) the units above u keep
    that for mb, and so does every unit for each microbatch whose B_IN pass has run and
    whose B_W pass has not (`_zb_profile`: up to s of them on stage s). Gradients exist
    from the stage's first B_W pass, all of them at once (a pass covers every unit), and
    none before it. The pass order reads pp, so the moments taken are those where these
    counts change, besides 1F1B's.
    """

    def __init__(
        self, spec: ModelSpec, plan: Plan, sends_held: bool = False, eager_kernels: bool = False
    ) -> None:
        self.spec, self.plan = spec, plan
        emb, head = counts.embedding_unit(spec), counts.head_unit(spec)
        kinds = {"emb": emb, "block": 1, "head": head}
        # The activation tables read the tokens, the dtype and the loss chunking only:
        # shared by the bounds of every structure and knob combination alike there.
        tkey = (
            spec,
            plan.micro_batch,
            plan.seq,
            plan.compute_dtype,
            plan.loss_chunk_tokens,
            eager_kernels,
        )
        tables = _TABLES.get_or(tkey, _unit_tables, spec, plan, kinds, eager_kernels)
        self.keep, self.bws, self.params, boundary, wgrad = tables
        self.gbp, vbp = grad_bytes_per_param(plan), view_bytes_per_param(plan)
        self.zb = plan.split_backward
        # zb-h1: what B_IN keeps for B_W (policy-independent), per unit kind: all of it,
        # and its output gradients alone (added when B_IN starts).
        self.w_keep = {k: sum(v) for k, v in wgrad.items()} if self.zb else {}
        self.w_out = {k: v[1] for k, v in wgrad.items()} if self.zb else {}
        # Under zb-h1 every gradient exists from the stage's first B_W pass on, and none
        # before it: counted per moment (`_stage`), not as the backward meets the units.
        self.zb_gbp = self.gbp if self.zb else 0
        if self.zb:
            self.gbp = 0
        self.transient = _transient_views(plan) and vbp > 0
        self.prefetch = self.transient and prefetched_views_of(
            plan.schedule, plan.view_policy, plan.view_lookahead
        )
        self.vbp = vbp
        self.state_per_param = (MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM) / shards(plan)
        # Everything `_stage` reads besides the stage's key: bounds of other structures
        # (another pp, split or family) with the same share their stages' values.
        self._share = (
            tkey,
            shards(plan),
            plan.microbatches,
            self.transient,
            self.prefetch,
            vbp,
            self.gbp,
            plan.offload_activations,
            sends_held,
            # zb-h1: its pass order reads pp (`_zb_profile`); its gradients count apart.
            (plan.pp, self.zb_gbp) if self.zb else None,
        )
        self.m = plan.microbatches
        # Sends held to the step's end (`Platform.sends_held_until_waited`): every output a
        # finished forward pass sent on, and every input gradient a finished backward pass
        # sent back, is still held.
        self.held_send_bytes = boundary if sends_held else 0
        self.extra: dict[tuple, object] = {}
        """Derived results memoised by their users on the same stage keys."""

    @staticmethod
    def key(plan: Plan) -> tuple:
        """The plan fields the bound reads besides the split (for sharing one instance):
        those the schema marks `bound`, the microbatches they make, and the views a stage
        holds (all that the lifecycle and the view policy change here)."""
        views = (
            _transient_views(plan),
            prefetched_views_of(plan.schedule, plan.view_policy, plan.view_lookahead),
        )
        return (plan.microbatches, views, *(getattr(plan, f) for f in _BOUND_FIELDS))

    def stage_key(self, stage: int) -> tuple[int, bool, bool, int]:
        """What the bound reads of a stage: its blocks, whether it holds the embedding or
        the head, and its warmup depth w (stages alike share their bounds)."""
        plan = self.plan
        n_blocks = plan.layer_split[stage] if plan.layer_split else None
        if n_blocks is None:
            n_blocks = plan.blocks_per_stage(self.spec)[stage]
        w = warmup(plan.pp, self.m, stage, plan.pipeline)
        return (n_blocks, stage == 0, stage == plan.pp - 1, w)

    def stage(self, stage: int, policy: str) -> int:
        return self.stage_at(self.stage_key(stage), policy)

    def stage_at(self, stage_key: tuple[int, bool, bool, int], policy: str) -> int:
        """`stage` of the stage whose `stage_key` is given (the plan's split not read)."""
        return _STAGE_MEMO.get_or(
            (self._share, (*stage_key, policy)), self._stage, *stage_key, policy
        )

    def breakdown(self, stage: int, policy: str) -> dict[str, int]:
        """The bound of `stage` under `policy` by state class (the ledger's classes), at
        the moment that gives it: the parts sum to `stage(stage, policy)`."""
        parts = self._stage(*self.stage_key(stage), policy, parts=True)
        assert sum(parts.values()) == self.stage(stage, policy)
        return parts

    def _layout(self, n_blocks: int, emb: bool, head: bool, policy: str) -> _Layout:
        """The stage's units as runs of units alike, their static bytes, and the units at
        which what a backward pass holds can be largest (see `_Layout`)."""
        # The stage's units as runs of units alike: (kind, policy, count).
        runs = [("emb", "none", 1)] if emb else []
        if policy.startswith("first:"):
            k = min(int(policy.split(":")[1]), n_blocks)
            runs += [("block", "full", k), ("block", "none", n_blocks - k)]
        else:
            runs.append(("block", policy, n_blocks))
        if head:
            runs.append(("head", "none", 1))
        runs = [r for r in runs if r[2] > 0]
        static = sum(c * int(self.params[k] * self.state_per_param) for k, _, c in runs)
        n_params = sum(c * self.params[k] for k, _, c in runs)
        views = 0 if self.transient else n_params * self.vbp
        static += views
        total_keep = sum(c * self.keep[(k, p)] for k, p, c in runs)
        starts, below0, met0 = [], [0], [0]  # per run: first unit, keep and params before it
        i = 0
        for k, p, c in runs:
            starts.append(i)
            i += c
            below0.append(below0[-1] + c * self.keep[(k, p)])
            met0.append(met0[-1] + c * self.params[k])
        # Within a run, what is held grows or shrinks linearly with the unit, except the
        # reload window near the run's start: the largest value is at the run's first
        # `ahead` + 1 units or at its last. Those units: (index, run, index in the run).
        ahead = RELOAD_AHEAD_UNITS
        at = []
        for r, (_, _, c) in enumerate(runs):
            for j in sorted({*range(min(ahead, c - 1) + 1), c - 1}):
                at.append((starts[r] + j, r, j))
        keeps = [self.keep[(k, p)] for k, p, _ in runs]
        w_below0 = [0]
        for k, _, c in runs:
            w_below0.append(w_below0[-1] + c * self.w_keep.get(k, 0))
        return _Layout(
            runs,
            static,
            views,
            total_keep,
            n_params * self.gbp,
            keeps,
            starts,
            below0,
            met0,
            at,
            w_below0[-1],
            w_below0,
            n_params * self.zb_gbp,
        )

    def _unit(self, lay: _Layout, u: int, r: int, j: int) -> tuple:
        """What does not depend on the moment, for unit `u` (run `r`, `j`-th in it):
        (kind, running, keep of units 0..u, the same when the microbatch is offloaded,
        the gradients not yet met below it, the next unit's view fetched ahead)."""
        k, p, _ = lay.runs[r]
        keep_u = self.keep[(k, p)]
        running = self.keep[(k, "none")] - keep_u + self.bws[k]
        if self.transient and k != "emb":
            running += self.params[k] * self.vbp
        # The unit the backward pass reads next (the one below, unless it is the
        # embedding, whose B reads no view): its view is fetched before B(u) starts.
        below_kind = k if j > 0 else (lay.runs[r - 1][0] if r > 0 else None)
        ahead_view = 0
        if self.prefetch and k != "emb" and below_kind == "block":
            ahead_view = self.params["block"] * self.vbp
        running += ahead_view
        above_w = 0
        if self.zb:
            # B_IN(u, mb) adds u's output gradients as it starts, and every unit above u
            # has run its B_IN of mb: each keeps what its B_W needs (`above_w`; with
            # offload, a microbatch whose weight pass is deferred moves it off the device,
            # `_add_weight_offload`: not counted then).
            running += self.w_out[k]
            above_w = lay.total_w - (lay.w_below0[r] + (j + 1) * self.w_keep[k])
        upto = lay.below0[r] + (j + 1) * keep_u  # keep of units 0..u
        # An offloaded microbatch holds the unit running and the ones reloaded ahead.
        mine_off = upto - lay.below(max(0, u - RELOAD_AHEAD_UNITS))
        met = lay.met0[r] + j * self.params[k]
        return k, running, upto, mine_off, lay.all_grads - met * self.gbp, ahead_view, above_w

    def _stage(
        self, n_blocks: int, emb: bool, head: bool, w: int, policy: str, parts: bool = False
    ):
        plan = self.plan
        lay = self._layout(n_blocks, emb, head, policy)
        static, views, total_keep, all_grads = lay.static, lay.views, lay.total_keep, lay.all_grads
        # Per unit, what does not depend on the moment; two switches do: whether every
        # unit's gradient exists (from the second backward pass on) and whether the
        # microbatch is offloaded. The largest unit per setting of the two is found once,
        # and each moment adds its own terms to it (integers: the same sums as unit by
        # unit, and the first unit at the largest, as before).
        terms = [self._unit(lay, u, r, j) for u, r, j in lay.at]
        largest: dict[tuple[bool, bool, bool], tuple] = {}

        def largest_unit(grads_all: bool, off: bool, above: bool) -> tuple:
            hit = largest.get((grads_all, off, above))
            if hit is None:
                top, arg = None, None
                for k, running, upto, mine_off, grads_some, ahead_view, above_w in terms:
                    grads = all_grads if grads_all else grads_some
                    mine = mine_off if off else upto
                    run = running + above_w if above else running
                    v = grads + mine + run
                    if top is None or v > top:
                        top, arg = v, (grads, mine, run, k, ahead_view)
                hit = largest[(grads_all, off, above)] = (top, arg)
            return hit

        best, at_best = 0, None
        m = plan.microbatches
        # B(., i) runs after F(min(i + w, m - 1)): microbatches i .. i + w are in flight.
        # From i = 1 on every unit's gradient exists; i = m - 1 - w is the last steady pair.
        # With sends held, the last backward pass too: fewer microbatches in flight, but
        # every forward pass's send and all the earlier backward passes' are held.
        moments = {0, min(1, m - 1), max(0, m - 1 - w)}
        if self.held_send_bytes:
            moments.add(m - 1)
        profile = _zb_profile(plan.pp, m, w, plan.pipeline) if self.zb else ()
        if profile:
            # Under zb-h1 the microbatches past their B_IN and before their B_W, and
            # whether a B_W has run, change too: what is held is linear in mb between
            # the changes, so the largest is at one end of a stretch without one.
            for i in range(1, m):
                if profile[i] != profile[i - 1]:
                    moments |= {i - 1, i}
        for mb in sorted(moments) if terms else ():
            others, grads_all = min(w, m - 1 - mb), mb >= 1
            off, others_b = self._offload(mb, others, m, w, total_keep)
            sent = (0 if head else min(mb + w, m - 1) + 1) + (0 if emb else mb)
            held = sent * self.held_send_bytes
            moved = bool(profile) and plan.offload_activations and profile[mb][2]
            v, (grads, mine, running, k, ahead_view) = largest_unit(grads_all, off, not moved)
            if profile:
                waiting, w_started, _ = profile[mb]
                if not plan.offload_activations:  # else offloaded until its B_W nears
                    others_b += waiting * lay.total_w  # each keeps what its B_W pass needs
                grads += lay.zb_grads if w_started else 0
                v += lay.zb_grads if w_started else 0
            total = static + others_b + held + v
            if total > best:
                best, at_best = total, (grads, mine + others_b, running, k, held, ahead_view)
        if not parts:
            return best
        return self._parts(static - views, views, at_best)

    def _parts(self, states: int, views: int, at_best) -> dict[str, int]:
        """`_stage`'s maximum split into the ledger's state classes."""
        grads, kept, running, k, held, ahead_view = at_best or (0, 0, 0, "block", 0, 0)
        fetched = self.params[k] * self.vbp if self.transient and k != "emb" else 0
        fetched += ahead_view
        workspace = self.bws[k] if at_best else 0
        share = MASTER_BYTES_PER_PARAM / (MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM)
        master = int(states * share)  # each unit's states, rounded once: split by share
        return {
            "master": master,
            "optimizer": states - master,
            "view": views + fetched,
            "grad": grads,
            "activation": kept + running - fetched - workspace,
            "comm_buffer": held,
            "workspace": workspace,
        }

    def _offload(self, mb: int, others: int, m: int, w: int, total_keep: int) -> tuple[bool, int]:
        """Whether microbatch `mb` is offloaded at its backward, and the bytes the other
        microbatches in flight keep on the device. Offload moves a microbatch with another
        forward pass between its F and B: all but the last when w >= 1."""
        if not self.plan.offload_activations or w == 0:
            return False, others * total_keep
        last_in_flight = mb < m - 1 <= mb + others  # another microbatch, kept on device
        return mb < m - 1, int(last_in_flight) * total_keep
