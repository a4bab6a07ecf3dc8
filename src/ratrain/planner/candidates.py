"""The plans a trial measures (`ratrain plan --trial K`, `ratrain train --plan auto`): the
best predicted plans of a search's `K` best structures (pp, dp, micro-batch, split, pass
order) per schedule, each compared family's best structure run under ratrain's lifecycle
(the lifecycle choosing its knobs), and each compared family's best plan itself, knobs
included, under ratrain's lifecycle; no structure twice under one schedule but for those
last, and no plan twice.

One plan per structure: the plans that differ only in knobs (views, gradient dtype, fused
loss) are predicted within a fraction of a percent of each other, so the K best plans
alone are often K knob variants of one structure, while the prediction's errors that
decide the order are those of the structures (micro-batch size, pass order).

The prediction ranks a space of thousands; its error on one plan (10-30% measured) is
larger than the gaps between the last few, so those few are measured
(`ratrain.validate.trial`). The other families' structures are among them because the
prediction has ranked a ratrain plan on such a structure below the one it picked while it
measured faster; their plans, knobs and all, because another family's plan on the very
structure of ratrain's pick, with other knobs (persistent views and an unsharded
optimizer, where the pick sharded it and fetched views), has measured faster than the pick
while no plan with those knobs was tried (docs/paper_eval.md, the 2 x 2 sweep with the
trial's rounds). Pure Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ratrain.config import Plan
from ratrain.deadline import Budget
from ratrain.planner.families import COMPARED_FAMILIES, FAMILIES
from ratrain.planner.report import describe
from ratrain.planner.result import Candidate
from ratrain.planner.search import search
from ratrain.planner.space import Request
from ratrain.schema import pinnable

__all__ = [
    "LIFECYCLE",
    "STRUCTURE_FIELDS",
    "WITHIN",
    "TrialCandidate",
    "family_bests",
    "lifecycle_plans",
    "lifecycle_variants",
    "plan_key",
    "plan_pins",
    "structure_key",
    "select",
    "structure_pins",
    "trial_candidates",
]

LIFECYCLE = "ratrain"
"""The family whose lifecycle the other families' structures are run under."""

WITHIN = 0.5
"""assumed: a plan is tried only where its predicted tokens/s are at least half the
first's. The prediction's worst errors seen are 27% (loopback) and 55% high (the 4x1,
50 Mbit/s sweep, docs/paper_eval.md); a plan predicted twice as slow would need errors of
both signs past those to measure faster, and its run would cost the trial the most."""

STRUCTURE_FIELDS = ("pp", "dp", "micro_batch", "layer_split", "pipeline")
"""What a plan's structure is: the pipeline's shape, its split and its pass order (the
knobs that decide memory and overlap, and the schedule, are the lifecycle's own)."""


@dataclass(frozen=True)
class TrialCandidate:
    """A plan to measure, with its prediction and why it is tried."""

    plan: Plan
    family: str
    predicted_tokens_per_s: float
    predicted_step_s: float
    source: str
    """"#i": the search's i-th plan; "<family> structure": that family's best structure
    under ratrain's lifecycle."""
    found: Candidate | None = field(default=None, compare=False, repr=False)
    """The search's entry (its memory per stage), where it came from one."""

    @property
    def name(self) -> str:
        return describe(self.plan)

    def to_json(self) -> dict:
        return {
            "plan": self.plan.to_dict(),
            "describe": self.name,
            "family": self.family,
            "source": self.source,
            "predicted_tokens_per_s": self.predicted_tokens_per_s,
            "predicted_step_time_s": self.predicted_step_s,
        }


def plan_key(plan: Plan) -> str:
    """One text per plan: two candidates with the same key are the same run."""
    return json.dumps(plan.to_dict(), sort_keys=True, default=str)


def structure_key(plan: Plan) -> tuple:
    """A schedule's structure: two plans with the same key are one structure run under
    one lifecycle (they differ in knobs only)."""
    return (plan.schedule, *(getattr(plan, f) for f in STRUCTURE_FIELDS))


def structure_pins(plan: Plan) -> dict[str, object]:
    """The pins that hold a search to `plan`'s structure (`STRUCTURE_FIELDS`)."""
    pins = {f: getattr(plan, f) for f in STRUCTURE_FIELDS}
    if pins["layer_split"] is None:
        del pins["layer_split"]
    return pins


def plan_pins(plan: Plan) -> dict[str, object]:
    """The pins that hold a search to `plan` itself, knobs included, under any schedule:
    every pinnable field but the schedule."""
    return {f: getattr(plan, f) for f in pinnable(Plan) if f != "schedule"}


def _of(c: Candidate, source: str) -> TrialCandidate:
    return TrialCandidate(c.plan, c.family, c.tokens_per_s, c.step_time_s, source, c)


def select(
    ranked: list[Candidate],
    k: int,
    variants: Mapping[str, Candidate | None],
    plans: Mapping[str, Candidate | None] | None = None,
) -> list[TrialCandidate]:
    """The best plan of each of the first `k` structures of `ranked` (fastest first: its
    first is the prediction-only pick, and stays first), then each family's structure under
    the lifecycle (`variants`: family -> that plan, None where none fits) whose structure
    is not tried already (`structure_key`), then each family's own plan under the
    lifecycle (`plans`, alike) that is not tried already (`plan_key`); none predicted
    slower than `WITHIN` x the first."""
    if k < 1:
        raise ValueError(f"select: k must be >= 1, got {k}")
    out: list[TrialCandidate] = []
    seen: set[tuple] = set()
    floor = WITHIN * ranked[0].tokens_per_s if ranked else 0.0
    for i, c in enumerate(ranked):
        if len(out) == k:
            break
        if structure_key(c.plan) not in seen and (i == 0 or c.tokens_per_s >= floor):
            seen.add(structure_key(c.plan))
            out.append(_of(c, f"#{i + 1}"))
    for fam, c in variants.items():
        if c is not None and structure_key(c.plan) not in seen and c.tokens_per_s >= floor:
            seen.add(structure_key(c.plan))
            out.append(_of(c, f"{fam} structure"))
    tried = {plan_key(c.plan) for c in out}
    for fam, c in (plans or {}).items():
        if c is not None and plan_key(c.plan) not in tried and c.tokens_per_s >= floor:
            tried.add(plan_key(c.plan))
            out.append(_of(c, f"{fam} plan"))
    return out


def family_bests(
    req: Request, budget: Budget | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Candidate | None]:
    """Each compared family's best plan for `req` (None where none fits or none was found
    in time), each searched on its own clock (`budget.restarted()`)."""
    budget = budget or Budget()
    out: dict[str, Candidate | None] = {}
    for name in COMPARED_FAMILIES:
        if req.pins.get("schedule") not in (None, FAMILIES[name].schedule):
            continue
        res = search(
            req.with_(families=(name,)), top=1, progress=progress, budget=budget.restarted()
        )
        out[name] = res.best
    return out


def _under_lifecycle(
    req: Request,
    bests: Mapping[str, Candidate | None],
    pins_of: Callable[[Plan], dict[str, object]],
    budget: Budget | None,
) -> dict[str, Candidate | None]:
    """Per family of `bests`: ratrain's best plan under `req`'s pins and `pins_of` that
    family's best plan; None where the family has none or no ratrain plan fits so.
    Nothing where `req` does not let ratrain's lifecycle run (its families or a schedule
    pin)."""
    if LIFECYCLE not in req.families or req.pins.get("schedule") not in (None, LIFECYCLE):
        return {}
    budget = budget or Budget()
    out: dict[str, Candidate | None] = {}
    for fam, best in bests.items():
        if best is None or fam == LIFECYCLE:
            continue
        pinned = req.with_(families=(LIFECYCLE,), pins={**req.pins, **pins_of(best.plan)})
        out[fam] = search(pinned, top=1, budget=budget.restarted()).best
    return out


def lifecycle_variants(
    req: Request,
    bests: Mapping[str, Candidate | None],
    budget: Budget | None = None,
) -> dict[str, Candidate | None]:
    """Per family of `bests`: ratrain's best plan on that family's best structure
    (`structure_pins`; the lifecycle chooses its own recompute, views, sharding), None
    where the family has none or no ratrain plan fits it (`_under_lifecycle`)."""
    return _under_lifecycle(req, bests, structure_pins, budget)


def lifecycle_plans(
    req: Request,
    bests: Mapping[str, Candidate | None],
    budget: Budget | None = None,
) -> dict[str, Candidate | None]:
    """Per family of `bests`: that family's best plan itself, knobs included, under
    ratrain's lifecycle (`plan_pins`), predicted and checked by the ledger as ratrain's;
    None where the family has none or it does not fit so (`_under_lifecycle`)."""
    return _under_lifecycle(req, bests, plan_pins, budget)


def trial_candidates(
    req: Request,
    ranked: list[Candidate],
    k: int,
    *,
    bests: Mapping[str, Candidate | None] | None = None,
    budget: Budget | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TrialCandidate]:
    """The plans a trial of `k` measures for `req`, whose search ranked `ranked`: `select`
    over the lifecycle variants and the lifecycle plans of each compared family's best
    (`bests`, or searched here by `family_bests`)."""
    if bests is None:
        bests = family_bests(req, budget, progress)
    bests = {f: c for f, c in bests.items() if isinstance(c, Candidate)}
    return select(
        ranked, k, lifecycle_variants(req, bests, budget), lifecycle_plans(req, bests, budget)
    )
