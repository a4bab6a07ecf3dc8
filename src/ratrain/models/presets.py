"""Built-in model presets.

The large presets copy the published Hugging Face `config.json` of each model (the
fields ratrain reads); `tests/models/test_spec.py` checks their parameter counts against
transformers built on the meta device. The tiny presets are for tests and demos.
"""

from __future__ import annotations

from pathlib import Path

from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec

__all__ = ["PRESETS", "get_preset", "resolve_model"]

_LLAMA2 = dict(max_seq=4096, norm_eps=1e-5, position="rope", rope_theta=10000.0)
_QWEN25 = dict(max_seq=32768, position="rope", rope_theta=1_000_000.0, qkv_bias=True)
_BAICHUAN2 = dict(max_seq=4096, norm_eps=1e-6, normalized_head=True)

PRESETS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        # meta-llama/Llama-2-{7,13,70}b-hf config.json
        ModelSpec("llama2-7b", 32, 4096, 32, 32, 11008, 32000, **_LLAMA2),
        ModelSpec("llama2-13b", 40, 5120, 40, 40, 13824, 32000, **_LLAMA2),
        ModelSpec("llama2-70b", 80, 8192, 64, 8, 28672, 32000, **_LLAMA2),
        # baichuan-inc/Baichuan2-{7,13}B-Base config.json: 7B uses RoPE, 13B ALiBi
        ModelSpec("baichuan2-7b", 32, 4096, 32, 32, 11008, 125696, position="rope", **_BAICHUAN2),
        ModelSpec("baichuan2-13b", 40, 5120, 40, 40, 13696, 125696, position="alibi", **_BAICHUAN2),
        # Qwen/Qwen2.5-{7,32}B config.json
        ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, norm_eps=1e-6, **_QWEN25),
        ModelSpec("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, norm_eps=1e-5, **_QWEN25),
        # meta-llama/Llama-3.2-1B config.json: GQA, tied embeddings, RoPE 5e5 with Llama 3's
        # scaling (factor 32)
        ModelSpec(
            "llama3.2-1b",
            16,
            2048,
            32,
            8,
            8192,
            128256,
            max_seq=131072,
            norm_eps=1e-5,
            tied_embeddings=True,
            rope_theta=500_000.0,
            rope_type="llama3",
            rope_factor=32.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_original_max_seq=8192,
        ),  # fmt: skip
        # meta-llama/Llama-3.1-405B config.json: GQA, RoPE 5e5 with Llama 3.1's scaling
        ModelSpec(
            "llama3-405b",
            126,
            16384,
            128,
            8,
            53248,
            128256,
            max_seq=131072,
            norm_eps=1e-5,
            rope_theta=500_000.0,
            rope_type="llama3",
            rope_factor=8.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_original_max_seq=8192,
        ),  # fmt: skip
        # tiny models for tests and demos (CPU, seconds)
        ModelSpec("tiny", 4, 64, 4, 2, 176, 256, max_seq=128),
        ModelSpec("tiny-qwen", 4, 64, 4, 2, 176, 256, max_seq=128, qkv_bias=True, rope_theta=1e6),
        ModelSpec(
            "tiny-alibi", 4, 64, 4, 4, 176, 256, max_seq=128, position="alibi", normalized_head=True
        ),
        ModelSpec("tiny-tied", 2, 32, 2, 1, 64, 128, max_seq=64, tied_embeddings=True),
        # small models for benchmarks on CPU (minutes): the runtime_vs_peers job's, and a
        # smaller one whose steps a 100 Mbit/s emulated network link can keep up with
        ModelSpec("bench-512", 8, 512, 8, 8, 1376, 8192, max_seq=256),
        ModelSpec("bench-256", 8, 256, 4, 4, 688, 8192, max_seq=256),
    ]
}


def get_preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise RatrainError(
            f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)} "
            "or pass a path to a Hugging Face config.json"
        ) from None


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset name, or a path to a Hugging Face `config.json` (or its directory)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    p = Path(name_or_path)
    if p.suffix == ".json" or p.is_dir() or p.exists():
        from ratrain.models.hf_config import from_hf_config

        return from_hf_config(p)
    return get_preset(name_or_path)
