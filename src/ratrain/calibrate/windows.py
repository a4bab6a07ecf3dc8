"""Repeated, interleaved measurement windows, and the spread check between them.

A calibration that times each quantity once, in one short stretch, takes whatever the
machine did during that stretch: a slow minute (another process, a frequency change, the
host's neighbours) lands on the few quantities measured in it, and two runs a minute apart
disagree by 1.2-2.5x on single values. Here every quantity is measured in R windows,
interleaved across quantities (window 1 of every quantity, then window 2 of every
quantity, ...), so that a slow spell hits all quantities alike instead of one; its value
is the median of its windows, and its spread (max / min - 1 over the windows, per timed
component, the largest) says how far the windows disagreed.

Quantities whose spread exceeds `max_spread` are measured again, one more round of R
windows (interleaved among themselves); their value is then the median of all their
windows and their spread that of the new round. Still over: they are reported
(`Windowed.over`), and the caller warns or refuses (`ratrain calibrate --strict`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

__all__ = [
    "Windowed",
    "spread_of",
    "run_windows",
    "DEFAULT_MAX_SPREAD",
    "CALIBRATE_STATISTIC",
    "TIMED_AS",
]

DEFAULT_MAX_SPREAD = 0.15
"""assumed: a median of windows whose extremes agree within 15% is within ~7% of each of
them, inside the step-time target (MAPE <= 10%) it feeds; on the idle 2-core reference
machine most quantities' windows agree within a few per cent, so more than 15% says the
machine's load changed while it was measured."""

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
    """One quantity's windows: `value` is the per-component median."""

    samples: tuple[tuple[float, ...], ...]
    spread: float
    rounds: int = 1
    first_spread: float | None = None
    """The first round's spread, when re-measured."""
    over: bool = False

    @property
    def value(self) -> tuple[float, ...]:
        return tuple(statistics.median(col) for col in zip(*self.samples, strict=True))

    def note(self) -> str:
        n = len(self.samples)
        if self.rounds == 1:
            return f"median of {n} windows, spread {self.spread:.0%}"
        return (
            f"median of {n} windows (re-measured: the first round's spread was "
            f"{self.first_spread:.0%}), spread of the last round {self.spread:.0%}"
        )


def run_windows(
    items: Sequence[Hashable],
    measure: Callable[[Hashable], Sequence[float]],
    windows: int,
    max_spread: float,
    label: Callable[[Hashable], str] = str,
    progress=None,
) -> dict[Hashable, Windowed]:
    """Measure every item in `windows` interleaved passes, re-measure those whose spread is
    over `max_spread` once more; {item: Windowed}."""
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")

    def passes(todo: Sequence[Hashable]) -> dict[Hashable, list[tuple[float, ...]]]:
        got: dict[Hashable, list[tuple[float, ...]]] = {it: [] for it in todo}
        for w in range(windows):
            for it in todo:
                if progress:
                    progress.step(f"{label(it)} ({w + 1}/{windows})")
                got[it].append(tuple(float(x) for x in measure(it)))
        return got

    first = passes(items)
    out = {it: Windowed(tuple(s), spread_of(s)) for it, s in first.items()}
    again = [it for it in items if windows > 1 and out[it].spread > max_spread]
    if again:
        if progress:
            progress.extend(len(again) * windows)
        second = passes(again)
        for it in again:
            sp = spread_of(second[it])
            out[it] = Windowed(
                tuple(first[it] + second[it]), sp, 2, out[it].spread, over=sp > max_spread
            )
    return out
