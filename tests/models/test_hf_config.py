"""config.json read exactly: every modelled field matches transformers; the rest are refused."""

import copy
import json

import pytest
import torch

from ratrain.errors import RatrainError
from ratrain.models.hf_config import from_hf_config, to_hf_config
from ratrain.nn.hf_weights import ratrain_to_hf_state_dict
from ratrain.nn.llama import LlamaModel
from ratrain.nn.rope import rope_inv_freq

transformers = pytest.importorskip("transformers")

TINY = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

CASES = {
    "llama-theta-in-rope_parameters": ("llama", dict(rope_parameters={"rope_theta": 5e5})),
    "llama-theta-top-level": ("llama", dict(rope_theta=5e5)),
    "llama-eps-tied": ("llama", dict(rms_norm_eps=1e-3, tie_word_embeddings=True)),
    "llama-linear": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "llama-legacy-type-linear": ("llama", dict(rope_scaling={"type": "linear", "factor": 2.0})),
    "llama-llama3": ("llama", dict(rope_parameters={**LLAMA3, "rope_theta": 5e5})),
    "llama-mha-head_dim": ("llama", dict(num_key_value_heads=4, head_dim=16)),
    "qwen2-bias-theta": ("qwen2", dict(rope_theta=1e6, rms_norm_eps=1e-5)),
}


def _hf_dir(tmp_path, mt, extra):
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[mt]
    kw = {**TINY, **copy.deepcopy(extra)}  # transformers fills the rope dicts in place
    if kw.get("num_key_value_heads") is None:
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    cfg = cls(**kw)
    cfg.save_pretrained(tmp_path)  # transformers 5 layout: rope_parameters, head_dim, ...
    return cfg


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(tmp_path, case):
    mt, extra = CASES[case]
    cfg = _hf_dir(tmp_path, mt, extra)
    spec = from_hf_config(tmp_path)
    assert spec.rope_theta == cfg.rope_parameters["rope_theta"]
    assert spec.rope_type == cfg.rope_parameters["rope_type"]
    if "5e5" in case or "theta" in case or "llama3" in case:
        assert spec.rope_theta in (5e5, 1e6)
    ours = LlamaModel(spec, seed=3)
    cfg._attn_implementation = "eager"
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    hf.load_state_dict(ratrain_to_hf_state_dict(ours.state_dict(), spec), strict=True)
    # 96 positions: past the llama3 original context (64) so all three bands are used.
    tokens = torch.randint(0, 96, (2, 96), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), hf(input_ids=tokens).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["llama-linear", "llama-llama3", "llama-theta-top-level"])
def test_inv_freq_bit_identical(tmp_path, case):
    mt, extra = CASES[case]
    cfg = _hf_dir(tmp_path, mt, extra)
    spec = from_hf_config(tmp_path)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rt = cfg.rope_parameters["rope_type"]
    if rt == "default":
        hf_model = transformers.AutoModelForCausalLM.from_config(cfg)
        hf_inv = hf_model.model.rotary_emb.inv_freq
    else:
        hf_inv, _ = ROPE_INIT_FUNCTIONS[rt](cfg, None)
    assert torch.equal(rope_inv_freq(spec), hf_inv)


def test_export_config_reads_back_identically(tmp_path):
    for mt, extra in CASES.values():
        _hf_dir(tmp_path, mt, extra)
        spec = from_hf_config(tmp_path)
        (tmp_path / "config.json").write_text(json.dumps(to_hf_config(spec)))
        assert from_hf_config(tmp_path) == spec


def _write(tmp_path, mt="llama", **fields):
    cfg = {"model_type": mt, **TINY, **fields}
    cfg = {k: v for k, v in cfg.items() if v is not ...}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "config.json"


@pytest.mark.parametrize(
    "mt, fields, named",
    [
        ("llama", dict(attention_bias=True), "attention_bias"),
        ("llama", dict(mlp_bias=True), "mlp_bias"),
        ("llama", dict(head_dim=32), "head_dim"),
        ("llama", dict(hidden_act="gelu"), "hidden_act"),
        ("llama", dict(attention_dropout=0.1), "attention_dropout"),
        ("llama", dict(initializer_range=0.01), "initializer_range"),
        ("llama", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_type"),
        ("llama", dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_type"),
        ("llama", dict(rope_parameters={"rope_type": "linear"}), "factor"),
        ("llama", dict(rope_parameters={"rope_type": "default", "foo": 1}), "foo"),
        ("llama", dict(rope_parameters={"partial_rotary_factor": 0.5}), "partial_rotary_factor"),
        ("llama", dict(quantization_config={"bits": 4}), "quantization_config"),
        ("qwen2", dict(use_sliding_window=True), "use_sliding_window"),
        ("qwen2", dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
        ("baichuan", dict(z_loss_weight=0.1), "z_loss_weight"),
        ("baichuan", dict(rope_theta=5e5), "rope_theta"),
        # mistyped and out of range
        ("llama", dict(rope_theta="big"), "rope_theta"),
        ("llama", dict(rope_parameters={"rope_theta": -1.0}), "rope_theta"),
        ("llama", dict(rms_norm_eps=0), "rms_norm_eps"),
        ("llama", dict(rms_norm_eps="1e-5"), "rms_norm_eps"),
        ("llama", dict(tie_word_embeddings="yes"), "tie_word_embeddings"),
        ("llama", dict(num_hidden_layers=2.5), "num_hidden_layers"),
        ("llama", dict(vocab_size=-3), "vocab_size"),
        ("llama", dict(num_key_value_heads=0), "num_key_value_heads"),
        ("llama", dict(max_position_embeddings=True), "max_position_embeddings"),
        ("llama", dict(rope_parameters=[1]), "rope_parameters"),
        ("llama", dict(rope_parameters={**LLAMA3, "low_freq_factor": 5.0}), "freq_factor"),
        ("llama", dict(rope_parameters={**LLAMA3, "factor": "x"}), "factor"),
    ],
)
def test_refused_with_one_line_naming_the_field(tmp_path, mt, fields, named):
    p = _write(tmp_path, mt, **fields)
    with pytest.raises(RatrainError) as e:
        from_hf_config(p)
    msg = str(e.value)
    assert named in msg and "\n" not in msg, msg


@pytest.mark.parametrize(
    "fields",
    [
        dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        dict(pretraining_tp=1, use_cache=False, dtype="bfloat16", bos_token_id=1),
        dict(attention_dropout=0.0, head_dim=16, rope_scaling=None),
    ],
)
def test_harmless_values_accepted(tmp_path, fields):
    spec = from_hf_config(_write(tmp_path, **fields))
    assert spec.rope_type == "default" and spec.rope_theta == 10000.0


def test_qwen2_absent_kv_heads_takes_transformers_default(tmp_path):
    # Qwen2Config defaults num_key_value_heads to 32; 4 heads cannot share 32 kv heads.
    p = _write(tmp_path, "qwen2", num_key_value_heads=...)
    with pytest.raises(RatrainError, match="kv heads"):
        from_hf_config(p)


# The published config.json files of the presets' models, as released (field for field).
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.31.0",
    "use_cache": True,
    "vocab_size": 32000,
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
BAICHUAN2_13B = {
    "_from_model_config": True, "architectures": ["BaichuanForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_baichuan.BaichuanConfig"}, "bos_token_id": 1,
    "eos_token_id": 2, "gradient_checkpointing": False, "hidden_act": "silu",
    "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 13696,
    "model_max_length": 4096, "model_type": "baichuan", "num_attention_heads": 40,
    "num_hidden_layers": 40, "pad_token_id": 0, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False, "tokenizer_class": "BaichuanTokenizer",
    "torch_dtype": "bfloat16", "transformers_version": "4.29.2", "use_cache": True,
    "vocab_size": 125696, "z_loss_weight": 0,
}  # fmt: skip


@pytest.mark.parametrize(
    "cfg, preset, changes",
    [
        (LLAMA2_7B, "llama2-7b", {}),
        (QWEN25_7B, "qwen2.5-7b", {"max_seq": 131072}),  # the preset trains at 32k
        (BAICHUAN2_13B, "baichuan2-13b", {}),
    ],
)
def test_released_configs_read_as_the_presets(tmp_path, cfg, preset, changes):
    from ratrain.models.presets import get_preset

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = from_hf_config(tmp_path)
    want = get_preset(preset).to_dict()
    assert {**spec.to_dict(), "name": preset} == {**want, **changes}
