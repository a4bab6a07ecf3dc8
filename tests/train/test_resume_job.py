"""A resume keeps the job: the checkpoint stores the effective job (`ratrain.json`'s
"job") and `--resume` restores it; only options given explicitly change it, each change
listed in one line; a change that would break the data order is refused in one line; an
older checkpoint without the job resumes with the flags as they are."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import pytest

from _cli import one_line_error
from ratrain.cli import main

pytestmark = pytest.mark.dist
SMALL = ["--pp", "1", "--seq", "16", "--micro-batch", "2", "--global-batch", "2", "--quiet"]
HYPER = ["--lr", "0.003", "--min-lr", "0.0002", "--warmup", "2", "--weight-decay", "0.05"]


def _records(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """4 steps of non-default hyperparameters and plan, a checkpoint every 2 steps."""
    d = tmp_path_factory.mktemp("job")
    m = d / "m.jsonl"
    argv = ["train", *SMALL, *HYPER, "--steps", "4", "--save-every", "2"]
    assert main([*argv, "--save", str(d / "ck"), "--metrics", str(m)]) == 0
    return d / "ck", _records(m)


@pytest.mark.timeout(180)
def test_a_resume_with_no_flags_keeps_every_saved_option(run, tmp_path, capfd, monkeypatch):
    ck, full = run
    capfd.readouterr()
    m = tmp_path / "m.jsonl"
    assert main(["train", "--resume", str(ck / "step-00000002"), "--metrics", str(m)]) == 0
    cap = capfd.readouterr()
    assert "changed on resume" not in cap.err and "note:" not in cap.err, cap.err
    assert "4 steps x 2 seqs x 16 tokens, pp=1 dp=1" in cap.out, cap.out
    resumed = _records(m)
    assert [r["step"] for r in resumed] == [2, 3]
    for r, want in zip(
        resumed, full[2:], strict=True
    ):  # the lr it used, and bit for bit the same losses
        assert (r["lr"], r["loss"]) == (want["lr"], want["loss"])
    # the TrainConfig it builds: every saved hyperparameter (betas, eps, ... included)
    import ratrain.train.command as command

    seen = {}
    monkeypatch.setattr(command, "run_distributed", lambda r, s, p, cfg, src: seen.update(
        cfg=cfg, plan=p, job=r.job) or 0)  # fmt: skip
    assert main(["train", "--resume", str(ck / "step-00000002")]) == 0
    meta = json.loads((ck / "step-00000002" / "ratrain.json").read_text())
    got = {k: v for k, v in asdict(seen["cfg"]).items() if k != "extra"}
    assert got == meta["lr_schedule"]
    assert (got["lr"], got["min_lr"], got["warmup_steps"], got["weight_decay"]) == (
        0.003, 0.0002, 2, 0.05)  # fmt: skip
    assert seen["plan"].to_dict() == meta["plan"]
    for section in ("plan", "training", "data", "evaluation"):  # what a resume restores
        assert seen["job"][section] == meta["job"][section]


@pytest.mark.timeout(180)
def test_an_explicit_change_is_said_in_one_line(run, tmp_path, capfd):
    ck, _ = run
    capfd.readouterr()
    cfg = tmp_path / "more.yaml"
    cfg.write_text("training: {steps: 5}\n")  # a job file's option is explicit too
    argv = ["train", "--resume", str(ck / "step-00000004"), "--lr", "0.001", "--config", str(cfg)]
    assert main(argv) == 0
    cap = capfd.readouterr()
    said = [x for x in cap.err.splitlines() if "changed on resume" in x]
    assert said == ["ratrain: changed on resume: steps 4 -> 5, lr 0.003 -> 0.001"], cap.err
    assert "note:" not in cap.err and "5 steps x 2 seqs" in cap.out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--seed", "1"], ["--seed 1 (saved 0)", "keeps the data order"]),
        (["--data", "{tmp}/t.txt"], ["--data", "(saved synthetic)"]),
        (["--seq", "32"], ["--seq 32 (saved 16)"]),
        (["--global-batch", "4", "--seed", "2"], ["--seed 2 (saved 0)", "--global-batch 4"]),
    ],
)
def test_a_change_of_the_data_order_is_refused_in_one_line(run, flags, needles, tmp_path, capfd):
    ck, _ = run
    (tmp_path / "t.txt").write_text("some text " * 100)
    flags = [f.format(tmp=tmp_path) for f in flags]
    argv = ["train", "--resume", str(ck / "step-00000002"), *flags]
    err = one_line_error(capfd, argv, *needles)
    assert err.startswith("ratrain train: error: checkpoint "), err


@pytest.mark.timeout(180)
def test_an_older_checkpoint_without_its_job_resumes_as_before(run, tmp_path, capfd):
    ck, _ = run
    old = tmp_path / "step-00000002"
    shutil.copytree(ck / "step-00000002", old)
    meta = json.loads((old / "ratrain.json").read_text())
    del meta["job"]
    (old / "ratrain.json").write_text(json.dumps(meta))
    capfd.readouterr()
    m = tmp_path / "m.jsonl"
    assert main(["train", "--resume", str(old), *SMALL, "--steps", "3", "--metrics", str(m)]) == 0
    cap = capfd.readouterr()
    assert "changed on resume" not in cap.err
    assert "note: resuming with another schedule/optimizer" in cap.err  # the flags' lr
    assert [r["step"] for r in _records(m)] == [2]
