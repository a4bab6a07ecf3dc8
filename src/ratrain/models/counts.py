"""Exact parameter counts and FLOPs of a `ModelSpec`, per pipeline unit.

Pure Python (no torch). A model is a sequence of *units*, the grain at which pipeline
stages own work and at which the schedule IR names layers:

    unit 0            the token embedding
    units 1 .. L      the transformer blocks
    unit L + 1        the final RMSNorm and the LM head (and the loss)

FLOP counts are matmul FLOPs (2·m·n·k per GEMM); element-wise work (norms, SwiGLU,
softmax, RoPE) is left out, as in Narayanan et al. 2021 ("Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", §5.1) and PaLM (Chowdhery et al.
2022, appendix B). Attention counts the full s×s score and value products (4·b·s²·h),
as both sources do; a causal kernel that skips masked tiles does about half of that.
"""

from __future__ import annotations

from ratrain.models.spec import ModelSpec

__all__ = [
    "n_units",
    "embedding_unit",
    "head_unit",
    "is_block",
    "block_params",
    "unit_params",
    "total_params",
    "block_gemms",
    "unit_fwd_flops",
    "unit_bwd_flops",
    "unit_recompute_flops",
    "attention_core_fwd_flops",
    "model_flops_per_token",
]


def n_units(spec: ModelSpec) -> int:
    return spec.n_layers + 2


def embedding_unit(spec: ModelSpec) -> int:
    return 0


def head_unit(spec: ModelSpec) -> int:
    return spec.n_layers + 1


def is_block(spec: ModelSpec, unit: int) -> bool:
    return 1 <= unit <= spec.n_layers


def _check_unit(spec: ModelSpec, unit: int) -> None:
    if not 0 <= unit <= spec.n_layers + 1:
        raise IndexError(f"unit {unit} out of range 0..{spec.n_layers + 1}")


def block_params(spec: ModelSpec) -> int:
    """Parameters of one transformer block (LLaMA layout; Baichuan's fused W_pack has the same count)."""
    h, kv = spec.hidden, spec.kv_dim
    attn = h * h + 2 * h * kv + h * h  # q, k, v, o projections
    if spec.qkv_bias:
        attn += h + 2 * kv
    mlp = 3 * h * spec.ffn  # gate, up, down (SwiGLU)
    norms = 2 * h  # input and post-attention RMSNorm weights
    return attn + mlp + norms


def unit_params(spec: ModelSpec, unit: int) -> int:
    """Parameters a stage stores for this unit.

    With tied embeddings the head unit still stores its copy of the embedding matrix (the
    stage holding it needs the weight); `total_params` counts it once.
    """
    _check_unit(spec, unit)
    if unit == 0:
        return spec.vocab * spec.hidden
    if unit == spec.n_layers + 1:
        return spec.hidden + spec.vocab * spec.hidden  # final norm + head projection
    return block_params(spec)


def total_params(spec: ModelSpec) -> int:
    """The model's parameter count, as `sum(p.numel() for p in model.parameters())` reports it."""
    n = sum(unit_params(spec, u) for u in range(n_units(spec)))
    if spec.tied_embeddings:
        n -= spec.vocab * spec.hidden
    return n


def block_gemms(spec: ModelSpec, tokens: int) -> list[tuple[str, int, int, int]]:
    """The weight GEMMs of one block's forward for `tokens` = b·s rows, as (name, m, n, k)."""
    h, kv, f = spec.hidden, spec.kv_dim, spec.ffn
    return [
        ("q_proj", tokens, h, h),
        ("k_proj", tokens, kv, h),
        ("v_proj", tokens, kv, h),
        ("o_proj", tokens, h, h),
        ("gate_proj", tokens, f, h),
        ("up_proj", tokens, f, h),
        ("down_proj", tokens, h, f),
    ]


def attention_core_fwd_flops(spec: ModelSpec, micro_batch: int, seq: int) -> int:
    """Q·Kᵀ and P·V of one block: 2 GEMMs of 2·b·s²·h each (Narayanan et al. 2021, §5.1)."""
    return 4 * micro_batch * seq * seq * spec.hidden


def unit_fwd_flops(spec: ModelSpec, unit: int, micro_batch: int, seq: int) -> int:
    """Forward matmul FLOPs of one unit for one microbatch of `micro_batch` sequences."""
    _check_unit(spec, unit)
    tokens = micro_batch * seq
    if unit == 0:
        return 0  # an embedding lookup is a gather, not a GEMM
    if unit == spec.n_layers + 1:
        return 2 * tokens * spec.hidden * spec.vocab
    gemm = sum(2 * m * n * k for _, m, n, k in block_gemms(spec, tokens))
    return gemm + attention_core_fwd_flops(spec, micro_batch, seq)


def unit_bwd_flops(spec: ModelSpec, unit: int, micro_batch: int, seq: int) -> int:
    """Backward = 2 × forward: one GEMM for the input gradient, one for the weight gradient
    (Narayanan et al. 2021, §5.1). Recomputation is counted separately."""
    return 2 * unit_fwd_flops(spec, unit, micro_batch, seq)


def unit_recompute_flops(
    spec: ModelSpec, unit: int, micro_batch: int, seq: int, policy: str
) -> int:
    """FLOPs re-done before a unit's backward under a recompute policy.

    'none': 0. 'full': the whole forward. 'selective': the attention core only (Korthikanti
    et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.2).
    """
    if policy == "none" or not is_block(spec, unit):
        return 0
    if policy == "full":
        return unit_fwd_flops(spec, unit, micro_batch, seq)
    if policy == "selective":
        return attention_core_fwd_flops(spec, micro_batch, seq)
    raise ValueError(f"unknown recompute policy {policy!r}")


def model_flops_per_token(spec: ModelSpec, seq: int) -> int:
    """Training FLOPs per token without recomputation (forward + backward = 3 × forward)."""
    fwd = sum(unit_fwd_flops(spec, u, 1, seq) for u in range(n_units(spec)))
    return 3 * fwd // seq
