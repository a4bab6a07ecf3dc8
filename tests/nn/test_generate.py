"""`ratrain generate`: KV-cached logits equal the uncached forward within fp32 rounding;
greedy decoding equals transformers' `generate(do_sample=False)` token for token (and stops
at the same EOS); sampling is seeded; the CLI prints the completion; bad input is one line."""

from __future__ import annotations

import pytest
import torch

from _cli import one_line_error
from _text import make_docs, make_tokenizer
from ratrain.cli import main
from ratrain.cli.generate import load_model
from ratrain.data.text import HFTokenizer
from ratrain.models.presets import get_preset
from ratrain.nn.generate import Sampling, generate, next_token
from ratrain.nn.llama import KVCache, LlamaModel

transformers = pytest.importorskip("transformers")


def _perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # norms start at one and biases at zero: make every weight count
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen", "tiny-tied"])
def test_kv_cache_logits_equal_the_uncached_forward(name):
    spec = get_preset(name)
    model = _perturbed(LlamaModel(spec, seed=0))
    tokens = torch.randint(0, spec.vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(spec, batch=2, max_len=24)
        prefill = model(tokens[:, :10], cache)
        steps = [model(tokens[:, i : i + 1], cache) for i in range(10, 24)]
    with torch.no_grad():  # the prompt: the training computation itself
        assert torch.equal(prefill, model(tokens[:, :10]))
    cached = torch.cat([prefill, *steps], dim=1)
    assert (cached - full).abs().max().item() <= 1e-5 * full.abs().max().item()
    assert cache.length == 24
    with pytest.raises(ValueError, match="holds 24 positions"):
        model(tokens[:, :1], cache)


def test_kv_cache_refuses_alibi_and_several_new_tokens():
    with pytest.raises(ValueError, match="RoPE models only"):
        KVCache(get_preset("tiny-alibi"), 1, 8)
    spec = get_preset("tiny")
    model, cache = LlamaModel(spec, seed=0), KVCache(spec, 1, 8)
    with torch.no_grad():
        model(torch.zeros(1, 2, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="one token at a time"):
            model(torch.zeros(1, 2, dtype=torch.long), cache)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random transformers Llama (GQA, rope theta 1e6) saved with a BPE tokenizer."""
    d = tmp_path_factory.mktemp("hf")
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
        rope_theta=1e6, bos_token_id=None, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = _perturbed(transformers.LlamaForCausalLM(cfg), seed=2)
    model.save_pretrained(d)
    make_tokenizer(d, make_docs(200))
    return d, model


def _hf_greedy(model, prompt: list[int], n: int, eos: int | None) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def test_greedy_equals_transformers_generate(hf_dir):
    d, hf = hf_dir
    ours, tok_dir = load_model(d)
    assert tok_dir == d and ours.spec.rope_theta == 1e6
    prompt = [5, 17, 42, 9, 77, 3]
    new = generate(ours, prompt, Sampling(max_new_tokens=40, temperature=0))
    assert new == _hf_greedy(hf, prompt, 40, eos=None)
    assert len(set(new)) > 3  # a sequence, not one token over and over
    # Stop at EOS: the first time the greedy sequence produces a token, both stop there.
    eos = new[len(new) // 2]
    stop = new.index(eos) + 1
    ours_stopped = generate(
        ours, prompt, Sampling(max_new_tokens=40, temperature=0, stop_ids=(eos,))
    )
    assert ours_stopped == new[:stop] == _hf_greedy(hf, prompt, 40, eos=eos)


def test_sampling_is_seeded_and_filters(hf_dir):
    ours, _ = load_model(hf_dir[0])
    prompt = [5, 17, 42]
    greedy = generate(ours, prompt, Sampling(max_new_tokens=12, temperature=0))

    def sample(**kw):
        return generate(ours, prompt, Sampling(max_new_tokens=12, **kw))

    assert sample(seed=1) == sample(seed=1) != sample(seed=2)
    assert sample(top_k=1, seed=5) == greedy
    assert sample(top_p=1e-6, seed=5) == greedy
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    g = torch.Generator().manual_seed(0)
    drawn = {next_token(logits, Sampling(top_k=2), g) for _ in range(200)}
    assert drawn == {1, 2}
    # probabilities 0.507, 0.458, 0.025, 0.009: token 1 alone holds p = 0.5, not 0.6
    drawn = {next_token(logits, Sampling(top_p=0.6), g) for _ in range(200)}
    assert drawn == {1, 2}
    assert {next_token(logits, Sampling(top_p=0.5), g) for _ in range(50)} == {1}


def test_uncached_alibi_model_decodes():
    spec = get_preset("tiny-alibi")
    model = _perturbed(LlamaModel(spec, seed=0))
    new = generate(model, [1, 2, 3], Sampling(max_new_tokens=5, temperature=0))
    seq = [1, 2, 3]
    with torch.no_grad():
        for _ in range(5):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert new == seq[3:]


def test_cli_prints_the_completion(hf_dir, capsys):
    d, hf = hf_dir
    tok = HFTokenizer(d)
    prompt = tok.encode_one("the cat sat on")
    expect = tok.decode(_hf_greedy(hf, prompt, 16, eos=0))
    argv = ["generate", str(d), "--prompt", "the cat sat on", "--max-new-tokens", "16"]
    assert main([*argv, "--temperature", "0"]) == 0
    assert capsys.readouterr().out == expect + "\n"
    assert main([*argv, "--top-k", "20", "--top-p", "0.9", "--seed", "4"]) == 0
    assert main([*argv, "--top-k", "20", "--top-p", "0.9", "--seed", "4"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first == second
    assert main([*argv, "--max-new-tokens", "500", "--temperature", "0"]) == 0
    assert "new tokens at most" in capsys.readouterr().err


def test_cli_errors_are_one_line(hf_dir, tmp_path, capsys):
    d, _ = hf_dir
    one_line_error(capsys, ["generate", str(tmp_path / "nope"), "--prompt", "a"], "not found")
    one_line_error(capsys, ["generate", str(d), "--prompt", "a", "--top-p", "2"], "--top-p must be")
    one_line_error(
        capsys, ["generate", str(d), "--prompt", "a", "--temperature", "-1"], "--temperature"
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).write_bytes((d / f).read_bytes())
    one_line_error(capsys, ["generate", str(bare), "--prompt", "a"], "holds no tokenizer.json")
    one_line_error(capsys, ["generate", str(d), "--prompt", ""], "empty string")
