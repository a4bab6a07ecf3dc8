"""--init-from takes a Hugging Face model directory, or the path to its config.json (its
directory is used); a wrong path is one line with the right advice, before any rank
starts."""

from __future__ import annotations

import pytest
import torch

from _cli import one_line_error
from _hf import hf_config_and_class
from ratrain.checkpoint.read import read_model_weights
from ratrain.cli import main
from ratrain.models import get_preset

safetensors_torch = pytest.importorskip("safetensors.torch")

L = get_preset("tiny").n_layers
SMALL = ["--seq", "16", "--micro-batch", "1", "--global-batch", "2", "--quiet", "--threads", "1"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    cfg, cls = hf_config_and_class(get_preset("tiny"))
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("hf") / "model"
    cls(cfg).save_pretrained(d)
    return d


@pytest.fixture
def no_ranks(monkeypatch):
    """A job that would start ranks fails the test instead."""
    import ratrain.train.job as job

    def spawn(*a, **k):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(job, "spawn", spawn)


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_init_from_a_config_json_uses_its_directory(hf_dir, tmp_path, capsys):
    save = tmp_path / "ck"
    argv = ["train", "--init-from", str(hf_dir / "config.json"), "--pp", "2", "--steps", "0"]
    assert main([*argv, "--save", str(save), *SMALL]) == 0
    capsys.readouterr()
    ours = read_model_weights(save / "step-00000000")
    theirs = safetensors_torch.load_file(str(hf_dir / "model.safetensors"))
    blocks = {k: v for k, v in ours.items() if not k.startswith(("units.0.", f"units.{L + 1}."))}
    assert len(blocks) == 9 * L  # every block of both stages, each from the HF weights
    for k, v in blocks.items():
        unit, rest = k.split(".", 2)[1:]
        assert torch.equal(v, theirs[f"model.layers.{int(unit) - 1}.{rest}"]), k
    assert torch.equal(ours["units.0.weight"], theirs["model.embed_tokens.weight"])


def test_a_missing_init_from_directory_gets_the_right_advice(tmp_path, capfd, no_ranks):
    line = one_line_error(
        capfd,
        ["train", "--init-from", str(tmp_path / "none"), "--pp", "2"],
        f"--init-from {tmp_path / 'none'}",
        "not found",
        "Hugging Face model directory",
    )
    assert "preset" not in line, line
    line = one_line_error(
        capfd,
        ["train", "--init-from", str(tmp_path / "none" / "config.json"), "--pp", "2"],
        "not found",
        "Hugging Face model directory",
    )
    assert "preset" not in line, line


def test_init_from_another_file_or_a_directory_without_weights(hf_dir, tmp_path, capfd, no_ranks):
    weights = hf_dir / "model.safetensors"
    one_line_error(
        capfd, ["train", "--init-from", str(weights), "--pp", "2"], "Hugging Face model directory"
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((hf_dir / "config.json").read_text())
    one_line_error(
        capfd,
        ["train", "--init-from", str(bare / "config.json"), "--pp", "2"],
        "no model.safetensors",
    )
