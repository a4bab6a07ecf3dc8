"""Branch and bound over the search space: feasible by the ledger, ranked by the simulator.

1. Enumerate the structures (pp, dp, micro-batch, split) of every family asked for, each
   with a lower bound on its step time (`ratrain.planner.time_bound`), in a heap: the tokens per
   step are fixed by the request, so a shorter step is more tokens/s.
2. Pop the structure with the smallest bound. Once `top` plans are known, a bound no
   shorter than the `top`-th best step cannot place, and neither can any after it: stop.
   A bound is refined before its structure is worked on, and pushed back: from kernel times
   at peak (where the kernel model is costly) to the kernel model's times after the memory
   pass, then per knob combination with the recomputation
   the memory bound forces and the communication and update overheads. Until a plan is
   ranked, the first refinement counts the recomputation and offload traffic the memory
   bound forces (`forced_bound_s`), and a structure popped past it goes down to its knob
   queue and is run at once (`_deepen`); refined for a while with no plan, the search runs
   the refined structure of smallest bound out of order (`_refined_first`).
3. For each knob combination that can still place: the cheapest recompute policy per stage
   the memory bound allows (`ratrain.planner.fit`) is replayed by the ledger; a stage over
   the cap moves to its next policy; what fits is simulated.

4. The V-shaped pass orders (zb-v, 1f1b-v: two chunks per stage) are not bounded: after
   the search they are tried on the structures and knobs of the best plans, each with a
   few chunk splits (`ratrain.planner.vpass`), and ranked with the rest where they fit.

The simulator's step time is the ranking; its memory (the full ledger) is what is reported.
The search keeps to a `ratrain.deadline.Budget`: a soft limit once a plan is ranked (cut,
with the floor left), a hard one while none is.

This module is the order of the search (the heap of structures, refinement levels); one
structure's fitting is `ratrain.planner.structure`, the V pass `ratrain.planner.vpass`,
the result types `ratrain.planner.result`. Pure Python.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import NamedTuple

from ratrain import deadline
from ratrain.config import V_PIPELINES
from ratrain.deadline import REFINED_FIRST_AT, Budget, OutOfTime
from ratrain.gcpause import gc_paused
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.families import Family
from ratrain.planner.feasible import Fit, find_feasible, relax
from ratrain.planner.result import Candidate, Near, SearchResult, Top, Untimed, candidate_of
from ratrain.planner.saving import dominant
from ratrain.planner.space import (
    Knobs,
    Request,
    Structure,
    family_of,
    knob_combos,
    knobs_key,
    structures,
)
from ratrain.planner.structure import (
    Queued,
    State,
    bound_knobs,
    floor_overheads,
    forced_bound_s,
    losses_of,
    memory_pass,
    run_queue,
    states_lower_bound_bytes,
    states_overflow,
    unit_times_of,
    zb_pipelines,
)
from ratrain.planner.time_bound import (
    Overheads,
    UnitTimes,
    first_unit_times,
    lowest_unit_times,
    plain_bounds_s,
    step_time_lower_bound_s,
    unit_times_cheap,
)
from ratrain.planner.vpass import V_TRIES, v_pass

__all__ = [
    "Candidate",
    "Near",
    "SearchResult",
    "Untimed",
    "V_TRIES",
    "search",
    "states_lower_bound_bytes",
]


_PEAK, _KERNELS, _KNOBS = 0, 1, 2
"""How far a structure's step-time bound has been refined: its first bound, before the
memory pass (kernel times at the dtype's peak, or the kernel model's where they are cheap:
`first_unit_times`), the kernel model's times after it, then per knob combination with the
recomputation the memory bound forces and the communication and update overheads."""


class _Entry(NamedTuple):
    """A structure in the heap, ordered as a tuple: by its step-time bound, then its
    family's order and its place in the enumeration (unique: no two entries tie)."""

    lb: float
    order: int
    seq: int
    level: int
    """`_PEAK`, `_KERNELS` or `_KNOBS`."""
    st: Structure
    fam: Family
    kns: list[Knobs]
    queue: list[Queued] | None = None
    """At `_KNOBS`: its knob combinations' queue (`bound_knobs`)."""
    passed: bool = False
    """At `_PEAK`: its knobs have been through `memory_pass` already."""


class _Pending(NamedTuple):
    """A structure before the heap: its model-state bound (the memory proof's order)."""

    states: int
    index: int
    order: int
    st: Structure
    fam: Family
    kns: list[Knobs]


def _tasks(req: Request, families: tuple[str, ...], state: State) -> tuple[list[_Entry], int]:
    """A heap of structures by their step-time bound, and the knob combinations of the
    whole space. Where the kernel model is costly (a tile model), a micro-batch size whose
    kernel times are not known yet is bounded at the dtype's peak first; the exact kernel
    times are computed when such a structure reaches the top of the heap
    (`first_unit_times`).

    A structure whose most memory-saving knob combination holds more model states than a
    stage can (`persistent_lower_bound_bytes`, memoised per split and shard count: cheap)
    is left out here, before its step-time bound is computed: no combination of it fits.
    The fuller per-stage bound (`first_overflow_bytes`, a closed form per stage and
    policy) is left to `memory_pass`, when the structure reaches the top of the heap:
    computed here for every structure it would cost a second on large spaces whose
    searches end long before most structures are reached. Except until the first
    structure that may fit (`_memory_proof`): a request none fits is proved infeasible
    before any step-time bound."""
    entries: list[_Pending] = []
    total = 0
    combos: dict[tuple, list[Knobs]] = {}  # by knobs_key: the same combinations
    leads: dict[tuple, Knobs | None] = {}
    limit = usable_bytes(req)
    for order, name in enumerate(families):
        fam = family_of(name)
        if req.pins.get("schedule", fam.schedule) != fam.schedule:
            continue
        for st in structures(req, fam):
            ck = knobs_key(req, st)
            kns = combos.get(ck)
            if kns is None:
                kns = combos[ck] = knob_combos(req, fam, st)
                leads[ck] = dominant(kns)
            if not kns:
                continue
            total += len(kns)
            lead = leads[ck]
            states = 0
            if lead is not None:
                if states_overflow(req, st, fam, lead, limit, state):
                    state.evaluated += len(kns)
                    continue
                states = max(states_lower_bound_bytes(req, st, lead))  # memoised
            entries.append(_Pending(states, len(entries), order, st, fam, kns))
        combos.clear()  # per family
        leads.clear()
    passed = _memory_proof(req, entries, state)
    if passed is None:
        return [], total
    out: list[_Entry] = []
    known: dict[tuple, UnitTimes] = {}
    seen: dict[tuple, float] = {}
    for e in entries:
        st = e.st
        kept = passed.get(e.index)
        if kept is not None and not kept:
            continue  # ruled out by the memory proof
        losses = losses_of(kept or e.kns)
        if (st.micro_batch, losses) not in known:
            known[st.micro_batch, losses] = lowest_unit_times(
                [
                    first_unit_times(
                        req.spec, req.platform, st.micro_batch, req.seq, req.compute_dtype, loss
                    )
                    for loss in losses
                ]
            )
        zb = zb_pipelines(kept or e.kns)
        lb = seen.get((st, zb, losses))
        if lb is None:  # families share structures: bound each once
            m = st.microbatches(req.global_batch)
            lb = seen[st, zb, losses] = _structure_bound_s(st, m, known[st.micro_batch, losses], zb)
        out.append(
            _Entry(lb, e.order, len(out), _PEAK, st, e.fam, kept or e.kns, passed=kept is not None)
        )
    heapq.heapify(out)
    return out, total


def _structure_bound_s(
    st: Structure, m: int, ut: UnitTimes, zb: tuple[str, ...], over: Overheads | None = None
) -> float:
    """A structure's step-time bound with no recompute and no overheads but those its knobs
    pay at least (`floor_overheads`: the least gradient syncs and sends, where given),
    below every pipeline its knobs try: the smallest of 1F1B's and the zero-bubble ones
    they try. Without the syncs a structure whose knob combinations all wait for a wide DP
    group's syncs would be refined, one at a time, before any was run."""
    if over is None:  # no overheads: the pipelines' bounds share their stage times
        return min(plain_bounds_s(st.layer_split, m, ut, ("1f1b", *zb)))
    lb = step_time_lower_bound_s(st.layer_split, m, ut, over=over)
    for pipe in zb:
        lb = min(lb, step_time_lower_bound_s(st.layer_split, m, ut, over=over, pipeline=pipe))
    return lb


def _memory_proof(
    req: Request, entries: list[_Pending], state: State
) -> dict[int, list[Knobs]] | None:
    """`memory_pass` over the structures, the smallest model-state bound first (the
    likeliest to fit), until one keeps a knob combination: the knobs each kept, by entry
    index, or None when none keeps any (the request is then proved infeasible by the
    memory bounds alone, and no step-time bound is computed: on such requests they were
    about a third of the search). The order only decides how soon a structure that may
    fit is met; the misses recorded are those of every structure either way. Past the hard
    limit it stops with the knobs kept so far (the search then stops too)."""
    passed: dict[int, list[Knobs]] = {}
    for e in sorted(entries, key=lambda e: (e.states, e.index)):
        if state.budget.over_hard():  # the rest in the heap: the search stops there
            return passed
        kept = passed[e.index] = memory_pass(req, e.st, e.fam, e.kns, state)
        if kept:
            return passed
    return None


@gc_paused()  # a whole search: see `ratrain.gcpause`
def search(
    req: Request,
    *,
    top: int = 5,
    prune: bool = True,
    progress: Callable[[str], None] | None = None,
    evaluator: Evaluator | None = None,
    budget: Budget | None = None,
    time_budget_s: float | None = None,
    hard_budget_s: float | None = None,
) -> SearchResult:
    """The `top` fastest feasible plans for `req` (all families in `req.families`).

    With a `budget` whose soft limit passes once some plan fits, the search stops where it
    is (`SearchResult.cut`) and reports the smallest step-time bound left
    (`floor_step_s`): the best plan is then within `gap` of the optimum over the space.
    Past its hard limit it stops even if no plan fits yet (`unfinished`). Its clock is the
    budget's (`Budget.start`). `time_budget_s` and `hard_budget_s` build one started now
    (soft and hard limits), instead of `budget`."""
    if budget is None:
        budget = Budget(time_budget_s, hard_budget_s)
    elif time_budget_s is not None or hard_budget_s is not None:
        raise ValueError("search: give a budget or time_budget_s/hard_budget_s, not both")
    t0 = budget.start
    ev = evaluator or Evaluator(req)
    best, state = Top(max(1, top)), State(budget)
    tasks, total = _tasks(req, req.families, state)
    report = _reporter(progress, ev, best, len(tasks), t0)
    state.work_start_s = budget.elapsed_s()
    queue_floor = _work(req, ev, tasks, best, state, prune, report)
    if state.fallback is not None:
        best.add(state.fallback)  # beside the search's own plans, if any
    if best.items and (not state.stopped or state.fallback is not None):
        best = v_pass(req, ev, best, state)  # past the budget: counts the V plans untried
    if state.floor is not None:
        tightening = budget.tightening()
        if tightening is not None:
            # Cut: refine the bounds left (no simulation) for a little longer, for a
            # smaller gap; a structure's queue cut midway keeps its own bound.
            enough_s = best.items[0].step_time_s / (1.0 + budget.gap)
            if queue_floor is not None:
                enough_s = min(enough_s, queue_floor)
            left = _tighten(req, tasks, tightening, enough_s)
            floors = [f for f in (left, queue_floor) if f is not None]
            # Nothing left that may fit: the ranking is the search's to the end.
            state.floor = max(state.floor, min(floors)) if floors else best.items[0].step_time_s
    if state.stopped and best.items and state.floor is None:
        # Stopped at the hard limit with only the plan found apart ranked: its gap is
        # certified by the smallest step-time bound left, tightened as after a cut.
        step_s = best.items[0].step_time_s
        tightening = budget.tightening()
        if tightening is not None:
            left = _tighten(req, tasks, tightening, step_s / (1.0 + budget.gap))
        else:
            left = tasks[0].lb if tasks else None
        state.floor = min(left, step_s) if left is not None else step_s
    found_apart = state.fallback is not None and best.items[0] is state.fallback
    return _result(req, ev, best, state, total, t0, found_apart)


def _dive(req: Request, ev: Evaluator, state: State) -> Candidate | None:
    """A first plan that fits, looked for apart from the bound-ordered search when none is
    ranked by a part of its soft limit (`Budget.look_apart_due`)
    (`ratrain.planner.feasible.find_feasible`: per structure, the most memory-saving knobs
    and the cheapest recompute the memory bound allows, confirmed by the ledger), relaxed
    (`feasible.relax`) and simulated, all before the hard limit, then bettered on its own
    structure (`_walk`); None where none is found by then. With it in hand the search goes
    on for a plan of its own until `Budget.with_grace`'s hard limit, and the faster of them
    is the answer. Where memory is tight, the structures with the smallest step-time
    bounds are those that do not fit: the search spends its time proving it and may not
    reach one that does within its budget. Not under a pinned V pipeline (the look tries
    one chunk per stage)."""
    if req.pins.get("pipeline") in V_PIPELINES:
        return None
    budget = state.budget
    window = Budget(budget.hard_s, start=budget.start)  # the look ends at the hard limit
    try:
        fit = find_feasible(req, ev, budget=window, fastest_first=True)
        if fit is None:
            return None
        fit = relax(ev, req, fit, window)
        with deadline.until(budget):
            res = ev.simulate(fit.plan)
    except OutOfTime:
        return None
    return _walk(req, ev, fit, candidate_of(res, fit.plan, fit.family, usable_bytes(req)), budget)


def _walk(req: Request, ev: Evaluator, fit: Fit, look: Candidate, budget: Budget) -> Candidate:
    """The look's plan (`look`, simulated), or a faster one of its structure: the
    structure's knob queue worked as the search works a structure (`run_queue`: per
    combination, fastest bound first, the cheapest recompute the ledger fits, simulated
    while its bound can still beat the best so far), with `look` ranked, for
    `deadline.WALK_SHARE` of the time left to `Budget.with_grace`'s hard limit; a
    simulation is not started, or is given up after its short steps, where expected to end
    past that. The look's plan takes the structure's most memory-saving knobs and
    recompute, which the job seldom needs all of: on the 2-core machine, given the whole
    queue, the walk took llama2-70b on 1000 h100-80g clusters (global batch 8192 x 2048)
    from the look's 69 s per step to 18.5 s (the exact search's best, on another
    structure: 18.1 s), and qwen2.5-32b there from 22.4 s to 8.3 s."""
    if fit.st is None:
        return look
    st, fam = fit.st, family_of(fit.family)
    local = State(budget.share_of_grace(deadline.WALK_SHARE))
    best = Top(1)  # the fastest only: every bound that cannot beat it prunes
    best.add(look)
    try:
        kns = memory_pass(req, st, fam, knob_combos(req, fam, st), local)
        queue = bound_knobs(req, st, fam, kns, local, budget=local.budget)
        run_queue(ev, req, st, fam, queue, best, local, True)
    except OutOfTime:  # the queue's bounds not all worked out by the grace
        pass
    return best.items[0]


def _work(
    req: Request,
    ev: Evaluator,
    tasks: list[_Entry],
    best: Top,
    state: State,
    prune: bool,
    report: Callable[[], None],
) -> float | None:
    """Work the heap of structures until it is empty or the search stops (pruned, out of
    time, or past the hard limit); the bound of a knob queue cut midway (None if none
    was)."""
    while tasks:
        # Where nothing the search ran has come to nothing yet, a refined structure due to
        # run goes before a look apart due at the same time: the look's plan, simulated
        # first, may take the rest of the time (llama3-405b on 1000 h100-80g clusters at
        # 8192 x 2048: the look's 348.8 s per step, its simulation 3-4 s, where the
        # structure run first gives 122.2 s).
        entry = None if state.missed else _refined_first(tasks, best, state)
        if (
            entry is None
            and not best.items
            and not state.dived
            and state.budget.look_apart_due(state.missed > 0)
        ):
            state.dived = True
            state.fallback = _dive(req, ev, state)
            if state.fallback is not None:
                # In hand: the search looks for a plan of its own a little longer (its
                # hard limit brought in), then the faster of the two is the answer.
                state.first_fit_s = state.budget.elapsed_s()
                state.budget = state.budget.with_grace()
        if entry is None:
            entry = _refined_first(tasks, best, state)
        if entry is None:
            entry = heapq.heappop(tasks)
            if _stops_at(tasks, entry, best, state, prune):
                return None
        if entry.level != _KNOBS:
            if best.items or entry.level == _PEAK:
                # A first bound is refined with the recomputation and offload traffic the
                # memory bound forces (`forced_bound_s`): the structure run next is then
                # the likeliest fastest, not the one whose kernels alone are. With a plan
                # ranked, a structure's knob bounds stop at the soft limit.
                try:
                    if entry.level == _PEAK:
                        _refine(req, tasks, entry, state, forced=True)
                    else:
                        _refine(req, tasks, entry, state, budget=state.budget)
                except OutOfTime:
                    heapq.heappush(tasks, entry)  # cut at its bound, next time round
                continue
            # No plan ranked yet: a structure past the memory pass with the smallest bound
            # is taken down to its knob queue and run now. Refined one level at a time, a
            # bound that rises at the knobs (the syncs, fetches and offload they add) would
            # send the search through every structure's knob bounds before it ran any.
            entry = _deepen(req, entry, state)
            if entry is None:
                continue
        state.heap_floor = tasks[0].lb if tasks else math.inf
        try:
            run_queue(ev, req, entry.st, entry.fam, entry.queue or [], best, state, prune)
        finally:
            state.heap_floor = None
        state.missed += not best.items
        if best.items and state.first_fit_s is None:
            state.first_fit_s = state.budget.elapsed_s()
        if state.stopped:
            state.pruned = len(tasks) + 1
            heapq.heappush(tasks, entry)  # its bound stays below its queue's bounds left
            return None
        if state.floor is not None:  # cut inside the queue: the structures left bound too
            queue_floor = state.floor  # the rest of this structure's queue: no smaller
            state.floor = min(state.floor, tasks[0].lb) if tasks else state.floor
            state.pruned = len(tasks)
            return queue_floor
        report()
    return None


def _refined_first(tasks: list[_Entry], best: Top, state: State) -> _Entry | None:
    """With no plan ranked after refining bounds for `deadline.REFINED_FIRST_AT` of the soft
    limit (from `state.work_start_s`: the heap is built first), once: the structure
    refined so far (`_KERNELS`, its bound with the recomputation the memory bound forces)
    with the smallest bound, taken out of the heap to be run now, ahead of the structures
    whose first bounds are smaller (None otherwise). Where memory forces recomputation
    those are many, each refined in turn before any is run: on llama2-70b over 128
    h100-80g clusters (1024 x 4096) the search refined 19 structures in 1.2 s and ran
    none, the look apart's plan (pp=4, 46.4 s per step) was the answer, and the structure
    of smallest refined bound (pp=16, 36.5 s) was never run. Running one out of order
    changes no bound: the heap's smallest still bounds every structure left."""
    budget = state.budget
    if best.items or state.ran_refined or budget.soft_s is None or budget.over_hard():
        return None  # past the hard limit (a look apart's grace): the search stops
    if budget.elapsed_s() < state.work_start_s + REFINED_FIRST_AT * budget.soft_s:
        return None
    at = min(
        (i for i, e in enumerate(tasks) if e.level == _KERNELS),
        key=lambda i: tasks[i],
        default=None,
    )
    if at is None:
        return None
    state.ran_refined = True
    entry = tasks.pop(at)
    heapq.heapify(tasks)
    return entry


def _deepen(req: Request, entry: _Entry, state: State) -> _Entry | None:
    """`entry` refined down to its knob queue (`_KNOBS`), or None where no knob
    combination of it is left."""
    while entry.level != _KNOBS:
        out: list[_Entry] = []
        _refine(req, out, entry, state)
        if not out:
            return None
        entry = out[0]
    return entry


def _stops_at(tasks: list[_Entry], entry: _Entry, best: Top, state: State, prune: bool) -> bool:
    """Whether the search stops at the heap's smallest `entry` (just popped): every bound
    left is beaten, the time budget is spent (`entry` goes back, setting the floor), or
    the hard limit is past with nothing ranked."""
    if prune and best.beaten(entry.lb):
        state.pruned = len(tasks) + 1
        return True
    if best.cut_by(state.budget, floor_s=entry.lb):
        # The heap's smallest bound is below every bound left (those of the knob queues
        # left are no smaller than their structure's). Back in the heap, to be tightened.
        heapq.heappush(tasks, entry)
        state.cut_at(entry.lb)
        state.pruned = len(tasks)
        return True
    if state.budget.over_hard():  # nothing fits yet: stop without a floor
        state.stopped, state.pruned = True, len(tasks) + 1
        heapq.heappush(tasks, entry)
        return True
    return False


def _refine(
    req: Request,
    tasks: list[_Entry],
    entry: _Entry,
    state: State,
    forced: bool = False,
    budget: Budget | None = None,
) -> None:
    """Refine a popped structure's bound one level and push it back (unless no knobs are
    left): at `_PEAK`, the memory pass (no kernel model), then the kernel model's times
    (`forced`: and the recomputation the memory bound forces under the structure's most
    memory-saving knobs, `forced_bound_s`); at `_KERNELS`, per knob combination with the
    recomputation the memory bound forces and the overheads.

    The search refines a first bound with `forced`, with a plan ranked too: a plan run
    early (`_refined_first`) leaves most structures at their first bounds, and refined
    without it they held a cut search's floor lower (run at a quarter of the soft limit,
    gaps of at most 5% on 80 of the wide grid's 202 answers against 123 without the early
    run; refined with it, 111 against 128). The structures whose kernels are fastest are
    often those that must recompute or offload most, and the first structure run takes
    most of a small budget (on llama2-70b over 96 a100-80g clusters at 8192 x 2048, pp=3
    went first by its kernels, 398 s, and was ranked at 506.6 s, where its forced bound is
    503.5 s and pp=12's 433 s, its plan 435.7 s, the optimum). Tightening the floor after
    a cut (`_tighten`) uses it too: there it lifts most structures past the best plan's
    step without their knobs.

    `budget`: the knob bounds raise `OutOfTime` past its soft limit (a deep structure's
    take up to a second), and nothing is pushed: the caller puts `entry` back."""
    st, fam, kns = entry.st, entry.fam, entry.kns
    if entry.level == _PEAK:
        if not entry.passed:
            kns = memory_pass(req, st, fam, kns, state)
        if not kns:
            return
        if forced:
            lb = forced_bound_s(req, st, fam, kns)
            if lb == float("inf"):  # no combination fits: the knob queue records the misses
                _refine(req, tasks, entry._replace(level=_KERNELS, kns=kns), state, budget=budget)
                return
            lb = max(entry.lb, lb)  # both bound every combination: the larger
        else:
            ut = lowest_unit_times([unit_times_of(req, st, loss) for loss in losses_of(kns)])
            m, zb = st.microbatches(req.global_batch), zb_pipelines(kns)
            lb = _structure_bound_s(st, m, ut, zb, floor_overheads(req, st, kns))
        heapq.heappush(tasks, _Entry(lb, entry.order, entry.seq, _KERNELS, st, fam, kns))
        return
    queue = bound_knobs(req, st, fam, kns, state, budget=budget)
    if queue:
        heapq.heappush(
            tasks, _Entry(queue[0].lb, entry.order, entry.seq, _KNOBS, st, fam, kns, queue)
        )


def _reporter(
    progress: Callable[[str], None] | None, ev: Evaluator, best: Top, n_tasks: int, t0: float
) -> Callable[[], None]:
    """Called after each structure worked on: `progress` at most once a second."""
    done, last_report = 0, t0

    def report() -> None:
        nonlocal done, last_report
        done += 1
        if progress is not None and time.perf_counter() - last_report > 1.0:
            last_report = time.perf_counter()
            tps = f"{best.items[0].tokens_per_s:,.0f} tokens/s" if best.items else "none fits yet"
            progress(
                f"{done}/{n_tasks} structures, {ev.n_memory} memory replays, "
                f"{ev.n_simulated} simulated; best {tps}"
            )

    return report


def _result(
    req: Request,
    ev: Evaluator,
    best: Top,
    state: State,
    total: int,
    t0: float,
    found_apart: bool,
) -> SearchResult:
    stopped = state.floor is not None or state.stopped
    return SearchResult(
        request=req,
        ranked=list(best.items),
        search_time_s=time.perf_counter() - t0,
        candidates_total=total,
        candidates_evaluated=state.evaluated,
        candidates_simulated=ev.n_simulated,
        memory_replays=ev.n_memory,
        structures_pruned=state.pruned,
        near=None if best.items else state.nearest(req),
        cut=stopped,
        floor_step_s=state.floor,
        structures_left=state.pruned if stopped else 0,
        untimed=None if best.items else state.untimed,
        v_untried=state.v_untried,
        first_fit_s=state.first_fit_s,
        found_apart=found_apart,
    )


TILE_MODEL_S = 0.2
"""measured: a micro-batch size's kernel times under a tile model (`unit_times` where not
`kernel_model_is_cheap`) take 0.12-0.16 s for llama2-70b, qwen2.5-32b and llama3.2-1b on
mt3000 (the 2-core machine); `_tighten` starts one only with this long left."""


def _tighten(
    req: Request, tasks: list[_Entry], budget: Budget, enough_s: float = math.inf
) -> float | None:
    """Refine the heap's smallest bounds (memory pass, kernel times, then per knob
    combination) until `budget`'s soft limit, until the smallest is refined as far as
    bounds go, or until it is at least `enough_s` (where a higher floor no longer changes
    the gap reported, or the gap is within the budget's: the caller's); the smallest bound
    left then (None if nothing is left). Stops at a micro-batch size whose kernel times
    are not known yet, once its memory pass has kept some knobs, where less than
    `TILE_MODEL_S` is left (the kernel model may take that long)."""
    scratch = State()  # a plan fits: the misses and near misses are not needed
    while tasks and tasks[0].lb < enough_s and not budget.over_soft():
        head = tasks[0]
        if head.level == _KNOBS:
            break
        st = head.st
        args = (req.spec, req.platform, st.micro_batch, req.seq, req.compute_dtype)
        losses = losses_of(head.kns)
        if head.level == _PEAK and not all(unit_times_cheap(*args, loss) for loss in losses):
            if not head.passed:
                # The memory pass needs no kernel times: a structure none of whose knobs
                # fit leaves the heap without them (on mt3000, a tile model of 0.12-0.16 s
                # per micro-batch size, a head that does not fit held a floor 12% under
                # the best plan: llama2-70b over 1000 clusters at 8192 x 2048, pp=15 with
                # 4 sequences).
                entry = heapq.heappop(tasks)
                kns = memory_pass(req, st, entry.fam, entry.kns, scratch)
                if kns:
                    heapq.heappush(tasks, entry._replace(kns=kns, passed=True))
                continue
            if budget.over_soft(TILE_MODEL_S):
                break
        entry = heapq.heappop(tasks)
        try:
            _refine(req, tasks, entry, scratch, forced=True, budget=budget)
        except OutOfTime:  # its knob bounds not all worked out in time: as it was
            heapq.heappush(tasks, entry)
            break
    return tasks[0].lb if tasks else None
