"""A measured final choice: the few plans a search ranked best
(`ratrain.planner.candidates`) run a handful of steps on the machine, and the fastest
measured is kept (`ratrain plan --trial K`, `ratrain train --plan auto`, `ratrain bench
cluster`'s ratrain entry).

Each run of a plan is one job of `warmup` untimed steps then `steps` timed ones, measured
by the slowest rank's median step (each rank's median of the timed steps, as `ratrain
validate` times a plan). The plans run in rounds: every plan in the first; in each round
after it (up to `rounds`, the order reversed every other round, so that a machine whose
speed drifts favours none), only the plans whose measure is within `margin` of the
fastest's run again. A plan's measure is the median of its runs, as tokens/s of the
global batch: plans that one run cannot tell apart are told apart by several, taken at
interleaved times, and plans far behind cost one run. A plan whose run fails (out of
memory, an error, past the time limit) is reported in one line and dropped. The
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
    "DEFAULT_MARGIN",
    "DEFAULT_PLANS",
    "DEFAULT_ROUNDS",
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
DEFAULT_ROUNDS = 3
"""assumed: at most three runs of a plan: the median of three is not moved by one run on a
slow minute; plans still within `DEFAULT_MARGIN` after the first run get the other two."""
DEFAULT_MARGIN = 0.08
"""sourced: `python benchmarks/cluster_noise.py` (4 x 1 at 50 Mbit/s, bench-256 pp=4 mb=1 1F1B,
8 interleaved rounds; docs/cluster-noise-4x1.json): two single runs of one plan measure
within 0.974-1.059x of each other on 90% of draws, so plans 8% apart after one run each may
still be in either order. At 2 x 2, 100 Mbit/s (pp=2 dp=2 dp-inner; docs/cluster-noise-2x2.json)
the same pair spread 0.848-1.293x: there the margin holds fewer of the ties; a wider one
costs more runs."""
DEFAULT_LIMIT_S = 600.0
"""assumed: ten minutes for the whole trial, against a run of hours; plans not started by
then are reported as not tried."""

Timer = Callable[["TrialCandidate", int, float], list[list[float]]]
"""(candidate, steps in all (warm-up included), seconds it may take) -> each rank's step
times, warm-up included. Raises on a failed run."""


@dataclass
class TrialRun:
    """One plan of a trial: its runs (each the slowest rank's median step) and their median,
    its measure; or why it has none."""

    candidate: TrialCandidate
    step_s: float | None = None
    """The median over the plan's runs of the slowest rank's median timed step."""
    tokens_per_s: float | None = None
    error: str | None = None
    wall_s: float = 0.0
    runs_s: list[float] = field(default_factory=list)
    """Each run's slowest rank's median step, in the order run."""

    def add(self, step_s: float) -> None:
        self.runs_s.append(step_s)
        self.step_s = statistics.median(self.runs_s)
        self.tokens_per_s = self.candidate.plan.global_batch * self.candidate.plan.seq / self.step_s

    def fail(self, why: str) -> None:
        """Dropped: a plan whose run failed once is not one to choose, whatever it measured
        before."""
        self.error = why
        self.step_s = self.tokens_per_s = None

    def to_json(self) -> dict:
        return {
            **self.candidate.to_json(),
            "measured_step_time_s": self.step_s,
            "measured_tokens_per_s": self.tokens_per_s,
            "runs_step_time_s": list(self.runs_s),
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
    rounds: int = 1
    """Rounds run (the first included)."""
    margin: float = DEFAULT_MARGIN

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
            "rounds": self.rounds,
            "margin": self.margin,
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
    rounds: int = DEFAULT_ROUNDS,
    margin: float = DEFAULT_MARGIN,
    limit_s: float | None = DEFAULT_LIMIT_S,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TrialResult:
    """Run each candidate for `warmup` + `steps` steps with `timer`, one after the other;
    then, up to `rounds` in all, again each plan whose measure is within `margin` of the
    fastest's while two or more are (the order reversed every other round). A failed run
    is reported (`progress`, `TrialRun.error`) and its plan dropped. Past `limit_s` (None:
    no limit) no run is started (plans never run are reported as not tried); each run may
    take what is left of it."""
    if steps < 1 or warmup < 0 or rounds < 1:
        raise ValueError(
            "run_trial: steps and rounds must be >= 1 and warmup >= 0, got "
            f"{steps}, {rounds}, {warmup}"
        )
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"run_trial: margin must be in [0, 1), got {margin}")
    say = progress or (lambda _msg: None)
    t0 = clock()
    runs = [TrialRun(c) for c in candidates]
    n = len(candidates)
    done = 0
    for rnd in range(rounds):
        if rnd == 0:
            order = list(range(n))
        else:
            best = max((r.tokens_per_s for r in runs if r.tokens_per_s is not None), default=None)
            order = [
                i
                for i, r in enumerate(runs)
                if r.tokens_per_s is not None and r.tokens_per_s >= (1.0 - margin) * best
            ] if best is not None else []  # fmt: skip
            if len(order) < 2 or (limit_s is not None and clock() - t0 >= limit_s):
                break
            if rnd % 2:
                order.reverse()
            say(
                f"trial round {rnd + 1}/{rounds}: {len(order)} plans within {margin:.0%} of the "
                "fastest run again"
            )
        for i in order:
            run, c = runs[i], candidates[i]
            left_s = None if limit_s is None else limit_s - (clock() - t0)
            if left_s is not None and left_s <= 0:
                if rnd == 0:
                    run.error = f"not tried: the trial's time limit ({limit_s:g} s) was reached"
                    say(f"trial {i + 1}/{n} [{c.source}] {c.name}: {run.error}")
                continue
            where = f"trial {i + 1}/{n} [{c.source}]" + (f" round {rnd + 1}" if rnd else "")
            say(f"{where}{'' if rnd else ' ' + c.name}: {warmup} + {steps} steps ...")
            start = clock()
            try:
                times = timer(c, warmup + steps, left_s if left_s is not None else float("inf"))
                run.add(slowest_median_s(times, warmup))
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # a plan that fails is reported and dropped
                run.fail(_one_line(e))
            run.wall_s += clock() - start
            if run.error:
                say(f"{where}: failed, dropped ({run.error})")
            else:
                last = c.plan.global_batch * c.plan.seq / run.runs_s[-1]
                say(
                    f"{where}: {last:,.0f} tokens/s measured"
                    + (f" (median of {len(run.runs_s)}: {run.tokens_per_s:,.0f})" if rnd else "")
                    + f", {c.predicted_tokens_per_s:,.0f} predicted ({clock() - start:.0f} s)"
                )
        done = rnd + 1
    return TrialResult(runs, warmup, steps, clock() - t0, limit_s, rounds=done, margin=margin)


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
        f"trial: {len(res.runs)} plans, {res.warmup} untimed + {res.steps} timed steps a run "
        f"(the slowest rank's median), {res.rounds} round(s): the plans within "
        f"{res.margin:.0%} of the fastest run again, each measured by the median of its runs; "
        f"{res.wall_s:.0f} s; * the measured pick",
        f" #  {'source':<20} {'predicted tok/s':>16} {'measured tok/s':>15} {'runs':>4}  plan",
    ]
    pick = res.pick
    for i, r in enumerate(res.runs):
        mark = "*" if r is pick else " "
        measured = f"{r.tokens_per_s:,.1f}" if r.tokens_per_s is not None else "failed"
        if r.error and r.error.startswith("not tried"):
            measured = "not tried"
        lines.append(
            f"{i + 1:>2}{mark} {r.candidate.source:<20} {r.candidate.predicted_tokens_per_s:>16,.1f} "
            f"{measured:>15} {len(r.runs_s):>4}  {r.candidate.name}"
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
