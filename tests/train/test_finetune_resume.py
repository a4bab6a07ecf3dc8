"""Fine-tune resume: `--init-from DIR --resume auto` on one command line
starts from DIR's weights when --save holds no checkpoint and continues from the newest one
when it does; `--resume` without `--model` takes the model from the checkpoint (one made
from `--init-from` too); a `--model` that contradicts the checkpoint is one line."""

from __future__ import annotations

import pytest
import torch

from _cli import one_line_error
from ratrain.checkpoint.hf import write_hf
from ratrain.checkpoint.read import read_model_weights
from ratrain.cli import main
from ratrain.models.presets import get_preset
from ratrain.nn.llama import LlamaModel

pytest.importorskip("safetensors")
pytestmark = pytest.mark.dist
SMALL = ["--pp", "1", "--seq", "16", "--micro-batch", "2", "--global-batch", "2", "--quiet"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A Hugging Face directory of the tiny architecture, named hf-init, with weights of
    its own (seed 7, not ratrain's default initialisation)."""
    d = tmp_path_factory.mktemp("hf") / "hf-init"
    spec = get_preset("tiny")
    write_hf(LlamaModel(spec, seed=7).state_dict(), spec, d)
    return d


@pytest.mark.timeout(240)
def test_init_from_with_resume_auto_then_resume_without_model(hf_dir, tmp_path, capfd):
    ck = tmp_path / "ck"
    job = ["train", "--init-from", str(hf_dir), "--resume", "auto", "--save", str(ck), *SMALL]
    # No checkpoint yet: starts from the HF weights (0 steps: the checkpoint is exactly them).
    assert main([*job, "--steps", "0"]) == 0
    out = capfd.readouterr().out
    assert f"weights from {hf_dir}" in out and "resuming" not in out
    want = LlamaModel(get_preset("tiny"), seed=7).state_dict()
    got = read_model_weights(ck / "step-00000000")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    # The same command line again: continues from the checkpoint, not from HF_DIR.
    assert main([*job, "--steps", "2"]) == 0
    out = capfd.readouterr().out
    assert "resuming from" in out and "step-00000000" in out and "weights from" not in out
    assert "training hf-init" in out and "2 steps in" in out
    # --resume without --model: the checkpoint's model (hf-init), not the default tiny.
    argv = ["train", "--resume", "auto", "--save", str(ck), "--steps", "3", *SMALL]
    assert main(argv) == 0
    out = capfd.readouterr().out
    assert "training hf-init" in out and "step-00000002" in out and "1 steps in" in out
    assert (ck / "step-00000003").is_dir()
    # and from a given checkpoint directory, without --save (at its last step: nothing to run)
    argv = ["train", "--resume", str(ck / "step-00000003"), "--steps", "3", *SMALL]
    assert main(argv) == 0
    assert "training hf-init" in capfd.readouterr().out


@pytest.mark.timeout(240)
def test_contradicting_model_and_init_from_with_a_given_checkpoint(hf_dir, tmp_path, capfd):
    ck = tmp_path / "ck"
    argv = ["train", "--init-from", str(hf_dir), "--save", str(ck), "--steps", "0", *SMALL]
    assert main(argv) == 0
    capfd.readouterr()
    resume = ["train", "--resume", "auto", "--save", str(ck), "--steps", "2", *SMALL]
    one_line_error(
        capfd, [*resume, "--model", "tiny-qwen"], "is of model 'hf-init', not 'tiny-qwen'"
    )
    given = ["train", "--init-from", str(hf_dir), "--resume", str(ck), "--steps", "2", *SMALL]
    one_line_error(capfd, given, "--init-from takes --resume auto only", "drop --init-from")
    one_line_error(capfd, [*given[:3], "--model", "tiny", *given[3:]], "drop --model")
