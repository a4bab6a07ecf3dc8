"""RoPE inverse frequencies, with the frequency scalings Hugging Face models use.

The arithmetic follows transformers' `modeling_rope_utils` (default, linear and llama3 rope
types) operation for operation in fp32, so the tables are bit-identical to theirs.
"""

from __future__ import annotations

import math

import torch

from ratrain.models.spec import ModelSpec

__all__ = ["rope_inv_freq"]


def rope_inv_freq(spec: ModelSpec, device: torch.device | None = None) -> torch.Tensor:
    """The (head_dim / 2,) fp32 inverse frequencies of `spec`'s rotary embedding."""
    hs = spec.head_dim
    inv_freq = 1.0 / (
        spec.rope_theta ** (torch.arange(0, hs, 2, dtype=torch.float32, device=device) / hs)
    )
    if spec.rope_type == "linear":
        # Position interpolation (Chen et al. 2023): positions / factor == frequencies / factor.
        return inv_freq / spec.rope_factor
    if spec.rope_type == "llama3":
        return _llama3(inv_freq, spec)
    return inv_freq


def _llama3(inv_freq: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # Llama 3.1: wavelengths longer than original_ctx / low_freq_factor are divided by the
    # factor, shorter than original_ctx / high_freq_factor are kept, and those in between are
    # interpolated linearly in original_ctx / wavelength.
    factor, lo, hi = spec.rope_factor, spec.rope_low_freq_factor, spec.rope_high_freq_factor
    old_ctx = spec.rope_original_max_seq
    low_wavelen, high_wavelen = old_ctx / lo, old_ctx / hi
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)
