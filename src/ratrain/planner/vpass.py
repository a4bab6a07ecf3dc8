"""The V pass: the V-shaped pass orders (zb-v, 1f1b-v: two chunks per stage) are not
bounded, so after the search they are tried on the structures and knobs of the best plans,
each with a few chunk splits, and ranked with the rest where they fit. Pure Python.
"""

from __future__ import annotations

import itertools

from ratrain import deadline
from ratrain.config import V_PIPELINES, Plan
from ratrain.deadline import Budget, OutOfTime
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.result import Top, candidate_of
from ratrain.planner.space import Request, family_of
from ratrain.planner.splits import v_splits
from ratrain.planner.structure import State

__all__ = ["V_TRIES", "v_pass"]


V_TRIES = 3
"""assumed: the ranked plans whose structures and knobs the V-shaped pass orders are tried
on (`v_pass`), each with `splits.v_splits`' three nearest-balanced chunk splits: eighteen
simulations at most (zb-v and 1f1b-v)."""


def v_pass(req: Request, ev: Evaluator, best: Top, state: State) -> Top:
    """zb-v and 1f1b-v (`ratrain.schedule.vshape`) on the structures and knobs of the
    `V_TRIES` best plans whose family tries them (pp > 1, not fsdp-pp; without offload,
    which a V does not support), each with the chunk splits of `splits.v_splits`: the V's
    plans that fit are ranked with the rest. (Not branch and bound: no bound of a V's step
    or memory is derived, so the search's gap, where it stops early, is over the plans
    with one chunk per stage.) A pinned V keeps only its plans, another pinned pipeline
    none of them. Past the time budget with a plan ranked, the V plans left are not tried
    (`state.v_untried`); a pinned V goes on until one of its plans is ranked."""
    pin = req.pins.get("pipeline")
    if pin is not None and pin not in V_PIPELINES:
        return best
    pinned = pin is not None
    out = Top(best.k) if pinned else best
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


def _v_try(req: Request, ev: Evaluator, out: Top, state: State, plan: Plan, family: str) -> bool:
    """Rank the V plan `plan` in `out` if it fits; False (nothing done) where the time
    budget ends first, before its replay or its simulation."""
    if out.cut_by(state.budget):
        return False
    # With a plan ranked, the replay is cut at the soft limit (a deep V over many
    # microbatches takes seconds to order); a pinned V with none goes on.
    budget = state.budget
    window = Budget(budget.soft_s, budget.soft_s, start=budget.start) if out.items else None
    try:
        with deadline.until(window):
            fits = ev.memory(plan).fits
    except OutOfTime:
        return False
    if not fits:
        return True
    if out.cut_by(state.budget, ev.expected_simulate_s(plan)):
        return False
    res = ev.simulate(plan, state.budget if out.items else None)
    if res is None:  # its steady-state tries would end past the soft limit
        return False
    out.add(candidate_of(res, plan, family, usable_bytes(req)))
    return True
