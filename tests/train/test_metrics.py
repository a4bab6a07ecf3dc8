"""Metrics and progress on the CPU: `--tensorboard` without the package is
one line before any work; every record says each rank's peak memory and what it counts
(tensor bytes, or peak RSS); a resumed run's progress bar counts on from the resumed step;
`--steps 0 --save` says it converts and trains nothing."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import _runtime as harness
from ratrain.cli import main
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.observe import metrics
from ratrain.observe.memory import peaks_per_rank
from ratrain.observe.metrics import Progress, TensorBoardWriter
from ratrain.train.job import Outputs

SMALL = ["--seq", "16", "--micro-batch", "2", "--global-batch", "4", "--threads", "1"]


def _no_tensorboard(monkeypatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name, *a, **kw):
        return None if name == "tensorboard" else real(name, *a, **kw)

    monkeypatch.setattr(metrics.importlib.util, "find_spec", find_spec)


def test_tensorboard_without_the_package_is_one_line_before_work(tmp_path, capsys, monkeypatch):
    _no_tensorboard(monkeypatch)
    tb = tmp_path / "tb"
    argv = ["train", "--tensorboard", str(tb), "--metrics", str(tmp_path / "m.jsonl")]
    assert main([*argv, "--pp", "1", "--steps", "1", *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert "--tensorboard" in err and "pip install 'ratrain[tensorboard]'" in err
    assert not tb.exists() and not (tmp_path / "m.jsonl").exists()  # nothing done
    with pytest.raises(RatrainError, match=r"ratrain\[tensorboard\]"):
        TensorBoardWriter(tb)
    assert not TensorBoardWriter(None).active


def test_pyproject_has_the_tensorboard_extra():
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    doc = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert doc["project"]["optional-dependencies"]["tensorboard"] == ["tensorboard>=2.14"]


def test_progress_starts_at_the_resumed_step():
    out = io.StringIO()
    bar = Progress(400, "train", stream=out, every_s=1e9, start=200)
    bar.update(loss=1.0)
    assert "201/400" in out.getvalue() and "[############" in out.getvalue()
    for _ in range(199):
        bar.update()
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "400/400" in lines[-1] and "#" * 24 in lines[-1]
    # the rate and the ETA are of this run's steps: 1 step done, 199 to go
    bar = Progress(400, stream=io.StringIO(), start=200)
    bar.update()
    bar._t0 -= 1.0  # one second in
    assert "1.00 it/s" in bar.line() or "0.99 it/s" in bar.line()
    assert "ETA 3:19" in bar.line() or "ETA 3:20" in bar.line()


def test_peaks_per_rank_says_what_it_counts():
    assert peaks_per_rank([10, 20], [100, 200]) == ([10, 20], "tensors")
    assert peaks_per_rank([None, None], [100, 200]) == ([100, 200], "rss")
    assert peaks_per_rank([10, None], [100, 200]) == ([100, 200], "rss")  # never mixed


def _ratrain(argv: list[str]):
    r = subprocess.run(
        [sys.executable, "-m", "ratrain", *argv], capture_output=True, text=True, timeout=170
    )
    assert r.returncode == 0, r.stderr
    return r


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_steps_0_says_it_converts_and_does_not_train(tmp_path):
    ck = tmp_path / "ck"
    r = _ratrain(["train", "--pp", "2", *SMALL, "--save", str(ck), "--steps", "0"])
    assert "converting tiny into a checkpoint in" in r.stdout and "no training" in r.stdout
    assert "initial weights (seed 0)" in r.stdout
    assert "training tiny" not in r.stdout and "steps x" not in r.stdout, r.stdout
    assert "synthetic" not in r.stdout and "0/1" not in r.stderr, r
    assert (ck / "step-00000000").is_dir()


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_cpu_peak_bytes_are_rss_and_resumed_progress_counts_on(tmp_path, capfd):
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    base = ["train", "--pp", "2", *SMALL, "--save", str(ck), "--metrics", str(m)]
    assert main([*base, "--steps", "2", "--quiet"]) == 0
    capfd.readouterr()
    # a subprocess: the progress line comes from a rank process
    err = _ratrain([*base, "--steps", "4", "--resume", "auto"]).stderr
    bars = [x for x in err.splitlines() if x.startswith("ratrain [")]
    assert bars and "3/4" in bars[0] and "4/4" in bars[-1], err
    assert not any(" 1/4" in x or " 2/4" in x for x in bars), err
    rows = _records(m)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r["peak_bytes_source"] == "rss"
        peaks = r["peak_bytes_per_rank"]
        assert len(peaks) == 2 and all(isinstance(p, int) and p > 2**20 for p in peaks)
        assert peaks == r["max_rss_bytes_per_rank"]


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_peak_bytes_are_tensor_bytes_with_measure_memory():
    spec = get_preset("tiny")
    plan = Plan(pp=1, micro_batch=2, global_batch=4, seq=16, compute_dtype="fp32", model="tiny")
    cfg = TrainConfig(steps=2, warmup_steps=1)
    (res,) = harness.run(spec, plan, cfg, [("ratrain", {})], outputs=Outputs(measure_memory=True))
    run = res.runs["ratrain"]
    rec = run.records[-1]
    assert rec["peak_bytes_source"] == "tensors"
    (peak,) = rec["peak_bytes_per_rank"]
    assert 0 < peak <= run.peak_bytes < rec["max_rss_bytes_per_rank"][0]
