"""benchmarks/gpu_check.py: the CPU dry run gives a report of every stage (ran, or skipped
with a reason), and a failing stage is recorded in one line while the next one runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
STAGES = ("environment", "train", "verify", "two_ranks", "calibrate_validate", "big_model")


def _run(tmp_path: Path, *args: str, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )
    return p, json.loads(out.read_text())


def _check_structure(report: dict) -> None:
    assert report["device"] == "cpu" and report["mode"] == "tiny"
    assert list(report["stages"]) == list(STAGES)
    assert report["summary"] == {n: s["status"] for n, s in report["stages"].items()}
    assert report["gpu_run"] == "not yet run on a GPU"
    for name, s in report["stages"].items():
        assert s["status"] in ("ok", "failed", "skipped"), name
        if s["status"] == "skipped":
            assert s["reason"], name
        if s["status"] == "failed":
            assert s["error"] and "\n" not in s["error"], name


@pytest.mark.slow  # ~70 s on 2 idle cores: six stages, a calibration among them
@pytest.mark.timeout(420)
def test_dry_run_every_stage_runs(tmp_path):
    p, report = _run(tmp_path, timeout=400)
    _check_structure(report)
    assert p.returncode == 0, (report["summary"], p.stderr[-2000:])
    assert all(v == "ok" for v in report["summary"].values()), report["summary"]
    st = report["stages"]
    env = st["environment"]["env"]
    for key in ("torch", "cpu_count", "nccl_available", "gemm_bf16_tflops"):
        assert key in env
    for dtype in ("fp32", "bf16"):
        r = st["train"]["results"][dtype]
        assert r["final_loss"] > 0 and r["tokens_per_s"] > 0
        assert r["peak_bytes_measured"] > 0 and r["peak_bytes_ledger"] > 0
    assert all(v["passed"] for v in st["verify"]["results"].values())
    assert st["two_ranks"]["results"]["gloo"]["ok"]
    assert any("adapted" in n for n in st["two_ranks"]["notes"])  # no NCCL on a CPU: said
    assert st["calibrate_validate"]["validate"]["plans"]
    assert st["big_model"]["results"]["peak_bytes_ledger"] > 0


@pytest.mark.timeout(240)
def test_dry_run_of_the_training_stages(tmp_path):
    """The stages that run ratrain itself (train and verify on the device), in the default
    suite; the calibration and the two-rank probe are in the slow run above."""
    p, report = _run(tmp_path, "--stages", "environment,train,verify", timeout=220)
    _check_structure(report)
    assert p.returncode == 0, (report["summary"], p.stderr[-2000:])
    st = report["stages"]
    assert [st[n]["status"] for n in ("environment", "train", "verify")] == ["ok"] * 3
    for dtype in ("fp32", "bf16"):
        r = st["train"]["results"][dtype]
        assert r["final_loss"] > 0 and r["tokens_per_s"] > 0
        assert r["peak_bytes_measured"] > 0 and r["peak_bytes_ledger"] > 0
    assert st["verify"]["results"] and all(v["passed"] for v in st["verify"]["results"].values())


@pytest.mark.timeout(120)
def test_failing_stage_is_recorded_and_the_next_runs(tmp_path):
    p, report = _run(
        tmp_path, "--stages", "environment,two_ranks", "--inject-fail", "environment", timeout=100
    )
    _check_structure(report)
    assert p.returncode == 1
    env = report["stages"]["environment"]
    assert env["status"] == "failed" and "injected failure" in env["error"]
    assert report["stages"]["two_ranks"]["status"] == "ok"
    for name in ("train", "verify", "calibrate_validate", "big_model"):
        assert report["stages"][name] == {"status": "skipped", "reason": "not in --stages"}
    assert "stage two_ranks" in p.stderr  # progress lines on stderr
