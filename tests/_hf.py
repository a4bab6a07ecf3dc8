"""The transformers config and class matching a ModelSpec (llama or qwen2), for parity tests."""

import pytest

from ratrain.models.spec import ModelSpec


def hf_config_and_class(spec: ModelSpec, **extra):
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads,
        rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=spec.tied_embeddings,
        max_position_embeddings=spec.max_seq,
        **extra,
    )
    if spec.qkv_bias:
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    # Some transformers versions read rope_theta only from rope_parameters.
    if getattr(cfg, "rope_parameters", None):
        cfg.rope_parameters["rope_theta"] = spec.rope_theta
    return cfg, cls
