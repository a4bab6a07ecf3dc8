"""Memory and speed of one candidate plan: the ledger and the simulator, with caches.

Feasibility is the ledger's: a plan fits when, on every stage, its peak plus the
platform's reserved workspace is at most the usable memory. The memory the planner
reports is the ledger's replay of the plan's own schedule (`ratrain.schedule.
build_schedule`), the same one `ratrain simulate --plan` reports.

During the search, memory is replayed on a shortened step: a 1F1B stage's memory repeats
from one steady-state pair to the next, so a step of a few more microbatches than stages
reaches the same per-stage peak as a longer one (`memory_microbatches`, with the simulator;
`tests/planner/test_search.py` checks the equality over schedules, policies and lookaheads).
A simulation is not replayed by the ledger again: its peaks are the shortened replay's (as
`ratrain simulate --plan` reports them; `tests/planner/test_search.py` compares ranked plans with
it). Pure Python.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ratrain.config import Plan
from ratrain.cost.model import CostModel
from ratrain.deadline import Budget, Rate
from ratrain.planner.space import Request
from ratrain.schedule import build_schedule
from ratrain.sim import steady as steady_state
from ratrain.sim.simulate import memory_microbatches, platform_ledger, simulate_schedule
from ratrain.sim.steady_one import one_point

__all__ = [
    "FULL_REPLAY_AT",
    "MemoryReport",
    "Evaluator",
    "simulated_microbatches",
    "usable_bytes",
]


FULL_REPLAY_AT = 0.75
"""measured: a shortened replay of at least this share of the step's microbatches replays the
whole step instead (at most 1/0.75 = 1.33x the shortened replay's work), whose schedule and
ledger a simulation of the same plan then reuses (`Evaluator.simulate`) instead of lowering
the step again. On the 2-core machine, llama3-405b on 1000 h100-80g clusters at 2048 x 8192
(pp=62, 128 microbatches, 127 for its memory): the lowering is 0.45 s of the plan's 2.1 s
replay and simulation."""


def usable_bytes(req: Request) -> int:
    """What a stage's ledger peak may reach: the cap less the workspace reserved from it
    and the headroom kept free (`Platform.plan_limit_bytes`)."""
    return req.platform.plan_limit_bytes


@dataclass(frozen=True)
class MemoryReport:
    """Per-stage ledger peaks of one plan against the cap."""

    peak_bytes: tuple[int, ...]
    breakdown: tuple[dict[str, int], ...]
    """Bytes per state class at each stage's peak."""
    limit_bytes: int
    """Usable memory less the workspace: the most a peak may be."""

    @property
    def fits(self) -> bool:
        return all(p <= self.limit_bytes for p in self.peak_bytes)

    def over_bytes(self, stage: int) -> int:
        return self.peak_bytes[stage] - self.limit_bytes

    @property
    def worst_stage(self) -> int:
        return max(range(len(self.peak_bytes)), key=lambda s: self.peak_bytes[s])


@dataclass
class Evaluator:
    """Counts and caches ledger replays and simulations for one request."""

    req: Request
    shortcut: bool = True
    """Replay memory on the shortened step (exact; see the module docstring)."""
    steady: bool = True
    """Time a long step from a short one (`ratrain.sim.steady`)."""
    n_memory: int = 0
    n_simulated: int = 0
    memory_s: float = 0.0
    simulate_s: float = 0.0
    last_simulate_s: float = 0.0
    """How long the last simulation took (with its memory replay): what the next may cost."""
    last_simulate_microbatches: int = 0
    """How many microbatches it simulated (`simulated_microbatches`)."""
    _mem: dict = field(default_factory=dict)
    _sim: dict = field(default_factory=dict)
    _schedule: tuple | None = None
    _short_rate: Rate = field(default_factory=lambda: Rate(slowest=False))
    """The last short step's simulation time per microbatch x stage (`_short_until`)."""

    def memory(self, plan: Plan) -> MemoryReport:
        pf = self.req.platform
        # Sends held to the end of the step (cpu-local's gloo) pile up with the microbatches:
        # there the shortened step's peak is not the full one's.
        if self.shortcut and not pf.sends_held_until_waited:
            m = memory_microbatches(plan)
            if m < FULL_REPLAY_AT * plan.microbatches:
                plan = plan.replace(global_batch=plan.micro_batch * plan.dp * m)
        key = _memory_key(plan)  # one replay for every rank layout
        hit = self._mem.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        spec = self.req.spec
        schedule = build_schedule(spec, plan)
        ledger = platform_ledger(schedule, spec, plan, pf, keep_trace=False)
        self._schedule = (key, schedule, ledger)  # a simulation of the same plan reuses both
        rep = MemoryReport(
            peak_bytes=tuple(int(st.peak_bytes) for st in ledger.stages),
            breakdown=tuple(dict(st.breakdown_at_peak) for st in ledger.stages),
            limit_bytes=usable_bytes(self.req),
        )
        self.memory_s += time.perf_counter() - t0
        self.n_memory += 1
        self._mem[key] = rep
        return rep

    def simulate(self, plan: Plan, budget: Budget | None = None):
        """The full step: `ratrain.sim.simulate`'s result (memory from `memory`'s replay,
        the full step's peaks; no memory timeline). With `budget`: None instead of a short
        step or a full simulation expected to end past its soft limit (the steady-state
        tries that fail would otherwise start a full one whatever the time)."""
        if budget is not None and not budget.limited:
            budget = None
        key = _freeze(plan)
        hit = self._sim.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        res = None
        if self.steady:
            rep = self.memory(plan)  # the shortened replay: the full step's peaks
            short = self._simulate_short if budget is None else self._short_until(budget)
            try:
                res = steady_state.extrapolate(
                    plan, short, (rep.peak_bytes, rep.breakdown), near=steady_state.NEAR
                )
            except _Late:
                return None
            if res is None and budget is not None and self._late(plan, budget):
                return None
        if res is not None:
            pass
        elif self._schedule and self._schedule[0] == _memory_key(plan):
            # The step just replayed in full: time it with the same schedule and ledger.
            _, schedule, ledger = self._schedule
            cost = CostModel(self.req.spec, plan, self.req.platform)
            res = simulate_schedule(schedule, cost, ledger=ledger, keep_events=False, drops=False)
        else:
            # Timed without a second ledger replay: the replay above has the full step's
            # peaks (the shortened step's equal them), as the steady-state path uses them.
            rep = self.memory(plan)
            res = self._simulate_full(plan)
            res.peak_memory_bytes = list(rep.peak_bytes)
            res.memory_breakdown = [dict(b) for b in rep.breakdown]
        self.last_simulate_s = time.perf_counter() - t0
        self.last_simulate_microbatches = simulated_microbatches(plan, self.steady)
        self.simulate_s += self.last_simulate_s
        self.n_simulated += 1
        self._sim[key] = res
        return res

    def expected_simulate_s(self, plan: Plan) -> float:
        """What simulating `plan` is expected to take: the last simulation's time, scaled
        by the microbatches each simulates (the engine's events grow with them)."""
        if not self.last_simulate_microbatches:
            return self.last_simulate_s
        ratio = simulated_microbatches(plan, self.steady) / self.last_simulate_microbatches
        return self.last_simulate_s * ratio

    def _short_until(self, budget: Budget):
        """`_simulate_short`, raising `_Late` instead of starting a step expected to end
        past `budget`'s soft limit (at the rate of the last short step simulated)."""

        def short(plan: Plan):
            if self._late(plan, budget):
                raise _Late
            t0 = time.perf_counter()
            res = self._simulate_short(plan)
            self._short_rate.record(plan.microbatches * plan.pp, time.perf_counter() - t0)
            return res

        return short

    def _late(self, plan: Plan, budget: Budget) -> bool:
        """Whether simulating `plan` in full is expected to end past `budget`'s soft limit:
        the events grow with microbatches x stages, at the last short step's rate per one
        (none measured yet: not late)."""
        if not self._short_rate.s_per_unit:
            return False
        return budget.over_soft(self._short_rate.expected_s(plan.microbatches * plan.pp))

    def _simulate_short(self, plan: Plan):
        """A shortened step's timing alone (no ledger: its memory is the plan's replay),
        with the events the steady-state checks read."""
        return self._timed(plan, keep_events=True)

    def _simulate_full(self, plan: Plan):
        """The whole step's timing alone, without its events (the search reads none)."""
        return self._timed(plan, keep_events=False)

    def _timed(self, plan: Plan, keep_events: bool):
        cost = CostModel(self.req.spec, plan, self.req.platform)
        schedule = build_schedule(self.req.spec, plan)
        # Its figures alone (and a short step's events for the steady-state checks): the
        # view drops, which time nothing, left out (`simulate_schedule`'s `drops`).
        return simulate_schedule(schedule, cost, keep_events=keep_events, drops=False)


class _Late(Exception):
    """A short step of the steady-state path would end past the simulation's deadline."""


def simulated_microbatches(plan: Plan, steady: bool = True) -> int:
    """Microbatches a simulation of `plan` runs: the steady-state shortcut's first short
    step where it applies (`ratrain.sim.steady_one.one_point`), else the step's."""
    # The thresholds are read when called: tests lower them on the module.
    limits = steady_state.MIN_SAVING, steady_state.MIN_MICROBATCHES
    m2 = one_point(plan, 0, 0, *limits) if steady else None
    return m2 or plan.microbatches


def _memory_key(plan: Plan) -> tuple:
    """`_freeze` with the rank layout left out: it moves communication, never memory."""
    return tuple(kv for kv in _freeze(plan) if kv[0] != "rank_layout")


def _freeze(plan: Plan) -> tuple:
    d = plan.to_dict()
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(d.items()))
