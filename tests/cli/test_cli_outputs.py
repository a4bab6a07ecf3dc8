"""Output paths fail before work or get their folders; --min-lr; plan files carry model and
platform, and a flag that overrides either says so."""

import pytest
import yaml

from ratrain.cli import main
from ratrain.config import Plan, save_plan


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv_of",
    [
        lambda d: ["train", "--steps", "1", "--metrics", str(d)],
        lambda d: ["train", "--steps", "1", "--tensorboard", str(d / "f.txt")],
        lambda d: ["simulate", "--model", "tiny", "--trace", str(d)],
        lambda d: ["simulate", "--model", "tiny", "--plot", str(d / "f.txt" / "p.png")],
        lambda d: ["plan", "--model", "tiny", "--clusters", "2", "--platform", "cpu-local",
                   "-o", str(d / "f.txt" / "x.yaml")],
    ],
)  # fmt: skip
def test_unwritable_output_is_one_line_before_work(tmp_path, capsys, argv_of):
    (tmp_path / "f.txt").write_text("a file, not a folder")
    assert main(argv_of(tmp_path)) == 2
    err = _err(capsys)
    assert "folder" in err or "file" in err


@pytest.mark.timeout(120)
def test_missing_parents_are_created(tmp_path, capsys):
    trace = tmp_path / "a" / "b" / "t.json"
    assert main(["simulate", "--model", "tiny", "--pp", "2", "--trace", str(trace)]) == 0
    assert trace.is_file()
    metrics = tmp_path / "x" / "y" / "m.jsonl"
    argv = ["train", "--steps", "1", "--pp", "1", "--seq", "16", "--micro-batch", "2"]
    assert main([*argv, "--global-batch", "2", "--quiet", "--metrics", str(metrics)]) == 0
    assert metrics.read_text().count("\n") == 1


def test_min_lr_above_lr_refused(capsys):
    assert main(["train", "--lr", "1e-3", "--min-lr", "1e-2"]) == 2
    assert "--min-lr" in _err(capsys)


def _plan_file(tmp_path, platform="cpu-local"):
    path = tmp_path / "p.yaml"
    plan = Plan(pp=2, dp=1, micro_batch=2, global_batch=4, seq=16, model="tiny-qwen")
    save_plan(plan, path, platform=platform)
    return path


def test_simulate_uses_the_plans_platform_and_says_when_overridden(tmp_path, capsys):
    path = _plan_file(tmp_path)
    assert main(["simulate", "--plan", str(path)]) == 0
    out = capsys.readouterr()
    assert "tiny-qwen on cpu-local" in out.out and out.err == ""
    assert main(["simulate", "--plan", str(path), "--platform", "a100-80g"]) == 0
    out = capsys.readouterr()
    assert "on a100-80g" in out.out
    assert "--platform a100-80g overrides the plan file's platform cpu-local" in out.err


def test_plan_field_override_is_reported(tmp_path, capsys):
    path = _plan_file(tmp_path)
    assert main(["simulate", "--plan", str(path), "--pp", "4"]) == 0
    assert "--pp 4 overrides the plan file's 2" in capsys.readouterr().err
    # A plan is sized for its model: another --model is refused, in one line.
    assert main(["simulate", "--plan", str(path), "--model", "tiny"]) == 2
    assert "plan is for model 'tiny-qwen'" in _err(capsys)


@pytest.mark.timeout(120)
def test_train_plan_trains_the_plans_model(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    save_plan(Plan(pp=1, micro_batch=2, global_batch=2, seq=16, model="tiny-qwen"), path)
    assert main(["train", "--plan", str(path), "--steps", "1", "--quiet"]) == 0
    assert "training tiny-qwen" in capsys.readouterr().out


def test_plan_output_records_platform(tmp_path):
    out = tmp_path / "new" / "plan.yaml"
    argv = ["plan", "--model", "tiny", "--clusters", "2", "--platform", "cpu-local", "--quiet"]
    assert main([*argv, "--global-batch", "4", "--seq", "64", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["platform"] == "cpu-local"
