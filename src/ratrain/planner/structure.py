"""One structure's knob combinations, fitted and simulated: the memory pass (what the quick
memory bounds rule out, recorded as misses), the knob queue (each combination's step-time
bound), and the recompute policies tried on each (`try_policy`: the ledger first, then the
simulator), per stage or uniform. The search's running state (`State`) is here too: what
was counted, the misses, and where it stopped. Pure Python.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from dataclasses import dataclass, field
from typing import NamedTuple

from ratrain import deadline
from ratrain.config import PIPELINES
from ratrain.deadline import Budget, OutOfTime
from ratrain.planner.cache import Memo
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.families import Family
from ratrain.planner.fit import (
    Options,
    StageFit,
    beaten_by,
    first_overflow_bytes,
    least_bounds,
    memory_bound,
    options,
    time_bound_s,
)
from ratrain.planner.memory_bound import gradients_bound_of, persistent_bound_of
from ratrain.planner.result import (
    Candidate,
    Near,
    Top,
    Untimed,
    candidate_of,
    closer,
    may_be_closer,
)
from ratrain.planner.saving import dominant_of
from ratrain.planner.space import Knobs, Request, Structure, make_plan
from ratrain.planner.time_bound import (
    Overheads,
    UnitTimes,
    grad_sync_s,
    offload_loads,
    overheads,
    p2p_sends_s,
    recompute_time_s,
    step_time_lower_bound_s,
    unit_times,
)
from ratrain.schedule.views import transient_views_of
from ratrain.sizes.states import grad_bytes_per_param, view_bytes_per_param

__all__ = [
    "Miss",
    "Outcome",
    "Queued",
    "State",
    "Tried",
    "bound_knobs",
    "forced_bound_s",
    "losses_of",
    "memory_pass",
    "ruled_out",
    "run_queue",
    "states_lower_bound_bytes",
    "floor_overheads",
    "send_floor_s",
    "sync_floor_s",
    "unit_times_of",
    "zb_pipelines",
]

NEAR_TRIES = 64
"""The bounded misses `State.nearest` ranks by their full bound, at most."""


@dataclass(frozen=True)
class Miss:
    """A candidate ruled out by a quick bound, ranked at the end only if nothing fits."""

    over_bytes: int
    """A lower bound on its overflow."""
    index: int
    """Its order among the misses (ties)."""
    states_only: bool
    """The model states alone overflow a stage (its plan is built on demand); else a stage
    overflows under every recompute policy."""
    st: Structure
    kn: Knobs
    fam: Family


@dataclass
class State:
    """What a search has counted and found so far, its budget, and where it stopped."""

    budget: Budget = field(default_factory=Budget)
    evaluated: int = 0
    pruned: int = 0
    near: Near | None = None
    misses: list[Miss] = field(default_factory=list)
    floor: float | None = None
    """Set when the search is cut (at the budget's soft limit, or with its best plan within
    the budget's gap of every bound left): the smallest step-time bound left."""
    heap_floor: float | None = None
    """While a structure's knob queue runs in the search: the least step-time bound of the
    structures left beside it (inf: none; None: not known, as in the walk of a plan
    looked for apart), for the cut at the budget's gap (`Budget.close_enough`)."""
    stopped: bool = False
    """Set when the search stops at the budget's hard limit with no plan ranked."""
    untimed: Untimed | None = None
    """A plan the ledger found to fit whose simulation the hard limit interrupted."""
    v_untried: int = 0
    """V-shaped plans the V pass left untried at the time budget (`ratrain.planner.vpass`)."""
    dived: bool = False
    """Whether the search has looked for a first fitting plan apart (`search._dive`)."""
    missed: int = 0
    """Structures whose knob queue the search ran, with no plan ranked, that ranked none
    (the ledger or the simulation found every combination over the cap). Once one has,
    the look apart is due sooner (`deadline.Budget.look_apart_due`). A structure its
    bounds drop does not count: on deep jobs (llama3-405b on 1000 clusters) the bounds
    drop many before the first that fits, and a look begun then took the time of the
    search's own first plan."""
    fallback: Candidate | None = None
    """The plan that look found, kept apart until the search ends (then ranked beside the
    search's own plans): the answer if the search does not better it."""
    first_fit_s: float | None = None
    """When the search first ranked a plan (seconds on its budget's clock)."""
    work_start_s: float = 0.0
    """When the search began working its heap of structures (seconds on its budget's
    clock)."""
    ran_refined: bool = False
    """Whether the search has run a refined structure out of the heap's order
    (`search._refined_first`)."""

    def cut_at(self, lb: float) -> None:
        """Cut at a step-time bound `lb`: the floor is the smallest such."""
        self.floor = lb if self.floor is None else min(self.floor, lb)

    def nearest(self, req: Request) -> Near | None:
        """The closest miss: `near`, or one of `misses` ranked by its full bound, tried in
        the order of their lower bounds while one may win, at most `NEAR_TRIES` of them
        (the miss only guides the explanation, which measures it with the ledger)."""
        limit = usable_bytes(req)
        near = self.near
        misses = sorted(self.misses, key=lambda m: (m.over_bytes, m.index))
        for m in misses[:NEAR_TRIES]:
            if not may_be_closer(near, m.over_bytes):
                break
            st, kn = m.st, m.kn
            if m.states_only:
                plan = make_plan(req, st, kn, ("full",) * st.pp)
                floor = tuple(memory_bound(req, plan).stage(s, "full") for s in range(plan.pp))
                miss = Near(plan, m.fam.name, floor, limit, measured=False)
            else:
                bound_bytes, most_saving = least_bounds(req, st, kn)
                plan = make_plan(req, st, kn, most_saving)
                miss = Near(plan, m.fam.name, bound_bytes, limit, measured=False)
            near = closer(near, miss)
        return near


def losses_of(kns: list[Knobs]) -> tuple[int | None, ...]:
    """The losses its knobs try (`space.loss_chunks`; the plain one first: a cache key)."""
    return tuple(sorted({kn.loss_chunk_tokens for kn in kns}, key=lambda c: c or 0))


def unit_times_of(req: Request, st: Structure, loss: int | None) -> UnitTimes:
    """`unit_times` of a structure under one loss (`Knobs.loss_chunk_tokens`)."""
    return unit_times(req.spec, req.platform, st.micro_batch, req.seq, req.compute_dtype, loss)


def zb_pipelines(kns: list[Knobs]) -> tuple[str, ...]:
    """The pass orders its knobs try besides 1F1B (sorted: a cache key)."""
    return tuple(sorted({kn.pipeline for kn in kns} - {"1f1b"}))


def memory_pass(
    req: Request, st: Structure, fam: Family, kns: list[Knobs], state: State
) -> list[Knobs]:
    """The knob combinations of a structure that the quick memory bounds do not rule out
    (no kernel model needed): the model states fit, and every stage fits under some
    policy. The others are recorded as misses. With a combination that saves no less
    memory than every other: none if the bounds rule it out, else all of them.

    Each pass order's combinations are bounded apart (a zero-bubble `MemoryBound` counts
    what each deferred B_W needs, and the gradients only from the first B_W pass, over its
    own warm-up: a 1F1B lead's bound says nothing of theirs), each group by its own lead.
    The zero-bubble misses are recorded only where no 1F1B combination is searched (its
    twins' are)."""
    limit = usable_bytes(req)
    losses = losses_of(kns)
    if len(losses) > 1:  # the losses hold different activations: bounded apart
        return [
            kn
            for loss in losses
            for kn in memory_pass(
                req, st, fam, [kn for kn in kns if kn.loss_chunk_tokens == loss], state
            )
        ]
    pipes = sorted({kn.pipeline for kn in kns}, key=PIPELINES.index)  # 1f1b first
    if len(pipes) > 1:
        out = []
        for pipe in pipes:
            group = [kn for kn in kns if kn.pipeline == pipe]
            if pipe == "1f1b":
                out += memory_pass(req, st, fam, group, state)
                continue
            scratch = State()  # the zero-bubble misses: not recorded
            out += memory_pass(req, st, fam, group, scratch if "1f1b" in pipes else state)
            state.evaluated += scratch.evaluated
        return out
    lead = dominant_of(tuple(kns))
    if lead is not None:
        state.evaluated += len(kns)
        if ruled_out(req, st, fam, lead, limit, state):
            # Every bound below is no smaller for the others: ruled out too (one miss
            # recorded, the nearest of them).
            return []
        # Some combination may fit: the others are tested when the structure is worked on
        # (`bound_knobs` rules out those no policy fits), not before its kernel times are
        # known, for a structure that may never be reached.
        return list(kns)
    out = []
    for kn in kns:
        state.evaluated += 1
        if states_overflow(req, st, fam, kn, limit, state):
            # The model states alone overflow a stage. Such a miss is ranked by the fuller
            # bound, which is no smaller: computed at the end, and only if nothing fits.
            continue
        over = first_overflow_bytes(req, st, kn)
        if over is not None:  # a stage overflows under every policy: ranked at the end
            state.misses.append(Miss(over, len(state.misses), False, st, kn, fam))
            continue
        out.append(kn)  # the full per-stage options are worked out if it gets that far
    return out


_FLOORS: Memo[tuple] = Memo(4096)
"""`grad_sync_s` by split, DP width and sync knobs, and `p2p_sends_s` by structure and send
knobs, each with the platform it was costed on (a platform is not hashable: held and
compared by identity, `Memo.get_or_owned`)."""


def sync_floor_s(req: Request, st: Structure, kns: list[Knobs]) -> tuple[float, ...]:
    """Per stage, the least gradient sync of all its units over the knob combinations (the
    `Overheads.sync_s` of every one of them is no smaller), or () where none syncs. A sync
    reads the combination's DP group and gradient bytes only: one cost per distinct
    (sharding, gradient dtype, rank layout), memoised per split and DP width."""
    if st.dp == 1:
        return ()
    out: tuple[float, ...] | None = None
    seen = set()
    for kn in kns:
        key = (kn.shard_optimizer, kn.grad_dtype, kn.compute_dtype, kn.rank_layout)
        if key in seen:
            continue
        seen.add(key)
        memo_key = ("sync", req.spec, id(req.platform), st.layer_split, st.dp, key)
        syncs = _FLOORS.get_or_owned(memo_key, req.platform, _costed, grad_sync_s, req, st, kn)
        out = syncs if out is None else tuple(map(min, out, syncs))
    return out if out and any(out) else ()


def send_floor_s(
    req: Request, st: Structure, kns: list[Knobs]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per boundary, the least time of one microbatch's activation sent forward and of its
    gradient sent back over the knob combinations (`Overheads.send_f_s`, `send_b_s`: every
    combination's are no smaller), or ((), ()) with one stage. A send reads the boundary's
    bytes (the compute dtype's) and the link between the two stages (the rank layout's):
    one cost per distinct pair, memoised per structure. The paths of the step-time bound
    (microbatch 0's round trip, the last microbatch's drain) cross every boundary: on a
    long sequence over many stages they are a good part of a step that has few
    microbatches."""
    if st.pp == 1:
        return (), ()
    fwd: tuple[float, ...] | None = None
    back: tuple[float, ...] = ()
    seen = set()
    for kn in kns:
        key = (kn.compute_dtype, kn.rank_layout)
        if key in seen:
            continue
        seen.add(key)
        memo_key = ("send", req.spec, id(req.platform), req.seq, st, key)
        f, b = _FLOORS.get_or_owned(memo_key, req.platform, _costed, p2p_sends_s, req, st, kn)
        fwd, back = (f, b) if fwd is None else (tuple(map(min, fwd, f)), tuple(map(min, back, b)))
    return (fwd or (), back)


def _costed(cost, req: Request, st: Structure, kn: Knobs):
    """`cost(spec, plan, platform)` of the structure's plan under `kn`, no recompute."""
    return cost(req.spec, make_plan(req, st, kn, ("none",) * st.pp), req.platform)


def floor_overheads(req: Request, st: Structure, kns: list[Knobs]) -> Overheads | None:
    """The overheads every knob combination of a structure pays at least: its least
    gradient syncs (`sync_floor_s`) and sends (`send_floor_s`); None where there are none."""
    syncs = sync_floor_s(req, st, kns)
    fwd, back = send_floor_s(req, st, kns)
    if not syncs and not any(fwd) and not any(back):
        return None
    none = Overheads.none(st.pp)
    return dataclasses.replace(
        none, sync_s=syncs, send_f_s=fwd or none.send_f_s, send_b_s=back or none.send_b_s
    )


FORCED_WALKS: int | None = 2
"""measured: how many offloading stages a group's walk in `forced_bound_s` takes, those
whose walks may end latest first (`step_time_lower_bound_s`'s `max_walks`; a knob queue's
bounds walk every one that may raise them). `benchmarks/forced_bound_sweep.py` (595
structures of six wide-grid jobs, the 2-core machine): on llama3-405b over 1000 h100-80g
clusters at 4096 x 4096, 19.5 ms a structure against 65.1 ms for every walk (none: 16.9
ms), the bound at its 10th percentile 0.994 of its knob queue's least (every walk 0.999,
none 0.943); on the other jobs every walk costs about what two do, for 0.997-1.000
against 0.966-1.000."""


def forced_bound_s(
    req: Request, st: Structure, fam: Family, kns: list[Knobs], prune: bool = True
) -> float:
    """A step-time bound below every knob combination of a structure, with the
    recomputation the memory bound forces: the smallest over its groups by loss, pass
    order and offload of the bound under the group's most memory-saving combination
    (`dominant_of`). That combination's bound is no larger than any other's of the group
    on every stage and policy, so the policies it leaves each stage are a superset of
    theirs, and its cheapest recomputation no dearer (`bound_knobs` bounds each
    combination under its own, with its overheads: no smaller). A group with no such
    combination is bounded with no recomputation. The overheads counted are those every
    combination of a group pays: its least gradient sync, and where it offloads, the
    offload traffic (`offload_loads`; apart from the groups that do not offload, whose
    lead would otherwise lend them its memory without its traffic). Cheap next to
    `bound_knobs`: one `options` per group, not one per combination.

    The groups are taken by their bound with no recomputation and no offload traffic
    (no larger than theirs with them: both only add time to a stage's compute and paths,
    or to a resource the step waits for), smallest first, and a group whose
    one is no smaller than the least found so far is not worked out: the least is the
    same, for a fraction of the memory bounds on a deep pipeline (12 groups of a
    ratrain structure, each with a memory bound per stage and policy). `prune=False`
    works out every group (the same bound: `tests/planner/test_forced_bound.py`)."""
    m = st.microbatches(req.global_batch)
    groups: dict[tuple, list[Knobs]] = {}
    for kn in kns:
        groups.setdefault((kn.loss_chunk_tokens, kn.pipeline, kn.offload_activations), []).append(
            kn
        )
    none = floor_overheads(req, st, kns) or Overheads.none(st.pp)
    leads = {key: dominant_of(tuple(group)) for key, group in groups.items()}
    unforced = {
        key: step_time_lower_bound_s(
            st.layer_split,
            m,
            unit_times_of(req, st, key[0]),
            over=None if leads[key] is None else none,
            pipeline=key[1],
        )
        for key in groups
    }
    found: list[tuple] = []  # heap of (bound, order, the walk to raise it or None)

    def least() -> float:
        # The least bound, its group's stages walked where it offloads: a walk only raises
        # a group's bound, so only the least one's is worked out, until the least is
        # walked (the same least as walking every offloading group, for one or two walks
        # where every group's would take one per group).
        while found and found[0][2] is not None:
            lb, k, walk = heapq.heappop(found)
            walked = time_bound_s(*walk, walked=True, max_walks=FORCED_WALKS)
            heapq.heappush(found, (max(lb, walked), k, None))
        return found[0][0] if found else float("inf")

    for key in sorted(groups, key=lambda k: unforced[k]):
        if prune and unforced[key] >= least():
            break  # this group's bound is no smaller, nor are those of the groups after it
        loss, pipe, offload = key
        ut = unit_times_of(req, st, loss)
        lead = leads[key]
        walk = None
        if lead is None:
            lb = unforced[key]
        else:
            opts = options(req, st, lead, ut)
            if not opts.feasible(fam.per_stage_recompute):
                continue  # no combination of the group fits: `bound_knobs` drops them all
            over = none
            if offload:
                plan = make_plan(req, st, lead, ("none",) * st.pp)
                over = dataclasses.replace(none, loads=offload_loads(req.spec, plan, req.platform))
            # First without the stages' whole walks (`_stage_walk_s`): a structure's first
            # refinement, thousands per search; `least` walks the least one's.
            lb = time_bound_s(fam, st, m, ut, opts, over, pipe, walked=False)
            if offload:
                walk = (fam, st, m, ut, opts, over, pipe)
        heapq.heappush(found, (lb, len(found), walk))
    return least()


def states_overflow(
    req: Request, st: Structure, fam: Family, kn: Knobs, limit: int, state: State
) -> bool:
    """Whether the model states alone overflow a stage under knobs `kn` (a miss is
    recorded; its plan is built only if the explanation ranks it): the states with the
    largest unit's view or gradient, and with two or more microbatches every gradient
    (`gradients_lower_bound_bytes`), which rules out deep pipelines' structures without
    a `MemoryBound`."""
    persistent = max(states_lower_bound_bytes(req, st, kn))
    if persistent <= limit and st.microbatches(req.global_batch) >= 2:
        persistent = max(gradients_lower_bound_bytes(req, st, fam, kn))
    if persistent > limit:
        state.misses.append(Miss(persistent - limit, len(state.misses), True, st, kn, fam))
        return True
    return False


def states_lower_bound_bytes(req: Request, st: Structure, kn: Knobs) -> tuple[int, ...]:
    """`persistent_lower_bound_bytes` of the plan `make_plan(req, st, kn, ...)` would
    build (whatever its recompute), without building it."""
    n_shards = st.dp if kn.shard_optimizer else 1
    most = max(view_bytes_per_param(kn), grad_bytes_per_param(kn))
    return persistent_bound_of(req.spec, st.layer_split, n_shards, most)


def gradients_lower_bound_bytes(
    req: Request, st: Structure, fam: Family, kn: Knobs
) -> tuple[int, ...]:
    """`gradients_bound_of` of the plan `make_plan(req, st, kn, ...)` would build: the
    states, every full gradient and the persistent views, held at once by a step of two
    or more microbatches."""
    n_shards = st.dp if kn.shard_optimizer else 1
    views = 0 if transient_views_of(fam.schedule, kn.view_policy) else view_bytes_per_param(kn)
    return gradients_bound_of(req.spec, st.layer_split, n_shards, grad_bytes_per_param(kn), views)


def ruled_out(
    req: Request, st: Structure, fam: Family, kn: Knobs, limit: int, state: State
) -> bool:
    """`memory_pass`'s test for one knob combination (a miss is recorded)."""
    if states_overflow(req, st, fam, kn, limit, state):
        return True
    over = first_overflow_bytes(req, st, kn)
    if over is not None:
        state.misses.append(Miss(over, len(state.misses), False, st, kn, fam))
        return True
    return False


class Queued(NamedTuple):
    """A knob combination of a structure the memory bound lets fit, in its queue."""

    lb: float
    """Its step-time bound: no policy of it is faster."""
    index: int
    kn: Knobs
    opts: Options
    over: Overheads


def bound_knobs(
    req: Request,
    st: Structure,
    fam: Family,
    kns: list[Knobs],
    state: State,
    budget: Budget | None = None,
) -> list[Queued]:
    """Each knob combination of a structure that the memory bound lets fit (`memory_pass`
    kept), with its step-time bound (recomputation the bound forces, and the overheads),
    fastest first. `budget`: raises `OutOfTime` past its soft limit (a combination's memory
    bounds take 10-20 ms on a deep pipeline: 144 of them, 2.4 s, for llama2-70b at pp=48
    on mt3000)."""
    m = st.microbatches(req.global_batch)
    queue: list[Queued] = []
    limit = usable_bytes(req)
    for kn in kns:
        if budget is not None:
            budget.check()
        ut = unit_times_of(req, st, kn.loss_chunk_tokens)
        opts = options(req, st, kn, ut)
        if not opts.feasible(fam.per_stage_recompute):  # no one policy fits every stage
            if kn.pipeline != "1f1b" and req.pins.get("pipeline") != kn.pipeline:
                continue  # its 1F1B twin's miss is recorded (`memory_pass`)
            plan = make_plan(req, st, kn, opts.most_saving)
            near = Near(plan, fam.name, opts.bound_bytes, limit, measured=False)
            state.near = closer(state.near, near)
            continue
        over = overheads(req.spec, make_plan(req, st, kn, ("none",) * st.pp), req.platform)
        lb = time_bound_s(fam, st, m, ut, opts, over, kn.pipeline)
        queue.append(Queued(lb, len(queue), kn, opts, over))
    queue.sort(key=lambda q: (q.lb, q.index))
    return queue


def run_queue(
    ev: Evaluator,
    req: Request,
    st: Structure,
    fam: Family,
    queue: list[Queued],
    best: Top,
    state: State,
    prune: bool,
) -> None:
    """Fit and simulate the knob combinations of one structure that can still place.

    Fastest bound first, each bound scaled by how far over it the simulated steps of its
    group (`_bound_group`: split backward or not, offload or not) came so far in this
    structure: where a group's bounds are loose (the split backward's with offload, whose
    copy engine the bound takes as free at each pass), its other combinations wait behind
    those of tighter groups whose bounds are under their expected steps (llama2-70b on 24
    a100-80g clusters, pp=12: zb-h2's bound 36.8 s, its step 43.9 s; 1F1B's 39.3 s and
    39.6 s). Only the order changes: where the search is cut, its floor is the least bound
    left."""
    m = st.microbatches(req.global_batch)
    pending = list(queue)  # sorted by bound
    scale: dict[tuple, float] = {}
    while pending:
        at = min(
            range(len(pending)),
            key=lambda j: (pending[j].lb * scale.get(_bound_group(pending[j].kn), 1.0), j),
        )
        q = pending.pop(at)
        left = min(q.lb, pending[0].lb) if pending else q.lb  # the least bound left
        if prune and best.beaten(q.lb):
            continue
        floor = None if state.heap_floor is None else min(left, state.heap_floor)
        if best.cut_by(state.budget, floor_s=floor):
            state.floor = left
            return
        if state.budget.over_hard() and not best.items:
            state.stopped = True
            return
        ut = unit_times_of(req, st, q.kn.loss_chunk_tokens)
        ctx = _Ctx(ev, req, st, fam, q.kn, ut, q.over, m, best, state, prune, q.lb)
        if "recompute" in req.pins:
            ctx.try_policy(_pinned(req.pins["recompute"], st.pp))
        elif fam.per_stage_recompute:
            _per_stage(ctx, q.opts)
        else:
            _uniform(ctx, q.opts)
        if state.floor is not None or state.stopped:  # stopped inside: its floor stands
            if state.floor is not None:
                state.cut_at(left)
            return
        if ctx.last_step_s is not None and q.lb > 0:
            g = _bound_group(q.kn)
            scale[g] = max(scale.get(g, 1.0), ctx.last_step_s / q.lb)


def _bound_group(kn: Knobs) -> tuple[bool, bool]:
    """Knob combinations whose step-time bounds are alike in how tight they come: by split
    backward and offload."""
    return (kn.pipeline != "1f1b", kn.offload_activations)


def _pinned(rec, pp: int) -> tuple[str, ...] | None:
    rec = (rec,) * pp if isinstance(rec, str) else tuple(rec)
    return rec if len(rec) == pp else None


class Tried(enum.Enum):
    """What trying one recompute policy came to (`Outcome`)."""

    PRUNED = "pruned"
    """Its bound cannot place (or no policy was given)."""
    FITS = "fits"
    """It fits and was ranked."""
    STOP = "stop"
    """Out of time: the search stops here."""
    OVER = "over"
    """The full replay finds stages over the cap (`Outcome.over`)."""


@dataclass(frozen=True)
class Outcome:
    kind: Tried
    over: tuple[int, ...] = ()
    """With `Tried.OVER`: the stages over the cap."""


PRUNED, FITS, STOP = Outcome(Tried.PRUNED), Outcome(Tried.FITS), Outcome(Tried.STOP)


@dataclass
class _Ctx:
    """One (structure, knobs) being fitted and simulated."""

    ev: Evaluator
    req: Request
    st: Structure
    fam: Family
    kn: Knobs
    ut: UnitTimes
    over: Overheads
    m: int
    best: Top
    state: State
    prune: bool
    lb: float
    """The knob combination's step-time bound: no policy of it is faster."""
    last_step_s: float | None = None
    """The step of the last policy `try_policy` ranked."""

    def replay(self, rec: tuple[str, ...], lowest: tuple[str, ...]):
        """The ledger's replay of `rec` (a `MemoryReport`; an overflow is recorded as a near
        miss), or None where the search stops first: out of time, or no plan left is
        faster than the best ranked (`lowest`: per stage the cheapest policy left)."""
        state, budget = self.state, self.state.budget
        if self.best.cut_by(budget):
            state.cut_at(self.lb)
            return None
        if budget.over_hard() and not self.best.items:
            state.stopped = True
            return None
        lb = step_time_lower_bound_s(
            self.st.layer_split, self.m, self.ut, lowest, self.over, pipeline=self.kn.pipeline
        )
        if self.prune and self.best.beaten(lb):
            return None
        plan = make_plan(self.req, self.st, self.kn, rec)
        rep = self.ev.memory(plan)
        if any(p > rep.limit_bytes for p in rep.peak_bytes):
            near = Near(plan, self.fam.name, rep.peak_bytes, rep.limit_bytes, rep.breakdown)
            state.near = closer(state.near, near)
        return rep

    def try_policy(self, rec: tuple[str, ...] | None) -> Outcome:
        """Simulate `rec` unless its bound cannot place (`Tried`)."""
        if rec is None:
            return PRUNED
        state, budget = self.state, self.state.budget
        # With a plan ranked, a simulation is not interrupted: stop before one that would
        # overrun the budget (expected to cost what the last one did, per microbatch
        # simulated).
        plan = make_plan(self.req, self.st, self.kn, rec)
        if self.best.cut_by(budget, self.ev.expected_simulate_s(plan)):
            state.cut_at(self.lb)
            return STOP
        if budget.over_hard() and not self.best.items:
            state.stopped = True
            return STOP
        lb = step_time_lower_bound_s(
            self.st.layer_split, self.m, self.ut, rec, self.over, pipeline=self.kn.pipeline
        )
        if self.prune and self.best.beaten(lb):
            return PRUNED
        rep = self.ev.memory(plan)  # the ledger first: a simulation costs several replays
        over = [s for s, p in enumerate(rep.peak_bytes) if p > rep.limit_bytes]
        if not over:
            # With a plan ranked, a simulation whose later steady-state tries or full
            # fallback would end past the soft limit is not run: cut there, as above.
            # Without one, it runs until the hard limit at most (checked between its
            # phases, `ratrain.deadline`): past it, the plan that fits is reported untimed.
            ranked = bool(self.best.items)
            try:
                with deadline.until(None if ranked else budget):
                    res = self.ev.simulate(plan, budget if ranked else None)
            except OutOfTime:
                state.stopped = True
                if state.untimed is None:
                    state.untimed = Untimed(
                        plan, self.fam.name, lb, tuple(rep.peak_bytes), rep.limit_bytes
                    )
                return STOP
            if res is None:
                state.cut_at(self.lb)
                return STOP
            peaks, parts = tuple(res.peak_memory_bytes), tuple(res.memory_breakdown)
            over = [s for s, p in enumerate(peaks) if p > rep.limit_bytes]
        else:
            peaks, parts = rep.peak_bytes, rep.breakdown
        if over:
            near = Near(plan, self.fam.name, peaks, rep.limit_bytes, parts)
            state.near = closer(state.near, near)
            return Outcome(Tried.OVER, tuple(over))
        self.best.add(candidate_of(res, plan, self.fam.name, rep.limit_bytes))
        self.last_step_s = res.step_time_s
        if state.first_fit_s is None:
            state.first_fit_s = budget.elapsed_s()
        return FITS


def _per_stage(ctx: _Ctx, opts: Options) -> None:
    """The cheapest policy per stage that the ledger fits (`StageFit`, one replay serving
    every stage), then that plan simulated; a stage its simulation finds over the cap is
    moved on, as a replay's would be."""
    fits = [StageFit(o, n) for o, n in zip(opts.per_stage, ctx.st.layer_split, strict=True)]
    while True:
        lowest = tuple(f.lowest() for f in fits)
        if None in lowest:
            return  # a stage fits under none of its policies
        answers = tuple(f.answer() for f in fits)
        if None not in answers:
            got = _try_fitted(ctx, opts, answers)
            if got.kind is not Tried.OVER:
                return
            for s in got.over:
                fits[s].learn(answers[s], False)
            continue
        probe = tuple(f.probe() for f in fits)
        rep = ctx.replay(probe, lowest)
        if rep is None:
            return
        for s, (f, p) in enumerate(zip(fits, probe, strict=True)):
            f.learn(p, rep.peak_bytes[s] <= rep.limit_bytes)


def _try_fitted(ctx: _Ctx, opts: Options, rec: tuple[str, ...]) -> Outcome:
    """`try_policy(rec)` of the cheapest policies the ledger fits; where stages offload,
    also their relieved policies (`_relieved`), the one of smaller step-time bound first,
    the other only while its bound is under the first's step. The cheapest recompute is
    not the fastest where a stage's copy engine is its bottleneck: recomputing more
    offloads less (llama2-70b on 24 h100-80g clusters at 64 x 4096, pp=11 zb-h2 with
    offload: 23.6 s per step under the cheapest policies that fit, whose stages 6-9
    spent 21.1 s of it offloading and reloading; 17.7 s with the relieved ones). The
    outcome is `rec`'s (a relieved plan over the cap after all is a near miss)."""
    relieved = _relieved(ctx, opts, rec) if ctx.over.loads else rec
    if relieved == rec:
        return ctx.try_policy(rec)
    st, pipe = ctx.st, ctx.kn.pipeline

    def bound(r: tuple[str, ...]) -> float:
        return step_time_lower_bound_s(st.layer_split, ctx.m, ctx.ut, r, ctx.over, pipeline=pipe)

    b_relieved, b_rec = bound(relieved), bound(rec)
    if b_relieved < b_rec:
        first, then, then_bound = relieved, rec, b_rec
    else:
        first, then, then_bound = rec, relieved, b_relieved
    ctx.last_step_s = None
    got = ctx.try_policy(first)
    if got.kind is Tried.STOP:
        return got
    if got.kind is Tried.FITS and then_bound >= ctx.last_step_s:
        return got
    second = ctx.try_policy(then)
    return got if first is rec else second


def _relieved(ctx: _Ctx, opts: Options, rec: tuple[str, ...]) -> tuple[str, ...]:
    """`rec` with each offloading stage at the policy whose terms of the bound
    (`step_time_lower_bound_s`'s `stage_terms`: its compute chain and its copy work under
    that policy, the other stages as they stand) are least, of those the memory bound
    leaves it that recompute no less than `rec`'s (they fit where `rec` does, but for the
    ledger's word); ties keep the least recompute."""
    st, ut, over, pipe = ctx.st, ctx.ut, ctx.over, ctx.kn.pipeline
    split, m = st.layer_split, ctx.m
    out = list(rec)
    for s, load in enumerate(over.loads):
        if not load.offloaded_mbs:
            continue
        floor_s = recompute_time_s(rec[s], split[s], ut)
        best_p, best_t = rec[s], None
        for p in opts.per_stage[s]:
            if recompute_time_s(p, split[s], ut) < floor_s:
                continue
            terms: list[float] = []
            out[s] = p
            step_time_lower_bound_s(
                split, m, ut, tuple(out), over, pipeline=pipe, stage_terms=terms
            )
            if best_t is None or terms[s] < best_t:
                best_p, best_t = p, terms[s]
        out[s] = best_p
    return tuple(out)


def _uniform(ctx: _Ctx, opts: Options) -> None:
    """Each uniform policy the bound allows, unless one found to fit is no slower anywhere."""

    def times(o: str) -> tuple[float, ...]:
        return tuple(recompute_time_s(o, n, ctx.ut) for n in ctx.st.layer_split)

    found: list[str] = []
    for o in opts.uniform:
        if beaten_by(times, o, found):
            continue
        got = ctx.try_policy((o,) * ctx.st.pp)
        if got.kind is Tried.STOP:
            return
        if got.kind is Tried.FITS:
            found.append(o)
