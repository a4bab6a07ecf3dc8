"""Read a Hugging Face `config.json` (llama, qwen2, baichuan) into a `ModelSpec`, exactly.

Every field is decided from the transformers implementation of its model type (transformers
5 `modeling_llama.py`, `modeling_qwen2.py`, `modeling_rope_utils.py`; Baichuan2's
`modeling_baichuan.py`): a field that changes the computation is modelled exactly or refused
with a one-line error naming it; a field that does not (token ids, caching, dtype on disk)
is accepted; a field ratrain does not know is refused, since it might change the model.
Absent fields take the defaults of the model type's transformers config class.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ratrain.errors import RatrainError
from ratrain.models.hf_rope import read_rope
from ratrain.models.spec import ModelSpec

__all__ = [
    "from_hf_config",
    "to_hf_config",
    "read_hf_config_dict",
    "hf_model_type",
    "SUPPORTED_MODEL_TYPES",
]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "baichuan")
_REQUIRED = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
# sourced: the defaults of transformers 5 LlamaConfig / Qwen2Config and Baichuan2's
# configuration_baichuan.py for the fields below, used when config.json omits them.
_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6},
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "num_key_value_heads": 32},
    "baichuan": {"model_max_length": 4096, "rms_norm_eps": 1e-6},
}
# Fields that do not change training or inference math (generation, caching, bookkeeping,
# storage dtype: ratrain chooses its own precision).
_HARMLESS = {
    "_name_or_path", "_from_model_config", "architectures", "auto_map", "bos_token_id", "eos_token_id",
    "pad_token_id", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
    "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "tokenizer_class",
    "pretraining_tp",  # read by no transformers-5 llama code path
    "gradient_checkpointing", "_attn_implementation", "model_type", "max_position_embeddings",
    "model_max_length", "max_window_layers", "sliding_window", "tie_word_embeddings",
    "num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
    "hidden_act", "initializer_range", "attention_dropout", "head_dim", "use_sliding_window",
    "layer_types", "attention_bias", "mlp_bias", "z_loss_weight", *_REQUIRED,
}  # fmt: skip


def _int(p, cfg: dict, key: str, default=None) -> int:
    v = cfg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise RatrainError(f"{p}: {key} must be a positive integer, got {v!r}")
    return v


def _num(p, cfg: dict, key: str, default: float) -> float:
    v = cfg.get(key, default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise RatrainError(f"{p}: {key} must be a finite number, got {v!r}")
    return float(v)


def _bool(p, cfg: dict, key: str, default: bool = False) -> bool:
    v = cfg.get(key, default)
    if not isinstance(v, bool):
        raise RatrainError(f"{p}: {key} must be true or false, got {v!r}")
    return v


def _refuse_if(p, cond: bool, key: str, why: str) -> None:
    if cond:
        raise RatrainError(f"{p}: {key} {why}")


def read_hf_config_dict(cfg: dict, p: str | Path = "config.json") -> ModelSpec:
    """The `ModelSpec` of a parsed config.json; `p` names it in error messages."""
    if not isinstance(cfg, dict):
        raise RatrainError(f"{p}: expected a JSON object at the top level")
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise RatrainError(
            f"{p}: model_type {mt!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise RatrainError(f"{p}: missing required field(s) {', '.join(missing)}")
    unknown = sorted(k for k in cfg if k not in _HARMLESS)
    if unknown:
        raise RatrainError(
            f"{p}: field {unknown[0]!r} is not understood by ratrain and may change the model; "
            "remove it if it does not"
        )
    cfg = {**_DEFAULTS[mt], **cfg}
    layers, hidden = _int(p, cfg, "num_hidden_layers"), _int(p, cfg, "hidden_size")
    heads = _int(p, cfg, "num_attention_heads")
    kv = cfg.get("num_key_value_heads")
    kv = heads if kv is None else _int(p, cfg, "num_key_value_heads")
    _refuse_if(p, hidden % heads != 0, "num_attention_heads", f"({heads}) must divide hidden_size")
    act = cfg.get("hidden_act", "silu")
    _refuse_if(p, act != "silu", "hidden_act", f"{act!r} is not supported; ratrain uses silu")
    if (hd := cfg.get("head_dim")) is not None:
        _refuse_if(
            p,
            hd != hidden // heads,
            "head_dim",
            f"{hd!r} differs from hidden_size / num_attention_heads ({hidden // heads}); "
            "ratrain models head_dim = hidden / heads only",
        )
    drop = _num(p, cfg, "attention_dropout", 0.0)
    _refuse_if(
        p, drop != 0.0, "attention_dropout", f"{drop} is not supported (ratrain has no dropout)"
    )
    init = _num(p, cfg, "initializer_range", 0.02)
    _refuse_if(p, init != 0.02, "initializer_range", f"{init} differs from ratrain's init std 0.02")
    attn_bias = _bool(p, cfg, "attention_bias")
    mlp_bias = _bool(p, cfg, "mlp_bias")
    if mt == "llama":
        # modeling_llama: attention_bias puts a bias on q, k, v *and* o_proj; only q/k/v exist here.
        _refuse_if(p, attn_bias, "attention_bias", "true is not supported for llama (o_proj bias)")
        _refuse_if(p, mlp_bias, "mlp_bias", "true is not supported")
    _check_sliding(p, cfg, mt, layers)
    z = _num(p, cfg, "z_loss_weight", 0.0)
    _refuse_if(p, z != 0.0, "z_loss_weight", f"{z} is not supported (ratrain's loss has no z-loss)")
    # Baichuan2: the 13B config has no RoPE (ALiBi); it is told apart by its layer count
    # (modeling_baichuan.py chooses ALiBi for the 40-layer model).
    alibi = mt == "baichuan" and layers == 40
    max_key = "model_max_length" if mt == "baichuan" else "max_position_embeddings"
    max_seq = _int(p, cfg, max_key)
    rope = read_rope(p, cfg, mt, max_seq)
    name = cfg.get("_name_or_path") or Path(p).parent.name or "hf-model"
    return ModelSpec(
        name=str(name),
        n_layers=layers,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=kv,
        ffn=_int(p, cfg, "intermediate_size"),
        vocab=_int(p, cfg, "vocab_size"),
        max_seq=max_seq,
        norm_eps=_positive(p, cfg, "rms_norm_eps"),
        position="alibi" if alibi else "rope",
        qkv_bias=mt == "qwen2",
        tied_embeddings=_bool(p, cfg, "tie_word_embeddings"),
        normalized_head=mt == "baichuan",
        **rope,
    )


def _positive(p, cfg: dict, key: str) -> float:
    v = _num(p, cfg, key, 0.0)
    _refuse_if(p, not v > 0, key, f"must be positive, got {v!r}")
    return v


def _check_sliding(p, cfg: dict, mt: str, layers: int) -> None:
    # modeling_qwen2: a layer attends within `sliding_window` when its layer_types entry says
    # so; the config derives layer_types from use_sliding_window and max_window_layers.
    use = _bool(p, cfg, "use_sliding_window")
    _refuse_if(p, use and mt == "qwen2", "use_sliding_window", "true is not supported")
    lt = cfg.get("layer_types")
    if lt is None:
        return
    if not isinstance(lt, list) or len(lt) != layers:
        raise RatrainError(f"{p}: layer_types must be a list of {layers} entries, got {lt!r}")
    bad = sorted({t for t in lt if t != "full_attention"}, key=str)
    _refuse_if(
        p, bool(bad), "layer_types", f"entry {bad[:1]} is not supported (full_attention only)"
    )


def from_hf_config(path: str | Path) -> ModelSpec:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise RatrainError(
            f"model config {str(p)!r} not found; pass a preset name or a config.json path"
        )
    try:
        cfg = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RatrainError(f"{p}: not valid JSON ({e}); pass a Hugging Face config.json") from None
    return read_hf_config_dict(cfg, p)


def hf_model_type(spec: ModelSpec) -> str:
    """The HF naming a spec maps to: 'baichuan' (NormHead), 'qwen2' (qkv bias) or 'llama'."""
    if spec.normalized_head:
        return "baichuan"
    return "qwen2" if spec.qkv_bias else "llama"


def _hf_rope(spec: ModelSpec) -> tuple[dict, dict | None]:
    """(rope_parameters, rope_scaling) of `spec`: transformers 5 reads `rope_parameters`
    (`rope_scaling` wins when set), transformers 4.x `rope_theta` and `rope_scaling` (None
    for the default rope type); both name the same frequencies."""
    scaling: dict = {"rope_type": spec.rope_type}
    if spec.rope_type != "default":
        scaling["factor"] = spec.rope_factor
    if spec.rope_type == "llama3":
        scaling.update(
            low_freq_factor=spec.rope_low_freq_factor,
            high_freq_factor=spec.rope_high_freq_factor,
            original_max_position_embeddings=spec.rope_original_max_seq,
        )
    params = {**scaling, "rope_theta": spec.rope_theta}
    return params, (None if spec.rope_type == "default" else scaling)


def to_hf_config(spec: ModelSpec, token_ids: dict | None = None) -> dict:
    """A config.json dict that transformers (5 and 4.x) reads as the same model as `spec`;
    `token_ids` (bos_token_id, eos_token_id) from the model's tokenizer, when known."""
    mt = hf_model_type(spec)
    if spec.position == "alibi" or mt == "baichuan":
        raise RatrainError(
            f"model {spec.name!r}: exporting Baichuan (NormHead/ALiBi) configs is not supported; "
            "transformers has no built-in class for it"
        )
    rope, scaling = _hf_rope(spec)
    cfg = {
        "architectures": ["Qwen2ForCausalLM" if mt == "qwen2" else "LlamaForCausalLM"],
        "model_type": mt,
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_seq,
        "rms_norm_eps": spec.norm_eps,
        "tie_word_embeddings": spec.tied_embeddings,
        "rope_parameters": rope,
        "rope_theta": spec.rope_theta,
        "rope_scaling": scaling,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }
    if mt == "llama":
        cfg.update(attention_bias=False, mlp_bias=False, head_dim=spec.head_dim)
    for key in ("bos_token_id", "eos_token_id"):
        if (token_ids or {}).get(key) is not None:
            cfg[key] = token_ids[key]
    return cfg
