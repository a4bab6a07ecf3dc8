"""A plan that fits, found fast: per structure, the family's most memory-saving knobs
(`ratrain.planner.saving`) with the cheapest recompute the memory bound allows, confirmed
by the ledger (`find_feasible`). The explanation of an infeasible request
(`ratrain.planner.explain`) scans sizes with it. Pure Python.
"""

from __future__ import annotations

import heapq
import time
from typing import NamedTuple

from ratrain.config import Plan
from ratrain.deadline import Budget, OutOfTime, Rate
from ratrain.planner.evaluate import Evaluator, MemoryReport, usable_bytes
from ratrain.planner.fit import first_overflow_bytes, options
from ratrain.planner.saving import saves, saving_order
from ratrain.planner.space import (
    Knobs,
    Request,
    Structure,
    family_of,
    knob_combos,
    knobs_key,
    make_plan,
    structures,
)
from ratrain.planner.structure import states_lower_bound_bytes
from ratrain.planner.time_bound import peak_unit_times, step_time_lower_bound_s
from ratrain.sim.simulate import memory_microbatches

__all__ = ["Fit", "ReplayClock", "find_feasible"]


class Fit(NamedTuple):
    """A plan found to fit: its ledger report (None where `find_feasible` was asked not to
    confirm it) and the family whose knobs it has."""

    plan: Plan
    report: MemoryReport | None
    family: str
    st: Structure | None = None
    """Its structure and knobs (`relax` reads them)."""
    kn: Knobs | None = None


def find_feasible(
    req: Request,
    ev: Evaluator | None = None,
    *,
    confirm: bool = True,
    max_replays: int | None = None,
    budget: Budget | None = None,
    fastest_first: bool = False,
) -> Fit | None:
    """Some plan that fits, if any: per structure, the most memory-saving knobs and per
    stage the cheapest recompute the bound allows, confirmed (and raised) by the ledger.
    `confirm=False`: the first candidate the memory bound does not rule out (no ledger;
    its report is None), a cheap necessary condition for `find_feasible` to find one.
    `max_replays`: give up (None) after that many structures the bound allows but the
    ledger rejects (a scan of many sizes stays quick; what it returns still fits).
    `budget`: raises `OutOfTime` past its soft limit (what was confirmed so far is the
    caller's to report). `fastest_first`: the ledger confirms the candidates by their
    step-time bound (`_bound_s`), not by the room they leave under the cap: the first that
    fits is then a fast one, not only a likely one."""
    budget = budget or Budget()
    ev = ev or Evaluator(req)
    rejected = 0
    limit = usable_bytes(req)
    if "micro_batch" not in req.pins:  # only the smallest is tried (below): skip the others
        req = req.with_(pins={**req.pins, "micro_batch": 1})
    allowed = []  # (largest stage bound, order, structure, knobs, options, family)
    ruled: dict[Structure, list[Knobs]] = {}  # knobs the bounds ruled out, per structure
    lazy = fastest_first and confirm
    for name in req.families:
        fam = family_of(name)
        if req.pins.get("schedule", fam.schedule) != fam.schedule:
            continue
        combos: dict[tuple, list[Knobs]] = {}  # by knobs_key: the same combinations
        for st in structures(req, fam):
            # The smallest micro-batch holds the fewest activations and, with the largest
            # dp, the smallest optimizer shards: the others cannot fit where it does not.
            if st.micro_batch != req.pins["micro_batch"]:
                continue
            budget.check()
            ck = knobs_key(req, st)
            kns = combos.get(ck)
            if kns is None:
                kns = combos[ck] = sorted(knob_combos(req, fam, st), key=saving_order)
            if not kns:
                continue
            kn = kns[0]
            # Families share structures: one whose knobs save no less was ruled out here.
            if any(saves(o, kn) for o in ruled.get(st, ())):
                continue
            if max(states_lower_bound_bytes(req, st, kn)) > limit:
                ruled.setdefault(st, []).append(kn)
                continue
            if lazy:  # the costlier checks when its turn comes (`_fastest_fit`)
                allowed.append((_bound_s(req, st, kn, None, fam), len(allowed), st, kn, None, fam))
                continue
            opts = _opts(req, st, kn)
            if opts is None:
                ruled.setdefault(st, []).append(kn)
                continue
            if not confirm:
                return Fit(make_plan(req, st, kn, ("full",) * st.pp), None, fam.name)
            key = _bound_s(req, st, kn, opts, fam) if fastest_first else max(opts.bound_bytes)
            allowed.append((key, len(allowed), st, kn, opts, fam))
    if lazy:
        return _fastest_fit(ev, req, allowed, ruled, budget, max_replays)
    # The most room under the cap by the bound first: the likeliest to fit by the ledger,
    # so a scan of sizes rarely pays for a rejected replay.
    for _, _, st, kn, opts, fam in sorted(allowed, key=lambda a: a[:2]):
        budget.check()
        found = _confirm(ev, req, st, kn, opts, fam.per_stage_recompute, budget)
        if found is not None:
            return Fit(*found, fam.name, st, kn)
        rejected += 1
        if max_replays is not None and rejected >= max_replays:
            return None
    return None


def _opts(req: Request, st: Structure, kn: Knobs):
    """The recompute options the memory bound leaves these knobs (`ratrain.planner.fit.
    options`), or None where the bound rules them out."""
    if first_overflow_bytes(req, st, kn) is not None:
        return None
    opts = options(req, st, kn, None)
    return opts if opts.feasible(True) else None


def _fastest_fit(ev, req, allowed, ruled, budget: Budget, max_replays: int | None):
    """`find_feasible(fastest_first=True)`'s confirmations, by the step-time bound, with the
    recompute options of a candidate worked out only when its turn comes: each starts at
    its bound without recomputation (`_bound_s` with no options: none is faster), and is
    refined to its bound with the recomputation the memory bound forces when it is the
    smallest left. The ledger confirms candidates in the order of their refined bounds,
    as with every bound worked out first (`_bound_s` with no options is no larger), at a
    fraction of the memory bounds: llama3-405b on 1000 h100-80g clusters refined 104 of
    its 487 candidates before the first that fits."""
    heap = [(key, n, False, st, kn, fam, None) for key, n, st, kn, _, fam in allowed]
    heapq.heapify(heap)
    rejected = 0
    while heap:
        budget.check()
        key, n, refined, st, kn, fam, opts = heapq.heappop(heap)
        if any(saves(o, kn) for o in ruled.get(st, ())):
            continue  # a family's knobs that save no less were ruled out meanwhile
        if not refined:
            opts = _opts(req, st, kn)
            if opts is None:
                ruled.setdefault(st, []).append(kn)
            else:
                heapq.heappush(heap, (_bound_s(req, st, kn, opts, fam), n, True, st, kn, fam, opts))
            continue
        found = _confirm(ev, req, st, kn, opts, fam.per_stage_recompute, budget)
        if found is not None:
            return Fit(*found, fam.name, st, kn)
        rejected += 1
        if max_replays is not None and rejected >= max_replays:
            return None
    return None


RELAX_REPLAYS = 2
"""assumed: ledger replays `relax` may spend (each 0.1-0.4 s on 70B-405B plans on the 2-core
machine), on the relaxations the memory bound allows, most relaxed first."""


def relax(ev, req: Request, fit: Fit, budget: Budget, replays: int = RELAX_REPLAYS) -> Fit:
    """`fit` with its knobs relaxed where the ledger finds the plan still fits: the look's
    plan takes its structure's most memory-saving knobs, and those that cost the most time
    (activation offload, transient views) often save memory the plan does not need
    (llama3-405b on 1000 h100-80g clusters: pp=31 with offload peaked at 53 of 70 GB and
    simulated at 393 s/step; without it, views fetched two ahead, 68 GB and 349 s). The
    structure's other combinations that save no more than `fit`'s (`saves`; the same pass
    order and rank layout), the most relaxed first (the largest memory ranks in all), each
    with the most memory-saving recompute its memory bound allows: the first the bound
    allows and the ledger confirms, within `replays` replays; else `fit`. Out of time
    (`OutOfTime` past `budget`'s soft limit): `fit`."""
    if fit.st is None or fit.kn is None:
        return fit
    fam = family_of(fit.family)
    st, kn0 = fit.st, fit.kn
    kns = [
        kn
        for kn in knob_combos(req, fam, st)
        if kn != kn0
        and saves(kn0, kn)
        and (kn.pipeline, kn.rank_layout) == (kn0.pipeline, kn0.rank_layout)
    ]
    try:
        # the most relaxed first: the largest memory ranks in all (`saving_order`)
        for kn in sorted(kns, key=lambda k: (-sum(saving_order(k)), saving_order(k))):
            if replays <= 0:
                break
            budget.check()
            if max(states_lower_bound_bytes(req, st, kn)) > usable_bytes(req):
                continue
            opts = _opts(req, st, kn)
            if opts is None:
                continue
            replays -= 1
            found = _confirm(ev, req, st, kn, opts, fam.per_stage_recompute, budget)
            if found is not None:
                return Fit(*found, fam.name, st, kn)
    except OutOfTime:
        pass
    return fit


def _bound_s(req: Request, st: Structure, kn: Knobs, opts, fam) -> float:
    """The step-time bound, at the dtype's peak, of the plan `_confirm` replays first for
    these knobs: the most memory-saving recompute the memory bound allows (`opts` None:
    no recomputation, a bound of that)."""
    ut = peak_unit_times(
        req.spec, req.platform, st.micro_batch, req.seq, req.compute_dtype, kn.loss_chunk_tokens
    )
    if "recompute" in req.pins:
        rec = req.pins["recompute"]
        rec = (rec,) * st.pp if isinstance(rec, str) else tuple(rec)
    elif opts is None:  # before the memory bound's options: none, the fastest
        rec = ("none",) * st.pp
    elif fam.per_stage_recompute:
        rec = tuple(o[-1] for o in opts.per_stage)
    else:
        rec = (opts.uniform[-1],) * st.pp
    m = st.microbatches(req.global_batch)
    return step_time_lower_bound_s(st.layer_split, m, ut, rec, pipeline=kn.pipeline)


class ReplayClock:
    """What a ledger confirmation is expected to take: its work (microbatches replayed,
    those of the shortened step where `Evaluator.memory` shortens it, x the model's units)
    at the slowest rate seen so far in this process (a `Rate`), or a default before the
    first one."""

    DEFAULT_S_PER_WORK = 120e-6
    """measured: 70-115 us per unit-microbatch (lowering and ledger replay, CPU time) over
    seven 7B-70B plans on mt3000, a100-80g and cpu-local on the shared 2-core machine."""

    def __init__(self) -> None:
        self.rate = Rate(self.DEFAULT_S_PER_WORK, slowest=True)

    @staticmethod
    def work(req: Request, plan: Plan) -> int:
        # Where sends are held to the step's end (cpu-local) the ledger replays the whole
        # step, not the shortened one (`Evaluator.memory`).
        full = req.platform.sends_held_until_waited
        microbatches = plan.microbatches if full else memory_microbatches(plan)
        return microbatches * (req.spec.n_layers + 2)

    def expected_s(self, req: Request, plan: Plan) -> float:
        return self.rate.expected_s(self.work(req, plan))

    def record(self, req: Request, plan: Plan, seconds: float) -> None:
        self.rate.record(self.work(req, plan), seconds)


_CLOCK = ReplayClock()


def _confirm(ev, req, st, kn, opts, per_stage: bool, budget: Budget):
    if "recompute" in req.pins:
        rec = req.pins["recompute"]
        rec = (rec,) * st.pp if isinstance(rec, str) else tuple(rec)
        if len(rec) != st.pp:
            return None
        plan = make_plan(req, st, kn, rec)
        rep = _replay(ev, req, plan, budget)
        return (plan, rep) if rep.fits else None
    if not per_stage:
        for o in opts.uniform[::-1][:1] + opts.uniform[:1]:
            plan = make_plan(req, st, kn, (o,) * st.pp)
            rep = _replay(ev, req, plan, budget)
            if rep.fits:
                return plan, rep
        return None
    # The most-saving policy each stage allows: if that does not fit, nothing does here.
    rec = tuple(o[-1] for o in opts.per_stage)
    plan = make_plan(req, st, kn, rec)
    rep = _replay(ev, req, plan, budget)
    return (plan, rep) if rep.fits else None


def _replay(ev: Evaluator, req: Request, plan: Plan, budget: Budget) -> MemoryReport:
    """The ledger's report of `plan`; not started when it is expected to end past the
    budget (a replay is not interrupted)."""
    if budget.limited:
        budget.check(_CLOCK.expected_s(req, plan))
    t0, n = time.perf_counter(), ev.n_memory
    rep = ev.memory(plan)
    if ev.n_memory > n:  # not a cached report
        _CLOCK.record(req, plan, time.perf_counter() - t0)
    return rep
