"""The step-time lower bound: a cheap bound on a candidate's step time, from the same cost
model the simulator uses (the memory bound is `ratrain.planner.memory_bound`).

The simulator replays one step from a cold start; every compute action (F, B, RECOMPUTE,
UPDATE) of a stage runs on that stage's one compute resource. A stage's first forward
needs microbatch 0's forwards on every earlier stage and their sends; the last
microbatch's backward must then flow back through every earlier stage. With f, b, r the
forward, backward and recompute seconds of one microbatch on a stage, m microbatches,
p_f / p_b the boundary sends forward / backward and u the optimizer step, for every s:

    end of stage 0's last B  ≥  Σ_{r<s} (f_r + p_f,r) + m·(f_s + b_s + r_s) + Σ_{r<s} (b_r + p_b,r)
    step                     ≥  Σ_{r<s} (f_r + p_f,r) + m·(f_s + b_s + r_s) + u_s

and after stage 0's last backward (the embedding's) its gradient sync still runs, then the
optimizer step that waits for it: with global checks (clipping, fp16 overflow) every
stage's UPDATE waits for them, so for all of its units. Every stage's own gradient syncs
(and the gathers refreshing a sharded optimizer's views) follow its last backward pass, one
at a time on the DP network (`Overheads.sync_s`); an offloading stage's compute waits for
RELOADs its walk issues late (`OffloadWalk`). Views, the other collectives and any
contention only add. `tests/planner/test_search.py` checks the bound against
the simulator and that pruning with it never drops the plan exhaustive search picks.

Here: the per-microbatch unit times (`UnitTimes`: `unit_times`, `peak_unit_times`,
`lowest_unit_times`) and per stage (`stage_times`, `recompute_time_s`), the
knob-dependent overheads (`Overheads`, `overheads`, `StageLoad`) and the bound itself
(`step_time_lower_bound_s`). Pure Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from ratrain.config import SPLIT_PIPELINES, Plan
from ratrain.cost.comm import dp_group, p2p_link
from ratrain.cost.compute import kernel_model_is_cheap
from ratrain.cost.model import CostModel
from ratrain.models import counts
from ratrain.models.spec import ModelSpec
from ratrain.planner.cache import Memo
from ratrain.platforms import Platform
from ratrain.schedule.ir import WEIGHT_VISIT, Action, Op, Resource
from ratrain.schedule.lowering import (
    RELOAD_AHEAD_UNITS,
    deferred_weight_mbs,
    offloaded_mbs,
    offloaded_of,
    weight_offloaded_mbs,
)
from ratrain.schedule.onef1b import pass_order
from ratrain.schedule.passes import global_checks
from ratrain.schedule.views import transient_views_of
from ratrain.schedule.zerobubble import pass_order as zb_pass_order
from ratrain.schedule.zerobubble import warmup
from ratrain.sizes.states import view_bytes_per_param

__all__ = [
    "UnitTimes",
    "WALK_MAX_MICROBATCHES",
    "unit_times",
    "unit_times_known",
    "unit_times_cheap",
    "first_unit_times",
    "lowest_unit_times",
    "peak_unit_times",
    "stage_times",
    "recompute_time_s",
    "step_time_lower_bound_s",
    "plain_bounds_s",
    "Overheads",
    "StageLoad",
    "grad_sync_s",
    "offload_loads",
    "p2p_sends_s",
    "overheads",
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
    args = (spec, platform, micro_batch, seq, dtype, loss_chunk_tokens)
    key = (spec, id(platform), micro_batch, seq, dtype, loss_chunk_tokens)
    return _UNIT_TIMES.get_or_owned(key, platform, _unit_times, *args)


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


def unit_times_cheap(
    spec: ModelSpec,
    platform: Platform,
    micro_batch: int,
    seq: int,
    dtype: str,
    loss_chunk_tokens: int | None = None,
) -> bool:
    """Whether `unit_times` costs no kernel-model work worth putting off: known already, or
    the platform's kernel model is cheap (`ratrain.cost.compute.kernel_model_is_cheap`)."""
    if kernel_model_is_cheap(platform):
        return True
    return unit_times_known(spec, platform, micro_batch, seq, dtype, loss_chunk_tokens)


def first_unit_times(
    spec: ModelSpec,
    platform: Platform,
    micro_batch: int,
    seq: int,
    dtype: str,
    loss_chunk_tokens: int | None = None,
) -> UnitTimes:
    """The times a structure's first step-time bound is computed with: the kernel model's
    where `unit_times_cheap`, else those at the dtype's peak (`peak_unit_times`: no larger,
    at no kernel-model cost). At the peak, a flat efficiency of 0.5 (h100-80g) halves every
    compute term of the bound, and the floor a cut search certifies with it."""
    args = (spec, platform, micro_batch, seq, dtype, loss_chunk_tokens)
    return unit_times(*args) if unit_times_cheap(*args) else peak_unit_times(*args)


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
    kernel-model cost. Memory-bound passes (the embedding) count as free. Cached as
    `unit_times` is (the look apart bounds a thousand structures with them)."""
    args = (spec, platform, micro_batch, seq, dtype, loss_chunk_tokens)
    key = (spec, id(platform), micro_batch, seq, dtype, loss_chunk_tokens)
    return _PEAK_TIMES.get_or_owned(key, platform, _peak_unit_times, *args)


_PEAK_TIMES: Memo[tuple[Platform, UnitTimes]] = Memo(None)
"""`peak_unit_times` as `_UNIT_TIMES` holds `unit_times`."""


def _peak_unit_times(
    spec: ModelSpec,
    platform: Platform,
    micro_batch: int,
    seq: int,
    dtype: str,
    loss_chunk_tokens: int | None,
) -> UnitTimes:
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
    sync_s: tuple[float, ...] = ()
    """Per stage (or empty): one gradient sync of all its units at once, no longer than its
    syncs one by one (a collective's time is affine in its bytes, with a latency no less
    than zero: the sum of several is no less than one of them all), and where the views
    are refreshed by an all-gather after the update, one such gather of them all. Every
    sync of a unit waits for that unit's last backward (its last B_W under a split
    backward), in the stage's last backward pass, each refresh for its unit's sync, and
    they run one at a time on the DP network."""
    last_pass_net_s: tuple[float, ...] = ()
    """Per stage (or empty): under 1F1B with views fetched per use over the DP network and
    synced per unit there (ratrain's lifecycle), the DP network's work in the stage's last
    backward pass before its last-fetched block's B (`_last_pass_net_s`)."""

    @staticmethod
    def none(pp: int) -> Overheads:
        return Overheads((0.0,) * pp, (0.0,) * (pp - 1), (0.0,) * (pp - 1), 0.0)


def overheads(spec: ModelSpec, plan: Plan, platform: Platform) -> Overheads:
    """The bound's overheads for `plan` (its recompute field is not read)."""
    # At the fastest any rank computes (alone on its node under processor sharing), so
    # that the UPDATE times stay bounds where the simulator shares cores.
    cm = CostModel(spec, plan, platform, speed="peak")
    units = [tuple(plan.stage_units(spec, s)) for s in range(plan.pp)]
    stage_s = _alike_stages(spec, plan, cm)
    upd = tuple(stage_s(Op.UPDATE, s, units[s]) for s in range(plan.pp))
    send_f, send_b = _sends(stage_s, units)
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
    transient = transient_views_of(plan.schedule, plan.view_policy)
    start = (
        cm.time_s(Action(Op.VIEW_FETCH, 0, (0,)))
        if transient and view_bytes_per_param(plan)
        else 0.0
    )
    # Views fetched per use: ratrain's transient views, fsdp-pp resharding after each use
    # (without resharding, fsdp-pp gathers a view once per step).
    per_use = plan.view_policy == "transient" and plan.schedule in ("ratrain", "fsdp-pp")
    fwd = (
        _fetched_forward_s(spec, plan, stage_s, units)
        if per_use and view_bytes_per_param(plan)
        else ()
    )
    load = _stage_loads(spec, plan, platform, cm, units, fwd)
    syncs = tuple(stage_s(Op.GRAD_SYNC, s, units[s]) for s in range(plan.pp))
    if _refreshes_over_dp(plan):
        # Each unit's refreshed view is gathered after its update, on the DP network too.
        syncs = tuple(t + stage_s(Op.VIEW_FETCH, s, units[s]) for s, t in enumerate(syncs))
    last_net = _last_pass_net_s(spec, plan, cm, stage_s, units) if fwd else ()
    return Overheads(
        upd,
        send_f,
        send_b,
        sync + after,
        start,
        fwd,
        load,
        syncs if any(syncs) else (),
        last_net,
    )


def _last_pass_net_s(
    spec: ModelSpec, plan: Plan, cm: CostModel, stage_s, units
) -> tuple[float, ...]:
    """`Overheads.last_pass_net_s`: in a stage's last backward pass (the last microbatch's,
    under 1F1B), the fetches of the uses k >= L + 1 of its n blocks are issued as the pass
    goes (`_fetched_forward_s`), and each block's GRAD_SYNC once its B has ended (its last
    backward): both on the DP network, in issue order. The last fetch is issued after the
    B of the block L + 1 uses before it, so behind the syncs of the n - L - 2 blocks before
    that one: from the pass's first B on, the network runs n - L - 1 fetches and those
    syncs before the last-fetched block's B can start. Empty where the views are not
    gathered over the DP network, under a split backward (the syncs wait for B_W) or
    outside ratrain's lifecycle (buckets, or syncs after the pass)."""
    if plan.schedule != "ratrain" or plan.split_backward or plan.dp == 1 or plan.sync_bucket_bytes:
        return ()
    out = []
    for s, (c, alike) in enumerate(_fetched_blocks(spec, plan, units)):
        if c <= 0:
            out.append(0.0)
            continue
        if cm.resource(Action(Op.VIEW_FETCH, s, (alike[0],))) is not Resource.DP_NET:
            return ()
        fetch = min(stage_s(Op.VIEW_FETCH, s, (u,)) for u in alike)
        sync = min(stage_s(Op.GRAD_SYNC, s, (u,)) for u in alike)
        out.append(c * fetch + (c - 1) * sync)
    return tuple(out) if any(out) else ()


def offload_loads(spec: ModelSpec, plan: Plan, platform: Platform) -> tuple[StageLoad, ...]:
    """`Overheads.loads` of `plan` without its views' fetches: the offload traffic alone
    (empty where it does not offload). Every plan that offloads alike (the same
    structure, pass order, loss and dtypes) puts at least this on its stages, whatever its
    views: a fetch only adds to a resource's work (`StageLoad.busiest_s`)."""
    if not plan.offload_activations:
        return ()
    cm = CostModel(spec, plan, platform, speed="peak")
    units = [tuple(plan.stage_units(spec, s)) for s in range(plan.pp)]
    return _stage_loads(spec, plan, platform, cm, units, ())


def grad_sync_s(spec: ModelSpec, plan: Plan, platform: Platform) -> tuple[float, ...]:
    """Per stage, one gradient sync of all its units (`Overheads.sync_s` without the
    refreshing gathers): what a structure's cheapest knobs sync at least."""
    cm = CostModel(spec, plan, platform, speed="peak")
    stage_s = _alike_stages(spec, plan, cm)
    return tuple(stage_s(Op.GRAD_SYNC, s, tuple(plan.stage_units(spec, s))) for s in range(plan.pp))


def p2p_sends_s(
    spec: ModelSpec, plan: Plan, platform: Platform
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(`Overheads.send_f_s`, `Overheads.send_b_s`) of `plan`: one microbatch's activation
    per boundary forward and its gradient back."""
    cm = CostModel(spec, plan, platform, speed="peak")
    units = [tuple(plan.stage_units(spec, s)) for s in range(plan.pp)]
    return _sends(_alike_stages(spec, plan, cm), units)


def _sends(stage_s, units) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per boundary s -> s+1, the SEND_F of stage s's last unit, and the SEND_B of stage
    s+1's first unit back (`stage_s`: `_alike_stages`)."""
    pp = len(units)
    return (
        tuple(stage_s(Op.SEND_F, s, (units[s][-1],)) for s in range(pp - 1)),
        tuple(stage_s(Op.SEND_B, s + 1, (units[s + 1][0],)) for s in range(pp - 1)),
    )


def _alike_stages(spec: ModelSpec, plan: Plan, cm: CostModel):
    """`cm.time_s` of an action of stage `s` on `units` (microbatch 0 where it has one),
    memoised over stages alike: the same blocks by size, the same edge units, and the same
    DP group (UPDATE, GRAD_SYNC, VIEW_FETCH) or link to the peer (SEND_F, SEND_B): what
    their cost reads of the stage. Deep pipelines have dozens of such stages."""
    memo: dict[tuple, float] = {}
    pp, dp, upn, layout = plan.pp, plan.dp, cm.platform.units_per_node, cm.rank_layout

    def time_s(op: Op, s: int, units: tuple[int, ...]) -> float:
        shape = tuple(
            ("block", counts.unit_params(spec, u)) if counts.is_block(spec, u) else u for u in units
        )
        if op is Op.SEND_F or op is Op.SEND_B:
            peer = s + 1 if op is Op.SEND_F else s - 1
            where = p2p_link(s, peer, pp, dp, cm.platform, layout) is cm.platform.inter_node
            key = (op, shape, where)
            mb = 0
        else:
            key = (op, shape, dp_group(s, pp, dp, upn, layout))
            mb = None
        t = memo.get(key)
        if t is None:
            t = memo[key] = cm.time_s(Action(op, s, units, mb))
        return t

    return time_s


def _refreshes_over_dp(plan: Plan) -> bool:
    """Whether the lowering ends the step with a VIEW_FETCH refreshing the views after the
    update that is an all-gather over DP (`lowering._stage_tail`, `lower_ratrain`): views
    kept between steps (not fsdp-pp's), gathered because the optimizer is sharded."""
    if not plan.shard_optimizer or not view_bytes_per_param(plan):
        return False
    if plan.schedule == "ratrain":
        return plan.view_policy == "persistent"
    return plan.schedule in ("baseline", "gpu-style")


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
    walk: OffloadWalk | None = None
    """With offload: what the stage's walk makes its compute wait for (`OffloadWalk`)."""
    weight_s: float = 0.0
    """With offload under a split backward: the round trips of what B_IN keeps for a
    deferred B_W (`lowering._add_weight_offload`), on the copy engine with the others,
    whatever the recompute (`_weight_visits`)."""

    def blocks_s(self, policy: str) -> float:
        t = dict(self.block_s)
        if policy.startswith("first:"):
            k = min(int(policy.split(":", 1)[1]), self.n_blocks)
            return k * t["full"] + (self.n_blocks - k) * t["none"]
        return self.n_blocks * t[policy]

    def busiest_s(self, policies) -> float:
        """The busiest resource's work, at least, under any of `policies`."""
        return max(self.traffic_s(policies) + self.fetch_copy_s, self.fetch_other_s)

    def traffic_s(self, policies) -> float:
        """The copy engine's OFFLOADs and RELOADs, at least, under any of `policies`: none
        starts before the stage's first forward has (each OFFLOAD follows its unit's F,
        each RELOAD its OFFLOAD), and each RELOAD is waited for by a compute action."""
        off = self.weight_s
        if self.offloaded_mbs:
            least = min(self.blocks_s(p) for p in policies)
            off += self.offloaded_mbs * (self.other_units_s + least)
        return off


@dataclass(frozen=True)
class OffloadWalk:
    """An offloading stage's reloads, as its walk issues them (`lowering._add_offload`):
    each unit of an offloaded microbatch goes OFFLOAD after its F and RELOAD before the
    backward work `RELOAD_AHEAD_UNITS` units ahead of it (the pass's start for the last
    ones), on the copy engine in issue order, and that unit's RECOMPUTE or B waits for it.
    The walk issues an action only once the compute before it has ended, so in a backward
    pass a RELOAD starts no earlier than the end of the work it is placed behind, and the
    work after it waits for the RELOAD: where a unit's RELOAD takes longer than the work it
    overlaps, the stage's compute idles. Right after an offloaded microbatch's forward pass
    (`pairs`), the pass's RELOADs also queue behind that pass's OFFLOADs, and the last of
    those starts only when the forward ends.

    `idle_s` is the compute's idle time in such a pass at least (its span, from the
    pass's start, or the forward's, less their compute), from durations that are lower
    bounds: the span is no shorter for longer ones, and each pass's span is its own
    interval of the stage's time, so the stage lasts at least its fill, all its compute and
    these idles."""

    kinds: tuple[str, ...]
    """The stage's units in order: "emb", "block" or "head"."""
    block_copy: tuple[tuple[str, float, float], ...]
    """A block's OFFLOAD and RELOAD seconds per policy (none, selective, full)."""
    edge_copy: tuple[tuple[float, float], ...]
    """The same for each unit that is not a block, in order."""
    pairs: int
    """Offloaded backward passes right after an offloaded microbatch's forward pass."""
    solos: int
    """The other offloaded backward passes."""
    ahead: int = 0
    """Offloaded microbatches among the forwards before the stage's first backward pass:
    their OFFLOADs are all issued before that pass's first RELOAD (`backlog_s`)."""
    weight_rel: tuple[float, ...] = ()
    """Under a split backward, per unit in order: the RELOAD of what its B_IN kept for a
    deferred B_W (`lowering._add_weight_offload`), 0.0 for a unit whose weight pass runs
    whole (the embedding's, the head's under the fused loss)."""
    weight_visits: int = 0
    """The stage's weight passes (B_W) that reload so (`_weight_visits`)."""
    weight_off: tuple[float, ...] = ()
    """The OFFLOAD, right after its B_IN, of what `weight_rel` reloads (0.0 where none)."""

    def first_pass_s(self, policy: str, ut: UnitTimes, zb: bool) -> float:
        """The stage's first backward pass (B, or B_IN under a split backward), at least:
        from its first unit's compute to its last unit's end, its RELOADs issued as the
        walk goes (`span`'s), those issued at the pass's start landed already."""
        return _walk_idle_s(self, policy, ut, zb)[2]

    def backlog_s(self, policy: str) -> float:
        """From the stage's first forward's start to its first backward pass's first unit
        of compute, at least, under `policy`: the copy engine runs in issue order, so the
        RELOAD that unit waits for (of the stage's last unit) follows every OFFLOAD of the
        `ahead` microbatches, each unit's after its forward (no earlier than the first
        forward's start)."""
        return _walk_backlog_s(self, policy)

    def idle_s(self, policy: str, ut: UnitTimes, zb: bool) -> float:
        """The compute's idle seconds over the step, at least, under `policy`."""
        pair, solo, _, _, wpass = _walk_idle_s(self, policy, ut, zb)
        return self.pairs * pair + self.solos * solo + self.weight_visits * wpass

    def later_idle_s(self, policy: str, ut: UnitTimes, zb: bool) -> float:
        """`idle_s` less one pass's (the largest a pass has): the idles of every offloaded
        backward pass but the stage's first, which may wait for its gradient while its
        RELOADs run (the others start after the stage's first backward pass has ended),
        and the first's from its first unit's compute on (`first_pass_s`)."""
        pair, solo, _, first, wpass = _walk_idle_s(self, policy, ut, zb)
        one = max(pair if self.pairs else 0.0, solo if self.solos else 0.0)
        later = self.pairs * pair + self.solos * solo - one + max(0.0, first)
        return later + self.weight_visits * wpass  # weight passes: after the first B_IN


def _unit_policies(walk: OffloadWalk, policy: str) -> list[str | None]:
    """Each unit's own recompute under the stage's `policy`, in the stage's unit order:
    "full", "selective" or "none" for a block (first:K: its first K blocks full), None for
    a unit that is not a block."""
    n_blocks = walk.kinds.count("block")
    k_full = n_blocks if policy == "full" else 0
    if policy.startswith("first:"):
        k_full = min(int(policy.split(":", 1)[1]), n_blocks)
    out: list[str | None] = []
    i = 0
    for kind in walk.kinds:
        if kind == "block":
            out.append("full" if i < k_full else "selective" if policy == "selective" else "none")
            i += 1
        else:
            out.append(None)
    return out


def _unit_copies(walk: OffloadWalk, pols: list[str | None]) -> tuple[list[float], list[float]]:
    """Each unit's (OFFLOAD, RELOAD) seconds under its policy (`_unit_policies`)."""
    copy = {p: (o, r) for p, o, r in walk.block_copy}
    edges = iter(walk.edge_copy)
    pairs = [copy[pol] if pol is not None else next(edges) for pol in pols]
    return [o for o, _ in pairs], [r for _, r in pairs]


def _unit_work(
    walk: OffloadWalk, pols: list[str | None], ut: UnitTimes, zb: bool
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Each unit's (F, backward: B or B_IN, B_W, RECOMPUTE) seconds, in the stage's unit
    order, under its own policy (`_unit_policies`)."""
    rc_of = {"full": ut.rc_full, "selective": ut.rc_selective, "none": 0.0, None: 0.0}
    by_kind = {
        "block": (ut.f_block, ut.bi_block if zb else ut.b_block, ut.bw_block),
        "emb": (ut.f_emb, ut.bi_emb if zb else ut.b_emb, ut.bw_emb),
        "head": (ut.f_head, ut.bi_head if zb else ut.b_head, ut.bw_head),
    }
    times = [by_kind[kind] for kind in walk.kinds]
    return (
        [t[0] for t in times],
        [t[1] for t in times],
        [t[2] for t in times],
        [rc_of[p] for p in pols],
    )


def _reload_chain(
    w: list[float], rel: list[float], t0: float, copy_free: float, landed_from: float
) -> float:
    """When a backward-order pass over units n - 1 .. 0 ends, from its start `t0` with the
    copy engine free from `copy_free`: unit u's work `w[u]` waits for the unit above and for
    its RELOAD `rel[u]`, which the walk places `RELOAD_AHEAD_UNITS` units ahead (issued when
    the unit above that one ends, at `t0` for the first ones) and which runs on the copy
    engine in issue order; a unit with u + `RELOAD_AHEAD_UNITS` >= `landed_from` has its
    RELOAD landed already."""
    n = len(w)
    ends = [0.0] * n
    for u in range(n - 1, -1, -1):
        ahead = u + RELOAD_AHEAD_UNITS
        if ahead >= landed_from:
            issued, r = t0, 0.0
        else:
            issued, r = (t0 if ahead >= n - 1 else ends[ahead + 1]), rel[u]
        copy_free = max(issued, copy_free) + r
        ends[u] = max(t0 if u == n - 1 else ends[u + 1], copy_free) + w[u]
    return ends[0]


@lru_cache(maxsize=8192)
def _walk_backlog_s(walk: OffloadWalk, policy: str) -> float:
    if not walk.ahead:
        return 0.0
    off, rel = _unit_copies(walk, _unit_policies(walk, policy))
    return walk.ahead * sum(off) + rel[-1]


@lru_cache(maxsize=8192)
def _walk_idle_s(
    walk: OffloadWalk, policy: str, ut: UnitTimes, zb: bool
) -> tuple[float, float, float, float, float]:
    """The idle of one pass right after an offloaded forward and of one other pass; the
    stage's first backward pass's length and its idle from its first unit's compute on
    (`first_pass_s`), at least; and the idle of one weight pass that reloads."""
    pols = _unit_policies(walk, policy)
    off, rel = _unit_copies(walk, pols)
    f, back, _, rcs = _unit_work(walk, pols, ut, zb)
    w = [rc + b for rc, b in zip(rcs, back, strict=True)]
    n = len(w)
    never = float("inf")

    def span(after_forward: bool) -> float:
        t0 = copy_free = 0.0
        if after_forward:  # the forward from 0, its units back to back, OFFLOADs behind
            for u in range(n):
                t0 += f[u]
                copy_free = max(copy_free, t0) + off[u]
        return _reload_chain(w, rel, t0, copy_free, never) - (t0 + sum(w))

    # The first pass, from its first unit's compute: the RELOADs issued at the pass's
    # start may have landed while it waited for its gradient (counted as none), and so may
    # its first RECOMPUTE; the others are issued as the pass goes, as in `span`.
    first = sum(w) - rcs[-1]  # a stage that offloads only its weight visits: no RELOAD
    if walk.pairs or walk.solos:
        first = _reload_chain([*w[:-1], w[-1] - rcs[-1]], rel, 0.0, 0.0, n - 1)
    return (
        span(True) if walk.pairs else 0.0,
        span(False) if walk.solos else 0.0,
        first,
        first - (sum(w) - rcs[-1]),
        _weight_pass_idle_s(walk, ut) if walk.weight_visits else 0.0,
    )


def _weight_pass_idle_s(walk: OffloadWalk, ut: UnitTimes) -> float:
    """The compute's idle in one weight pass that reloads (`OffloadWalk.weight_rel`), at
    least: the pass runs its units last first, each B_W waiting for its RELOAD, placed
    `RELOAD_AHEAD_UNITS` units ahead in the pass (issued once the B_W before that one has
    ended; at the pass's start for the unit that many below the first); the first units'
    are placed before the compute before the pass, and counted as landed. The copy engine
    is taken as free at the pass's start."""
    w = _unit_work(walk, _unit_policies(walk, "none"), ut, True)[2]
    return _reload_chain(w, list(walk.weight_rel), 0.0, 0.0, len(w)) - sum(w)


WALK_MAX_MICROBATCHES = 512
"""assumed: the stage walk (`_stage_walk_s`) bounds steps of at most this many microbatches.
Its scan of a stage's passes is linear in them (`_walk_passes`, per pass order and depth:
0.7-1.8 ms a stage at 512 on the 2-core machine, 2.5-4.6 ms at 2,048, noisy); with it on every
offload knob queue's bound and a scan three times slower, answers on long steps took up to
0.9 s longer on the wide grid (llama2-70b on 24 a100-80g clusters at 8192 x 2048: 4,096
microbatches) for the same plan and gap. The steps it tightens most have few microbatches
per stage (a warm-up and cool-down that are most of the step, and copy backlogs that never
drain in between)."""


@lru_cache(maxsize=4096)
def _stage_walk_s(
    walk: OffloadWalk, policy: str, ut: UnitTimes, pp: int, m: int, s: int, pipeline: str
) -> tuple[float, float]:
    """Stage `s`'s whole step as its walk runs it alone, from its first F's start: (the end
    of its last backward pass, B or B_IN; the end of its last compute action), at least.

    Its list as the lowering makes it (`onef1b.pass_order` or `zerobubble.pass_order`;
    `passes.add_recompute`; `lowering._add_activation_offload` and `_add_weight_offload`),
    with the other stages infinitely fast: every F, RECOMPUTE, B, B_IN and B_W of the stage
    in list order on its compute, each once the one before has ended and its RELOAD has
    landed; every OFFLOAD and RELOAD on the copy engine, one at a time in issue order, each
    issued when the walk reaches it (once the compute before it has ended). Left out: the
    receives a pass waits for, the sends, the view fetches and drops, the syncs and the
    update. The step's events are a max-plus system in the durations (each start the
    largest of its issue, its dependencies' ends and the end of what its queue ran before),
    so an action's time only grows with longer durations and more dependencies: the real
    stage, which waits for its neighbours and runs what is left out too, ends its passes no
    earlier after its first F's start. Where the copy engine runs behind, the per-pass
    idles (`OffloadWalk.idle_s`, each pass from a free copy engine) miss the OFFLOADs and
    weight-pass RELOADs that earlier passes left queued; this carries them."""
    zb = pipeline in SPLIT_PIPELINES
    pols = _unit_policies(walk, policy)
    off, rel = _unit_copies(walk, pols)
    n = len(pols)
    f, back, bw, rc = _unit_work(walk, pols, ut, zb)
    wrel = walk.weight_rel or (0.0,) * n
    woff = walk.weight_off or (0.0,) * n
    ahead = RELOAD_AHEAD_UNITS
    first_w = [u for u in range(n - 1, -1, -1) if u + ahead > n - 1 and wrel[u] > 0.0]
    sig, runs = _walk_passes(pp, m, s, pipeline, bool(walk.weight_visits), bool(first_w))
    op_f, op_w = Op.F, Op.B_W
    period = 3 if zb else 2
    t = cf = last_back = 0.0  # the walk (end of the last compute), the copy engine
    landed: dict[int, float] = {}  # unit -> its weight RELOAD's end, for the next B_W pass
    nxt_landed: dict[int, float] = {}  # the same, issued within a weight pass for the next
    seen: list[tuple] = []  # the state at each pass's start
    i = 0
    while i < len(sig):
        # What the rest reads of the copy engine and the weight RELOADs landed is their
        # time past the walk's (every copy is issued, every B_W runs, at t or later): as
        # such, a steady run's state advances alike in every part.
        cf = max(cf, t)
        landed = {u: max(e, t) for u, e in landed.items()}
        seen.append((t, cf, last_back, tuple(sorted(landed.items()))))
        jump = _jump(seen, sig, runs, i, period)
        if jump is not None:
            blocks, delta, back_too = jump
            shift = blocks * delta
            t, cf = t + shift, cf + shift
            last_back += shift if back_too else 0.0
            landed = {u: e + shift for u, e in landed.items()}
            i += blocks * period
            seen.clear()
            continue
        op, mine, w_mine, lead = sig[i]
        i += 1
        if op is op_f:
            for u in range(n):
                if lead and u == n - 1:
                    for v in first_w:
                        cf = max(cf, t) + wrel[v]
                        landed[v] = cf
                t += f[u]
                if mine:
                    cf = max(cf, t) + off[u]
        elif op is op_w:
            for u in range(n - 1, -1, -1):
                v = u - ahead
                if w_mine and v >= 0 and wrel[v] > 0.0:
                    cf = max(cf, t) + wrel[v]
                    landed[v] = cf
                if lead and u == 0:
                    for x in first_w:
                        cf = max(cf, t) + wrel[x]
                        nxt_landed[x] = cf
                t = (max(t, landed.pop(u, 0.0)) if w_mine else t) + bw[u]
            landed.update(nxt_landed)
            nxt_landed.clear()
        else:  # B, or B_IN
            ends: dict[int, float] = {}
            if mine:  # the last units' RELOADs at the pass's start
                for u in range(n - 1, n - 1 - ahead, -1):
                    if u >= 0:
                        cf = max(cf, t) + rel[u]
                        ends[u] = cf
            for u in range(n - 1, -1, -1):
                v = u - ahead
                if mine and v >= 0:  # before unit u's backward work
                    cf = max(cf, t) + rel[v]
                    ends[v] = cf
                start = max(t, ends.get(u, 0.0)) if mine else t
                if lead and u == 0:  # before the pass's last compute (its B or B_IN)
                    issued = start + rc[u] if rc[u] else t  # after its RECOMPUTE, if any
                    for x in first_w:
                        cf = max(cf, issued) + wrel[x]
                        landed[x] = cf
                t = start + rc[u] + back[u]
                if w_mine and woff[u] > 0.0:  # right after its B_IN
                    cf = max(cf, t) + woff[u]
            last_back = t
    return last_back, t


@lru_cache(maxsize=1024)
def _walk_passes(
    pp: int, m: int, s: int, pipeline: str, weights: bool, leads: bool
) -> tuple[list[tuple], list[int]]:
    """Stage `s`'s passes as `_stage_walk_s` reads them, (op, its microbatch offloaded,
    its weight pass deferred, the next pass a deferred weight pass that reloads its first
    units before this pass's last compute); and per pass the end of the run of passes from
    it that repeat the kinds of the period before them (one microbatch's passes: 2 under
    1F1B, 3 under a split backward)."""
    zb = pipeline in SPLIT_PIPELINES
    order = zb_pass_order(pp, m, s, pipeline) if zb else pass_order(pp, m, s)
    moved = offloaded_of(order)
    wmoved = deferred_weight_mbs(order) if zb and weights else set()
    op_w = Op.B_W
    kinds: dict[tuple, tuple] = {}  # one tuple per kind
    sig = []
    for i, (op, mb) in enumerate(order):
        lead = (
            leads and i + 1 < len(order) and order[i + 1][0] is op_w and order[i + 1][1] in wmoved
        )
        key = (op, mb in moved, mb in wmoved, lead)
        sig.append(kinds.setdefault(key, key))
    period = 3 if zb else 2
    runs = [0] * (len(sig) + 1)
    runs[len(sig)] = len(sig)
    for j in range(len(sig) - 1, -1, -1):
        runs[j] = runs[j + 1] if j >= period and sig[j] == sig[j - period] else j
    return sig, runs


_SETTLE_BLOCKS = 32
"""assumed: a steady run whose per-period advance has not settled after this many periods
walked is jumped over at the least advance seen in its last period (`_jump`): a lower
bound all the same, and the walk of a step of thousands of microbatches stays short."""


def _jump(seen: list[tuple], sig: list[tuple], runs: list[int], i: int, period: int):
    """Where the passes from `i` on repeat the period before them (the same kinds, pass by
    pass, `sig`; `runs`: where each run of such passes ends) for whole periods: (how many,
    the least advance per period, whether the period holds a backward pass), once the
    state's advance over the last period equals that over the one before and is alike in
    every part (to 1e-12, relative), or after `_SETTLE_BLOCKS` periods; None to walk on.
    `seen`: the state at each pass's start since the last jump.

    Sound: each pass's times are maxima and sums of the state's times and fixed durations,
    so a period's map of the state (t, the copy engine, the weight RELOADs landed) is
    monotone and commutes with adding a constant to every time. The next period, of the
    same kinds, maps a state at least the last one plus the least advance d to one at least
    its own result plus d; by induction every time k periods on is at least the time now
    plus k d, and the walk goes on from there (a state no later than the real one). A
    period's last backward pass ends no earlier than k d after the last one's, likewise."""
    k = len(seen) - 1
    if k < 2 * period or (len(sig) - i) < period:
        return None
    now, one, two = seen[k], seen[k - period], seen[k - 2 * period]
    units = [u for u, _ in now[3]]
    if units != [u for u, _ in one[3]] or units != [u for u, _ in two[3]]:
        return None  # not the same weight RELOADs pending
    if i - 2 * period < period or runs[i - 2 * period] < i:
        return None  # the two periods before are not alike
    blocks = (runs[i] - i) // period
    if blocks < 1:
        return None
    x_now = (now[0], now[1], *(e for _, e in now[3]))
    x_one = (one[0], one[1], *(e for _, e in one[3]))
    adv = [a - b for a, b in zip(x_now, x_one, strict=True)]
    if len(seen) <= _SETTLE_BLOCKS * period:
        x_two = (two[0], two[1], *(e for _, e in two[3]))
        before = [a - b for a, b in zip(x_one, x_two, strict=True)]
        tol = 1e-12 * max(1.0, *map(abs, x_now))
        if any(abs(a - b) > tol for a, b in zip(adv, before, strict=True)):
            return None
        if max(adv) - min(adv) > tol:
            return None
    delta = min(adv)
    if delta <= 0.0:
        return None
    back_too = any(sig[j][0] is not Op.F and sig[j][0] is not Op.B_W for j in range(i - period, i))
    return blocks, delta, back_too


_DEFERRING = {"1f1b": 1, "zb-h1": 1, "zb-h2": 2}
"""Per pass order with a closed form: the backward passes per warm-up forward that do not
follow an offloaded forward in the steady state (`_offload_passes`)."""


@lru_cache(maxsize=4096)
def _offload_passes(pp: int, m: int, s: int, pipeline: str) -> tuple[int, int]:
    """(`OffloadWalk.pairs`, `OffloadWalk.solos`) of stage `s`: its offloaded backward
    passes (B, or B_IN under a split backward) right after an offloaded forward pass in
    its pass order, and the others.

    From 2 pp + 2 microbatches on, under 1F1B, zb-h1 and zb-h2, every microbatch but the
    last is offloaded on a stage before the last (none on the last), and of them k w
    follow no offloaded forward, w = pp - s - 1 the stage's warm-up forwards and k 1 (2
    under zb-h2): a closed form, where the walk of `m` passes costs about 2 ms a stage at a
    thousand microbatches, once per stage of every structure bounded
    (`tests/planner/test_offload_passes.py` checks it against the walk)."""
    k = _DEFERRING.get(pipeline)
    if k is not None and m >= 2 * pp + 2:
        if s == pp - 1:
            return 0, 0
        solos = k * (pp - s - 1)
        return m - 1 - solos, solos
    return _offload_passes_walked(pp, m, s, pipeline)


def _offload_passes_walked(pp: int, m: int, s: int, pipeline: str) -> tuple[int, int]:
    """`_offload_passes` by walking the stage's pass order."""
    moved = offloaded_mbs(pp, m, s, pipeline)
    if pipeline in SPLIT_PIPELINES:
        order = zb_pass_order(pp, m, s, pipeline)
    else:
        order = pass_order(pp, m, s)
    pairs = solos = 0
    prev = None
    for op, mb in order:
        if op in (Op.B, Op.B_IN) and mb in moved:
            if prev is not None and prev[0] is Op.F and prev[1] in moved:
                pairs += 1
            else:
                solos += 1
        prev = (op, mb)
    return pairs, solos


def _stage_loads(spec, plan: Plan, platform, cm: CostModel, units, fetched) -> tuple:
    if not plan.offload_activations and not fetched:
        return ()
    m = plan.microbatches
    models = {
        pol: CostModel(spec, plan.replace(recompute=(pol,) * plan.pp), platform)
        for pol in (("none", "selective", "full") if plan.offload_activations else ())
    }
    out = []
    trips: dict[
        tuple, tuple[float, float]
    ] = {}  # a block's, by policy and size: alike on every stage

    def block_trip(pol: str, c: CostModel, s: int, u: int) -> tuple[float, float]:
        key = (pol, counts.unit_params(spec, u))
        t = trips.get(key)
        if t is None:
            t = trips[key] = _one_way_s(c, s, u)
        return t

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
        walk = None
        if models:
            pairs, solos = _offload_passes(plan.pp, m, s, plan.pipeline)
            n_off = pairs + solos  # every offloaded microbatch has one backward pass
            edge = tuple(_one_way_s(models["none"], s, u) for u in others)
            other_units = sum(o + r for o, r in edge)
            alike = {counts.unit_params(spec, u): u for u in blocks}
            one_way = tuple(
                (pol, *min((block_trip(pol, c, s, u) for u in alike.values()), key=sum))
                for pol, c in models.items()
                if alike
            )
            block = tuple((pol, o + r) for pol, o, r in one_way) or tuple(
                (pol, 0.0) for pol in models
            )
            kinds = tuple(
                "block" if counts.is_block(spec, u) else "emb" if u == 0 else "head"
                for u in units[s]
            )
            if n_off:
                ahead = _offloaded_ahead(plan.pp, m, s, plan.pipeline)
                walk = OffloadWalk(kinds, one_way, edge, pairs, solos, ahead)
        else:
            n_off, other_units, block = 0, 0.0, ()
        weight = 0.0
        if models and plan.split_backward and plan.pipeline in _DEFERRING and len(units[s]) > 1:
            visits = _weight_visits(plan.pp, m, s, plan.pipeline)
            head = counts.head_unit(spec)
            split_units = [u for u in units[s] if counts.is_block(spec, u)]
            if not plan.loss_chunk_tokens and head in units[s]:
                split_units.append(head)
            if visits and split_units:
                trip = {}  # by parameter count: alike blocks move alike
                for u in split_units:
                    key = counts.unit_params(spec, u), u == head
                    if key not in trip:
                        trip[key] = _one_way_s(models["none"], s, u, WEIGHT_VISIT)
                    weight += sum(trip[key])
                weight *= visits
                if walk is None:  # no microbatch offloaded: the weight visits alone
                    walk = OffloadWalk(kinds, one_way, edge, 0, 0)
                if walk is not None:
                    split_set = set(split_units)
                    unit_trips = [
                        trip[counts.unit_params(spec, u), u == head] if u in split_set else None
                        for u in units[s]
                    ]
                    walk = dataclasses.replace(
                        walk,
                        weight_rel=tuple(t[1] if t else 0.0 for t in unit_trips),
                        weight_visits=visits,
                        weight_off=tuple(t[0] if t else 0.0 for t in unit_trips),
                    )
        out.append(StageLoad(n_off, other_units, block, len(blocks), copy_s, other_s, walk, weight))
    return tuple(out)


@lru_cache(maxsize=4096)
def _offloaded_ahead(pp: int, m: int, s: int, pipeline: str) -> int:
    """`OffloadWalk.ahead` of stage `s`: its offloaded microbatches (`offloaded_mbs`) among
    the forwards before its first backward pass (`_first_forwards`). From 2 pp + 2
    microbatches on, under 1F1B, zb-h1 and zb-h2, every microbatch but the last is
    offloaded on a stage before the last (`_offload_passes`): all of them but the last."""
    k = _first_forwards(pp, m, pipeline)[s]
    if pipeline in _DEFERRING and m >= 2 * pp + 2:
        return 0 if s == pp - 1 else min(k, m - 1)
    return sum(1 for mb in offloaded_mbs(pp, m, s, pipeline) if mb < k)


@lru_cache(maxsize=4096)
def _weight_visits(pp: int, m: int, s: int, pipeline: str) -> int:
    """Stage `s`'s microbatches whose weight pass is deferred behind another forward or
    input-gradient pass (`lowering.weight_offloaded_mbs`): on a stage of two units or
    more each split unit of them makes a weight visit's round trip (the pass between puts
    a compute action between its B_IN and the RELOAD). From 2 pp + 2 microbatches on, m -
    1 on every stage but the first under zb-h1 and on the stages from ceil(pp / 2) under
    zb-h2, none elsewhere: a closed form
    (`tests/planner/test_offload_passes.py` checks it against the pass order)."""
    if m >= 2 * pp + 2:
        first = 1 if pipeline == "zb-h1" else (pp + 1) // 2 if pipeline == "zb-h2" else None
        if first is not None:
            return m - 1 if s >= first else 0
    return len(weight_offloaded_mbs(pp, m, s, pipeline))


def _one_way_s(cm: CostModel, s: int, u: int, visit: int = 0) -> tuple[float, float]:
    """(OFFLOAD, RELOAD) seconds of unit `u` of one microbatch: its activations, or with
    `visit` `WEIGHT_VISIT` what B_IN keeps of it for its deferred B_W."""
    off = cm.time_s(Action(Op.OFFLOAD, s, (u,), 0, visit))
    return off, cm.time_s(Action(Op.RELOAD, s, (u,), 0, visit))


def _fetched_blocks(spec: ModelSpec, plan: Plan, units) -> list[tuple[int, list[int]]]:
    """Per stage, the fetches a pass of its n blocks surely waits for, n - L - 1 with L the
    view lookahead (at most 0: none), and one block of each size (a fetch's or a sync's
    time depends on the unit through its parameter count only)."""
    out = []
    for s in range(plan.pp):
        blocks = [u for u in units[s] if counts.is_block(spec, u)]
        alike = {counts.unit_params(spec, u): u for u in blocks}
        out.append((len(blocks) - plan.view_lookahead - 1, list(alike.values())))
    return out


def _fetched_forward_s(spec: ModelSpec, plan: Plan, stage_s, units) -> tuple[float, ...]:
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
    out = []
    for s, (c, alike) in enumerate(_fetched_blocks(spec, plan, units)):
        if c <= 0:
            out.append(0.0)
            continue
        out.append(c * min(stage_s(Op.VIEW_FETCH, s, (u,)) for u in alike))
    return tuple(out)


def step_time_lower_bound_s(
    split: tuple[int, ...],
    microbatches: int,
    ut: UnitTimes,
    recompute: tuple[str, ...] | None = None,
    over: Overheads | None = None,
    load_policies: tuple | None = None,
    pipeline: str = "1f1b",
    stage_terms: list[float] | None = None,
    walked: bool = True,
    max_walks: int | None = None,
) -> float:
    """The bound above; no recompute and no overheads when not given. `load_policies`
    (per stage, the recompute policies left) bounds the resource loads below all of them;
    by default they are `recompute`'s. `stage_terms`: a list that gets, per stage, the
    largest of its own terms (the step is at least each; their largest is the bound).
    `walked`: an offloading stage's terms include its whole walk (`_stage_walk_s`), its
    copy engine's queue carried from pass to pass (False: the per-pass terms alone, for
    the cheaper bounds of a structure's first refinement); `max_walks`: at most that many
    stages walked, those whose walks may end latest first (their compute and copies one
    after the other: a bound still, a walk only raises a stage's terms).

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
    if recompute is None and over is None and load_policies is None and stage_terms is None:
        return _plain_bound_s(split, microbatches, ut, pipeline)
    m, pp = microbatches, len(split)
    zb = pipeline in SPLIT_PIPELINES
    over = over or Overheads.none(pp)
    fb = stage_times(split, ut)
    if zb:
        ins, ws = _split_times(split, ut)
        fb = [(f, bi + bw) for (f, _), bi, bw in zip(fb, ins, ws, strict=True)]
    plain = fb  # the compute alone: the offload idles are counted apart from fetch waits
    if over.forward_pass_s:  # a pass that waits for its fetches lasts longer than its F's
        fb = [
            (max(f, x + ut.f_block) if x else f, b)
            for (f, b), x in zip(fb, over.forward_pass_s, strict=True)
        ]
    rc = [recompute_time_s(recompute[s], split[s], ut) if recompute else 0.0 for s in range(pp)]
    rcp = [_on_paths(r, ut) for r in rc]  # what the paths back count of it
    # Views fetched per use: a backward pass on a path back lasts at least its fetches and
    # the block that waits for the last of them (`own`, below).
    one_back = ut.bi_block if zb else ut.b_block
    pass_fetch = [x + one_back if x else 0.0 for x in over.forward_pass_s] or [0.0] * pp

    def on_path(s: int, rp: float) -> float:
        """Stage `s`'s backward pass of one microbatch on a path back, its recompute `rp`."""
        return max(back[s] + rp, pass_fetch[s])

    # The last pass of a stage (the last microbatch's drain runs through them) waits for
    # the DP network's fetches and syncs (`Overheads.last_pass_net_s`).
    last_net = [x + one_back if x else 0.0 for x in over.last_pass_net_s] or [0.0] * pp

    sf = (*over.send_f_s, 0.0)  # sf[s]: s -> s+1
    sb = (0.0, *over.send_b_s)  # sb[s]: s -> s-1
    # What a gradient sent back waits for on each stage: B, or B_IN under zb-h1.
    back = ins if zb else [b for _, b in fb]
    # Microbatch 0's round trip from stage s: forward to the last stage and back to s + 1.
    trip = [0.0] * pp
    for s in range(pp - 2, -1, -1):
        f1 = fb[s + 1][0]
        trip[s] = trip[s + 1] + sf[s] + f1 + on_path(s + 1, rcp[s + 1]) + sb[s + 1]
    best = drain = 0.0
    fill = over.start_s
    firsts = _first_forwards(pp, m, pipeline)
    tail, upd, syncs, loads = over.tail_s, over.update_s, over.sync_s, over.loads
    # Where stages offload: when each stage's first backward may start at the earliest,
    # its own copy backlog (`OffloadWalk.backlog_s`, the least over the policies it may
    # take) and the next stage's first backward, whose gradient it waits for (`gate`);
    # `after[s]`: the gradient's arrival from stage s + 1.
    fetched_s = over.forward_pass_s
    after = _gates(
        split, ut, zb, fill, fb, sf, sb, on_path, firsts, loads, load_policies, recompute
    )

    def own(s: int, f: float, b: float, r: float, rp: float, p: str | None) -> float:
        """The largest of stage `s`'s own terms with its recompute `r` (`rp` on the
        paths) under policy `p` (None: no offload traffic or walk to read)."""
        k = firsts[s]
        bi = back[s]
        if fetched_s and fetched_s[s]:
            # Views fetched per use: a backward pass (B_IN's under a split backward) waits
            # for as many fetches as a forward pass (`_fetched_forward_s`), each use k of
            # it past the lookahead dropped since its previous use, at least 2 k + 1 uses
            # back, and fetched once the pass's first unit has started; the block that
            # waits for the last one runs its backward after it. Its recompute's seconds
            # may run while the fetches do.
            x = fetched_s[s]
            if zb:
                bi = max(bi, x + ut.bi_block - r)
                b = bi + ws[s]
            else:
                b = max(b, x + ut.b_block - r)
        walk = loads[s].walk if loads and p is not None else None

        def first_backward(f: float) -> float:
            """When its first backward may start, its forwards taking `f` each: after k of
            them and microbatch 0's round trip (the other m - k forwards follow it), the
            gradient's arrival and its copy backlog (`_gates`)."""
            t = fill + max(k * f, f + trip[s])
            if after:
                t = max(t, after[s])
                if walk is not None:
                    t = max(t, fill + walk.backlog_s(p))
            return t

        first_b = first_backward(f)
        end_b = max(fill + m * (f + b + r), first_b + (m - k) * f + m * (b + r) - (r - rp))
        if last_net[s] > b + r:  # its last pass: no shorter than its network's work
            end_b += last_net[s] - (b + r)
        if zb and s > 0:  # its last gradient sent back: after its forwards and B_IN's only
            last_in = max(fill + m * (f + bi + r), first_b + (m - k) * f + m * (bi + r) - (r - rp))
            t = max(last_in + drain + tail, end_b + upd[s])
        else:
            t = max(end_b + drain + tail, end_b + upd[s])
        if syncs:
            # The stage's last pass (B, or B_W under a split backward, of the last
            # microbatch) starts no earlier than its chain less the pass; the syncs follow.
            last = end_b - (ws[s] if zb else max(b + r, last_net[s]))
            t = max(t, last + syncs[s])
            if not zb and fetched_s and loads and loads[s].fetch_other_s:
                # Under 1F1B the last pass's fetches (issued once it has started) share
                # the DP network with those syncs (each after its unit's backward).
                t = max(t, last + fetched_s[s] + syncs[s])
        if loads:
            load = loads[s]
            if p is not None:
                if load.walk is not None:  # the idles the walk forces under the policy
                    f0, b0 = plain[s]
                    idle = load.walk.idle_s(p, ut, zb)
                    t = max(t, fill + m * (f0 + b0 + r) + idle + upd[s])
                    # After its first backward pass (which needs microbatch 0's round
                    # trip), the stage's other passes, their compute and their idles.
                    later = load.walk.later_idle_s(p, ut, zb)
                    if later > 0.0:
                        rest = first_backward(f0) + (m - k) * f0 - (r - rp) + later
                        end0 = rest + m * (b0 + r)
                        if zb and s > 0:  # its last gradient sent: after its B_IN passes
                            t = max(t, rest + m * (back[s] + r) + drain + tail)
                        else:
                            t = max(t, end0 + drain + tail)
                        t = max(t, end0 + upd[s])
                t = max(t, load.busiest_s((p,)), fill + load.traffic_s((p,)))
            else:
                least = pols or ("full",)
                t = max(t, load.busiest_s(least), fill + load.traffic_s(least))
        return t

    leasts: list[float] = []
    walks: list[tuple] = []  # offloading stages to walk, after the others' terms
    for s, (f, b) in enumerate(fb):
        pols = load_policies[s] if load_policies else (recompute[s],) if recompute else None
        # A stage's own terms under each policy it may take, the other stages at their
        # cheapest (`rc`, `rcp`): the policy it takes gives each term at least this, so
        # the least over its policies of their largest bounds the step. Where it offloads,
        # recomputing more shortens its copy work and its reloads' waits but lengthens its
        # compute: bounded apart (the least traffic beside the least recompute), the
        # terms let a stage take full's traffic and none's compute at once. Elsewhere
        # every term grows with the recompute: the cheapest is the least.
        if loads and loads[s].walk is not None and pols is not None:
            terms = []
            for p in pols:
                r = recompute_time_s(p, split[s], ut)
                terms.append((own(s, f, b, r, _on_paths(r, ut), p), p))
            least = min(t for t, _ in terms)
            if walked and m <= WALK_MAX_MICROBATCHES:
                walks.append((s, sorted(terms, key=lambda tp: tp[0]), fill, drain))
        else:
            least = own(s, f, b, rc[s], rcp[s], None)
        if syncs:
            # On the DP network with the fetches the forward passes surely make there.
            fetched = loads[s].fetch_other_s if loads else 0.0
            least = max(least, fetched + syncs[s])
        leasts.append(least)
        fill += f + sf[s]
        drain += max(on_path(s, rcp[s]), last_net[s]) + (sb[s + 1] if s + 1 < pp else 0.0)
    best = max(leasts, default=0.0)

    # The offloading stages' own walks, their copy engine's queue carried from pass to
    # pass (`_stage_walk_s`), from their first forward on. A walk only raises a policy's
    # terms: a stage is walked under the policies whose terms are under its least so far
    # (the same least), and, where only the bound is asked, not at all where its walk
    # cannot end past the largest stage term (it lasts no longer than the stage's compute
    # and copies one after the other: at any moment the compute runs, or waits for a
    # RELOAD that the copy engine runs or has queued behind what it runs).
    def ceiling(w) -> float:
        s, terms, fill_s, drain_s = w
        p = terms[0][1]
        work = m * (plain[s][0] + plain[s][1] + recompute_time_s(p, split[s], ut))
        work += loads[s].traffic_s((p,))
        return fill_s + work + max(upd[s], drain_s + tail)

    # Where only `max_walks` are taken: the stages whose walks may end latest first.
    key = (lambda w: -ceiling(w)) if max_walks is not None else (lambda w: -leasts[w[0]])
    for w in sorted(walks, key=key):
        s, terms, fill_s, drain_s = w
        load = loads[s]
        if stage_terms is None and terms[0][0] <= best and ceiling(w) * (1 + 1e-9) <= best:
            continue
        if max_walks is not None:
            if max_walks <= 0:
                break
            max_walks -= 1
        least = float("inf")
        for t, p in terms:
            if t >= least:
                break
            last_back, last = _stage_walk_s(load.walk, p, ut, pp, m, s, pipeline)
            t = max(t, fill_s + last + upd[s])
            if zb and s > 0:  # its last gradient sent back: after its last B_IN
                t = max(t, fill_s + last_back + drain_s + tail)
            else:
                t = max(t, fill_s + last + drain_s + tail)
            least = min(least, t)
        leasts[s] = max(leasts[s], least)
        best = max(best, leasts[s])
    if stage_terms is not None:
        stage_terms.extend(leasts)
    return best


def _gates(
    split, ut, zb, start, fb, sf, sb, on_path, firsts, loads, load_policies, recompute
) -> list:
    """Per stage s, when the gradient of microbatch 0 may arrive from stage s + 1 at the
    earliest (0.0 on the last stage); [] where no stage's walk has a backlog. A stage's
    first backward pass starts no earlier than its k forwards (`firsts`), that gradient
    and its own backlog (`OffloadWalk.backlog_s`); the pass and the send back follow. Per
    stage the least over the policies it may take of that pass's end, its recompute
    (`_on_paths`) and its backlog under the same policy: the chain runs from the last
    stage back (`step_time_lower_bound_s`'s round trip, each stage's start raised)."""
    if not loads or not any(ld.walk is not None and ld.walk.ahead for ld in loads):
        return []
    pp = len(split)
    fills = []
    fill = start
    for s in range(pp):
        fills.append(fill)
        fill += fb[s][0] + sf[s]
    arrive = [0.0] * pp
    for s in range(pp - 1, 0, -1):
        g = max(fills[s] + firsts[s] * fb[s][0], arrive[s])
        walk = loads[s].walk
        pols = load_policies[s] if load_policies else (recompute[s],) if recompute else None
        if walk is not None and walk.ahead and pols:
            leave = min(
                max(g, fills[s] + walk.backlog_s(p))
                + max(
                    on_path(s, _on_paths(recompute_time_s(p, split[s], ut), ut)),
                    walk.first_pass_s(p, ut, zb),
                )
                for p in pols
            )
        else:
            r = recompute_time_s(recompute[s], split[s], ut) if recompute else 0.0
            leave = g + on_path(s, _on_paths(r, ut))
        arrive[s - 1] = leave + sb[s]
    return arrive


def _plain_bound_s(split: tuple[int, ...], m: int, ut: UnitTimes, pipeline: str) -> float:
    """`step_time_lower_bound_s` with no recompute and no overheads (a structure's first
    bound, thousands per search): the same terms and the same float operations, with every
    zero term and the per-stage function call left out (adding 0.0 changes no sum of
    non-negative terms). `tests/planner/test_time_bound_plain.py` checks it is the general
    path's value, bit for bit."""
    return plain_bounds_s(split, m, ut, (pipeline,))[0]


def plain_bounds_s(
    split: tuple[int, ...], m: int, ut: UnitTimes, pipelines: tuple[str, ...]
) -> list[float]:
    """`_plain_bound_s` of each of `pipelines`, in order, with what they share worked out
    once: the stages' forward seconds, and their backward seconds and microbatch 0's round
    trips, which 1F1B's bound and the split backward's (zb-h1, zb-h2: B_IN's) read apart.
    The same values."""
    fwd = _per_stage(split, ut.f_block, ut.f_emb, ut.f_head)
    shared: dict[bool, tuple[list[float], list[float], list[float]]] = {}
    out = []
    for pipeline in pipelines:
        zb = pipeline in SPLIT_PIPELINES
        parts = shared.get(zb)
        if parts is None:
            if zb:
                back, ws = _split_times(split, ut)
                bwd = [bi + bw for bi, bw in zip(back, ws, strict=True)]
            else:
                bwd = back = _per_stage(split, ut.b_block, ut.b_emb, ut.b_head)
            trip = [0.0] * len(split)
            for s in range(len(split) - 2, -1, -1):
                trip[s] = trip[s + 1] + fwd[s + 1] + back[s + 1]
            parts = shared[zb] = (back, bwd, trip)
        out.append(_plain_end(fwd, *parts, m, _first_forwards(len(split), m, pipeline), zb))
    return out


def _plain_end(
    fwd: list[float],
    back: list[float],
    bwd: list[float],
    trip: list[float],
    m: int,
    firsts: tuple[int, ...],
    zb: bool,
) -> float:
    """`_plain_bound_s`'s step: the latest of the stages' ends."""
    best = drain = fill = 0.0
    for s in range(len(fwd)):
        f, b, k = fwd[s], bwd[s], firsts[s]
        first_b = fill + max(k * f, f + trip[s])
        lead = first_b + (m - k) * f
        end_b = max(fill + m * (f + b), lead + m * b)
        if zb and s > 0:
            bi = back[s]
            last_in = max(fill + m * (f + bi), lead + m * bi)
            t = max(last_in + drain, end_b)
        else:
            t = end_b + drain
        if t > best:
            best = t
        fill += f
        drain += back[s]
    return best


def _on_paths(r: float, ut: UnitTimes) -> float:
    """Of a stage's recompute seconds `r`, what the paths back count: the first RECOMPUTE of
    a backward pass needs only its forward, so it may run while the stage waits for the
    gradient (one block's recomputation less)."""
    return max(0.0, r - (ut.rc_full if r else 0.0))


@lru_cache(maxsize=4096)
def _first_forwards(pp: int, m: int, pipeline: str) -> tuple[int, ...]:
    """Each stage's forwards before its first backward (or input-gradient) pass, once per
    shape: its warm-up w (`zerobubble.warmup`) and the first steady forward, w + 1, where
    w < m; all m where the warm-up holds every forward (w = m: a stage at least as many
    stages from the last as there are microbatches; `onef1b.pass_order`,
    `zerobubble.order_of`)."""
    return tuple(min(warmup(pp, m, s, pipeline) + 1, m) for s in range(pp))


def _split_times(split: tuple[int, ...], ut: UnitTimes) -> tuple[list[float], list[float]]:
    """(B_IN, B_W) seconds of one microbatch on each stage (`stage_times`' backward, split)."""
    return (
        _per_stage(split, ut.bi_block, ut.bi_emb, ut.bi_head),
        _per_stage(split, ut.bw_block, ut.bw_emb, ut.bw_head),
    )
