"""HF export read by every transformers: RoPE as transformers 5 `rope_parameters` and as 4.x
`rope_theta`/`rope_scaling`, the same frequencies either way (theta 1e6 arrives as 1e6); the
tokenizer, generation_config.json and bos/eos ids travel; file modes follow the umask."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from _text import make_docs, make_tokenizer
from ratrain.checkpoint.hf import write_hf
from ratrain.models.hf_config import from_hf_config
from ratrain.models.presets import get_preset
from ratrain.nn.llama import LlamaModel
from ratrain.nn.rope import rope_inv_freq

transformers = pytest.importorskip("transformers")

TINY = get_preset("tiny")
SPECS = {
    "qwen-theta-1e6": get_preset("tiny-qwen"),
    "llama-theta-1e6": dataclasses.replace(TINY, name="llama-1e6", rope_theta=1e6),
    "linear": dataclasses.replace(TINY, name="lin", rope_type="linear", rope_factor=4.0),
    "llama3": dataclasses.replace(
        TINY, name="l3", rope_theta=5e5, rope_type="llama3", rope_factor=8.0,
        rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_seq=32,
    ),
}  # fmt: skip


def _export(spec, out, **kw):
    model = LlamaModel(spec, seed=0)
    write_hf(model.state_dict(), spec, out, **kw)
    return model


@pytest.mark.parametrize("case", list(SPECS))
def test_rope_reaches_transformers_5_exactly(tmp_path, case):
    spec = SPECS[case]
    ours = _export(spec, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["rope_theta"] == spec.rope_theta == cfg["rope_parameters"]["rope_theta"]
    if spec.rope_type == "default":
        assert cfg["rope_scaling"] is None
    else:  # what transformers 4.x reads, without the theta (4.x warns on unknown keys)
        assert cfg["rope_scaling"]["rope_type"] == spec.rope_type
        assert cfg["rope_scaling"]["factor"] == spec.rope_factor
        assert "rope_theta" not in cfg["rope_scaling"]
    assert from_hf_config(tmp_path) == dataclasses.replace(spec, name=tmp_path.name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert hf.config.rope_parameters["rope_theta"] == spec.rope_theta
    assert hf.config.rope_parameters["rope_type"] == spec.rope_type
    assert torch.equal(hf.model.rotary_emb.inv_freq, rope_inv_freq(spec))
    tokens = torch.randint(0, spec.vocab, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(input_ids=tokens).logits - ours(tokens)).abs().max().item() <= 1e-5


def _modes(d):
    return {f.name: f.stat().st_mode & 0o777 for f in d.iterdir()}


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_file_modes_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        _export(TINY, tmp_path / "one")
        _export(TINY, tmp_path / "shards", max_shard_bytes=200_000)
        make_tokenizer(tmp_path / "tok", make_docs(50))
        _export(TINY, tmp_path / "tok_out", tokenizer=tmp_path / "tok")
    finally:
        os.umask(old)
    for d in ("one", "shards", "tok_out"):
        modes = _modes(tmp_path / d)
        assert set(modes.values()) == {0o666 & ~umask}, modes
    assert len(list((tmp_path / "shards").glob("model-*-of-*.safetensors"))) > 1


def test_tokenizer_generation_config_and_token_ids(tmp_path):
    tok = make_tokenizer(tmp_path / "tok", make_docs(100))
    _export(TINY, tmp_path / "out", tokenizer=tok)
    out = tmp_path / "out"
    cfg = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    assert cfg["eos_token_id"] == cfg["bos_token_id"] == 0  # <|endoftext|>, GPT-2 style
    assert gen == {"bos_token_id": 0, "eos_token_id": 0}
    assert (out / "tokenizer.json").read_bytes() == (tok / "tokenizer.json").read_bytes()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == 0
    assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == 0
    # A tokenizer_config.json beside tokenizer.json names the special tokens: copied, obeyed.
    (tok / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "a",
                    "eos_token": {"content": "<|endoftext|>"}})
    )  # fmt: skip
    _export(TINY, tmp_path / "named", tokenizer=tok)
    named = json.loads((tmp_path / "named" / "config.json").read_text())
    a_id = json.loads((tok / "tokenizer.json").read_text())["model"]["vocab"]["a"]
    assert (named["bos_token_id"], named["eos_token_id"]) == (a_id, 0)
    assert (tmp_path / "named" / "tokenizer_config.json").read_text() == (
        tok / "tokenizer_config.json"
    ).read_text()
