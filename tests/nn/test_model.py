"""The torch model: parity with Hugging Face, ALiBi and NormHead by formula, units, init, counts."""

import math

import pytest
import torch
import torch.nn.functional as F

from _hf import hf_config_and_class
from ratrain.errors import RatrainError
from ratrain.kernels import get_backend
from ratrain.models.counts import n_units, total_params, unit_params
from ratrain.models.presets import PRESETS, get_preset
from ratrain.models.spec import ModelSpec
from ratrain.nn.hf_weights import (
    hf_to_ratrain_state_dict,
    ratrain_to_hf_state_dict,
    unit_state_dict,
)
from ratrain.nn.llama import (
    Block,
    Head,
    LlamaModel,
    alibi_slopes,
    build_unit,
    cross_entropy,
)

TINY = ["tiny", "tiny-qwen", "tiny-alibi", "tiny-tied"]


def _tokens(spec, B=2, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.vocab, (B, T), generator=g)


# --- Hugging Face parity --------------------------------------------------------------


def _hf_model(spec: ModelSpec):
    cfg, cls = hf_config_and_class(spec, attn_implementation="eager")
    return cls(cfg).eval()


@torch.no_grad()
def _perturb(model, std=0.1):
    # Norm weights start at one and biases at zero: perturb every parameter so that a
    # swapped or ignored weight would show up in the comparison.
    g = torch.Generator().manual_seed(11)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * std)


@pytest.mark.parametrize(
    "spec",
    [
        get_preset("tiny"),  # GQA 4:2
        get_preset("tiny-qwen"),  # GQA, qkv bias, theta 1e6
        get_preset("tiny-tied"),  # GQA 2:1, tied embeddings
        ModelSpec("mha", 2, 32, 4, 4, 48, 96, max_seq=64, norm_eps=1e-6),  # plain MHA
    ],
    ids=lambda s: s.name,
)
def test_logits_and_grads_match_hf(spec):
    ours = LlamaModel(spec, seed=3)
    _perturb(ours)
    hf = _hf_model(spec)
    hf.load_state_dict(ratrain_to_hf_state_dict(ours.state_dict(), spec), strict=True)
    tokens, targets = _tokens(spec, seed=1), _tokens(spec, seed=2)

    logits = ours(tokens)
    hf_logits = hf(input_ids=tokens).logits
    torch.testing.assert_close(logits, hf_logits, atol=1e-5, rtol=1e-5)

    cross_entropy(logits, targets).backward()
    cross_entropy(hf_logits, targets).backward()
    hf_grads = {k: p.grad for k, p in hf.named_parameters()}
    hf_grads = hf_to_ratrain_state_dict(hf_grads, spec)
    ours_params = dict(ours.named_parameters())
    assert len(ours_params) == sum(1 for _ in hf.parameters())
    for name, p in ours_params.items():
        torch.testing.assert_close(p.grad, hf_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_cross_entropy_matches_hf_loss():
    spec = get_preset("tiny")
    hf = _hf_model(spec)
    tokens = _tokens(spec, T=12)
    out = hf(input_ids=tokens, labels=tokens)
    # HF shifts labels inside; ours takes targets already aligned with the logits.
    ours = cross_entropy(out.logits[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(ours, out.loss)


# --- ALiBi ----------------------------------------------------------------------------


def test_alibi_slopes_power_of_two():
    assert alibi_slopes(8) == pytest.approx([2.0**-i for i in range(1, 9)])


def test_alibi_slopes_40_heads():
    s = alibi_slopes(40)
    assert len(s) == 40
    # the 32 slopes of the closest power of two: 2^(-8 i / 32)
    assert s[:32] == pytest.approx([2.0 ** (-i / 4) for i in range(1, 33)])
    # then the odd-indexed slopes of the 64-head sequence 2^(-8 i / 64), i = 1, 3, ..., 15
    assert s[32:] == pytest.approx([2.0 ** (-i / 8) for i in range(1, 16, 2)])
    assert s[32] == pytest.approx(0.9170040432046712)  # 2^-0.125
    assert len(set(s)) == 40


def _attention_by_formula(attn, x, slopes):
    """softmax(Q Kᵀ / sqrt(d) + m_h (j - i), causal) V, then o_proj, written out by hand."""
    spec = attn.spec
    B, T, H = x.shape
    nh, hs = spec.n_heads, spec.head_dim
    q = (x @ attn.q_proj.weight.T).view(B, T, nh, hs).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(B, T, nh, hs).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(B, T, nh, hs).transpose(1, 2)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    out = torch.empty(B, nh, T, hs)
    for h in range(nh):
        scores = q[:, h] @ k[:, h].transpose(-1, -2) / math.sqrt(hs) + slopes[h] * (j - i)
        scores = scores.masked_fill(j > i, float("-inf"))
        out[:, h] = torch.softmax(scores, dim=-1) @ v[:, h]
    return out.transpose(1, 2).reshape(B, T, H) @ attn.o_proj.weight.T


def test_alibi_attention_matches_formula():
    spec = get_preset("tiny-alibi")
    block = Block(spec, "torch", 0, seed=5)
    x = torch.randn(2, 12, spec.hidden)
    got = block.self_attn(x)
    want = _attention_by_formula(block.self_attn, x, alibi_slopes(spec.n_heads))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_backend_alibi_gqa_and_non_power_of_two():
    # 6 query heads (not a power of two) reading 3 kv heads through the backend directly.
    be = get_backend("torch")
    B, T, hs = 1, 7, 8
    q, k, v = torch.randn(B, 6, T, hs), torch.randn(B, 3, T, hs), torch.randn(B, 3, T, hs)
    slopes = torch.tensor(alibi_slopes(6))
    got = be.attention(q, k, v, causal=True, alibi_slopes=slopes)
    k6, v6 = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    pos = torch.arange(T)
    bias = slopes[:, None, None] * (pos[None, :] - pos[:, None])
    scores = q @ k6.transpose(-1, -2) / math.sqrt(hs) + bias
    scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    torch.testing.assert_close(got, torch.softmax(scores, -1) @ v6, atol=1e-5, rtol=1e-5)


# --- NormHead -------------------------------------------------------------------------


def test_normhead_uses_row_normalised_weight():
    spec = get_preset("tiny-alibi")
    head = Head(spec, seed=1)
    x = torch.randn(2, 5, spec.hidden)
    want = head.norm(x) @ F.normalize(head.weight, dim=-1).T
    torch.testing.assert_close(head(x), want, atol=1e-5, rtol=1e-5)
    plain = Head(get_preset("tiny"), seed=1)
    torch.testing.assert_close(plain(x), plain.norm(x) @ plain.weight.T)


# --- units, init, counts --------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_units_chain_equals_model_and_init_is_per_unit(name):
    spec = PRESETS[name]
    model = LlamaModel(spec, seed=7)
    tokens = _tokens(spec)
    x = tokens
    for u in range(n_units(spec)):
        alone = build_unit(spec, u, seed=7)
        alone_sd, model_sd = alone.state_dict(), model.units[u].state_dict()
        assert alone_sd.keys() == model_sd.keys()
        for k in model_sd:
            assert torch.equal(alone_sd[k], model_sd[k]), (u, k)
        x = alone(x)
    assert torch.equal(x, model(tokens))


def test_seeds_differ_and_init_values():
    spec = get_preset("tiny")
    a, b = LlamaModel(spec, seed=0), LlamaModel(spec, seed=1)
    assert not torch.equal(a.units[1].self_attn.q_proj.weight, b.units[1].self_attn.q_proj.weight)
    assert not torch.equal(a.units[1].mlp.up_proj.weight, a.units[2].mlp.up_proj.weight)
    w = a.units[1].mlp.gate_proj.weight
    assert abs(w.std().item() - 0.02) < 0.002
    assert torch.equal(a.units[1].input_layernorm.weight, torch.ones(spec.hidden))
    q = LlamaModel(get_preset("tiny-qwen"), seed=0).units[1].self_attn.q_proj
    assert torch.equal(q.bias, torch.zeros_like(q.bias))


def test_tied_head_shares_in_model_and_copies_alone():
    spec = get_preset("tiny-tied")
    model = LlamaModel(spec, seed=2)
    assert model.units[-1].weight is model.units[0].weight
    head = build_unit(spec, spec.n_layers + 1, seed=2)
    assert head.weight is not model.units[0].weight
    assert torch.equal(head.weight, model.units[0].weight)


@pytest.mark.parametrize("name", TINY)
def test_param_counts_match_counts(name):
    spec = PRESETS[name]
    model = LlamaModel(spec)
    for u in range(n_units(spec)):
        assert sum(p.numel() for p in build_unit(spec, u).parameters()) == unit_params(spec, u)
    assert sum(p.numel() for p in model.parameters()) == total_params(spec)


@pytest.mark.parametrize("name", ["llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b"])
def test_large_param_counts_on_meta(name):
    spec = PRESETS[name]
    with torch.device("meta"):
        model = LlamaModel(spec, seed=None)
        block = build_unit(spec, 1, seed=None)
    assert sum(p.numel() for p in model.parameters()) == total_params(spec)
    assert sum(p.numel() for p in block.parameters()) == unit_params(spec, 1)


# --- dtypes ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["tiny", "tiny-alibi"])
def test_low_precision_forward_close_to_fp32(name, dtype):
    spec = PRESETS[name]
    tokens = _tokens(spec)
    ref = LlamaModel(spec, seed=0)(tokens)
    low = LlamaModel(spec, seed=0, dtype=dtype)
    assert all(p.dtype == dtype for p in low.parameters())
    logits = low(tokens)
    assert logits.dtype == dtype
    torch.testing.assert_close(logits.float(), ref, atol=0.05, rtol=0.05)
    loss = cross_entropy(logits, tokens)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - cross_entropy(ref, tokens).item()) < 0.01
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in low.parameters())


# --- checkpoint mapping ---------------------------------------------------------------


def test_baichuan_w_pack_roundtrip():
    spec = get_preset("tiny-alibi")
    sd = LlamaModel(spec, seed=4).state_dict()
    hf = ratrain_to_hf_state_dict(sd, spec)
    assert "model.layers.0.self_attn.W_pack.weight" in hf
    assert "model.layers.0.self_attn.q_proj.weight" not in hf
    w_pack = hf["model.layers.0.self_attn.W_pack.weight"]
    assert w_pack.shape == (3 * spec.hidden, spec.hidden)
    assert torch.equal(w_pack[spec.hidden : 2 * spec.hidden], sd["units.1.self_attn.k_proj.weight"])
    back = hf_to_ratrain_state_dict(hf, spec)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_tied_checkpoint_without_lm_head_and_unit_load():
    spec = get_preset("tiny-tied")
    sd = LlamaModel(spec, seed=4).state_dict()
    hf = ratrain_to_hf_state_dict(sd, spec)
    del hf["lm_head.weight"]  # saved tied checkpoints omit it
    back = hf_to_ratrain_state_dict(hf, spec)
    head = build_unit(spec, spec.n_layers + 1, seed=None)
    head.load_state_dict(unit_state_dict(back, spec.n_layers + 1), strict=True)
    assert torch.equal(head.weight, sd["units.0.weight"])


def test_checkpoint_mismatch_is_a_user_error():
    spec = get_preset("tiny")
    hf = ratrain_to_hf_state_dict(LlamaModel(spec).state_dict(), spec)
    with pytest.raises(RatrainError, match="shape"):
        hf_to_ratrain_state_dict(hf, ModelSpec(**{**spec.to_dict(), "ffn": 64}))
    hf.pop("model.layers.1.mlp.up_proj.weight")
    with pytest.raises(RatrainError, match="lacks"):
        hf_to_ratrain_state_dict(hf, spec)
    hf["model.layers.9.mlp.up_proj.weight"] = torch.zeros(1)
    with pytest.raises(RatrainError, match="does not"):
        hf_to_ratrain_state_dict(hf, spec)
