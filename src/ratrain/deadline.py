"""The planner's time: one `Budget` for a search and its explanation, and the check that
long pure computations make between their phases.

A `Budget` is a clock (started at `start`, `time.perf_counter`) with two limits: the soft
one (`soft_s`, the time budget: once a plan is ranked, the search stops there) and the
hard one (`hard_s`: with no plan yet, it stops there too). `over_soft(ahead_s)` asks
whether a step expected to take `ahead_s` more would end past the soft limit (the
estimate is the caller's: `Rate` keeps one from what was measured). The `ratrain plan`
defaults (`DEFAULT_TIME_BUDGET_S` and the factors below) are the budget's own
(`Budget.for_plan`, `Budget.explanation`).

The planner's first simulation of a deep pipeline can take seconds. Where the search has
no plan yet, it runs that simulation under `until(budget)`; the simulator, the schedule
lowering and the steady-state extrapolation call `check()` between their phases (never
inside a phase's inner loop), which raises `OutOfTime` once the clock is past the budget's
hard limit, so a simulation overruns it by at most one phase. The budget is carried to
them by a context variable (only a `Budget` enters it), not through their signatures.
Outside `until`, `check()` costs one lookup. Pure Python.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

__all__ = [
    "DEFAULT_TIME_BUDGET_S",
    "EXPLAIN_BUDGET_FACTOR",
    "EXPLAIN_MIN_FACTOR",
    "FLOOR_BUDGET_FRACTION",
    "GAP_ENOUGH",
    "INFEASIBLE_BUDGET_FACTOR",
    "LOOK_APART_AT",
    "LOOK_APART_LATE",
    "REFINED_FIRST_AT",
    "DIVE_GRACE",
    "WALK_SHARE",
    "NO_FIT_BUDGET_FACTOR",
    "Budget",
    "OutOfTime",
    "Rate",
    "check",
    "explain_budget_s",
    "until",
]

DEFAULT_TIME_BUDGET_S = 1.2
"""assumed: an interactive answer within about 2 s of a fresh process (start-up about 0.3 s,
a fifth of the budget more to tighten the gap after a cut); the exact search is one flag away
(--time-budget 0)."""

NO_FIT_BUDGET_FACTOR = 5.0
"""measured: with no plan fitting yet, the search goes on to 5x the budget (6 s by default)
before it answers that none was found in time. At 2.5x (3 s), on the 2-core machine on a
day it ran about 2x slower than when the default budget was set, llama2-70b, qwen2.5-32b
(1024 mt3000 clusters) and llama2-13b (64 a100-80g clusters) got "no plan found" at
3.6-4.2 s; at 5x each was answered, its first plan found after 2.6-4.5 s of search
(`docs/paper_eval.md`, "The hard deadline on a slower day"). Only a search with no plan fitting yet runs
that long: one cut at the budget with a plan answers as before."""

EXPLAIN_BUDGET_FACTOR = 0.4
"""assumed: the explanation of an infeasible request searches for its suggested changes for
0.4x the budget (0.48 s by default), so that "this cannot fit" comes within about 1 s."""

INFEASIBLE_BUDGET_FACTOR = 0.6
"""assumed: the command's own start-up (imports, reading the platform), the proof of
infeasibility and its explanation together keep to 0.6x the budget (0.72 s by default,
under 1 s with the interpreter's start): a command that took longer to get there leaves the
explanation less than `EXPLAIN_BUDGET_FACTOR`, down to `EXPLAIN_MIN_FACTOR`."""

EXPLAIN_MIN_FACTOR = 0.1
"""assumed: whatever the search took, the explanation may look for changes for 0.1x the
budget (the closest miss and its worst stage are described in any case)."""

FLOOR_BUDGET_FRACTION = 0.2
"""assumed: after a cut, a fifth of the budget more for tightening the bounds left (no
simulation), which shrinks the gap reported."""

GAP_ENOUGH = 0.01
"""assumed: a `ratrain plan` search stops, before its time budget, once its best plan is
certified within 1% of the optimum over the space (the step-time bound left is at least the
best step / 1.01), and the tightening after a cut stops there too. A hundredth is a tenth
of the cost model's own error against measured steps (about 10%, `docs/validation.md`) and
a fifth of the 5% gap the planner aims to certify within its budget; `--gap 0` searches to
the budget (and `--time-budget 0` to the optimum, whatever the gap)."""


LOOK_APART_AT = 0.25
"""assumed: with no plan ranked by this fraction of the soft limit (0.3 s at the default
budget), the search looks for a fitting plan apart (`ratrain.planner.search._dive`), and
that plan, simulated, is kept apart while the search looks on for a faster plan of its own
(`DIVE_GRACE`); the faster of them is the answer. Where memory is tight the fastest structures are those that do not fit, and a
search that only worked through them by their step-time bound answered "no plan found in
time" to jobs that fit (llama2-70b on 64 a100-80g and 128 h100-80g clusters). The look
takes 0.2-0.8 s on such jobs on the 2-core machine; a search that ranks a plan of its own
by then does not pay for it."""

LOOK_APART_LATE = 1.0
"""assumed: where no structure the search has worked on has come to nothing yet (all that
stands between it and a first plan is the simulation of the one it is working on), the
look apart waits until this fraction of the soft limit (1.2 s at the default budget)
rather than `LOOK_APART_AT`. Begun at 0.3 s on jobs that are not memory-tight, the look
took 0.7-2.7 s of the answer on the 2-core machine for a plan of the structure's most
memory-saving knobs (llama2-70b on 96 a100-80g clusters: 506.6 s per step, where the search,
left to it, ranked the optimum, 435.7 s, by 0.8-1.1 s; llama3-405b on 1000 h100-80g: 348.8 s,
where the search ranked 125.3 s)."""

REFINED_FIRST_AT = 0.5
"""assumed, then measured: with no plan ranked once the search has refined structures' bounds
for this fraction of the soft limit (0.6 s at the default budget, counted from when the heap
of structures is built), it runs the structure of smallest refined bound at once, ahead of
those whose first bounds are still smaller (`ratrain.planner.search._refined_first`). On
the wide grid (`benchmarks/plan_grid.py --wide`, 288 jobs, interleaved with the search
without it, the 2-core machine): answers over 2 s 29 to 18, steps geometric mean 0.997 (9
faster by over 1%, 4 slower), certified gaps of at most 5% 131 to 126 of 202. At 0.25 the
first structures refined were run before the likelier fastest were reached: answers over
2 s 27 to 16 but gaps of at most 5% 128 to 111 (llama2-70b on 96 mt3000 clusters at
64 x 4096: pp=42 ran, 519.1 s per step, where pp=48's 490.0 s is the optimum)."""
DIVE_GRACE = 2.0
"""assumed: with the plan looked for apart in hand, the search goes on for a plan of its own
until this many times the soft limit (2.4 s at the default budget; never past the hard
limit), and answers with the faster of the two. The look's plan takes the most
memory-saving knobs, so it is often far slower than the search's own first fit: answering
with it at the soft limit gave llama2-70b on 1024 mt3000 clusters 3,011 tokens/s where the
search, 0.5 s later, found 4,990 (benchmarks/plan_grid.py --quick)."""

WALK_SHARE = 0.5
"""assumed: with the look's plan in hand, the share of the time left to `DIVE_GRACE` x the
soft limit that the walk of its structure's knob queue takes (`ratrain.planner.search.
_walk`); the search goes on for a plan of its own in the rest. Each wins jobs the other
loses on the 2-core machine: given all of it, the walk took llama2-70b on 1000 h100-80g
clusters from 69 s per step to 18.5 s, but left qwen2.5-32b on 1000 mt3000 clusters at
248 s where the search had found 179 s in that time, and llama2-7b on 24 mt3000 clusters at
5,685 s where it had found 4,337 s."""


def explain_budget_s(budget_s: float, search_s: float) -> float:
    """The explanation's time for an infeasible request whose search (with the command's
    start-up before it) took `search_s`."""
    left = INFEASIBLE_BUDGET_FACTOR * budget_s - search_s
    return min(EXPLAIN_BUDGET_FACTOR, max(EXPLAIN_MIN_FACTOR, left / budget_s)) * budget_s


class OutOfTime(Exception):
    """A budget's limit passed: raised by `check()` past the hard limit of the budget
    `until` entered, and by `Budget.check` past the soft one."""


@dataclass(frozen=True)
class Budget:
    """A clock and its limits (seconds from `start`; None: no limit)."""

    soft_s: float | None = None
    """The time budget: with a plan ranked, the search stops here."""
    hard_s: float | None = None
    """With no plan yet, the search stops here."""
    start: float = field(default_factory=time.perf_counter)
    """When the clock started (`time.perf_counter`)."""
    origin: float | None = None
    """When the answer began (the command's start, before its imports), where earlier than
    `start`: that time counts against the explanation's share (`explanation`)."""
    gap: float = 0.0
    """With a soft limit: the search stops sooner, once its best plan is certified within
    this of the optimum, relative (`close_enough`); 0: only at its limits."""

    @classmethod
    def for_plan(
        cls, budget_s: float | None, origin: float | None = None, gap: float = GAP_ENOUGH
    ) -> Budget:
        """`ratrain plan`'s budget: `budget_s` (None: none), and `NO_FIT_BUDGET_FACTOR` x
        that with no plan fitting yet, stopping sooner at a certified `gap`; its clock
        starts now."""
        if budget_s is None:
            return cls(origin=origin)
        return cls(budget_s, budget_s * NO_FIT_BUDGET_FACTOR, origin=origin, gap=gap)

    def restarted(self) -> Budget:
        """The same limits on a clock started now (each search of a command its own)."""
        return replace(self, start=time.perf_counter())

    @property
    def soft(self) -> float | None:
        """The soft limit as a `time.perf_counter` time."""
        return None if self.soft_s is None else self.start + self.soft_s

    @property
    def hard(self) -> float | None:
        """The hard limit as a `time.perf_counter` time."""
        return None if self.hard_s is None else self.start + self.hard_s

    @property
    def limited(self) -> bool:
        return self.soft_s is not None

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def over_soft(self, ahead_s: float = 0.0) -> bool:
        """Past the soft limit, or past it after `ahead_s` more seconds of work."""
        soft = self.soft
        return soft is not None and time.perf_counter() + ahead_s > soft

    def close_enough(self, step_s: float, floor_s: float | None) -> bool:
        """Whether a best step of `step_s` against the least step-time bound left
        (`floor_s`; None: none known) is within `gap` of the optimum (never without a
        soft limit or a gap)."""
        if not self.gap or self.soft_s is None or floor_s is None:
            return False
        return step_s <= floor_s * (1.0 + self.gap)

    def look_apart_due(self, stuck: bool = True) -> bool:
        """Past `LOOK_APART_AT` of the soft limit where the search is `stuck` (something it
        worked on came to no plan), else past `LOOK_APART_LATE` of it (never without both
        limits)."""
        if self.soft_s is None or self.hard_s is None:
            return False
        at = LOOK_APART_AT if stuck else LOOK_APART_LATE
        return time.perf_counter() > self.start + at * self.soft_s

    def with_grace(self) -> Budget:
        """This budget with its hard limit brought to `DIVE_GRACE` x the soft one, where that
        is sooner (a plan looked for apart is in hand: `ratrain.planner.search._dive`)."""
        if self.soft_s is None or self.hard_s is None:
            return self
        return replace(self, hard_s=min(self.hard_s, DIVE_GRACE * self.soft_s))

    def share_of_grace(self, share: float) -> Budget:
        """From now, `share` of the time left to `with_grace`'s hard limit, as both limits
        (this budget where it has no soft limit)."""
        grace = self.with_grace()
        if grace.hard_s is None:
            return self
        left = max(0.0, grace.hard_s - self.elapsed_s())
        return Budget(share * left, share * left)

    def over_hard(self) -> bool:
        hard = self.hard
        return hard is not None and time.perf_counter() > hard

    def check(self, ahead_s: float = 0.0) -> None:
        """Raise `OutOfTime` where `over_soft(ahead_s)`."""
        if self.over_soft(ahead_s):
            raise OutOfTime

    def spent_s(self, search_s: float) -> float:
        """What the answer has taken so far: since `origin` (imports, the platform, the
        search), or `search_s` (the search alone) without one."""
        if self.origin is None:
            return search_s
        return max(search_s, time.perf_counter() - self.origin)

    def explanation(self, search_s: float) -> Budget:
        """The explanation's budget, started now, for an infeasible request whose search
        took `search_s` (`explain_budget_s`; none without a soft limit)."""
        if self.soft_s is None:
            return Budget(origin=self.origin)
        return Budget(explain_budget_s(self.soft_s, self.spent_s(search_s)), origin=self.origin)

    def tightening(self) -> Budget | None:
        """After a cut, the time for tightening the bounds left, started now:
        `FLOOR_BUDGET_FRACTION` of the soft limit (None without one, or at 0)."""
        if not self.soft_s:
            return None
        return Budget(FLOOR_BUDGET_FRACTION * self.soft_s, gap=self.gap)


@dataclass
class Rate:
    """What a step of some kind is expected to take: its work (in the caller's units) at
    the rate measured so far, the slowest seen (`slowest`) or the last, or `default_s` per
    unit before any (None: 0 s expected)."""

    default_s: float | None = None
    slowest: bool = True
    s_per_unit: float | None = None

    def expected_s(self, work: float) -> float:
        rate = self.default_s if self.s_per_unit is None else self.s_per_unit
        return 0.0 if rate is None else rate * work

    def record(self, work: float, seconds: float) -> None:
        rate = seconds / work
        if self.slowest and self.s_per_unit is not None:
            rate = max(self.s_per_unit, rate)
        self.s_per_unit = rate


_ACTIVE: ContextVar[Budget | None] = ContextVar("ratrain_budget", default=None)


@contextmanager
def until(budget: Budget | None) -> Iterator[None]:
    """Within the block, `check()` raises `OutOfTime` once `budget`'s hard limit passes
    (None, or a budget without a hard limit: the enclosing one, if any, holds)."""
    if budget is None or budget.hard_s is None:
        yield
        return
    token = _ACTIVE.set(budget)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> Budget | None:
    """The budget the innermost `until` entered (None outside)."""
    return _ACTIVE.get()


def check() -> None:
    """Between phases: raise `OutOfTime` past the hard limit of the budget `until` entered."""
    budget = _ACTIVE.get()
    if budget is not None and budget.over_hard():
        raise OutOfTime
