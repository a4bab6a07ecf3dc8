"""The RoPE fields of a Hugging Face config.json, read the way transformers 5 reads them.

transformers 5 (`modeling_rope_utils.RotaryEmbeddingConfigMixin`) takes `rope_scaling` if
present, else `rope_parameters`; inside it, `rope_theta` wins over a top-level
`rope_theta`, which wins over the default 10000; `rope_type` falls back to the legacy
`type`, then 'default'. The rope types ratrain computes bit-identically (see
`ratrain.nn.rope`) are modelled; any other is refused, naming the field.
"""

from __future__ import annotations

import math

from ratrain.errors import RatrainError

__all__ = ["read_rope"]

_KEYS = {
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "llama3": (
        {"factor", "low_freq_factor", "high_freq_factor"},
        {"original_max_position_embeddings"},
    ),
}
_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
_WHY = {
    "dynamic": "its frequencies depend on the longest sequence seen so far",
    "yarn": "not modelled",
    "longrope": "not modelled",
}


def _number(p, key: str, v, *, positive: bool = True) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise RatrainError(f"{p}: {key} must be a finite number, got {v!r}")
    if positive and not v > 0:
        raise RatrainError(f"{p}: {key} must be positive, got {v!r}")
    return float(v)


def read_rope(p, cfg: dict, model_type: str, max_seq: int) -> dict:
    """ModelSpec keyword arguments (rope_theta, rope_type, rope_factor, ...) for `cfg`."""
    key = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    rp = cfg.get(key) or {}
    if not isinstance(rp, dict):
        raise RatrainError(f"{p}: {key} must be a JSON object or null, got {rp!r}")
    layer_types = cfg.get("layer_types") or []
    if rp and set(rp) <= set(layer_types):
        # transformers nests rope_parameters by layer type when the config declares them;
        # `_check_sliding` already required every layer to be full attention.
        rp = rp.get("full_attention") or {}
        key += ".full_attention"
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in _KEYS:
        why = _WHY.get(rope_type, "unknown")
        raise RatrainError(
            f"{p}: {key}.rope_type {rope_type!r} is not supported ({why}); "
            f"supported: {', '.join(_KEYS)}"
        )
    required, optional = _KEYS[rope_type]
    unknown = sorted(set(rp) - _COMMON - required - optional)
    if unknown:
        raise RatrainError(f"{p}: {key}.{unknown[0]} is not supported for rope_type {rope_type!r}")
    absent = sorted(required - set(rp))
    if absent:
        raise RatrainError(f"{p}: {key} lacks {absent[0]!r}, needed by rope_type {rope_type!r}")
    prf = _number(p, f"{key}.partial_rotary_factor", rp.get("partial_rotary_factor", 1.0))
    if prf != 1.0:
        raise RatrainError(f"{p}: {key}.partial_rotary_factor {prf} is not supported (1.0 only)")
    if "rope_theta" in rp:
        theta = _number(p, f"{key}.rope_theta", rp["rope_theta"])
    else:
        theta = _number(p, "rope_theta", cfg.get("rope_theta", 10000.0))
    if model_type == "baichuan" and (theta != 10000.0 or rope_type != "default"):
        # modeling_baichuan.py hard-codes base 10000 without scaling and ignores these fields.
        raise RatrainError(
            f"{p}: rope_theta/{key} are ignored by Baichuan's modelling code (base 10000); "
            "remove them"
        )
    out: dict = {"rope_theta": theta, "rope_type": rope_type}
    if rope_type != "default":
        out["rope_factor"] = _number(p, f"{key}.factor", rp["factor"])
    if rope_type == "llama3":
        out["rope_low_freq_factor"] = _number(p, f"{key}.low_freq_factor", rp["low_freq_factor"])
        out["rope_high_freq_factor"] = _number(p, f"{key}.high_freq_factor", rp["high_freq_factor"])
        omax = rp.get("original_max_position_embeddings", max_seq)
        if not isinstance(omax, int) or isinstance(omax, bool) or omax <= 0:
            raise RatrainError(
                f"{p}: {key}.original_max_position_embeddings must be a positive integer, "
                f"got {omax!r}"
            )
        out["rope_original_max_seq"] = omax
    return out
