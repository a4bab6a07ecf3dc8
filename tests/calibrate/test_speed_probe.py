"""The speed probe (`ratrain.calibrate.probe`): calibrate records it, validate re-times it
and reports the machine's speed relative to calibration, `--rescore` against the new file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import ratrain.platforms
from ratrain.calibrate.probe import probe_s
from ratrain.config import Plan
from ratrain.platforms import load
from ratrain.validate.grid import load_grid
from ratrain.validate.rescore import rescore
from ratrain.validate.run import validate
from ratrain.validate.speed import describe, machine_speed, relative_speeds

PLATFORMS_DIR = Path(ratrain.platforms.__file__).parent
GRID = """
models:
  tiny: {n_layers: 2, hidden: 64, n_heads: 4, n_kv_heads: 4, ffn: 172, vocab: 256}
plans:
  - {name: a, model: tiny, micro_batch: 2, global_batch: 4, seq: 32}
"""


def _with_probe(platform, seconds):
    measured_on = dict(platform.measured_on or {"cpu": "x", "cores": 2})
    measured_on["speed_probe_s"] = seconds
    return dataclasses.replace(platform, measured_on=measured_on)


def test_relative_speed_and_its_line():
    assert relative_speeds(None, [0.1]) == [] and machine_speed(None, [0.1]) is None
    assert machine_speed(0.1, []) is None and describe(None) is None
    s = machine_speed(0.1, [0.1, 0.105, 0.095])
    assert s["relative_speed"] == pytest.approx([1.0, 0.1 / 0.105, 0.1 / 0.095])
    assert s["moved"] is False and "moved" not in describe(s)
    slow = machine_speed(0.1, [0.1, 0.125])  # 0.8x: moved by more than 10%
    assert slow["moved"] is True
    assert "0.80x .. 1.00x of calibration" in describe(slow) and "re-calibrate" in describe(slow)
    assert machine_speed(0.1, [0.092])["moved"] is False  # 1.09x
    assert machine_speed(0.1, [0.08])["moved"] is True  # 1.25x


def test_probe_times_a_block():
    t = probe_s("cpu", windows=1, budget_s=0.01)
    assert 0 < t < 10


def test_validate_times_the_probe_around_every_pass(tmp_path):
    g = tmp_path / "g.yaml"
    g.write_text(GRID)
    grid = load_grid(g)
    times = iter([0.1, 0.125, 0.08])
    calls = []

    def probe():
        calls.append(1)
        return next(times)

    plat = _with_probe(load("cpu-local"), 0.1)
    _, summary = validate(grid, plat, steps=2, warmup=0, plan_picks=False, passes=2, probe=probe)
    assert len(calls) == 3  # before the first pass and after each of two
    speed = summary["machine_speed"]
    assert speed["probes_s"] == [0.1, 0.125, 0.08]
    assert speed["relative_speed"] == pytest.approx([1.0, 0.8, 1.25]) and speed["moved"]
    # A platform file without a probe (a preset, an older calibration): not timed at all.
    plain = dataclasses.replace(load("cpu-local"), measured_on=None)
    calls.clear()
    _, summary = validate(grid, plain, steps=1, warmup=0, plan_picks=False, probe=probe)
    assert calls == [] and summary["machine_speed"] is None


def test_rescore_compares_the_probes_with_the_new_file(tmp_path):
    plan = Plan(micro_batch=2, global_batch=4, seq=32, compute_dtype="fp32")
    doc = {
        "platform": "old",
        "summary": {"machine_speed": {"probes_s": [0.2, 0.25]}},
        "models": {
            "tiny": dict(n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=172, vocab=256)
        },
        "results": [
            {
                "name": "a",
                "model": "tiny",
                "plan": plan.to_dict(),
                "measured_step_s": 0.01,
                "measured_peak_bytes": [[1_000_000]],
            }
        ],
    }
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps(doc))
    _, summary, _ = rescore(prev, _with_probe(load("cpu-local"), 0.25), plan_picks=False)
    assert summary["machine_speed"]["relative_speed"] == pytest.approx([1.25, 1.0])
    _, summary, _ = rescore(prev, dataclasses.replace(load("cpu-local"), measured_on=None))
    assert summary["machine_speed"] is None


def test_loader_reads_the_probe(tmp_path):
    import yaml

    from ratrain.errors import RatrainError

    data = yaml.safe_load((PLATFORMS_DIR / "cpu-local.yaml").read_text())
    data["measured_on"]["speed_probe_s"] = {"value": 0.05, "note": "measured: test"}
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(data))
    assert load(str(f)).measured_on["speed_probe_s"] == 0.05
    data["measured_on"]["speed_probe_s"] = {"value": -1, "note": "measured: test"}
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(RatrainError, match="speed_probe_s"):
        load(str(f))
