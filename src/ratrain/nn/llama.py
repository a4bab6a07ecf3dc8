"""The LLaMA family (LLaMA-2, Qwen2/2.5, Baichuan2) as independently callable units.

A model is a chain of units (see `ratrain.models.counts`):

    unit 0            Embedding       tokens (B, T)  -> hidden (B, T, H)
    units 1 .. L      Block           hidden (B, T, H) -> hidden (B, T, H)
    unit L + 1        Head            hidden (B, T, H) -> logits (B, T, V)

Every unit takes one tensor and returns one tensor, so a pipeline stage owning units
u0..u1 runs them as a plain chain. There is no distributed code here.

Parameter names follow Hugging Face inside each unit (`self_attn.q_proj.weight`,
`mlp.gate_proj.weight`, `input_layernorm.weight`, ...), so a checkpoint maps over by a
prefix rewrite (`ratrain.nn.hf_weights`). GEMMs and attention go through a
`ratrain.kernels.Backend`; norms, softmax and RoPE are done in fp32 and cast back, as in
Hugging Face, so bf16/fp16 parameters work.

Decoding: `LlamaModel.forward(tokens, cache)` with a `KVCache` keeps each block's keys and
values, so a prompt is run once and each new token costs one position (`ratrain.nn.generate`);
without a cache (training) the computation is unchanged.

Tied embeddings: `LlamaModel` shares one Parameter between `units[0]` and `units[-1]`. A
`Head` built alone for a tied spec owns its own copy (initialised to the same values as the
embedding); a pipeline runtime that places the two units on different stages must keep the
copies in sync (sum their gradients, update both).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ratrain.kernels import Backend, get_backend
from ratrain.models.spec import ModelSpec
from ratrain.nn.chunked_loss import chunked_cross_entropy
from ratrain.nn.rope import rope_inv_freq

__all__ = [
    "RMSNorm",
    "Embedding",
    "Block",
    "Head",
    "LlamaModel",
    "KVCache",
    "build_unit",
    "init_weights",
    "cross_entropy",
    "alibi_slopes",
    "rope_cos_sin",
    "INIT_STD",
]

INIT_STD = 0.02
"""Std of the normal init of weight matrices (the value of HF `initializer_range` for LLaMA)."""


# --- position schemes -----------------------------------------------------------------


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi head slopes (Press et al. 2022, "Train Short, Test Long", §3).

    For n a power of two: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise,
    as Baichuan2 and BLOOM do: the slopes of the closest smaller power of two p, then every
    other slope of the 2p-head sequence for the remaining n - p heads.
    """

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_2(n_heads)
    p = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(p) + alibi_slopes(2 * p)[0::2][: n_heads - p]


def rope_cos_sin(
    spec: ModelSpec, seq: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables in fp32, HF layout (frequencies repeated over both halves): (T, hs) each."""
    inv_freq = rope_inv_freq(spec, device)  # (hs/2,), scaled as spec.rope_type says
    pos = torch.arange(seq, dtype=torch.float32, device=device)
    freqs = pos[:, None] * inv_freq[None, :]  # (T, hs/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hs)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, n, T, hs); rotated in fp32 and cast back."""
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)


# --- the KV cache for decoding --------------------------------------------------------


class LayerKV:
    """One block's cached keys and values, (B, n_kv_heads, max_len, head_dim) each."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device):
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        """Positions cached so far: the next key's position."""

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' keys and values; every cached one, new ones included."""
        s, t = self.length, k.shape[2]
        if s + t > self.k.shape[2]:
            raise ValueError(f"KV cache holds {self.k.shape[2]} positions; {s} + {t} do not fit")
        self.k[:, :, s : s + t] = k
        self.v[:, :, s : s + t] = v
        self.length = s + t
        return self.k[:, :, : s + t], self.v[:, :, : s + t]


class KVCache:
    """Keys and values of the positions seen so far, per block (inference only). Fill it with
    the prompt in one forward, then feed one token per forward."""

    def __init__(
        self,
        spec: ModelSpec,
        batch: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        if spec.position != "rope":
            raise ValueError("the KV cache supports RoPE models only (ALiBi: decode uncached)")
        shape = (batch, spec.n_kv_heads, max_len, spec.head_dim)
        self.layers = [LayerKV(shape, dtype, device) for _ in range(spec.n_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0


# --- building blocks ------------------------------------------------------------------


def _empty(*shape: int, dtype: torch.dtype | None) -> nn.Parameter:
    # Allocated uninitialised on purpose: `init_weights` fills them deterministically, or a
    # checkpoint does; it also keeps construction on the meta device free.
    return nn.Parameter(torch.empty(*shape, dtype=dtype))


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in fp32 like HF `LlamaRMSNorm`."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = _empty(dim, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Linear(nn.Module):
    """A weight (and optional bias) whose product is computed by the backend."""

    def __init__(
        self, d_in: int, d_out: int, backend: Backend, *, bias: bool, dtype: torch.dtype | None
    ):
        super().__init__()
        self.backend = backend
        self.weight = _empty(d_out, d_in, dtype=dtype)
        self.bias = _empty(d_out, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.linear(x, self.weight, self.bias)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, backend: Backend, *, dtype: torch.dtype | None):
        super().__init__()
        self.spec = spec
        self.backend = backend
        h, kv, b = spec.hidden, spec.kv_dim, spec.qkv_bias
        self.q_proj = Linear(h, h, backend, bias=b, dtype=dtype)
        self.k_proj = Linear(h, kv, backend, bias=b, dtype=dtype)
        self.v_proj = Linear(h, kv, backend, bias=b, dtype=dtype)
        self.o_proj = Linear(h, h, backend, bias=False, dtype=dtype)
        # Plain floats, not a buffer: `module.to(bf16)` must not round the slopes.
        self.slopes = alibi_slopes(spec.n_heads) if spec.position == "alibi" else None

    def forward(self, x: torch.Tensor, cache: LayerKV | None = None) -> torch.Tensor:
        """x (B, T, H); with `cache` (decoding), x holds the positions after the cached ones:
        the whole prompt into an empty cache, or one token."""
        B, T, H = x.shape
        nh, nkv, hs = self.spec.n_heads, self.spec.n_kv_heads, self.spec.head_dim
        q = self.q_proj(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        slopes, start = None, 0 if cache is None else cache.length
        if start and T != 1:
            raise ValueError("after the prompt, feed the KV cache one token at a time")
        if self.slopes is None:
            cos, sin = rope_cos_sin(self.spec, start + T, x.device)  # rows of positions 0..
            cos, sin = cos[start:], sin[start:]
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        else:
            slopes = torch.tensor(self.slopes, dtype=torch.float32, device=x.device)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, nkv, start + T, hs)
        # One new query after cached keys sees them all: no mask.
        causal = not start
        y = self.backend.attention(q, k, v, causal=causal, alibi_slopes=slopes)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, H)  # (B, T, H)
        return self.o_proj(y)


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: ModelSpec, backend: Backend, *, dtype: torch.dtype | None):
        super().__init__()
        h, f = spec.hidden, spec.ffn
        self.gate_proj = Linear(h, f, backend, bias=False, dtype=dtype)
        self.up_proj = Linear(h, f, backend, bias=False, dtype=dtype)
        self.down_proj = Linear(f, h, backend, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# --- units ----------------------------------------------------------------------------


class Embedding(nn.Module):
    """Unit 0: token ids (B, T) -> hidden states (B, T, H).

    `backend` is accepted so that every unit is built the same way; a lookup needs no GEMM.
    """

    def __init__(
        self,
        spec: ModelSpec,
        backend: str | Backend = "torch",
        *,
        seed: int | None = 0,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.spec, self.unit = spec, 0
        self.weight = _empty(spec.vocab, spec.hidden, dtype=dtype)
        if seed is not None:
            init_weights(self, spec, seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)  # (B, T, H)


class Block(nn.Module):
    """Units 1..L: one pre-norm transformer block. `layer_index` is 0-based (HF `layers.{i}`),
    so the block is unit `layer_index + 1`."""

    def __init__(
        self,
        spec: ModelSpec,
        backend: str | Backend,
        layer_index: int,
        *,
        seed: int | None = 0,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        assert 0 <= layer_index < spec.n_layers, (layer_index, spec.n_layers)
        be = get_backend(backend)
        self.spec, self.layer_index, self.unit = spec, layer_index, layer_index + 1
        self.input_layernorm = RMSNorm(spec.hidden, spec.norm_eps, dtype=dtype)
        self.self_attn = Attention(spec, be, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.norm_eps, dtype=dtype)
        self.mlp = MLP(spec, be, dtype=dtype)
        if seed is not None:
            init_weights(self, spec, seed)

    def forward(self, x: torch.Tensor, cache: LayerKV | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Head(nn.Module):
    """Unit L+1: final RMSNorm and the LM head projection (B, T, H) -> logits (B, T, V).

    With `spec.normalized_head` (Baichuan2's NormHead) the rows of the head weight are
    L2-normalised before the projection; the stored weight stays unnormalised.
    """

    def __init__(
        self,
        spec: ModelSpec,
        backend: str | Backend = "torch",
        *,
        seed: int | None = 0,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.spec, self.unit = spec, spec.n_layers + 1
        self.backend = get_backend(backend)
        self.norm = RMSNorm(spec.hidden, spec.norm_eps, dtype=dtype)
        self.weight = _empty(spec.vocab, spec.hidden, dtype=dtype)
        if seed is not None:
            init_weights(self, spec, seed)

    def head_weight(self) -> torch.Tensor:
        """The (V, H) matrix the projection uses (row-normalised for NormHead)."""
        if not self.spec.normalized_head:
            return self.weight
        return F.normalize(self.weight.float(), dim=-1).to(self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.linear(self.norm(x), self.head_weight())  # (B, T, V)

    def loss(
        self, x: torch.Tensor, targets: torch.Tensor, chunk_tokens: int | None = None
    ) -> torch.Tensor:
        """Mean next-token loss of hidden states x (B, T, H) against targets (B, T).

        With `chunk_tokens`, the fused chunked loss (`ratrain.nn.chunked_loss`): the
        logits of the whole microbatch never exist at once. Backends other than "torch"
        (the tiled one schedules its own GEMMs and memory) always take the plain path."""
        if chunk_tokens is None or self.backend.name != "torch":
            return cross_entropy(self(x), targets)
        return chunked_cross_entropy(self.norm(x), self.head_weight(), targets, chunk_tokens)


def build_unit(
    spec: ModelSpec,
    unit: int,
    backend: str | Backend = "torch",
    *,
    seed: int | None = 0,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """The module of one unit, initialised from (seed, unit) exactly as inside `LlamaModel`."""
    if not 0 <= unit <= spec.n_layers + 1:
        raise IndexError(f"unit {unit} out of range 0..{spec.n_layers + 1}")
    if unit == 0:
        return Embedding(spec, backend, seed=seed, dtype=dtype)
    if unit == spec.n_layers + 1:
        return Head(spec, backend, seed=seed, dtype=dtype)
    return Block(spec, backend, unit - 1, seed=seed, dtype=dtype)


class LlamaModel(nn.Module):
    """The whole model as `units` (index == unit id); forward(tokens) -> logits."""

    def __init__(
        self,
        spec: ModelSpec,
        backend: str | Backend = "torch",
        *,
        seed: int | None = 0,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.spec = spec
        be = get_backend(backend)
        self.units = nn.ModuleList(
            build_unit(spec, u, be, seed=seed, dtype=dtype) for u in range(spec.n_layers + 2)
        )
        if spec.tied_embeddings:
            self.units[-1].weight = self.units[0].weight

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits (B, T, V) of tokens (B, T); with `cache`, tokens are the positions after
        the cached ones (see `KVCache`)."""
        x = tokens
        for unit in self.units:
            if cache is not None and isinstance(unit, Block):
                x = unit(x, cache.layers[unit.layer_index])
            else:
                x = unit(x)
        return x


# --- init and loss --------------------------------------------------------------------


def _unit_generator(seed: int, unit: int) -> torch.Generator:
    # One independent stream per (seed, unit): a stage initialises its own units only and
    # gets the same values as the full model. 1_000_003 is a prime larger than any unit count.
    return torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + unit)


@torch.no_grad()
def _init_unit(unit: nn.Module, spec: ModelSpec, seed: int) -> None:
    params = list(unit.named_parameters())
    if any(p.is_meta for _, p in params):
        return
    # A tied head draws from the embedding's stream, so its own copy equals the embedding.
    stream = 0 if isinstance(unit, Head) and spec.tied_embeddings else unit.unit
    gen = _unit_generator(seed, stream)
    norms = {id(m.weight) for m in unit.modules() if isinstance(m, RMSNorm)}
    for name, p in params:
        if id(p) in norms:
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            # Drawn in fp32 on the CPU and cast: the values do not depend on device or dtype.
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * INIT_STD)


def init_weights(module_or_model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Deterministic init of every unit found in `module_or_model` (a unit, a stage's
    container of units, or a `LlamaModel`): normal(0, INIT_STD) for matrices, ones for
    norms, zeros for biases, each unit from its own (seed, unit) stream."""
    for m in module_or_model.modules():
        if isinstance(m, (Embedding, Block, Head)):
            _init_unit(m, spec, seed)


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100
) -> torch.Tensor:
    """Mean next-token loss in fp32. logits (B, T, V), targets (B, T) already shifted."""
    V = logits.shape[-1]
    return F.cross_entropy(
        logits.float().reshape(-1, V), targets.reshape(-1), ignore_index=ignore_index
    )
