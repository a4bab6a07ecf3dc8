"""Read a Hugging Face `config.json` (llama, qwen2, baichuan) into a `ModelSpec`."""

from __future__ import annotations

import json
from pathlib import Path

from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec

__all__ = ["from_hf_config", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "baichuan")
_REQUIRED = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
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
    if cfg.get("rope_scaling"):
        raise RatrainError(
            f"{p}: rope_scaling is not supported; remove it or use a config without it"
        )
    heads = cfg["num_attention_heads"]
    layers = cfg["num_hidden_layers"]
    # Baichuan2: the 13B config has no RoPE (ALiBi); it is told apart by its layer count
    # (modeling_baichuan.py chooses ALiBi for the 40-layer model).
    alibi = mt == "baichuan" and layers == 40
    max_seq = cfg.get("max_position_embeddings", cfg.get("model_max_length", 4096))
    name = cfg.get("_name_or_path") or p.parent.name or "hf-model"
    try:
        return ModelSpec(
            name=str(name),
            n_layers=layers,
            hidden=cfg["hidden_size"],
            n_heads=heads,
            n_kv_heads=cfg.get("num_key_value_heads") or heads,
            ffn=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            max_seq=max_seq,
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            position="alibi" if alibi else "rope",
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias", False)),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            normalized_head=mt == "baichuan",
        )
    except TypeError as e:
        raise RatrainError(f"{p}: malformed field ({e})") from None
