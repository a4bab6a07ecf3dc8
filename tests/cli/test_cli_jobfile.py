"""Job files: `ratrain train --print-config` writes the effective job, grouped as the help
groups the flags, and `--config` reads it back to the same job; flags override the file; a
bad file is one line, exit 2, before any work."""

from __future__ import annotations

import pytest
import yaml

from _cli import one_line_error
from ratrain.cli import main
from ratrain.cli.jobfile import job_sections
from ratrain.cli.train import job_parser

SMALL = ["--pp", "1", "--seq", "16", "--micro-batch", "2", "--global-batch", "2"]


def _job(capsys, argv: list[str]) -> dict:
    assert main(["train", *argv, "--print-config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_the_keys_are_the_parsers_groups_and_dests(capsys):
    job = _job(capsys, [])
    sections = job_sections(job_parser())
    assert list(job) == list(sections)
    assert {s: list(keys) for s, keys in job.items()} == {
        s: [a.dest for a in acts] for s, acts in sections.items()
    }
    assert job["training"]["lr"] == 0.01 and job["plan"]["pp"] == 2  # the defaults
    assert job["training"]["min_lr"] == pytest.approx(0.001)  # derived: lr / 10
    assert job["training"]["warmup"] == 20 and job["plan"]["model"] == "tiny"


def test_print_config_round_trips_through_config(tmp_path, capsys):
    argv = [*SMALL, "--lr", "0.003", "--min-lr", "0.0002", "--warmup", "3", "--steps", "9",
            "--layer-split", "1,3", "--pp", "2", "--recompute", "full,none", "--clip-grad", "0",
            "--no-shard-optimizer", "--metrics", str(tmp_path / "m.jsonl")]  # fmt: skip
    first = _job(capsys, argv)
    path = tmp_path / "job.yaml"
    assert main(["train", *argv, "--print-config", str(path)]) == 0
    assert yaml.safe_load(path.read_text()) == first
    again = _job(capsys, ["--config", str(path)])
    assert again == first
    assert first["plan"]["layer_split"] == [1, 3] and first["plan"]["recompute"] == "full,none"
    assert first["plan"]["clip_grad"] == 0.0 and first["training"]["lr"] == 0.003


def test_a_plan_file_is_written_out_as_its_values(tmp_path, capsys):
    from ratrain.config import Plan, save_plan

    plan = Plan(pp=1, micro_batch=2, global_batch=4, seq=16, compute_dtype="fp32", model="tiny")
    save_plan(plan, tmp_path / "p.yaml", memory_cap_gib=3.5)
    job = _job(capsys, ["--plan", str(tmp_path / "p.yaml")])
    assert job["plan"]["plan"] is None and job["plan"]["global_batch"] == 4
    assert job["output"]["memory_cap"] == 3.5 and job["plan"]["model"] == "tiny"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert _job(capsys, ["--config", str(tmp_path / "job.yaml")]) == job


def test_flags_override_the_file_and_toml_reads_too(tmp_path, capsys):
    f = tmp_path / "job.yaml"
    f.write_text("training: {lr: 0.003, steps: 7}\nplan: {pp: 1}\noutput: {quiet: true}\n")
    job = _job(capsys, ["--config", str(f), "--lr", "0.005", "--no-shard-optimizer"])
    assert job["training"]["lr"] == 0.005 and job["training"]["steps"] == 7
    assert job["plan"]["pp"] == 1 and job["output"]["quiet"] is True
    t = tmp_path / "job.toml"
    t.write_text('[training]\nlr = 0.003\nsteps = 7\n[plan]\npp = 1\nrecompute = "full"\n')
    job = _job(capsys, ["--config", str(t), "--steps", "8"])
    assert job["training"]["lr"] == 0.003 and job["training"]["steps"] == 8
    assert job["plan"]["recompute"] == "full"


def test_a_job_file_runs_the_job_it_says(tmp_path, capsys, monkeypatch):
    """What the file gives reaches the training config and the plan the run builds."""
    import ratrain.train.reference_run as ref

    seen = {}

    def fake(spec, plan, cfg, *a, **k):
        seen.update(plan=plan, cfg=cfg)
        return 0

    monkeypatch.setattr(ref, "run_reference", fake)
    f = tmp_path / "job.yaml"
    f.write_text("plan: {pp: 1, seq: 16}\ntraining: {lr: 0.003, warmup: 2, weight_decay: 0.05}\n")
    assert main(["train", "--config", str(f), "--steps", "5"]) == 0
    cfg, plan = seen["cfg"], seen["plan"]
    assert (cfg.lr, cfg.warmup_steps, cfg.weight_decay, cfg.steps) == (0.003, 2, 0.05, 5)
    assert (plan.pp, plan.seq) == (1, 16)


@pytest.mark.parametrize(
    "text, needles",
    [
        ("training: {lrr: 0.1}\n", ["training.lrr", "unknown key", "did you mean lr?"]),
        ("training: {pp: 2}\n", ["training.pp", "belongs under plan"]),
        ("trainin: {lr: 0.1}\n", ["unknown key 'trainin'", "did you mean training?"]),
        ("training: {lr: abc}\n", ["training.lr", "expected a positive number"]),
        ("training: {lr: -1}\n", ["training.lr", "expected a finite"]),
        ("training: {steps: 2.5}\n", ["training.steps", "expected an integer >= 0"]),
        ("plan: {schedule: xyz}\n", ["plan.schedule", "invalid choice 'xyz'"]),
        ("output: {quiet: 3}\n", ["output.quiet", "expected true or false"]),
        ("training: {lr: true}\n", ["training.lr", "expected a value"]),
        ("training: 3\n", ["training: expected keys"]),
        ("- lr\n", ["expected sections"]),
        ("training: {lr: [\n", ["not valid YAML"]),
        ("config: x.yaml\n", ["unknown key 'config'"]),
    ],
)
def test_a_bad_job_file_is_one_line(text, needles, tmp_path, capsys):
    f = tmp_path / "job.yaml"
    f.write_text(text)
    err = one_line_error(capsys, ["train", "--config", str(f), "--print-config"], *needles)
    assert err.startswith("ratrain train: error: --config ") and str(f) in err


def test_a_missing_job_file_is_one_line(tmp_path, capsys):
    one_line_error(capsys, ["train", "--config", str(tmp_path / "no.yaml")], "cannot read it")
    one_line_error(capsys, ["train", "--config", str(tmp_path)], "is a folder")
    (tmp_path / "j.toml").write_text("[training\n")
    one_line_error(capsys, ["train", "--config", str(tmp_path / "j.toml")], "not valid TOML")
