"""`ratrain verify`, and the one-line errors of the distributed path."""

from __future__ import annotations

import json

import pytest

from _cli import one_line_error
from ratrain.cli import main
from ratrain.cli.verify import max_rel_dev
from ratrain.config import Plan, save_plan
from ratrain.launch.spawn import free_port


def test_max_rel_dev():
    assert max_rel_dev([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert max_rel_dev([1.1, 2.0], [1.0, 2.0]) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        max_rel_dev([1.0], [1.0, 2.0])


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_verify_json_reports_every_pair(capsys):
    assert main(["verify", "--steps", "3", "--seq", "16", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    devs = out["max_rel_dev"]
    assert set(devs) == {"ratrain_vs_baseline", "ratrain_vs_reference", "baseline_vs_reference"}
    assert devs["ratrain_vs_baseline"] == 0.0 and out["bit_identical"]
    assert devs["ratrain_vs_reference"] <= 1e-5
    assert out["tokens"] == 3 * 8 * 16 and out["steps"] == 3


def _one_line_error(capsys, argv: list[str], match: str) -> None:
    err = one_line_error(capsys, argv, match)
    assert err.startswith("ratrain verify: error: "), err


def _torchrun_env(monkeypatch, rank: int, world: int) -> None:
    for k, v in {
        "RANK": rank,
        "WORLD_SIZE": world,
        "LOCAL_RANK": rank,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": free_port(),
    }.items():
        monkeypatch.setenv(k, str(v))


def test_world_size_mismatch_is_one_line(capsys, monkeypatch):
    _torchrun_env(monkeypatch, rank=0, world=3)
    _one_line_error(capsys, ["verify", "--steps", "1"], "world size 3 != pp x dp = 2 x 2 = 4")


def test_plan_for_another_model_is_one_line(capsys, tmp_path):
    path = tmp_path / "plan.yaml"
    save_plan(Plan(pp=2, dp=2, global_batch=8, model="llama2-7b"), path)
    _one_line_error(
        capsys,
        ["verify", "--plan", str(path), "--model", "tiny"],
        "plan is for model 'llama2-7b', not 'tiny'",
    )


def test_plan_over_memory_cap_is_one_line(capsys):
    _one_line_error(capsys, ["verify", "--memory-cap", "0.0001"], "plan does not fit: stage")


@pytest.mark.timeout(60)
def test_unreachable_rendezvous_is_one_line(capsys, monkeypatch):
    _torchrun_env(monkeypatch, rank=1, world=4)  # rank 0 never starts
    _one_line_error(capsys, ["verify", "--steps", "1", "--timeout", "2"], "rendezvous at 127.0.0.1")


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_train_routes_pipelines_to_the_distributed_runtime(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    argv = [
        "train",
        "--pp",
        "2",
        "--steps",
        "2",
        "--seq",
        "16",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--metrics",
        str(path),
        "--quiet",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "pp=2 dp=1 (2 ranks)" in out and "final loss" in out and "2 steps in" in out
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    keys = {
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "step_time_s",
        "peak_bytes_per_rank",
        "max_rss_bytes_per_rank",
    }
    assert keys <= set(rows[0]) and len(rows[0]["max_rss_bytes_per_rank"]) == 2


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_a_failing_rank_is_one_line(capfd, monkeypatch):
    """A rank raising (the RATRAIN_FAULT hook) ends verify with one line, as train does:
    which rank, what, at which step; exit code 1 (not a user mistake)."""
    monkeypatch.setenv("RATRAIN_FAULT", "0:1:step-raise")
    argv = ["verify", "--dp", "1", "--steps", "2", "--seq", "16", "--global-batch", "2"]
    assert main([*argv, "--dtype", "bf16", "--quiet", "--no-reference"]) == 1
    err = capfd.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("ratrain verify: error: rank 0 failed (RuntimeError: injected fault")
    assert err.endswith("at step 1"), err
