"""`ratrain.calibrate.timing.Timer`: the window's statistic over its repetitions, on a
fake clock (no timing of this machine)."""

from __future__ import annotations

import pytest
import torch

from ratrain.calibrate import timing
from ratrain.calibrate.timing import Timer


class _Clock:
    """perf_counter for the timing module: each call of `fn` advances it by the next of
    `durations`; reading the clock costs nothing."""

    def __init__(self, durations):
        self.now, self.durations = 0.0, list(durations)

    def __call__(self):
        return self.now

    def fn(self):
        self.now += self.durations.pop(0)


@pytest.mark.parametrize(
    "statistic, expected",
    [("min", 1.0), ("median", 2.0), ("mean", 3.0)],
)
def test_window_statistic(monkeypatch, statistic, expected):
    # warm-up 0.1 s (not counted), then 1, 2, 6: min 1, median 2, mean 3
    clock = _Clock([0.1, 1.0, 2.0, 6.0])
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    t = Timer(torch.device("cpu"), budget_s=0.5, min_reps=3, statistic=statistic)
    assert t.time_s(clock.fn, warmup=1) == pytest.approx(expected)
    assert clock.durations == []  # exactly min_reps timed calls once the budget is spent


def test_unknown_statistic():
    with pytest.raises(ValueError, match="statistic must be one of"):
        Timer(torch.device("cpu"), 0.1, statistic="fastest")
