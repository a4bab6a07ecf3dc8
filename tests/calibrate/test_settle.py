"""Settling noisy calibration values: further rounds of windows within a time limit (a fake
clock: no sleeping), judged by the last round; and the CLI writing what it measured
(the default) or refusing and keeping it beside the output (`--strict`)."""

import itertools

import pytest
import yaml

from ratrain.calibrate.windows import (
    MAX_ROUNDS,
    SETTLE_MAX_S,
    run_windows,
    settle_limit_s,
    settle_summary,
)
from ratrain.cli import main
from ratrain.platforms import load
from ratrain.platforms.load import PRESETS_DIR


class FakeClock:
    """A clock that each measurement advances by `per_call_s`."""

    def __init__(self, per_call_s: float = 1.0) -> None:
        self.now_s, self.per_call_s = 0.0, per_call_s

    def __call__(self) -> float:
        return self.now_s

    def measured(self, values):
        """A `measure` returning the next of each item's values, the clock advanced."""
        its = {item: iter(v) for item, v in values.items()}

        def measure(item):
            self.now_s += self.per_call_s
            return (next(its[item]),)

        return measure


class Steps:
    """A progress object that keeps what it was told."""

    def __init__(self) -> None:
        self.lines, self.extended = [], 0

    def step(self, what: str) -> None:
        self.lines.append(what)

    def extend(self, n: int) -> None:
        self.extended += n


def test_windows_that_agree_later_settle_and_say_so():
    clock = FakeClock()
    # Two rounds far apart (a slow spell), then a third within 2%; "steady" agrees at once.
    slow = [1.0, 2.0, 1.0] + [2.0, 1.0, 2.0] + [1.0, 1.02, 1.01]
    measure = clock.measured({"slow": slow, "steady": itertools.repeat(5.0)})
    steps = Steps()
    got = run_windows(["slow", "steady"], measure, 3, 0.15, progress=steps, clock=clock)
    w = got["slow"]
    assert w.rounds == 3 and not w.over
    assert w.spread == pytest.approx(0.02) and w.first_spread == pytest.approx(1.0)
    # Kept: the last round and the first, whose median (1.0) agrees; not the second (2.0).
    assert w.kept == (1, 3) and len(w.samples) == 6
    assert w.value == pytest.approx((1.005,))  # 1, 1, 1, 1.01, 1.02, 2
    assert "re-measured" in w.note() and "rounds 1 and 3 of 3" in w.note()
    assert got["steady"].rounds == 1 and got["steady"].note() == "median of 3 windows, spread 0%"
    assert "settling 1 noisy values, round 2: slow (1/3)" in steps.lines
    assert "settling 1 noisy values, round 3: slow (3/3)" in steps.lines
    assert steps.extended == 2 * 3 and len(steps.lines) == 2 * 3 + 2 * 3
    s = settle_summary(got)
    assert (s.remeasured, s.settled, s.rounds) == (1, 1, 3)
    assert s.text() == "re-measured 1 quantity in up to 3 rounds, 1 settled"


def test_a_slow_last_round_is_what_counts():
    """A first round that agreed with nothing later: the value is the last round's."""
    clock = FakeClock()
    measure = clock.measured({"a": [1.0, 3.0, 1.0] + [2.0, 2.1, 2.0]})
    w = run_windows(["a"], measure, 3, 0.15, clock=clock)["a"]
    assert w.kept == (2,) and w.value == (2.0,) and not w.over
    assert "round 2 of 2" in w.note()


def test_windows_that_never_agree_stop_at_the_time_limit():
    clock = FakeClock()  # 1 s per window: a first pass of 6 s, a round of "bad" 3 s
    never = itertools.cycle([1.0, 3.0])
    measure = clock.measured({"bad": never, "ok": itertools.repeat(1.0)})
    got = run_windows(["bad", "ok"], measure, 3, 0.15, settle_s=7.0, max_rounds=50, clock=clock)
    # Round 2 (3 s) and round 3 (6 s) fit in 7 s; round 4 would end at 9 s.
    assert got["bad"].over and got["bad"].rounds == 3 and clock() == 6 + 6
    assert got["bad"].spread == pytest.approx(2.0) and not got["ok"].over
    s = settle_summary(got)
    assert (s.remeasured, s.settled) == (1, 0)


def test_the_default_limit_keeps_a_long_first_pass_from_settling_for_long():
    """A first pass of 600 s: settling gets SETTLE_MAX_S, so after the first re-measurement
    (300 s, always run) no round that would end past it starts."""
    clock = FakeClock(per_call_s=100.0)
    measure = clock.measured({"bad": itertools.cycle([1.0, 3.0]), "ok": itertools.repeat(1.0)})
    got = run_windows(["bad", "ok"], measure, 3, 0.15, clock=clock)
    assert settle_limit_s(600.0) == SETTLE_MAX_S < 300.0
    assert got["bad"].over and got["bad"].rounds == 2


def test_windows_that_never_agree_stop_at_the_round_cap():
    clock = FakeClock()
    measure = clock.measured({"bad": itertools.cycle([1.0, 3.0])})
    got = run_windows(["bad"], measure, 3, 0.15, settle_s=1e9, clock=clock)
    assert got["bad"].over and got["bad"].rounds == MAX_ROUNDS
    assert clock() == 3 * MAX_ROUNDS


def _fake_calibration(warnings):
    """`calibrate()` as the CLI calls it, returning the shipped cpu-local data with these
    warnings, and telling what settling did."""
    from ratrain.calibrate.windows import Settled

    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["name"] = "fake"
    data.pop("calibration_warnings", None)
    data["calibration_warnings"] = warnings

    def calibrate(*a, on_settle=None, **kw):
        if on_settle is not None:
            on_settle(Settled(remeasured=9, settled=7, rounds=4))
        return dict(data)

    return calibrate


_WARNS = [
    "gemm fp32 512x1024x512: its windows disagree by 40% (> 15%) in the last of 4 rounds",
    "units fp32 h320 b1 block: its windows disagree by 22% (> 15%) in the last of 4 rounds",
]


def test_noisy_values_are_written_by_default_with_one_line(tmp_path, capsys, monkeypatch):
    import ratrain.calibrate as cal

    monkeypatch.setattr(cal, "calibrate", _fake_calibration(_WARNS))
    out = tmp_path / "my.yaml"
    assert main(["calibrate", "--quick", "--no-progress", "-o", str(out)]) == 0
    cap = capsys.readouterr()
    (line,) = cap.err.strip().splitlines()
    assert "warning: wrote" in line and "re-measured 9 quantities in up to 4 rounds" in line
    assert "7 settled" in line
    assert "still noisy (2): gemm fp32 512x1024x512, units fp32 h320 b1 block" in line
    assert "ratrain validate" in line and "--merge" in line
    assert "values measured" in cap.out
    data = yaml.safe_load(out.read_text())
    assert data["calibration_warnings"] == _WARNS and "WRITTEN NOISY" in data["description"]
    load(str(out))  # it loads
    assert not (tmp_path / "my.noisy.yaml").exists()


def test_strict_refuses_and_keeps_the_measurements_beside(tmp_path, capsys, monkeypatch):
    import ratrain.calibrate as cal

    monkeypatch.setattr(cal, "calibrate", _fake_calibration(_WARNS))
    out = tmp_path / "my.yaml"
    assert main(["calibrate", "--quick", "--strict", "--no-progress", "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    kept = tmp_path / "my.noisy.yaml"
    assert line.startswith("ratrain calibrate: error: not writing") and str(kept) in line
    assert not out.exists() and kept.exists()
    data = yaml.safe_load(kept.read_text())
    assert data["calibration_warnings"] == _WARNS
    assert load(str(kept)).name == "fake"  # a platform file, to merge later
