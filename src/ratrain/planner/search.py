"""Branch and bound over the search space: feasible by the ledger, ranked by the simulator.

1. Enumerate the structures (pp, dp, micro-batch, split) of every family asked for, each
   with a lower bound on its step time (`ratrain.planner.bounds`), in a heap: the tokens per
   step are fixed by the request, so a shorter step is more tokens/s.
2. Pop the structure with the smallest bound. Once `top` plans are known, a bound no
   shorter than the `top`-th best step cannot place, and neither can any after it: stop.
   A bound is refined before its structure is worked on, and pushed back: from kernel times
   at peak to the kernel model's times, then per knob combination with the recomputation
   the memory bound forces and the communication and update overheads.
3. For each knob combination that can still place: the cheapest recompute policy per stage
   the memory bound allows (`ratrain.planner.fit`) is replayed by the ledger; a stage over
   the cap moves to its next policy; what fits is simulated.

4. The V-shaped pass orders (zb-v, 1f1b-v: two chunks per stage) are not bounded: after
   the search they are tried on the structures and knobs of the best plans, each with a
   few chunk splits (`_v_pass`), and ranked with the rest where they fit.

The simulator's step time is the ranking; its memory (the full ledger) is what is reported.
Pure Python.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ratrain import deadline
from ratrain.config import PIPELINES, V_PIPELINES, Plan
from ratrain.planner.bounds import (
    UnitTimes,
    lowest_unit_times,
    overheads,
    peak_unit_times,
    persistent_bound_of,
    recompute_time_s,
    step_time_lower_bound_s,
    unit_times,
    unit_times_known,
)
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.fit import (
    beaten_by,
    first_overflow_bytes,
    least_bounds,
    memory_bound,
    options,
    per_stage_choices,
    time_bound_s,
)
from ratrain.planner.saving import dominant, dominant_of
from ratrain.planner.space import (
    Request,
    Structure,
    family_of,
    knob_combos,
    knobs_key,
    make_plan,
    structures,
    v_splits,
)
from ratrain.sizes.states import grad_bytes_per_param, view_bytes_per_param

__all__ = ["Candidate", "Near", "SearchResult", "search", "states_lower_bound_bytes"]


@dataclass
class Candidate:
    """One feasible, simulated plan."""

    plan: Plan
    family: str
    tokens_per_s: float
    step_time_s: float
    bubble_fraction: float
    peak_memory_bytes: tuple[int, ...]
    memory_breakdown: tuple[dict[str, int], ...]
    limit_bytes: int
    clusters_used: int
    exposed: list[dict[str, float]] = field(default_factory=list)
    utilization: list[dict[str, float]] = field(default_factory=list)

    @property
    def recompute_free(self) -> bool:
        return all(r == "none" for r in self.plan.recompute)

    def predicted(self) -> dict:
        return {
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": self.step_time_s,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "memory_breakdown": [dict(b) for b in self.memory_breakdown],
            "limit_bytes": self.limit_bytes,
        }


@dataclass
class Near:
    """The infeasible candidate that came closest to fitting (least overflow)."""

    plan: Plan
    family: str
    peak_bytes: tuple[int, ...]
    """Per stage: the ledger's peak under the most-saving recompute tried, or, when
    `measured` is False, the persistent-state lower bound."""
    limit_bytes: int
    breakdown: tuple[dict[str, int], ...] = ()
    measured: bool = True

    @property
    def over_bytes(self) -> int:
        return max(self.peak_bytes) - self.limit_bytes

    @property
    def worst_stage(self) -> int:
        return max(range(len(self.peak_bytes)), key=lambda s: self.peak_bytes[s])


@dataclass(frozen=True)
class Untimed:
    """A plan whose replay fits the cap but whose step the search could not simulate before
    its hard deadline (the search stopped there, with no plan ranked)."""

    plan: Plan
    family: str
    step_lower_bound_s: float
    """No policy of its knobs steps faster (the search's step-time bound)."""
    peak_bytes: tuple[int, ...]
    limit_bytes: int

    def to_json(self) -> dict:
        return {
            "family": self.family,
            "plan": self.plan.to_dict(),
            "step_time_lower_bound_s": self.step_lower_bound_s,
            "peak_memory_bytes": list(self.peak_bytes),
            "limit_bytes": self.limit_bytes,
        }


@dataclass
class SearchResult:
    request: Request
    ranked: list[Candidate]
    search_time_s: float
    candidates_total: int
    """Structure x knob combinations in the space (before any pruning)."""
    candidates_evaluated: int
    """Combinations whose feasibility was decided (bound or ledger)."""
    candidates_simulated: int
    memory_replays: int
    structures_pruned: int
    near: Near | None = None
    cut: bool = False
    """The search stopped at its time budget before it could prove the ranking optimal."""
    floor_step_s: float | None = None
    """When cut: a lower bound on the step of every plan not examined (the smallest
    step-time bound left), so no plan of the space is faster than min(floor, best)."""
    structures_left: int = 0
    """When cut: structures not examined."""
    untimed: Untimed | None = None
    """When unfinished: a plan found to fit whose step was not simulated in time."""
    v_untried: int = 0
    """V-shaped plans (`_v_pass`) not tried for the time budget: outside the gap, which
    is over the plans with one chunk per stage."""

    @property
    def unfinished(self) -> bool:
        """Cut before any plan was found to fit: not a proof that none does."""
        return self.cut and not self.ranked

    @property
    def gap(self) -> float:
        """When cut: how much longer the best step may be than the optimum over the space
        (0.0 when the bound left proves it optimal, or when not cut)."""
        if not self.cut or not self.ranked or self.floor_step_s is None:
            return 0.0
        return max(0.0, self.ranked[0].step_time_s / self.floor_step_s - 1.0)

    @property
    def feasible(self) -> bool:
        return bool(self.ranked)

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


class _Top:
    """The `k` shortest steps seen so far."""

    def __init__(self, k: int) -> None:
        self.k, self.items = k, []

    def add(self, c: Candidate) -> None:
        same = [o for o in self.items if _signature(o) == _signature(c)]
        if same and _tie(same[0]) <= _tie(c):
            return  # the same prediction by a plan no simpler: adds nothing to the ranking
        self.items = [o for o in self.items if _signature(o) != _signature(c)]
        self.items.append(c)
        self.items.sort(key=lambda c: (c.step_time_s, _tie(c)))
        del self.items[self.k :]

    def beaten(self, lower_bound_s: float) -> bool:
        """No plan whose step is at least `lower_bound_s` can enter the top."""
        return len(self.items) >= self.k and lower_bound_s >= self.items[-1].step_time_s


def _signature(c: Candidate) -> tuple:
    return (c.family, c.step_time_s, c.peak_memory_bytes)


def _tie(c: Candidate) -> tuple:
    """Equal steps: the plan that keeps more memory free, then the one with fewer features."""
    p = c.plan
    features = (
        p.offload_activations,
        p.view_policy == "transient",
        p.shard_optimizer,
        p.pipeline != "1f1b",
    )
    return (max(c.peak_memory_bytes), sum(features), p.view_lookahead, str(p.to_dict()))


_PEAK, _KERNELS, _KNOBS = 0, 1, 2
"""How far a structure's step-time bound has been refined: kernel times at the dtype's
peak, the kernel model's times, then per knob combination with the recomputation the
memory bound forces and the communication and update overheads."""


def _tasks(req: Request, families: tuple[str, ...], state: _State) -> tuple[list[tuple], int]:
    """A heap of structures by their step-time bound, and the knob combinations of the
    whole space. A micro-batch size whose kernel times are not known yet is bounded at the
    dtype's peak first (no kernel-model cost); the exact kernel times are computed when
    such a structure reaches the top of the heap.

    A structure whose most memory-saving knob combination holds more model states than a
    stage can (`persistent_lower_bound_bytes`, memoised per split and shard count: cheap)
    is left out here, before its step-time bound is computed: no combination of it fits.
    The fuller per-stage bound (`first_overflow_bytes`, a closed form per stage and
    policy) is left to `_memory_pass`, when the structure reaches the top of the heap:
    computed here for every structure it would cost a second on large spaces whose
    searches end long before most structures are reached. Except until the first
    structure that may fit (`_memory_proof`): a request none fits is proved infeasible
    before any step-time bound."""
    entries, total = [], 0  # (model-state bound, index, order, structure, family, knobs)
    combos: dict[tuple, list] = {}  # by knobs_key: the same combinations
    leads: dict[tuple, object] = {}
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
                if _states_overflow(req, st, fam, lead, limit, state):
                    state.evaluated += len(kns)
                    continue
                states = max(states_lower_bound_bytes(req, st, lead))  # memoised
            entries.append((states, len(entries), order, st, fam, kns))
        combos.clear()  # per family
        leads.clear()
    passed = _memory_proof(req, entries, state)
    if passed is None:
        return [], total
    out, known, seen = [], {}, {}
    for _, i, order, st, fam, kns in entries:
        kept = passed.get(i)
        if kept is not None and not kept:
            continue  # ruled out by the memory proof
        losses = _losses(kept or kns)
        if (st.micro_batch, losses) not in known:
            known[st.micro_batch, losses] = lowest_unit_times(
                [
                    peak_unit_times(
                        req.spec, req.platform, st.micro_batch, req.seq, req.compute_dtype, loss
                    )
                    for loss in losses
                ]
            )
        zb = _zb_pipelines(kept or kns)
        lb = seen.get((st, zb, losses))
        if lb is None:  # families share structures: bound each once
            m = st.microbatches(req.global_batch)
            lb = seen[st, zb, losses] = _structure_bound_s(st, m, known[st.micro_batch, losses], zb)
        mark = None if kept is None else _PASSED
        out.append((lb, order, len(out), _PEAK, st, fam, kept or kns, mark))
    heapq.heapify(out)
    return out, total


def _losses(kns) -> tuple[int | None, ...]:
    """The losses its knobs try (`space.loss_chunks`; the plain one first: a cache key)."""
    return tuple(sorted({kn.loss_chunk_tokens for kn in kns}, key=lambda c: c or 0))


def _unit_times(req: Request, st: Structure, loss: int | None) -> UnitTimes:
    """`unit_times` of a structure under one loss (`Knobs.loss_chunk_tokens`)."""
    return unit_times(req.spec, req.platform, st.micro_batch, req.seq, req.compute_dtype, loss)


def _zb_pipelines(kns) -> tuple[str, ...]:
    """The pass orders its knobs try besides 1F1B (sorted: a cache key)."""
    return tuple(sorted({kn.pipeline for kn in kns} - {"1f1b"}))


def _structure_bound_s(st: Structure, m: int, ut, zb: tuple[str, ...]) -> float:
    """A structure's step-time bound with no recompute and no overheads, below every
    pipeline its knobs try: the smallest of 1F1B's and the zero-bubble ones they try."""
    lb = step_time_lower_bound_s(st.layer_split, m, ut)
    for pipe in zb:
        lb = min(lb, step_time_lower_bound_s(st.layer_split, m, ut, pipeline=pipe))
    return lb


_PASSED = "passed"
"""A heap entry's mark at `_PEAK`: its knobs have been through `_memory_pass` already."""


def _memory_proof(req: Request, entries: list, state: _State) -> dict[int, list] | None:
    """`_memory_pass` over the structures, the smallest model-state bound first (the
    likeliest to fit), until one keeps a knob combination: the knobs each kept, by entry
    index, or None when none keeps any (the request is then proved infeasible by the
    memory bounds alone, and no step-time bound is computed: on such requests they were
    about a third of the search). The order only decides how soon a structure that may
    fit is met; the misses recorded are those of every structure either way. Past the hard
    deadline it stops with the knobs kept so far (the search then stops too)."""
    passed: dict[int, list] = {}
    for _, i, _, st, fam, kns in sorted(entries, key=lambda e: e[:2]):
        if state.past_hard_deadline():  # the rest in the heap: the search stops there
            return passed
        kept = passed[i] = _memory_pass(req, st, fam, kns, state)
        if kept:
            return passed
    return None


def search(
    req: Request,
    *,
    top: int = 5,
    prune: bool = True,
    progress: Callable[[str], None] | None = None,
    evaluator: Evaluator | None = None,
    time_budget_s: float | None = None,
    hard_budget_s: float | None = None,
) -> SearchResult:
    """The `top` fastest feasible plans for `req` (all families in `req.families`).

    With `time_budget_s`, once that many seconds have passed and some plan fits, the search
    stops where it is (`SearchResult.cut`) and reports the smallest step-time bound left
    (`floor_step_s`): the best plan is then within `gap` of the optimum over the space.
    With `hard_budget_s`, it stops then even if no plan fits yet (`unfinished`)."""
    t0 = time.perf_counter()
    ev = evaluator or Evaluator(req)
    best, state = _Top(max(1, top)), _State()
    if time_budget_s is not None:
        state.deadline = t0 + time_budget_s
    if hard_budget_s is not None:
        state.hard_deadline = t0 + hard_budget_s
    tasks, total = _tasks(req, req.families, state)
    report = _reporter(progress, ev, best, len(tasks), t0)
    queue_floor = _work(req, ev, tasks, best, state, prune, report)
    if best.items and not state.stopped:
        best = _v_pass(req, ev, best, state)
    if state.floor is not None and time_budget_s:
        # Cut: refine the bounds left (no simulation) for a little longer, for a smaller
        # gap; a structure's queue cut midway keeps its own bound.
        until = time.perf_counter() + FLOOR_BUDGET_FRACTION * time_budget_s
        left = _tighten(req, tasks, until)
        floors = [f for f in (left, queue_floor) if f is not None]
        # Nothing left that may fit: the ranking is the search's to the end.
        state.floor = max(state.floor, min(floors)) if floors else best.items[0].step_time_s
    return _result(req, ev, best, state, total, t0)


V_TRIES = 3
"""assumed: the ranked plans whose structures and knobs the V-shaped pass orders are tried
on (`_v_pass`), each with `space.v_splits`' three nearest-balanced chunk splits: eighteen
simulations at most (zb-v and 1f1b-v)."""


def _v_pass(req: Request, ev: Evaluator, best: _Top, state: _State) -> _Top:
    """zb-v and 1f1b-v (`ratrain.schedule.vshape`) on the structures and knobs of the
    `V_TRIES` best plans whose family tries them (pp > 1, not fsdp-pp; without offload,
    which a V does not support), each with the chunk splits of `space.v_splits`: the V's
    plans that fit are ranked with the rest. (Not branch and bound: no bound of a V's step
    or memory is derived, so the search's gap, where it stops early, is over the plans
    with one chunk per stage.) A pinned V keeps only its plans, another pinned pipeline
    none of them. Past the time budget with a plan ranked, the V plans left are not tried
    (`state.v_untried`); a pinned V goes on until one of its plans is ranked."""
    pin = req.pins.get("pipeline")
    if pin is not None and pin not in V_PIPELINES:
        return best
    pinned = pin is not None
    out = _Top(best.k) if pinned else best
    if "layer_split" in req.pins or req.pins.get("offload_activations") is True:
        return out
    bases: list[tuple[Plan, str, list[str]]] = []
    for c in best.items:
        fam, p = family_of(c.family), c.plan.replace(offload_activations=False)
        pipes = [pin] if pinned else [v for v in V_PIPELINES if v in fam.pipelines]
        if pipes and p.pp > 1 and p.schedule != "fsdp-pp" and p not in [b[0] for b in bases]:
            bases.append((p, c.family, pipes))
    tries = [
        (p.replace(pipeline=pipe, layer_split=split), family)
        for p, family, pipes in bases[:V_TRIES]
        for pipe, split in itertools.product(pipes, v_splits(req.spec, p.pp))
    ]
    for i, (plan, family) in enumerate(tries):
        if not _v_try(req, ev, out, state, plan, family):  # out of time: it and the rest
            state.v_untried = len(tries) - i
            break
    return out


def _v_try(req: Request, ev: Evaluator, out: _Top, state: _State, plan: Plan, family) -> bool:
    """Rank the V plan `plan` in `out` if it fits; False (nothing done) where the time
    budget ends first, before its replay or its simulation."""
    if state.out_of_time(out):
        return False
    if not ev.memory(plan).fits:
        return True
    if state.out_of_time(out, ev.expected_simulate_s(plan)):
        return False
    res = ev.simulate(plan, state.deadline if out.items else None)
    if res is None:  # its steady-state tries would end past the deadline
        return False
    out.add(_candidate(res, plan, family, usable_bytes(req)))
    return True


def _work(req: Request, ev: Evaluator, tasks: list, best: _Top, state: _State, prune, report):
    """Work the heap of structures until it is empty or the search stops (pruned, out of
    time, or past the hard deadline); the bound of a knob queue cut midway (None if none
    was)."""
    while tasks:
        entry = heapq.heappop(tasks)
        if _stops_at(tasks, entry, best, state, prune):
            return None
        _, _, _, level, st, fam, _, queue = entry
        if level != _KNOBS:
            _refine(req, tasks, entry, state)
            continue
        _run_queue(ev, req, st, fam, queue, best, state, prune)
        if state.stopped:
            state.pruned = len(tasks) + 1
            return None
        if state.floor is not None:  # cut inside the queue: the structures left bound too
            queue_floor = state.floor  # the rest of this structure's queue: no smaller
            state.floor = min(state.floor, tasks[0][0]) if tasks else state.floor
            state.pruned = len(tasks)
            return queue_floor
        report()
    return None


def _stops_at(tasks: list, entry: tuple, best: _Top, state: _State, prune: bool) -> bool:
    """Whether the search stops at the heap's smallest `entry` (just popped): every bound
    left is beaten, the time budget is spent (`entry` goes back, setting the floor), or
    the hard deadline is past with nothing ranked."""
    lb = entry[0]
    if prune and best.beaten(lb):
        state.pruned = len(tasks) + 1
        return True
    if state.out_of_time(best):
        # The heap's smallest bound is below every bound left (those of the knob queues
        # left are no smaller than their structure's). Back in the heap, to be tightened.
        heapq.heappush(tasks, entry)
        state.floor = lb if state.floor is None else min(state.floor, lb)
        state.pruned = len(tasks)
        return True
    if state.past_hard_deadline():  # nothing fits yet: stop without a floor
        state.stopped, state.pruned = True, len(tasks) + 1
        return True
    return False


def _refine(req: Request, tasks: list, entry: tuple, state: _State) -> None:
    """Refine a popped structure's bound one level and push it back (unless no knobs are
    left): at `_PEAK`, the memory pass (no kernel model), then the kernel model's times;
    at `_KERNELS`, per knob combination with the recomputation the memory bound forces and
    the overheads."""
    _, order, seq, level, st, fam, kns, queue = entry
    if level == _PEAK:
        if queue is not _PASSED:
            kns = _memory_pass(req, st, fam, kns, state)
        if kns:
            ut = lowest_unit_times([_unit_times(req, st, loss) for loss in _losses(kns)])
            lb = _structure_bound_s(st, st.microbatches(req.global_batch), ut, _zb_pipelines(kns))
            heapq.heappush(tasks, (lb, order, seq, _KERNELS, st, fam, kns, None))
        return
    queue = _bound_knobs(req, st, fam, kns, state)
    if queue:
        heapq.heappush(tasks, (queue[0][0], order, seq, _KNOBS, st, fam, kns, queue))


def _reporter(progress, ev: Evaluator, best: _Top, n_tasks: int, t0: float) -> Callable[[], None]:
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


def _result(req: Request, ev: Evaluator, best: _Top, state: _State, total: int, t0: float):
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
    )


_NEAR_TRIES = 64

FLOOR_BUDGET_FRACTION = 0.2
"""assumed: after a cut, a fifth of the budget more for tightening the bounds left (no
simulation), which shrinks the gap reported."""


def _tighten(req: Request, tasks: list, until: float) -> float | None:
    """Refine the heap's smallest bounds (memory pass, kernel times, then per knob
    combination) until `until` or until the smallest is refined as far as bounds go; the
    smallest bound left then (None if nothing is left). Stops at a micro-batch size whose
    kernel times are not known yet (the kernel model may take a second)."""
    scratch = _State()  # a plan fits: the misses and near misses are not needed
    while tasks and time.perf_counter() < until:
        _, _, _, level, st, _, _, _ = tasks[0]
        if level == _KNOBS:
            break
        args = (req.spec, req.platform, st.micro_batch, req.seq, req.compute_dtype)
        losses = _losses(tasks[0][6])
        if level == _PEAK and not all(unit_times_known(*args, loss) for loss in losses):
            break
        _refine(req, tasks, heapq.heappop(tasks), scratch)
    return tasks[0][0] if tasks else None


@dataclass
class _State:
    evaluated: int = 0
    pruned: int = 0
    near: Near | None = None
    misses: list = field(default_factory=list)
    """(a lower bound on its overflow, order, plan, structure, knobs, family) of the
    candidates ruled out by a quick bound: the model states alone overflow a stage (plan
    `_STATES`, built when ranked), or a stage overflows under every recompute policy (plan
    None)."""
    deadline: float | None = None
    hard_deadline: float | None = None
    floor: float | None = None
    """Set when the search is cut at `deadline`: the smallest step-time bound left."""
    stopped: bool = False
    """Set when the search stops at `hard_deadline` with no plan ranked."""
    untimed: Untimed | None = None
    """A plan the ledger found to fit whose simulation the hard deadline interrupted."""
    v_untried: int = 0
    """V-shaped plans the V pass left untried at the time budget (`_v_pass`)."""

    def out_of_time(self, best: _Top, ahead_s: float = 0.0) -> bool:
        """Past the deadline with some plan ranked (without one, the search goes on), or
        past it after `ahead_s` more seconds of work (a simulation about to start)."""
        return (
            self.deadline is not None
            and bool(best.items)
            and time.perf_counter() + ahead_s > self.deadline
        )

    def past_hard_deadline(self) -> bool:
        return self.hard_deadline is not None and time.perf_counter() > self.hard_deadline

    def nearest(self, req: Request) -> Near | None:
        """The closest miss: `near`, or one of `misses` ranked by its full bound, tried in
        the order of their lower bounds while one may win, at most `_NEAR_TRIES` of them
        (the miss only guides the explanation, which measures it with the ledger)."""
        limit = usable_bytes(req)
        near = self.near
        for over, _, plan, st, kn, fam in sorted(self.misses, key=lambda x: x[:2])[:_NEAR_TRIES]:
            if not _may_be_closer(near, over):
                break
            if plan is _STATES:
                plan = make_plan(req, st, kn, ("full",) * st.pp)
                floor = tuple(memory_bound(req, plan).stage(s, "full") for s in range(plan.pp))
                miss = Near(plan, fam.name, floor, limit, measured=False)
            else:
                bound_bytes, most_saving = least_bounds(req, st, kn)
                plan = make_plan(req, st, kn, most_saving)
                miss = Near(plan, fam.name, bound_bytes, limit, measured=False)
            near = _closer(near, miss)
        return near


def _memory_pass(req, st, fam, kns, state: _State) -> list:
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
    losses = _losses(kns)
    if len(losses) > 1:  # the losses hold different activations: bounded apart
        return [
            kn
            for loss in losses
            for kn in _memory_pass(
                req, st, fam, [kn for kn in kns if kn.loss_chunk_tokens == loss], state
            )
        ]
    pipes = sorted({kn.pipeline for kn in kns}, key=PIPELINES.index)  # 1f1b first
    if len(pipes) > 1:
        out = []
        for pipe in pipes:
            group = [kn for kn in kns if kn.pipeline == pipe]
            if pipe == "1f1b":
                out += _memory_pass(req, st, fam, group, state)
                continue
            scratch = _State()  # the zero-bubble misses: not recorded
            out += _memory_pass(req, st, fam, group, scratch if "1f1b" in pipes else state)
            state.evaluated += scratch.evaluated
        return out
    lead = dominant_of(tuple(kns))
    if lead is not None:
        state.evaluated += len(kns)
        if _ruled_out(req, st, fam, lead, limit, state):
            # Every bound below is no smaller for the others: ruled out too (one miss
            # recorded, the nearest of them).
            return []
        # Some combination may fit: the others are tested when the structure is worked on
        # (`_bound_knobs` rules out those no policy fits), not before its kernel times are
        # known, for a structure that may never be reached.
        return list(kns)
    out = []
    for kn in kns:
        state.evaluated += 1
        if _states_overflow(req, st, fam, kn, limit, state):
            # The model states alone overflow a stage. Such a miss is ranked by the fuller
            # bound, which is no smaller: computed at the end, and only if nothing fits.
            continue
        over = first_overflow_bytes(req, st, kn)
        if over is not None:  # a stage overflows under every policy: ranked at the end
            state.misses.append((over, len(state.misses), None, st, kn, fam))
            continue
        out.append(kn)  # the full per-stage options are worked out if it gets that far
    return out


def _states_overflow(req, st, fam, kn, limit: int, state: _State) -> bool:
    """Whether the model states alone overflow a stage under knobs `kn` (a miss is
    recorded; its plan is built only if the explanation ranks it)."""
    persistent = max(states_lower_bound_bytes(req, st, kn))
    if persistent > limit:
        state.misses.append((persistent - limit, len(state.misses), _STATES, st, kn, fam))
        return True
    return False


_STATES = "states"
"""A miss's mark: the model states alone overflow a stage (its plan is built on demand)."""


def states_lower_bound_bytes(req: Request, st: Structure, kn) -> tuple[int, ...]:
    """`persistent_lower_bound_bytes` of the plan `make_plan(req, st, kn, ...)` would
    build (whatever its recompute), without building it."""
    n_shards = st.dp if kn.shard_optimizer else 1
    most = max(view_bytes_per_param(kn), grad_bytes_per_param(kn))
    return persistent_bound_of(req.spec, st.layer_split, n_shards, most)


def _ruled_out(req, st, fam, kn, limit: int, state: _State) -> bool:
    """`_memory_pass`'s test for one knob combination (a miss is recorded)."""
    if _states_overflow(req, st, fam, kn, limit, state):
        return True
    over = first_overflow_bytes(req, st, kn)
    if over is not None:
        state.misses.append((over, len(state.misses), None, st, kn, fam))
        return True
    return False


def _bound_knobs(req, st, fam, kns, state: _State) -> list[tuple]:
    """Each knob combination of a structure that the memory bound lets fit (`_memory_pass`
    kept), with its step-time bound (recomputation the bound forces, and the overheads),
    fastest first."""
    m = st.microbatches(req.global_batch)
    queue = []
    limit = usable_bytes(req)
    for kn in kns:
        ut = _unit_times(req, st, kn.loss_chunk_tokens)
        opts = options(req, st, kn, ut)
        if not opts.feasible(fam.per_stage_recompute):  # no one policy fits every stage
            if kn.pipeline != "1f1b" and req.pins.get("pipeline") != kn.pipeline:
                continue  # its 1F1B twin's miss is recorded (`_memory_pass`)
            plan = make_plan(req, st, kn, opts.most_saving)
            near = Near(plan, fam.name, opts.bound_bytes, limit, measured=False)
            state.near = _closer(state.near, near)
            continue
        over = overheads(req.spec, make_plan(req, st, kn, ("none",) * st.pp), req.platform)
        lb = time_bound_s(fam, st, m, ut, opts, over, kn.pipeline)
        queue.append((lb, len(queue), kn, opts, over))
    queue.sort(key=lambda q: (q[0], q[1]))
    return queue


def _run_queue(ev, req, st, fam, queue, best: _Top, state: _State, prune: bool) -> None:
    """Fit and simulate the knob combinations of one structure that can still place."""
    m = st.microbatches(req.global_batch)
    for lb, _, kn, opts, over in queue:
        if prune and best.beaten(lb):
            continue
        if state.out_of_time(best):  # the queue is sorted: lb is its smallest bound left
            state.floor = lb
            return
        if state.past_hard_deadline() and not best.items:
            state.stopped = True
            return
        ut = _unit_times(req, st, kn.loss_chunk_tokens)
        ctx = _Ctx(ev, req, st, fam, kn, ut, over, m, best, state, prune, lb)
        if "recompute" in req.pins:
            ctx.try_policy(_pinned(req.pins["recompute"], st.pp))
        elif fam.per_stage_recompute:
            _per_stage(ctx, opts)
        else:
            _uniform(ctx, opts)
        if state.floor is not None or state.stopped:  # stopped inside: its floor stands
            return


def _pinned(rec, pp: int) -> tuple[str, ...] | None:
    rec = (rec,) * pp if isinstance(rec, str) else tuple(rec)
    return rec if len(rec) == pp else None


@dataclass
class _Ctx:
    """One (structure, knobs) being fitted and simulated."""

    ev: Evaluator
    req: Request
    st: Structure
    fam: object
    kn: object
    ut: object
    over: object
    m: int
    best: _Top
    state: _State
    prune: bool
    lb: float
    """The knob combination's step-time bound: no policy of it is faster."""

    def try_policy(self, rec: tuple[str, ...] | None) -> str | list[int]:
        """Simulate `rec` unless its bound cannot place: "pruned", "fits" (ranked), "stop"
        (out of time), or the stages the full replay finds over the cap."""
        if rec is None:
            return "pruned"
        # With a plan ranked, a simulation is not interrupted: stop before one that would
        # overrun the deadline (expected to cost what the last one did, per microbatch
        # simulated).
        plan = make_plan(self.req, self.st, self.kn, rec)
        if self.state.out_of_time(self.best, self.ev.expected_simulate_s(plan)):
            floor = self.state.floor
            self.state.floor = self.lb if floor is None else min(floor, self.lb)
            return "stop"
        if self.state.past_hard_deadline() and not self.best.items:
            self.state.stopped = True
            return "stop"
        lb = step_time_lower_bound_s(
            self.st.layer_split, self.m, self.ut, rec, self.over, pipeline=self.kn.pipeline
        )
        if self.prune and self.best.beaten(lb):
            return "pruned"
        rep = self.ev.memory(plan)  # the ledger first: a simulation costs several replays
        over = [s for s, p in enumerate(rep.peak_bytes) if p > rep.limit_bytes]
        if not over:
            # With a plan ranked, a simulation whose later steady-state tries or full
            # fallback would end past the deadline is not run: cut there, as above.
            # Without one, it runs until the hard deadline at most (checked between its
            # phases, `ratrain.deadline`): past it, the plan that fits is reported untimed.
            ranked = bool(self.best.items)
            try:
                with deadline.until(None if ranked else self.state.hard_deadline):
                    res = self.ev.simulate(plan, self.state.deadline if ranked else None)
            except deadline.DeadlinePassed:
                self.state.stopped = True
                if self.state.untimed is None:
                    self.state.untimed = Untimed(
                        plan, self.fam.name, lb, tuple(rep.peak_bytes), rep.limit_bytes
                    )
                return "stop"
            if res is None:
                floor = self.state.floor
                self.state.floor = self.lb if floor is None else min(floor, self.lb)
                return "stop"
            peaks, parts = tuple(res.peak_memory_bytes), tuple(res.memory_breakdown)
            over = [s for s, p in enumerate(peaks) if p > rep.limit_bytes]
        else:
            peaks, parts = rep.peak_bytes, rep.breakdown
        if over:
            near = Near(plan, self.fam.name, peaks, rep.limit_bytes, parts)
            self.state.near = _closer(self.state.near, near)
            return over
        limit = rep.limit_bytes
        self.best.add(_candidate(res, plan, self.fam.name, limit))
        return "fits"


def _per_stage(ctx: _Ctx, opts) -> None:
    """The cheapest policy per stage that the bound allows; a stage the full replay finds
    over the cap moves to its next one."""
    idx = [0] * ctx.st.pp
    while True:
        rec = tuple(o[i] for o, i in zip(opts.per_stage, idx, strict=True))
        over = ctx.try_policy(rec)
        if isinstance(over, str) or not per_stage_choices(opts, over, idx):
            return


def _uniform(ctx: _Ctx, opts) -> None:
    """Each uniform policy the bound allows, unless one found to fit is no slower anywhere."""

    def times(o: str) -> tuple[float, ...]:
        return tuple(recompute_time_s(o, n, ctx.ut) for n in ctx.st.layer_split)

    found: list[str] = []
    for o in opts.uniform:
        if beaten_by(times, o, found):
            continue
        got = ctx.try_policy((o,) * ctx.st.pp)
        if got == "stop":
            return
        if got == "fits":
            found.append(o)


def _may_be_closer(near: Near | None, over_at_least: int) -> bool:
    """Whether a bounded miss over the cap by at least `over_at_least` bytes could replace
    `near` in `_closer` (a measured miss always stays)."""
    return near is None or (not near.measured and over_at_least < near.over_bytes)


def _closer(a: Near | None, b: Near) -> Near:
    """The nearer miss; one measured by the ledger beats one only bounded."""
    if a is None:
        return b
    return b if (not b.measured, b.over_bytes) < (not a.measured, a.over_bytes) else a


def _candidate(res, plan: Plan, family: str, limit: int) -> Candidate:
    return Candidate(
        plan=plan,
        family=family,
        tokens_per_s=res.tokens_per_s,
        step_time_s=res.step_time_s,
        bubble_fraction=res.bubble_fraction,
        peak_memory_bytes=tuple(res.peak_memory_bytes),
        memory_breakdown=tuple(res.memory_breakdown),
        limit_bytes=limit,
        clusters_used=plan.pp * plan.dp,
        exposed=list(res.exposed),
        utilization=list(res.utilization),
    )
