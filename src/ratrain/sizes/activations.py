"""Activation bytes a microbatch keeps for one unit between its F and its B, tensor by tensor.

Pure Python (no torch). The reference is Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", §4.1, Table 2 / eq. 1): a GPT block at 16-bit
with 1-byte dropout masks keeps

    34·s·b·h + 5·a·s²·b  bytes per layer   (s sequence, b microbatch, h width, a heads).

`gpt_block_tensors` lists that block tensor by tensor (tests check the sum is eq. 1);
`llama_block_tensors` lists the LLaMA block the same way. Widths are elements per token
(s·b tokens), c = bytes of the compute dtype (2 for bf16/fp16, 4 for fp32):

    tensor kept for backward          GPT (Korthikanti)       LLaMA (this model)
    --------------------------------  ----------------------  --------------------------------
    norm 1 input (block input)        h  (LayerNorm)          h  (RMSNorm)
    norm 1 output = q/k/v input       h                       h
    Q, K for Q·Kᵀ                     h, h                    h, kv   (after RoPE; GQA: K is
                                                                       kv_dim = n_kv·head_dim)
    V for P·V                         h                       kv
    softmax output                    a·s     [core]          a·s     [core, not with flash]
    attention dropout mask (1 B)      a·s     [core]          none: LLaMA has no dropout
    dropout output (P·V input)        a·s     [core]          none: P itself is the input
    flash log-sum-exp (fp32, 4 B)     (a, flash only)         a       [core, flash only]
    attention output = o_proj input   h                       h
    residual dropout mask (1 B)       h                       none
    norm 2 input                      h                       h
    norm 2 output = MLP input         h                       h
    MLP                               4h (GeLU in), 4h (GeLU  ffn gate out (SiLU input),
                                      out = fc2 input)        ffn up out, ffn silu(gate),
                                                              ffn product (down_proj input)
    MLP dropout mask (1 B)            h                       none

    sum (c = 2, no flash)             34·sbh + 5·as²b         2·sb·(6h + 2·kv + 4·ffn) + 2·as²b

Choices and what is left out, so the numbers mean what they say:
- Per-token norm statistics (mean, rstd: a few fp32 scalars per token) are left out, as
  in Korthikanti. The runtime's RMSNorm computes in fp32 (`ratrain.nn.llama`), so an
  eager autograd graph may keep an fp32 copy of a norm input as well; this table counts
  the compute-dtype tensor a fused norm keeps.
- SwiGLU counts the four tensors eager autograd keeps for ``down(silu(gate(x)) * up(x))``;
  a fused SwiGLU kernel that recomputes silu in backward keeps three.
- K and V are counted kv_dim wide (a GQA-aware kernel); an attention that repeats the kv
  heads before the product would keep them h wide.
- Flash (fused) attention keeps no s² tensor: it stores the output (already counted as
  the o_proj input) plus the log-sum-exp, 4·b·a·s bytes fp32, and recomputes the scores.

Eager kernels (``eager_kernels=True``, what the runtime's torch model runs; a platform
says which with `Platform.eager_kernels`): `ratrain.nn.llama.RMSNorm` computes in fp32 as
``weight * (x.float() * rsqrt(mean(x²) + eps)).to(dtype)``, so autograd keeps, per norm,
the normalised tensor before the weight product (c·h) and, when the compute dtype is not
fp32, the fp32 copy of the input (4·h) in place of the compute-dtype input (which nothing
else keeps, except the block input the executor holds). RoPE rotates in fp32 too, but its
products save only the fp32 cos/sin tables the forward builds (2·s·head_dim·4 bytes per
block and microbatch), so it keeps nothing per token beyond Q and K.
And the attention kernel keeps its own output (B, heads, T, head_dim) for its backward,
apart from the contiguous (B, T, H) copy the output projection keeps (a core tensor:
under selective recompute the checkpointed core keeps nothing).

Recompute policies (Korthikanti §4.2, §5): ``none`` keeps the whole table; ``selective``
drops the attention core's tensors marked [core] (≈ 34·s·b·h in the GPT case), recomputed
before the backward; ``full`` keeps only the block input, c·s·b·h.

Embedding unit: keeps the token ids (int64, 8 B per token; the weight gradient is a
scatter by id). Head unit: final RMSNorm input and output (c·h each per token), the fp32
log-probabilities the loss keeps (4·s·b·V, Korthikanti §4.3) and the int64 targets;
with `plan.loss_chunk_tokens` (fused chunked loss) the norm input, dL/dh and the fp32
dL/dw instead (`_chunked_head_bytes`).
Recompute policies apply to blocks only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ratrain.config import DTYPE_BYTES, Plan
from ratrain.models.counts import head_unit, is_block
from ratrain.models.spec import ModelSpec
from ratrain.sizes.workspace import ADAMW_CHUNK_ELEMS, largest_tensor_elems

__all__ = [
    "ActTensor",
    "gpt_block_tensors",
    "llama_block_tensors",
    "tensors_bytes",
    "activation_bytes",
    "recompute_bytes",
    "boundary_bytes",
    "forward_workspace_bytes",
    "backward_workspace_bytes",
    "update_workspace_bytes",
    "weight_grad_bytes",
    "weight_workspace_bytes",
]

_ID_BYTES = 8  # int64 token ids / targets
_LSE_BYTES = 4  # flash attention keeps its log-sum-exp in fp32


@dataclass(frozen=True)
class ActTensor:
    """One tensor autograd keeps between a unit's forward and its backward."""

    name: str
    per_token: int
    """Elements per token (the tensor has s·b·per_token elements)."""
    elem_bytes: int
    core: bool = False
    """Part of the attention core: dropped by selective recompute."""
    block_input: bool = False
    """The block input: the only tensor full recompute keeps."""


def gpt_block_tensors(hidden: int, heads: int, seq: int, *, flash: bool = False) -> list[ActTensor]:
    """Korthikanti et al.'s GPT block at 16-bit (GeLU MLP 4h, MHA, LayerNorm, dropout)."""
    h, a, c = hidden, heads, 2
    attn_core = (
        [ActTensor("flash_lse", a, _LSE_BYTES, core=True)]
        if flash
        else [
            ActTensor("softmax_out", a * seq, c, core=True),
            ActTensor("attn_dropout_mask", a * seq, 1, core=True),
            ActTensor("attn_dropout_out", a * seq, c, core=True),
        ]
    )
    return [
        ActTensor("ln1_in", h, c, block_input=True),
        ActTensor("ln1_out", h, c),
        ActTensor("q", h, c),
        ActTensor("k", h, c),
        *attn_core,
        ActTensor("v", h, c),
        ActTensor("attn_out", h, c),
        ActTensor("attn_resid_dropout_mask", h, 1),
        ActTensor("ln2_in", h, c),
        ActTensor("ln2_out", h, c),
        ActTensor("gelu_in", 4 * h, c),
        ActTensor("gelu_out", 4 * h, c),
        ActTensor("mlp_resid_dropout_mask", h, 1),
    ]


def _eager_norm(name: str, h: int, c: int) -> list[ActTensor]:
    """What an eager fp32 RMSNorm keeps beyond the table's input and output (see above)."""
    out = [ActTensor(f"{name}_normalized", h, c)]
    if c != 4:
        out.append(ActTensor(f"{name}_in_fp32", h, 4))
    return out


def llama_block_tensors(
    spec: ModelSpec, seq: int, elem_bytes: int, *, flash: bool, eager_kernels: bool = False
) -> list[ActTensor]:
    """The LLaMA block (RMSNorm, GQA with RoPE or ALiBi, SwiGLU, no dropout); see the table."""
    h, kv, f, a, c = spec.hidden, spec.kv_dim, spec.ffn, spec.n_heads, elem_bytes
    core = (
        ActTensor("flash_lse", a, _LSE_BYTES, core=True)
        if flash
        else ActTensor("softmax_out", a * seq, c, core=True)
    )

    # Eager kernels also keep each norm's own temporaries and the attention kernel's
    # output; below fp32 what autograd holds of the MLP norm's input is its fp32 copy
    # (counted by `_eager_norm`), not the compute-dtype tensor.
    def eager(*ts: ActTensor) -> list[ActTensor]:
        return list(ts) if eager_kernels else []

    mlp_in = [ActTensor("mlp_norm_in", h, c)] if not eager_kernels or c == 4 else []
    return [
        ActTensor("attn_norm_in", h, c, block_input=True),
        *eager(*_eager_norm("attn_norm", h, c)),
        ActTensor("attn_norm_out", h, c),
        ActTensor("q_rope", h, c),
        ActTensor("k_rope", kv, c),
        ActTensor("v", kv, c),
        core,
        *eager(ActTensor("sdpa_out", h, c, core=True)),
        ActTensor("attn_out", h, c),
        *mlp_in,
        *eager(*_eager_norm("mlp_norm", h, c)),
        ActTensor("mlp_norm_out", h, c),
        ActTensor("gate_out", f, c),
        ActTensor("up_out", f, c),
        ActTensor("silu_gate", f, c),
        ActTensor("swiglu_out", f, c),
    ]


def tensors_bytes(tensors: list[ActTensor], tokens: int, policy: str = "none") -> int:
    """Bytes of the tensors a recompute policy keeps, for `tokens` = s·b tokens."""
    if policy == "none":
        kept = tensors
    elif policy == "selective":
        kept = [t for t in tensors if not t.core]
    elif policy == "full":
        kept = [t for t in tensors if t.block_input]
    else:
        raise ValueError(f"unknown recompute policy {policy!r}")
    return tokens * sum(t.per_token * t.elem_bytes for t in kept)


def _tokens(plan: Plan) -> int:
    return plan.micro_batch * plan.seq


def activation_bytes(
    spec: ModelSpec, plan: Plan, unit: int, policy: str, *, flash: bool, eager_kernels: bool = False
) -> int:
    """Bytes one microbatch keeps for one unit between F and B under a recompute policy."""
    tokens, c = _tokens(plan), DTYPE_BYTES[plan.compute_dtype]
    if unit == 0:
        return tokens * _ID_BYTES
    if unit == head_unit(spec):
        norm = (
            sum(t.per_token * t.elem_bytes for t in _eager_norm("final_norm", spec.hidden, c))
            if eager_kernels
            else 0
        )
        if plan.loss_chunk_tokens:
            return _chunked_head_bytes(spec, tokens, c) + tokens * norm
        return tokens * (2 * c * spec.hidden + norm + 4 * spec.vocab + _ID_BYTES)
    assert is_block(spec, unit), unit
    tensors = llama_block_tensors(spec, plan.seq, c, flash=flash, eager_kernels=eager_kernels)
    out = tensors_bytes(tensors, tokens, policy)
    if eager_kernels and spec.position == "rope" and policy != "full":
        out += _rope_tables_bytes(spec, plan.seq)
    return out


def weight_grad_bytes(
    spec: ModelSpec, plan: Plan, unit: int, *, flash: bool = True, eager_kernels: bool = False
) -> tuple[int, int]:
    """What a split backward keeps for the deferred B_W of one (unit, mb), from the end of
    its B_IN to the end of its B_W (`ratrain.schedule.zerobubble`): (inputs, out_grads).

    derived: a linear layer Y = X·Wᵀ has dW = dYᵀ·X, so B_W needs, per linear layer, its
    input X (a tensor of the activation table above, kept from the forward) and the
    gradient of its output dY (produced by B_IN). Per token, c bytes each (what the
    runtime keeps, `ratrain.runtime.split_backward`):

        block  inputs    attn_norm_out (q/k/v in, h), attn_out (o_proj in, h),
                         mlp_norm_out (gate/up in, h), swiglu_out (down in, ffn)
                         = 3h + ffn
               out_grads dQ (h), dK (kv), dV (kv), d o_proj out (h), d gate (ffn),
                         d up (ffn), d down out (h)                 = 3h + 2kv + 2ffn
        head   inputs    final norm output (h); out_grads dlogits (V)
               chunked loss: nothing: the fused loss is one autograd Function that
               computes both gradients, so B_IN runs the head's whole backward
        embed  inputs    the token ids (8 B); out_grads the output gradient (h)

    The one-dimensional weights (norms, biases) are left out: B_IN computes their gradients
    (reductions over tokens of tensors it holds) and keeps them, a few h-sized vectors, for
    B_W to accumulate. Under recompute, RECOMPUTE rebuilt the inputs before B_IN, so a
    ledger keeps act - (act - inputs) + out_grads after B_IN whatever the policy.
    """
    tokens, c = _tokens(plan), DTYPE_BYTES[plan.compute_dtype]
    h = spec.hidden
    if unit == 0:
        return tokens * _ID_BYTES, tokens * c * h
    if unit == head_unit(spec):
        if plan.loss_chunk_tokens:
            return 0, 0
        return tokens * c * h, tokens * c * spec.vocab
    assert is_block(spec, unit), unit
    kv, f = spec.kv_dim, spec.ffn
    return tokens * c * (3 * h + f), tokens * c * (3 * h + 2 * kv + 2 * f)


def weight_workspace_bytes(spec: ModelSpec, plan: Plan, unit: int, *, eager_kernels: bool) -> int:
    """Transient bytes while B_W(unit) runs: with eager kernels each weight's gradient is
    computed into a new tensor before it is added to the gradient buffer (the unit's largest
    weight at the compute dtype, as in `backward_workspace_bytes`); fused, nothing."""
    if not eager_kernels:
        return 0
    c, h = DTYPE_BYTES[plan.compute_dtype], spec.hidden
    return c * h * (spec.vocab if unit in (0, head_unit(spec)) else spec.ffn)


def _chunked_head_bytes(spec: ModelSpec, tokens: int, c: int) -> int:
    """The head under the chunked loss (`ratrain.nn.chunked_loss`): the final norm's
    input and the loss's dL/dh (c·h per token each), and its dL/dw (fp32, V·H): no
    per-token V-wide tensor outlives the forward."""
    return tokens * 2 * c * spec.hidden + 4 * spec.vocab * spec.hidden


def _rope_tables_bytes(spec: ModelSpec, seq: int) -> int:
    """The fp32 cos and sin tables (seq x head_dim each) a block's forward builds and its
    RoPE products keep: per microbatch, not per token."""
    return 2 * seq * spec.head_dim * 4


def recompute_bytes(
    spec: ModelSpec, plan: Plan, unit: int, policy: str, *, flash: bool, eager_kernels: bool = False
) -> int:
    """Bytes a RECOMPUTE brings back (alive from RECOMPUTE to B): what the policy dropped."""
    full = activation_bytes(spec, plan, unit, "none", flash=flash, eager_kernels=eager_kernels)
    return full - activation_bytes(
        spec, plan, unit, policy, flash=flash, eager_kernels=eager_kernels
    )


def boundary_bytes(spec: ModelSpec, plan: Plan) -> int:
    """One microbatch's hidden states (or their gradient) crossing a stage boundary."""
    return _tokens(plan) * spec.hidden * DTYPE_BYTES[plan.compute_dtype]


def forward_workspace_bytes(
    spec: ModelSpec, plan: Plan, unit: int, policy: str, *, flash: bool, eager_kernels: bool = False
) -> int:
    """Transient bytes while F(unit) runs, beyond what it keeps.

    assumed: a block produces every tensor of its table and frees what the policy drops
    only at the end of the unit (an upper bound: a checkpointed forward frees earlier);
    the head holds its compute-dtype logits and their fp32 copy before the log-softmax.
    """
    tokens, c = _tokens(plan), DTYPE_BYTES[plan.compute_dtype]
    if unit == head_unit(spec) and plan.loss_chunk_tokens:
        # one chunk's fp32 buffer (logits, log-softmax and softmax in turn, in place),
        # and an fp32 copy of a 16-bit head weight
        chunk = min(plan.loss_chunk_tokens, tokens)
        return chunk * spec.vocab * 4 + (spec.vocab * spec.hidden * 4 if c != 4 else 0)
    if unit == head_unit(spec):
        return tokens * spec.vocab * (c + 4)
    if unit == 0:
        return 0
    return recompute_bytes(spec, plan, unit, policy, flash=flash, eager_kernels=eager_kernels)


def backward_workspace_bytes(
    spec: ModelSpec, plan: Plan, unit: int, *, flash: bool, eager_kernels: bool = False
) -> int:
    """Transient bytes while B(unit) runs: gradients of its activations.

    assumed: a block holds the gradient flowing in and the one flowing out (c·h each per
    token) plus the widest pair of intermediate gradients: two ffn-wide ones in the MLP,
    or the a·s-wide score gradient in a non-fused attention; the head holds the fp32
    gradient of the logits and its compute-dtype cast; the embedding the incoming gradient.
    With `eager_kernels` the unfused cross-entropy's backward holds two fp32 gradients of
    the log-probabilities at once (the loss's, and the log-softmax's own), 8 bytes per
    logit, before the cast.
    """
    tokens, c, h = _tokens(plan), DTYPE_BYTES[plan.compute_dtype], spec.hidden
    if unit == head_unit(spec) and plan.loss_chunk_tokens:
        # dL/dh scaled by the incoming gradient (a copy), and dL/dw cast to a 16-bit weight
        return tokens * c * h + (spec.vocab * h * c if c != 4 else 0)
    # Eager autograd computes each weight's gradient into a new tensor before adding it to
    # the gradient buffer: the unit's largest weight, at the compute dtype, is transient.
    wgrad = c * h * (spec.vocab if unit in (0, head_unit(spec)) else spec.ffn)
    extra = wgrad if eager_kernels else 0
    if unit == head_unit(spec):
        return tokens * spec.vocab * (max(8, 4 + c) if eager_kernels else 4 + c) + extra
    if unit == 0:
        return tokens * c * h + extra
    # The SwiGLU product's backward turns one ffn-wide gradient into two while the first
    # is still held: three at once in eager autograd.
    mlp = (3 if eager_kernels else 2) * spec.ffn
    widest = max(mlp, 0 if flash else spec.n_heads * plan.seq)
    return tokens * c * (2 * h + widest) + extra


def update_workspace_bytes(spec: ModelSpec, plan: Plan, unit: int) -> int:
    """Transient bytes of the runtime's eager AdamW step (`ratrain.runtime.optim`) on one
    unit: per slice of a tensor, up to three fp32 temporaries at once (the scaled or cast
    gradient, sqrt(v) and its quotient), for the unit's largest tensor (its shard's, when
    sharded), walked in slices of `ADAMW_CHUNK_ELEMS`."""
    return 3 * 4 * min(largest_tensor_elems(spec, plan, unit), ADAMW_CHUNK_ELEMS)
