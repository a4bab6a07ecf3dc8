"""Bad checkpoints and flags: one line, exit 2, no traceback, no hang."""

from __future__ import annotations

import json

import pytest

from _cli import one_line_error
from ratrain.checkpoint import complete_checkpoints
from ratrain.cli import main

pytestmark = pytest.mark.dist
SMALL = ["--pp", "1", "--seq", "16", "--micro-batch", "2", "--global-batch", "2", "--quiet"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck")
    assert main(["train", "--steps", "2", *SMALL, "--save", str(d / "run")]) == 0
    return d / "run"


@pytest.mark.timeout(120)
def test_checkpoint_of_another_model(ckpt, capfd):
    argv = ["train", "--model", "tiny-qwen", "--steps", "3", *SMALL, "--resume", str(ckpt)]
    one_line_error(capfd, argv, "is of model 'tiny', not 'tiny-qwen'")


@pytest.mark.timeout(120)
def test_missing_partial_and_non_checkpoint_dirs(ckpt, tmp_path, capfd):
    base = ["train", "--steps", "3", *SMALL]
    one_line_error(capfd, [*base, "--resume", str(tmp_path / "nope")], "no such checkpoint")
    part = tmp_path / ".tmp-step-00000002"
    part.mkdir()
    one_line_error(capfd, [*base, "--resume", str(part)], "partial save")
    one_line_error(capfd, [*base, "--resume", str(tmp_path)], "no complete checkpoint")
    one_line_error(capfd, [*base, "--resume", "auto"], "--resume auto needs --save")
    one_line_error(capfd, [*base, "--save", str(ckpt)], "already holds checkpoints")
    one_line_error(
        capfd, ["export", str(tmp_path / "nope"), "--hf", str(tmp_path / "o")], "no such"
    )


@pytest.mark.timeout(120)
def test_corrupt_checkpoints(ckpt, tmp_path, capfd):
    import shutil

    base = ["train", "--steps", "2", *SMALL]  # the saved run's schedule: no note on stderr
    bad = tmp_path / "step-00000002"
    shutil.copytree(ckpt / "step-00000002", bad)
    for f in bad.glob("*.distcp"):
        f.write_bytes(f.read_bytes()[:100])  # truncated data files
    one_line_error(capfd, [*base, "--resume", str(bad)], "corrupt or incomplete")
    one_line_error(
        capfd, ["export", str(bad), "--hf", str(tmp_path / "o")], "corrupt or incomplete"
    )
    (bad / "ratrain.json").write_text("{not json")
    one_line_error(capfd, [*base, "--resume", str(bad)], "corrupt ratrain.json")
    (bad / "ratrain.json").write_text(json.dumps({"format": "other"}))
    one_line_error(capfd, [*base, "--resume", str(bad)], "not a ratrain checkpoint")


@pytest.mark.timeout(120)
def test_resume_auto_continues_and_bad_hf_dirs(ckpt, tmp_path, capfd):
    argv = ["train", "--steps", "3", *SMALL, "--save", str(ckpt), "--resume", "auto"]
    assert main([*argv, "--keep", "1"]) == 0
    out = capfd.readouterr().out
    assert "resuming from" in out and "step-00000002" in out and "1 steps in" in out
    assert (ckpt / "latest").read_text().strip() == "step-00000003"
    assert [c.name for c in complete_checkpoints(ckpt)] == ["step-00000003"]  # --keep 1
    (tmp_path / "hf").mkdir()
    one_line_error(capfd, ["train", "--init-from", str(tmp_path / "hf")], "not found")
    (tmp_path / "hf" / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                    "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 256})
    )  # fmt: skip
    one_line_error(
        capfd, ["train", "--init-from", str(tmp_path / "hf"), *SMALL], "no model.safetensors"
    )
    one_line_error(capfd, ["train", "--keep", "2"], "--keep needs --save")
