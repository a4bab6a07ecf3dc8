"""Timing kernels on one device: wall clock on CPU, CUDA events on a GPU, one interface.

`Timer.time_s(fn)` runs `fn` a few times for warm-up, then repeats it until the time
budget is spent (at least `min_reps` times): one *window*. It returns the window's fastest
repetition by default (timeit's advice: slower repetitions measure interference from other
work on the machine, not the kernel), the median with `statistic="median"`, or the mean
with `statistic="mean"`: what a long run of such calls pays per call, jitter included
(`ratrain calibrate` uses it; see `ratrain.calibrate.windows.CALIBRATE_STATISTIC`). On
CUDA the events are recorded on the current stream around each call and read after a
synchronize, so the figure is device time, not launch time. (The CUDA path is written to the same
interface but was not run on the machine this was built on, which has no GPU.)
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

from ratrain.calibrate.windows import TIMED_AS

__all__ = ["Timer", "Progress"]


class Timer:
    """Time of a callable on `device` within a per-measurement budget."""

    def __init__(
        self, device: torch.device, budget_s: float, min_reps: int = 3, statistic: str = "min"
    ) -> None:
        self.device, self.budget_s, self.min_reps = device, budget_s, min_reps
        if statistic not in TIMED_AS:
            raise ValueError(f"statistic must be one of {tuple(TIMED_AS)}, got {statistic!r}")
        self.statistic = statistic
        self.cuda = device.type == "cuda"

    def _once(self, fn: Callable[[], object], setup: Callable[[], object] | None = None) -> float:
        if setup is not None:  # untimed: e.g. the forward whose backward is timed
            setup()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def time_s(
        self,
        fn: Callable[[], object],
        warmup: int = 1,
        setup: Callable[[], object] | None = None,
    ) -> float:
        """Time of `fn` (after an untimed `setup()` each repetition, when given)."""
        for _ in range(warmup):
            first = self._once(fn, setup)
        times: list[float] = []
        deadline = time.perf_counter() + self.budget_s
        # One call longer than the budget is measured once more and no further.
        while len(times) < self.min_reps or time.perf_counter() < deadline:
            times.append(self._once(fn, setup))
            if warmup and first > self.budget_s and len(times) >= 1:
                break
        if self.statistic == "min":
            return min(times)
        return statistics.median(times) if self.statistic == "median" else statistics.mean(times)


class Progress:
    """A one-line progress bar on stderr: `[#####.....] 12/40 what`."""

    def __init__(self, total: int, enabled: bool = True, width: int = 30) -> None:
        self.total, self.done, self.enabled, self.width = max(total, 1), 0, enabled, width
        self.t0 = time.perf_counter()

    def extend(self, n: int) -> None:
        """n more steps than planned (a re-measurement)."""
        self.total += n

    def step(self, what: str) -> None:
        self.done = min(self.done + 1, self.total)
        if not self.enabled:
            return
        fill = self.width * self.done // self.total
        bar = "#" * fill + "." * (self.width - fill)
        elapsed = time.perf_counter() - self.t0
        sys.stderr.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.1f}s {what[:40]:<40}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
