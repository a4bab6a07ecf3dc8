"""Repeated, interleaved calibration windows: the median, the spread, the re-measurement,
the warnings a file carries and `--strict` (no torch work: fake measurements)."""

import itertools

import pytest
import yaml

from ratrain.calibrate.load import OthersLoad
from ratrain.calibrate.windows import MAX_ROUNDS, Windowed, run_windows, spread_of
from ratrain.cli import main
from ratrain.platforms import load
from ratrain.platforms.load import PRESETS_DIR


def test_spread_of_known_values():
    assert spread_of([(1.0, 10.0), (1.1, 10.0), (1.2, 10.0)]) == pytest.approx(0.2)
    assert spread_of([(1.0, 2.0), (1.0, 3.0)]) == pytest.approx(0.5)  # the worst component
    assert spread_of([(0.0, 2.0), (5.0, 2.0)]) == 0.0  # a component not always positive
    w = Windowed(((1.0,), (3.0,), (2.0,)), spread_of([(1.0,), (3.0,), (2.0,)]))
    assert w.value == (2.0,) and w.note() == "median of 3 windows, spread 200%"


def test_windows_are_interleaved_and_noisy_items_measured_again():
    calls = []
    noisy = iter([1.0, 2.0, 1.0, 1.0, 1.05, 1.0])  # first round 100% apart, second 5%
    hopeless = itertools.cycle([1.0, 3.0, 1.0])  # never agrees

    def measure(item):
        calls.append(item)
        if item == "steady":
            return (1.0, 7.0)
        return (next(noisy if item == "noisy" else hopeless),)

    got = run_windows(["steady", "noisy", "hopeless"], measure, 3, 0.15)
    # Pass 1 over every item, then pass 2, then 3; then the re-measured ones, interleaved,
    # then the one still over, alone, until the round cap.
    assert calls[:9] == ["steady", "noisy", "hopeless"] * 3
    assert calls[9:15] == ["noisy", "hopeless"] * 3
    assert calls[15:] == ["hopeless"] * 3 * (MAX_ROUNDS - 2)
    assert got["steady"].rounds == 1 and got["steady"].spread == 0 and not got["steady"].over
    assert got["steady"].value == (1.0, 7.0)
    noisy_w = got["noisy"]
    assert noisy_w.rounds == 2 and noisy_w.first_spread == pytest.approx(1.0)
    assert noisy_w.spread == pytest.approx(0.05) and not noisy_w.over
    assert noisy_w.value == (1.0,)  # the median of all six windows
    assert "re-measured" in noisy_w.note()
    assert got["hopeless"].over and got["hopeless"].spread == pytest.approx(2.0)
    assert got["hopeless"].rounds == MAX_ROUNDS
    with pytest.raises(ValueError):
        run_windows(["a"], measure, 0, 0.15)


def test_one_window_is_never_re_measured():
    got = run_windows(["a"], lambda item: (1.0,), 1, 0.15)
    assert got["a"].spread == 0 and got["a"].rounds == 1


def test_others_load_is_a_share():
    share = OthersLoad().share()
    assert share is None or 0.0 <= share <= 1.0


_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass\n"
_LAUNCHER = (  # like the launcher's forkserver: reaps a child that computed, lives on
    "import subprocess, sys, time\n"
    "subprocess.run([sys.executable, '-c', sys.argv[1]], check=True)\n"
    "print('done', flush=True)\n"
    "time.sleep(60)\n"
)


def test_own_cpu_counts_a_live_childs_reaped_children():
    """The ranks are children of the launcher's forkserver, which outlives them: their CPU
    time is ours, not other processes' (it read as 25-27% of an idle machine)."""
    import subprocess
    import sys

    from ratrain.calibrate.load import _own_s

    before = _own_s()
    p = subprocess.Popen([sys.executable, "-c", _LAUNCHER, _BURN], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"done"
        assert p.poll() is None  # alive: not among our waited-for children
        assert _own_s() - before >= 0.5  # the grandchild's 0.6 s of CPU
    finally:
        p.kill()
        p.wait(timeout=10)


def _fake_calibration(warnings):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["name"] = "fake"
    data.pop("calibration_warnings", None)  # the shipped file's own, if any
    if warnings:
        data["calibration_warnings"] = warnings
    return lambda *a, **kw: dict(data)


def test_warnings_are_written_and_strict_refuses(tmp_path, capsys, monkeypatch):
    import ratrain.calibrate as cal

    warns = [f"gemm fp32 {i}: its windows disagree by 40% (> 15%)" for i in range(6)]
    monkeypatch.setattr(cal, "calibrate", _fake_calibration(warns))
    out = tmp_path / "w.yaml"
    assert main(["calibrate", "--strict", "--no-progress", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--strict" in err[0] and "and 2 more" in err[0]
    assert "6 measurement(s) did not repeat" in err[0]
    assert not out.exists()
    assert main(["calibrate", "--no-progress", "--allow-noisy", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "still noisy (6)" in err
    assert yaml.safe_load(out.read_text())["calibration_warnings"] == warns
    load(str(out))  # a file with warnings loads


def test_clean_calibration_passes_strict(tmp_path, capsys, monkeypatch):
    import ratrain.calibrate as cal

    monkeypatch.setattr(cal, "calibrate", _fake_calibration([]))
    out = tmp_path / "ok.yaml"
    assert main(["calibrate", "--strict", "--no-progress", "-o", str(out)]) == 0
    assert out.exists() and "did not repeat" not in capsys.readouterr().err


def test_malformed_warnings_field_is_one_line(tmp_path):
    from ratrain.errors import RatrainError

    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["calibration_warnings"] = "not a list"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(RatrainError, match="calibration_warnings must be a list"):
        load(str(p))
