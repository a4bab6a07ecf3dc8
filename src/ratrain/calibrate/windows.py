"""Repeated, interleaved measurement windows, and the spread check between them.

A calibration that times each quantity once, in one short stretch, takes whatever the
machine did during that stretch: a slow minute (another process, a frequency change, the
host's neighbours) lands on the few quantities measured in it, and two runs a minute apart
disagree by 1.2-2.5x on single values. Here every quantity is measured in R windows,
interleaved across quantities (window 1 of every quantity, then window 2 of every
quantity, ...), so that a slow spell hits all quantities alike instead of one; its value
is the median of its windows, and its spread (max / min - 1 over the windows, per timed
component, the largest) says how far the windows disagreed.

Settling: quantities whose spread exceeds `max_spread` are measured again, in further
rounds of R windows interleaved among themselves, each round over those still over only,
until none is over, the settle time limit is spent (`settle_limit_s`: a share of the time
the first pass took, so a quick calibration stays quick) or `MAX_ROUNDS` is reached. A
quantity is judged by its last round's spread (a slow spell that has passed no longer
counts); its value is the median of the windows of its last round and of the earlier
rounds whose median agrees with the last's within `max_spread` (`Windowed.note` says which).
Still over: they are reported (`Windowed.over`); the caller writes them with a warning, or
refuses (`ratrain calibrate --strict`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

__all__ = [
    "Windowed",
    "Settled",
    "spread_of",
    "run_windows",
    "settle_limit_s",
    "settle_summary",
    "DEFAULT_MAX_SPREAD",
    "SETTLE_FRACTION",
    "SETTLE_MIN_S",
    "SETTLE_MAX_S",
    "MAX_ROUNDS",
    "CALIBRATE_STATISTIC",
    "TIMED_AS",
]

DEFAULT_MAX_SPREAD = 0.15
"""assumed: a median of windows whose extremes agree within 15% is within ~7% of each of
them, inside the step-time target (MAPE <= 10%) it feeds; on the idle 2-core reference
machine most quantities' windows agree within a few per cent, so more than 15% says the
machine's load changed while it was measured."""

SETTLE_FRACTION = 0.5
"""assumed: settling (the re-measurement rounds) may take half the time the first pass took:
a slow spell on the shared 2-core reference machine lasts seconds to a minute, so half the
first pass outlasts most of them, while a `--quick` calibration stays quick (at most 1.5x
its windowed part, plus one round: the first re-measurement always runs)."""

SETTLE_MIN_S = 10.0
"""assumed: a first pass of a few seconds (a tiny `--budget-s`) still gets ~10 s to settle:
less than that is within one slow spell, and re-measuring a few values costs little."""

SETTLE_MAX_S = 120.0
"""assumed: two minutes of settling at most, whatever the first pass took: a machine whose
values still disagree after that is busy for longer than calibration should wait, and the
values it could not settle are better improved by a second run later (`--merge`)."""

MAX_ROUNDS = 4
"""assumed: the first round and up to three re-measurements. Idle, the reference VM's speed
itself moves from one window to the next (37-47 of a full run's quantities over 15% after
one re-measurement), so a quantity still over after three more rounds is that machine's
jitter, which further rounds would not settle, only make longer."""

CALIBRATE_STATISTIC = "mean"
"""measured: a training step runs hundreds of kernel calls back to back, so its time is
their sum and its median over steps approaches the sum of each call's *mean* time, not of
its fastest. On the 2-core reference VM (idle, one thread, 55-200 calls each) the median
call of a Block forward (h384, 128-256 tokens), the Head's loss and a 256x384x1024 GEMM
ran 1.05-1.52x the fastest and the mean 1.01-1.11x the median: the fastest call
under-charges every kernel by the machine's jitter. A calibration window's value is thus
its calls' mean (`ratrain.calibrate.timing.Timer`); a slow spell over a whole window is
still left out by the median over interleaved windows."""

TIMED_AS = {"min": "fastest of", "median": "median of", "mean": "mean of"}
"""The statistics a window can take, each as a platform file's kernel note names it
(followed by "repeated ..."); `ratrain calibrate --merge` reads it back. Here, beside
the windows, so that the platform file is written and merged without torch."""


def spread_of(samples: Sequence[Sequence[float]]) -> float:
    """The largest max/min - 1 over the components of the windows' samples (components
    not positive in every window are left out: counts, flags)."""
    worst = 0.0
    for col in zip(*samples, strict=True):
        if min(col) > 0:
            worst = max(worst, max(col) / min(col) - 1.0)
    return worst


@dataclass(frozen=True)
class Windowed:
    """One quantity's windows: `value` is the per-component median of `samples`, the windows
    of the rounds kept (`kept`; all of the first when it was measured once)."""

    samples: tuple[tuple[float, ...], ...]
    spread: float
    """The last round's spread."""
    rounds: int = 1
    first_spread: float | None = None
    """The first round's spread, when re-measured."""
    over: bool = False
    kept: tuple[int, ...] = (1,)
    """The rounds (1-based) whose windows are in `samples`: the last, and those whose
    median agreed with it."""

    @property
    def value(self) -> tuple[float, ...]:
        return tuple(statistics.median(col) for col in zip(*self.samples, strict=True))

    def note(self) -> str:
        n = len(self.samples)
        if self.rounds == 1:
            return f"median of {n} windows, spread {self.spread:.0%}"
        return (
            f"median of {n} windows, {_rounds_text(self.kept, self.rounds)} (re-measured: the "
            f"first round's spread was {self.first_spread:.0%}; kept: the rounds agreeing "
            f"with the last), spread of the last round {self.spread:.0%}"
        )


def _rounds_text(kept: tuple[int, ...], rounds: int) -> str:
    """'rounds 2-4 of 4', 'rounds 1, 3 and 4 of 4', 'round 3 of 3'."""
    if len(kept) == 1:
        return f"round {kept[0]} of {rounds}"
    if list(kept) == list(range(kept[0], kept[-1] + 1)):
        return f"rounds {kept[0]}-{kept[-1]} of {rounds}"
    return f"rounds {', '.join(map(str, kept[:-1]))} and {kept[-1]} of {rounds}"


def settle_limit_s(first_pass_s: float) -> float:
    """Seconds the re-measurement rounds may take after a first pass of `first_pass_s`."""
    return min(max(SETTLE_FRACTION * first_pass_s, SETTLE_MIN_S), SETTLE_MAX_S)


def _medians(windows: Sequence[Sequence[float]]) -> tuple[float, ...]:
    return tuple(statistics.median(col) for col in zip(*windows, strict=True))


def _agrees(
    earlier: Sequence[Sequence[float]], last: Sequence[Sequence[float]], tol: float
) -> bool:
    """Whether an earlier round's median is within `tol` of the last round's, component by
    component (components not positive in both are left out, as in `spread_of`)."""
    return spread_of([_medians(earlier), _medians(last)]) <= tol


def _judge(rounds: list[list[tuple[float, ...]]], max_spread: float) -> Windowed:
    """One quantity from its rounds of windows: judged by the last round."""
    last = rounds[-1]
    spread = spread_of(last)
    if len(rounds) == 1:
        return Windowed(tuple(last), spread)
    kept = [i for i, r in enumerate(rounds[:-1]) if _agrees(r, last, max_spread)]
    kept.append(len(rounds) - 1)
    return Windowed(
        tuple(w for i in kept for w in rounds[i]),
        spread,
        len(rounds),
        spread_of(rounds[0]),
        over=spread > max_spread,
        kept=tuple(i + 1 for i in kept),
    )


def run_windows(
    items: Sequence[Hashable],
    measure: Callable[[Hashable], Sequence[float]],
    windows: int,
    max_spread: float,
    label: Callable[[Hashable], str] = str,
    progress=None,
    *,
    settle_s: float | None = None,
    max_rounds: int = MAX_ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[Hashable, Windowed]:
    """Measure every item in `windows` interleaved passes, then settle: re-measure those
    whose spread is over `max_spread` in further rounds until none is over, `max_rounds`
    rounds in all, or the settle time limit (`settle_s`; default `settle_limit_s` of the
    first pass) would be passed; {item: Windowed}. The first re-measurement always runs;
    a later round starts only when it is expected (at the seconds per window so far) to
    end within the limit."""
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")

    def one_round(todo: Sequence[Hashable], what: Callable[[Hashable], str]):
        got: dict[Hashable, list[tuple[float, ...]]] = {it: [] for it in todo}
        for w in range(windows):
            for it in todo:
                if progress:
                    progress.step(f"{what(it)} ({w + 1}/{windows})")
                got[it].append(tuple(float(x) for x in measure(it)))
        return got

    t0 = clock()
    rounds = {it: [r] for it, r in one_round(items, label).items()}
    t_settle = clock()
    limit_s = settle_limit_s(t_settle - t0) if settle_s is None else settle_s
    n_windows = len(items) * windows
    todo = [it for it in items if windows > 1 and spread_of(rounds[it][-1]) > max_spread]
    k = 1
    while todo and k < max_rounds:
        now = clock()
        expected_s = (now - t0) / max(n_windows, 1) * len(todo) * windows
        if k > 1 and now - t_settle + expected_s > limit_s:
            break
        k += 1
        if progress:
            progress.extend(len(todo) * windows)
        head = f"settling {len(todo)} noisy values, round {k}"
        for it, r in one_round(todo, lambda it, head=head: f"{head}: {label(it)}").items():
            rounds[it].append(r)
        n_windows += len(todo) * windows
        todo = [it for it in todo if spread_of(rounds[it][-1]) > max_spread]
    return {it: _judge(rounds[it], max_spread) for it in items}


@dataclass(frozen=True)
class Settled:
    """What settling did over a calibration's quantities."""

    remeasured: int
    """Quantities measured in more than one round."""
    settled: int
    """Of those, the ones whose last round agreed within the spread allowed."""
    rounds: int
    """The most rounds any quantity took."""

    def text(self) -> str:
        """'re-measured 12 quantities in up to 3 rounds, 9 settled' ('' when none was)."""
        if not self.remeasured:
            return ""
        return (
            f"re-measured {self.remeasured} quantit{'y' if self.remeasured == 1 else 'ies'} "
            f"in up to {self.rounds} rounds, {self.settled} settled"
        )


def settle_summary(got: dict[Hashable, Windowed]) -> Settled:
    """What `run_windows` did to settle its items."""
    again = [w for w in got.values() if w.rounds > 1]
    return Settled(
        len(again), sum(not w.over for w in again), max((w.rounds for w in again), default=1)
    )
