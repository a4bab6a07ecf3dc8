"""A measured final choice: the few plans a search ranked best
(`ratrain.planner.candidates`) run a handful of steps on the machine, and the fastest
measured is kept (`ratrain plan --trial K`, `ratrain train --plan auto`, `ratrain bench
cluster`'s ratrain entry).

Each plan runs one job of `warmup` untimed steps then `steps` timed ones; its measure is
the slowest rank's median step (each rank's median of the timed steps, as `ratrain
validate` times a plan), as tokens/s of the global batch. A plan whose run fails (out of
memory, an error, past the time limit) is reported in one line and skipped. The
prediction-only pick is the search's first plan; its regret is how much slower it
measured than the trial's pick.

What runs a plan is a `Timer`: `local_timer` runs it on this machine's cores
(`ratrain.validate.run`); `ratrain bench cluster` passes one that runs it on the emulated
network.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line reads the defaults below without the planner
    from ratrain.models.spec import ModelSpec
    from ratrain.planner.candidates import TrialCandidate

__all__ = [
    "DEFAULT_LIMIT_S",
    "DEFAULT_PLANS",
    "DEFAULT_STEPS",
    "DEFAULT_WARMUP",
    "Timer",
    "TrialResult",
    "TrialRun",
    "local_timer",
    "pick_lines",
    "run_trial",
    "slowest_median_s",
    "trial_lines",
]

DEFAULT_PLANS = 3
"""assumed: the search's best 3 structures (`train --plan auto`), beside each compared
family's structure under ratrain's lifecycle: the measured pick of the issue's sweep was
within the first three the prediction ranked."""
DEFAULT_WARMUP = 1
"""assumed: the first step builds the schedule's buffers and the allocator's pools; it is
slower by far (2-5x on CPU) and is not timed."""
DEFAULT_STEPS = 3
"""assumed: three timed steps, their median: one slow step on a shared machine does not
move it, and a plan costs 4 steps in all."""
DEFAULT_LIMIT_S = 600.0
"""assumed: ten minutes for the whole trial, against a run of hours; plans not started by
then are reported as not tried."""

Timer = Callable[["TrialCandidate", int, float], list[list[float]]]
"""(candidate, steps in all (warm-up included), seconds it may take) -> each rank's step
times, warm-up included. Raises on a failed run."""


@dataclass
class TrialRun:
    """One plan of a trial: its timed steps (the slowest rank's median is the measure), or
    why it has none."""

    candidate: TrialCandidate
    step_s: float | None = None
    """The slowest rank's median of its timed steps."""
    tokens_per_s: float | None = None
    error: str | None = None
    wall_s: float = 0.0

    def to_json(self) -> dict:
        return {
            **self.candidate.to_json(),
            "measured_step_time_s": self.step_s,
            "measured_tokens_per_s": self.tokens_per_s,
            "error": self.error,
            "wall_s": self.wall_s,
        }


@dataclass
class TrialResult:
    runs: list[TrialRun]
    warmup: int
    steps: int
    wall_s: float
    limit_s: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def measured(self) -> list[TrialRun]:
        return [r for r in self.runs if r.tokens_per_s is not None]

    @property
    def pick(self) -> TrialRun | None:
        """The fastest measured plan (None where none ran)."""
        return max(self.measured, key=lambda r: r.tokens_per_s, default=None)

    @property
    def prediction_pick(self) -> TrialRun | None:
        """The search's first plan: what the prediction alone would have chosen."""
        return self.runs[0] if self.runs else None

    @property
    def regret(self) -> float | None:
        """How much slower the prediction-only pick measured than the trial's pick: 1 -
        its tokens/s over the pick's (0.0 where they are one plan; None where the
        prediction-only pick did not run)."""
        pred, pick = self.prediction_pick, self.pick
        if pred is None or pick is None or pred.tokens_per_s is None:
            return None
        return 1.0 - pred.tokens_per_s / pick.tokens_per_s

    def to_json(self) -> dict:
        pick, pred = self.pick, self.prediction_pick
        return {
            "plans": [r.to_json() for r in self.runs],
            "warmup_steps": self.warmup,
            "timed_steps": self.steps,
            "wall_s": self.wall_s,
            "limit_s": self.limit_s,
            "pick": None if pick is None else self.runs.index(pick),
            "prediction_pick": None if pred is None else 0,
            "regret": self.regret,
            "notes": list(self.notes),
        }


def slowest_median_s(times: list[list[float]], warmup: int) -> float:
    """The slowest rank's median over its steps after `warmup`."""
    per_rank = [statistics.median(t[warmup:]) for t in times if len(t) > warmup]
    if not per_rank:
        raise ValueError(f"no rank timed a step after the {warmup} warm-up step(s)")
    return max(per_rank)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__


def run_trial(
    candidates: list[TrialCandidate],
    timer: Timer,
    *,
    warmup: int = DEFAULT_WARMUP,
    steps: int = DEFAULT_STEPS,
    limit_s: float | None = DEFAULT_LIMIT_S,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TrialResult:
    """Run each candidate for `warmup` + `steps` steps with `timer`, one after the other;
    a failed run is reported (`progress`, `TrialRun.error`) and skipped. Past `limit_s`
    (None: no limit) the plans left are not started; each run may take what is left of
    it."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"run_trial: steps must be >= 1 and warmup >= 0, got {steps}, {warmup}")
    say = progress or (lambda _msg: None)
    t0 = clock()
    runs: list[TrialRun] = []
    n = len(candidates)
    for i, c in enumerate(candidates):
        left_s = None if limit_s is None else limit_s - (clock() - t0)
        run = TrialRun(c)
        runs.append(run)
        if left_s is not None and left_s <= 0:
            run.error = f"not tried: the trial's time limit ({limit_s:g} s) was reached"
            say(f"trial {i + 1}/{n} [{c.source}] {c.name}: {run.error}")
            continue
        say(f"trial {i + 1}/{n} [{c.source}] {c.name}: {warmup} + {steps} steps ...")
        start = clock()
        try:
            times = timer(c, warmup + steps, left_s if left_s is not None else float("inf"))
            run.step_s = slowest_median_s(times, warmup)
            run.tokens_per_s = c.plan.global_batch * c.plan.seq / run.step_s
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a plan that fails is reported and skipped
            run.error = _one_line(e)
        run.wall_s = clock() - start
        if run.error:
            say(f"trial {i + 1}/{n} [{c.source}]: failed, skipped ({run.error})")
        else:
            say(
                f"trial {i + 1}/{n} [{c.source}]: {run.tokens_per_s:,.0f} tokens/s measured, "
                f"{c.predicted_tokens_per_s:,.0f} predicted ({run.wall_s:.0f} s)"
            )
    return TrialResult(runs, warmup, steps, clock() - t0, limit_s)


def local_timer(spec: ModelSpec) -> Timer:
    """A `Timer` that runs a plan of `spec` on this machine's cores, as `ratrain validate`
    does (the runtime's job on synthetic data, ranks spawned here)."""
    from ratrain.validate.grid import GridPlan
    from ratrain.validate.run import _timing

    def timer(c: TrialCandidate, total_steps: int, deadline_s: float) -> list[list[float]]:
        g = GridPlan(f"trial {c.source}", spec.name, spec, c.plan)
        deadline = min(deadline_s, 1800.0)  # the grid's own cap on one job
        times, _ = _timing(g, total_steps, 0, deadline_s=max(deadline, 1.0))
        return times

    return timer


def trial_lines(res: TrialResult) -> list[str]:
    """The trial as a table and the two picks, for a terminal."""
    lines = [
        f"trial: {len(res.runs)} plans, {res.warmup} untimed + {res.steps} timed steps each "
        f"(the slowest rank's median), {res.wall_s:.0f} s; * the measured pick",
        f" #  {'source':<20} {'predicted tok/s':>16} {'measured tok/s':>15}  plan",
    ]
    pick = res.pick
    for i, r in enumerate(res.runs):
        mark = "*" if r is pick else " "
        measured = f"{r.tokens_per_s:,.1f}" if r.tokens_per_s is not None else "failed"
        if r.error and r.error.startswith("not tried"):
            measured = "not tried"
        lines.append(
            f"{i + 1:>2}{mark} {r.candidate.source:<20} {r.candidate.predicted_tokens_per_s:>16,.1f} "
            f"{measured:>15}  {r.candidate.name}"
        )
        if r.error:
            lines.append(f"      {r.error}")
    lines += pick_lines(res)
    return lines


def pick_lines(res: TrialResult) -> list[str]:
    """The trial's pick, the prediction-only pick and the regret, in words."""
    pick, pred = res.pick, res.prediction_pick
    if pick is None:
        return ["no plan of the trial ran: the prediction-only pick stands (#1)"]
    out = [f"measured pick: [{pick.candidate.source}] {pick.candidate.name}"]
    if pred is pick:
        out.append("the prediction-only pick (#1) measured fastest: regret 0.0%")
    elif res.regret is None:
        out.append(f"the prediction-only pick (#1) did not run ({pred.error})")
    else:
        out.append(
            f"the prediction-only pick (#1) measured {pred.tokens_per_s:,.1f} tokens/s, "
            f"{res.regret:.1%} slower than the measured pick's {pick.tokens_per_s:,.1f} "
            "(regret)"
        )
    return out
