"""Map Hugging Face checkpoints (llama, qwen2, baichuan) to and from `LlamaModel` state dicts.

Names inside a block are the HF names, so the mapping is a prefix rewrite:

    model.embed_tokens.weight      <->  units.0.weight
    model.layers.{i}.<rest>        <->  units.{i+1}.<rest>
    model.norm.weight              <->  units.{L+1}.norm.weight
    lm_head.weight                 <->  units.{L+1}.weight

Baichuan fuses q, k and v into `self_attn.W_pack.weight`, rows [q; k; v]; its NormHead
stores the raw (unnormalised) weight as `lm_head.weight`, as ours does. A checkpoint of a
tied model may omit `lm_head.weight`; the embedding is used for it then.
"""

from __future__ import annotations

import re

import torch

from ratrain.errors import RatrainError
from ratrain.models.hf_config import hf_model_type
from ratrain.models.spec import ModelSpec

__all__ = [
    "hf_to_ratrain_state_dict",
    "ratrain_to_hf_state_dict",
    "unit_state_dict",
]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_UNIT = re.compile(r"^units\.(\d+)\.(.+)$")
# Buffers some HF versions save that carry no learned state.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


def _expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    from ratrain.nn.llama import LlamaModel

    with torch.device("meta"):
        model = LlamaModel(spec, seed=None)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _split_w_pack(key: str, w: torch.Tensor, spec: ModelSpec) -> dict[str, torch.Tensor]:
    h, kv = spec.hidden, spec.kv_dim
    if w.shape[0] != h + 2 * kv:
        raise RatrainError(
            f"{key}: W_pack has {w.shape[0]} rows, expected {h + 2 * kv} for model {spec.name!r}; "
            "check that the checkpoint matches the config"
        )
    q, k, v = torch.split(w, [h, kv, kv], dim=0)
    base = key.removesuffix("W_pack.weight")
    return {base + "q_proj.weight": q, base + "k_proj.weight": k, base + "v_proj.weight": v}


def hf_to_ratrain_state_dict(hf_sd: dict[str, torch.Tensor], spec: ModelSpec) -> dict:
    """A `LlamaModel(spec).state_dict()`-shaped dict from an HF checkpoint's state dict."""
    L = spec.n_layers
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, t in hf_sd.items():
        if _IGNORED.search(key):
            continue
        if key == "model.embed_tokens.weight":
            out["units.0.weight"] = t
        elif key == "model.norm.weight":
            out[f"units.{L + 1}.norm.weight"] = t
        elif key == "lm_head.weight":
            out[f"units.{L + 1}.weight"] = t
        elif m := _LAYER.match(key):
            layer, rest = int(m.group(1)), m.group(2)
            if rest == "self_attn.W_pack.weight":
                for k, v in _split_w_pack(rest, t, spec).items():
                    out[f"units.{layer + 1}.{k}"] = v
            else:
                out[f"units.{layer + 1}.{rest}"] = t
        else:
            unknown.append(key)
    if spec.tied_embeddings and f"units.{L + 1}.weight" not in out and "units.0.weight" in out:
        out[f"units.{L + 1}.weight"] = out["units.0.weight"]
    _check(out, spec, unknown)
    return out


def _check(sd: dict, spec: ModelSpec, unknown: list[str]) -> None:
    expected = _expected_shapes(spec)
    unknown = unknown + [k for k in sd if k not in expected]
    if unknown:
        raise RatrainError(
            f"checkpoint has keys model {spec.name!r} does not: {sorted(unknown)[:5]}; "
            "check that the checkpoint matches the config"
        )
    missing = sorted(k for k in expected if k not in sd)
    if missing:
        raise RatrainError(
            f"checkpoint lacks {len(missing)} weight(s) of model {spec.name!r}, e.g. {missing[:5]}"
        )
    for k, shape in expected.items():
        if tuple(sd[k].shape) != shape:
            raise RatrainError(
                f"checkpoint weight {k} has shape {tuple(sd[k].shape)}, model {spec.name!r} "
                f"expects {shape}; check that the checkpoint matches the config"
            )


def ratrain_to_hf_state_dict(
    sd: dict[str, torch.Tensor], spec: ModelSpec, *, model_type: str | None = None
) -> dict[str, torch.Tensor]:
    """HF names for a `LlamaModel` state dict. `model_type` defaults to `hf_model_type(spec)`;
    'baichuan' fuses q, k, v into W_pack. A tied model's `lm_head.weight` is included (it
    equals the embedding) so that `load_state_dict(strict=True)` accepts the result."""
    mt = model_type or hf_model_type(spec)
    if mt not in ("llama", "qwen2", "baichuan"):
        raise RatrainError(f"model_type {mt!r} is not supported; use llama, qwen2 or baichuan")
    L = spec.n_layers
    out: dict[str, torch.Tensor] = {}
    for key, t in sd.items():
        m = _UNIT.match(key)
        if not m:
            raise RatrainError(f"{key!r} is not a LlamaModel weight name (units.<u>.<name>)")
        unit, rest = int(m.group(1)), m.group(2)
        if unit == 0:
            out["model.embed_tokens.weight"] = t
        elif unit == L + 1:
            out["model.norm.weight" if rest == "norm.weight" else "lm_head.weight"] = t
        else:
            out[f"model.layers.{unit - 1}.{rest}"] = t
    if mt == "baichuan":
        for i in range(L):
            p = f"model.layers.{i}.self_attn."
            qkv = [out.pop(p + f"{n}_proj.weight") for n in "qkv"]
            out[p + "W_pack.weight"] = torch.cat(qkv, dim=0)  # (h + 2 kv, h)
    return out


def unit_state_dict(sd: dict[str, torch.Tensor], unit: int) -> dict[str, torch.Tensor]:
    """The weights of one unit from a full `LlamaModel` state dict, with the `units.<u>.`
    prefix removed, ready for `build_unit(spec, unit).load_state_dict(...)`."""
    prefix = f"units.{unit}."
    return {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
