"""Kernel time: the only place where ratrain decides how long a GEMM or an attention takes.

Every compute action is a sum over kernels (`unit_kernels`), and every kernel's time comes
from `gemm_time_s` or `attention_time_s` (plus memory-bound passes such as the embedding
gather, timed by `memory_pass_time_s`). Both return ``(time_s, bound)``:

- ``"flat"``: FLOPs / (peak[dtype] x efficiency), the platform's flat efficiency;
- ``"compute"`` / ``"dma"``: from a tile-level model of the on-chip tiers, when one applies;
- ``"measured"``: FLOPs / (peak[dtype] x the platform's measured efficiency curve at the
  kernel's FLOPs), when `ratrain calibrate` measured that kernel kind and dtype
  (`ratrain.cost.measured`).

The model's memory-bound kernels (norms, RoPE, the SwiGLU product, residual adds, the
cross-entropy) are kernels of kind ``"elementwise"``; they cost what the platform measured
for them, and nothing on a platform that did not measure them.

A tile-level model plugs in as the module `ratrain.cost.tiling` exposing
``applies(platform) -> bool`` and ``gemm_time_s`` / ``attention_time_s`` with the
signatures below; when it is absent or does not apply, the flat model is used.

FLOPs follow `ratrain.models.counts` (matmul FLOPs only, 2·m·n·k per GEMM; element-wise
work is left out, as in Narayanan et al. 2021 §5.1), except that a causal attention kernel
is charged half of the full s×s products it would do without the mask (flash-style kernels
skip the masked tiles). Pure Python.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

from ratrain.config import DTYPE_BYTES
from ratrain.cost import measured
from ratrain.models import counts
from ratrain.models.spec import ModelSpec
from ratrain.platforms import Platform

__all__ = [
    "Kernel",
    "flat_time_s",
    "gemm_time_s",
    "attention_time_s",
    "attention_flops",
    "memory_pass_time_s",
    "unit_kernels",
    "kernels_time_s",
    "kernel_model_is_cheap",
]


@dataclass(frozen=True)
class Kernel:
    """One kernel of a compute action: a GEMM (m, n, k), an attention, or a memory pass."""

    kind: str  # "gemm" | "attention" | "memory" | "elementwise"
    name: str
    args: tuple
    """gemm: (m, n, k); attention: (batch, heads, kv_heads, seq, head_dim, causal, backward);
    memory: (bytes,); elementwise: (op, elements, backward), op in
    `ratrain.cost.measured.MEMORY_BOUND_OPS`."""

    @property
    def flops(self) -> int:
        if self.kind == "gemm":
            m, n, k = self.args
            return 2 * m * n * k
        if self.kind == "attention":
            b, h, _, s, d, causal, backward = self.args
            return attention_flops(b, h, s, d, causal=causal, backward=backward)
        return 0


@functools.cache
def _tile_model():
    try:
        return importlib.import_module("ratrain.cost.tiling")
    except ImportError:
        return None


def _tiled(platform: Platform):
    tm = _tile_model()
    if tm is None or not hasattr(tm, "applies") or not tm.applies(platform):
        return None
    return tm


def kernel_model_is_cheap(platform: Platform) -> bool:
    """Whether a unit's kernel times cost a few arithmetic steps per kernel: no tile model
    applies (flat efficiency, curves or measured tables). measured: under 1 ms per
    micro-batch shape (llama2-7b on a100-80g, llama3.2-1b on cpu-local) against 150-190 ms
    for llama2-70b under mt3000's tile model, on the 2-core machine."""
    return _tiled(platform) is None


def flat_time_s(flops: float, dtype: str, platform: Platform) -> float:
    """FLOPs at the platform's peak for `dtype` times its flat efficiency."""
    return flops / (platform.peak_flops[dtype] * platform.efficiency)


def _curve_time_s(kind: str, flops: float, dtype: str, platform: Platform) -> float | None:
    points = platform.efficiency_curves.get(f"{kind}.{dtype}")
    if points is None:
        return None
    return flops / (platform.peak_flops[dtype] * measured.curve_efficiency(points, flops))


def gemm_time_s(
    m: int, n: int, k: int, dtype: str, platform: Platform, *, backward: bool = False
) -> tuple[float, str]:
    """Time of C(m, n) = A(m, k) @ B(k, n) in `dtype`, and what bounds it. `backward`: one
    of a linear layer's gradient GEMMs (their layouts run at their own measured speed)."""
    flops = 2 * m * n * k
    t = _curve_time_s("gemm_bwd", flops, dtype, platform) if backward else None
    if t is None:
        t = _curve_time_s("gemm", flops, dtype, platform)
    if t is not None:
        return t, "measured"
    tm = _tiled(platform)
    if tm is not None:
        return tm.gemm_time_s(m, n, k, dtype, platform)
    return flat_time_s(2 * m * n * k, dtype, platform), "flat"


def attention_flops(
    batch: int, heads: int, seq: int, head_dim: int, *, causal: bool, backward: bool
) -> int:
    """Q·Kᵀ and P·V: 2 GEMMs of 2·b·h·s²·d (Narayanan et al. 2021); backward twice that
    (dQ, dK from dS; dV, dP from dO). A causal kernel skips the masked half."""
    fwd = 4 * batch * heads * seq * seq * head_dim
    if causal:
        fwd //= 2
    return 2 * fwd if backward else fwd


def attention_time_s(
    batch: int,
    heads: int,
    kv_heads: int,
    seq: int,
    head_dim: int,
    dtype: str,
    platform: Platform,
    *,
    causal: bool,
    backward: bool,
) -> tuple[float, str]:
    """Time of the attention core (scores, softmax, values) forward or backward."""
    flops = attention_flops(batch, heads, seq, head_dim, causal=causal, backward=backward)
    kind = "attention_bwd" if backward else "attention_fwd"
    t = _curve_time_s(kind, flops, dtype, platform)
    if t is not None:
        return t, "measured"
    tm = _tiled(platform)
    if tm is not None:
        return tm.attention_time_s(
            batch, heads, kv_heads, seq, head_dim, dtype, platform, causal=causal, backward=backward
        )
    return flat_time_s(flops, dtype, platform), "flat"


def memory_pass_time_s(nbytes: float, platform: Platform) -> tuple[float, str]:
    """A memory-bound pass over main memory (gather, scatter-add, optimizer step)."""
    mem = platform.main_memory
    return mem.latency_s + nbytes / mem.bandwidth_bytes_per_s, "memory"


def _gemm_bwd(name: str, m: int, n: int, k: int) -> list[Kernel]:
    # Y(m, n) = X(m, k) Wᵀ: dX(m, k) = dY(m, n) W(n, k); dW(n, k) = dYᵀ(n, m) X(m, k).
    return [Kernel("gemm", f"{name}.dx", (m, k, n)), Kernel("gemm", f"{name}.dw", (n, k, m))]


def _attention(spec: ModelSpec, micro_batch: int, seq: int, backward: bool) -> Kernel:
    args = (micro_batch, spec.n_heads, spec.n_kv_heads, seq, spec.head_dim, True, backward)
    return Kernel("attention", "attention.bwd" if backward else "attention", args)


def _elementwise(spec: ModelSpec, tokens: int, where: str, backward: bool) -> list[Kernel]:
    """The model's memory-bound kernels (`ratrain.nn.llama`) of a block or the head."""
    if where == "head":
        ops = [("rmsnorm", tokens * spec.hidden), ("cross_entropy", tokens * spec.vocab)]
    else:
        ops = [
            ("rmsnorm", 2 * tokens * spec.hidden),  # input and post-attention norms
            ("rope", tokens * (spec.hidden + spec.kv_dim)) if spec.position == "rope" else None,
            ("swiglu", tokens * spec.ffn),
            ("add", 2 * tokens * spec.hidden),  # the two residual adds
        ]
    return [
        Kernel("elementwise", f"{op}.{'bwd' if backward else 'fwd'}", (op, n, backward))
        for op, n in filter(None, ops)
    ]


def _grad_accumulate(spec: ModelSpec, unit: int) -> Kernel:
    """Adding a backward's weight gradients into the unit's gradient buffer (eager autograd
    computes them into new tensors first). The embedding's dense backward also zero-fills a
    vocab x hidden gradient before scattering into it: twice the elements."""
    n = counts.unit_params(spec, unit) * (2 if unit == counts.embedding_unit(spec) else 1)
    return Kernel("elementwise", "grad_accumulate.bwd", ("grad_accumulate", n, True))


def unit_kernels(
    spec: ModelSpec,
    unit: int,
    micro_batch: int,
    seq: int,
    kind: str,
    *,
    dtype: str = "bf16",
    loss_chunk_tokens: int | None = None,
) -> list[Kernel]:
    """The kernels of one unit's forward ("F"), backward ("B") or recomputation
    ("RC:full" / "RC:selective") for one microbatch; a split backward's halves are "BI"
    (input gradient) and "BW" (weight gradient), which together are "B"'s kernels.
    `loss_chunk_tokens` (`Plan.loss_chunk_tokens`) moves the head's work: see `_fused_head`.

    derived: for a linear layer Y = X·Wᵀ the backward is two GEMMs of the forward's size,
    dX = dY·W (B_IN) and dW = dYᵀ·X (B_W), each about the forward's FLOPs. The attention
    core, the norms' and activations' backward (elementwise) and the loss have no weight
    of their own (the norms' weight gradients are per-token reductions, left in B_IN):
    all B_IN. B_W adds the weight gradients into the gradient buffer (grad_accumulate).
    The embedding has no input gradient: its B_IN is empty, its B_W is the scatter-add."""
    tokens = micro_batch * seq
    if loss_chunk_tokens and unit == counts.head_unit(spec):
        return _fused_head(spec, tokens, kind)
    if kind in ("BI", "BW"):
        ks = unit_kernels(spec, unit, micro_batch, seq, "B", dtype=dtype)
        return [k for k in ks if _weight_grad_kernel(k) == (kind == "BW")]
    if unit == counts.embedding_unit(spec):
        # A gather of rows forward; a scatter-add into the table's gradient backward.
        row_bytes = tokens * spec.hidden * DTYPE_BYTES[dtype]
        if kind == "F":
            return [Kernel("memory", "embedding.gather", (2 * row_bytes,))]
        if kind == "B":
            return [
                Kernel("memory", "embedding.scatter_add", (3 * row_bytes,)),
                _grad_accumulate(spec, unit),
            ]
        return []
    if unit == counts.head_unit(spec):
        gemm = ("lm_head", tokens, spec.vocab, spec.hidden)
        if kind == "F":
            return [Kernel("gemm", gemm[0], gemm[1:]), *_elementwise(spec, tokens, "head", False)]
        if kind == "B":
            return [
                *_gemm_bwd(*gemm),
                *_elementwise(spec, tokens, "head", True),
                _grad_accumulate(spec, unit),
            ]
        return []
    gemms = counts.block_gemms(spec, tokens)
    if kind == "F" or kind == "RC:full":
        return [Kernel("gemm", g[0], g[1:]) for g in gemms] + [
            _attention(spec, micro_batch, seq, False),
            *_elementwise(spec, tokens, "block", False),
        ]
    if kind == "B":
        out = [k for g in gemms for k in _gemm_bwd(*g)]
        return out + [
            _attention(spec, micro_batch, seq, True),
            *_elementwise(spec, tokens, "block", True),
            _grad_accumulate(spec, unit),
        ]
    if kind == "RC:selective":
        return [_attention(spec, micro_batch, seq, False)]
    if kind == "RC:none":
        return []
    raise ValueError(f"unknown kernel group {kind!r}")


def _fused_head(spec: ModelSpec, tokens: int, kind: str) -> list[Kernel]:
    """The head under the fused chunked loss (`ratrain.nn.chunked_loss`): its forward runs
    the loss's gradient too, chunk by chunk (the logits' GEMM, then dL/dh and dL/dw from the
    chunk's softmax minus one-hot), so F holds all three GEMMs and the norm's forward; the
    backward only scales dL/dh and dL/dw by the loss's incoming gradient, runs the norm's
    backward and adds dL/dw into the gradient buffer. The runtime does not split it (B_IN
    runs it whole, B_W nothing: `ratrain.schedule.lowering`).

    assumed: the fused loss's passes over the tokens x vocab logits cost what the plain
    loss's forward passes cost (the "cross_entropy" forward), its backward passes over them
    none: it builds the gradient in place in the same chunk; the scaling costs a residual
    add's pass per element ("add"). `benchmarks/loss_head.py` times the head under both
    losses beside this model (docs/runtime.md: plain over fused measured 1.08-1.19 on the
    2-core machine, modelled 1.02 on cpu-local)."""
    gemm = ("lm_head", tokens, spec.vocab, spec.hidden)
    if kind == "F":
        return [
            Kernel("gemm", gemm[0], gemm[1:]),
            *_gemm_bwd(*gemm),
            *_elementwise(spec, tokens, "head", False),
        ]
    if kind in ("B", "BI"):
        scale = tokens * spec.hidden + spec.vocab * spec.hidden
        return [
            Kernel("elementwise", "rmsnorm.bwd", ("rmsnorm", tokens * spec.hidden, True)),
            Kernel("elementwise", "loss_scale.fwd", ("add", scale, False)),
            _grad_accumulate(spec, counts.head_unit(spec)),
        ]
    return []


def _weight_grad_kernel(k: Kernel) -> bool:
    """Whether a backward kernel belongs to B_W (see `unit_kernels`)."""
    return k.name.endswith(".dw") or k.name in ("grad_accumulate.bwd", "embedding.scatter_add")


_KERNELS_TIME: dict[tuple, tuple[Platform, tuple[float, str]]] = {}


def kernels_time_s(kernels: list[Kernel], dtype: str, platform: Platform) -> tuple[float, str]:
    """Sum of the kernels' times; the bound is the one that took the most time. Memoised
    per kernel list, dtype and platform object (a planner costs the same units for every
    candidate; the platform is kept, so its id is not reused while the entry lives)."""
    key = (tuple(kernels), dtype, id(platform))
    hit = _KERNELS_TIME.get(key)
    if hit is not None and hit[0] is platform:
        return hit[1]
    if len(_KERNELS_TIME) > 100_000:
        _KERNELS_TIME.clear()
    out = _kernels_time_s(kernels, dtype, platform)
    _KERNELS_TIME[key] = (platform, out)
    return out


def _kernels_time_s(kernels: list[Kernel], dtype: str, platform: Platform) -> tuple[float, str]:
    total, by_bound = 0.0, {}
    for k in kernels:
        if k.kind == "gemm":
            bwd = k.name.endswith((".dx", ".dw"))
            t, bound = gemm_time_s(*k.args, dtype, platform, backward=bwd)
        elif k.kind == "attention":
            b, h, kv, s, d, causal, backward = k.args
            t, bound = attention_time_s(
                b, h, kv, s, d, dtype, platform, causal=causal, backward=backward
            )
        elif k.kind == "elementwise":
            op, n, backward = k.args
            t, bound = measured.memory_bound_time_s(op, n, dtype, backward, platform), "memory"
            if t is None:
                continue  # not measured on this platform: not charged
        else:
            t, bound = memory_pass_time_s(k.args[0], platform)
        total += t
        by_bound[bound] = by_bound.get(bound, 0.0) + t
    if not by_bound:
        return 0.0, "none"
    return total, max(by_bound, key=by_bound.__getitem__)
