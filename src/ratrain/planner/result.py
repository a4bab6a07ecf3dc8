"""What a search returns: the plans ranked (`Candidate`), the closest miss when none fits
(`Near`), a plan found to fit but not timed (`Untimed`), the result itself
(`SearchResult`), and the running top (`Top`). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ratrain.config import Plan
from ratrain.deadline import Budget
from ratrain.planner.space import Request
from ratrain.sim.result import SimResult

__all__ = [
    "Candidate",
    "Near",
    "SearchResult",
    "Top",
    "Untimed",
    "candidate_of",
    "closer",
    "may_be_closer",
]


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
    """V-shaped plans (`ratrain.planner.vpass`) not tried for the time budget: outside the gap, which
    is over the plans with one chunk per stage."""
    first_fit_s: float | None = None
    """Seconds from the search's start to its first ranked plan (None: none)."""
    found_apart: bool = False
    """The answer is the plan looked for apart (`ratrain.planner.search._dive`), which the
    bound-ordered search did not better by its limit (`Budget.with_grace`; cut, with its
    gap)."""

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


class Top:
    """The `k` shortest steps seen so far."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.items: list[Candidate] = []

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

    def cut_by(self, budget: Budget, ahead_s: float = 0.0, floor_s: float | None = None) -> bool:
        """Past `budget`'s soft limit with some plan ranked (without one, the search goes
        on), or past it after `ahead_s` more seconds of work (a simulation about to
        start), or the best plan within `budget`'s gap of `floor_s`, the least step-time
        bound left (`Budget.close_enough`; None: not known)."""
        if not self.items:
            return False
        return budget.over_soft(ahead_s) or budget.close_enough(self.items[0].step_time_s, floor_s)


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


def may_be_closer(near: Near | None, over_at_least: int) -> bool:
    """Whether a bounded miss over the cap by at least `over_at_least` bytes could replace
    `near` in `closer` (a measured miss always stays)."""
    return near is None or (not near.measured and over_at_least < near.over_bytes)


def closer(a: Near | None, b: Near) -> Near:
    """The nearer miss; one measured by the ledger beats one only bounded."""
    if a is None:
        return b
    return b if (not b.measured, b.over_bytes) < (not a.measured, a.over_bytes) else a


def candidate_of(res: SimResult, plan: Plan, family: str, limit: int) -> Candidate:
    """The ranked entry of a simulated plan that fits."""
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
