"""Kernel measurements, through the code the runtime runs.

- GEMMs: the backend's `linear` (the model's `Linear` calls it) forward, and its autograd
  backward (dX and dW), per dtype at a few model-like shapes, one thread;
- attention: the backend's `attention` (causal) forward and backward;
- memory-bound kernels: the model's own `RMSNorm`, `_apply_rope` with `rope_cos_sin`,
  `cross_entropy` (`ratrain.nn.llama`), the MLP's `silu(gate) * up` product and a
  residual add, forward and backward;
- the gradient norm's local pass: the runtime's `unit_sq_norm` (fp64 sum of squares, one
  tensor at a time) over a unit's gradient buffer;
- the optimizer step: the runtime's `adamw_step_` over fp32 state, as bytes moved per
  second (the cost model's count of bytes per parameter);
- the speed-up of a second thread on a GEMM (`thread_efficiency`).

`measure_kernel` takes one window of one item of `kernel_plan`; the caller
(`ratrain.calibrate.calibrate`, through `ratrain.calibrate.windows`) repeats the windows,
interleaved across items, and `assemble_kernels` turns the medians into the raw figures
`ratrain.calibrate.platform_file` reads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ratrain.calibrate.timing import Timer
from ratrain.cost.compute import attention_flops
from ratrain.cost.measured import MEMORY_BOUND_OPS
from ratrain.kernels import get_backend
from ratrain.models.spec import ModelSpec
from ratrain.nn.llama import RMSNorm, _apply_rope, cross_entropy, rope_cos_sin
from ratrain.runtime.optim import adamw_step_, unit_sq_norm

__all__ = [
    "TORCH_DTYPES",
    "kernel_plan",
    "measure_kernel",
    "assemble_kernels",
    "threads_efficiency",
    "label",
]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# (m, n, k): m the tokens of a microbatch, n x k a weight, as the model's GEMMs are.
_GEMMS = ((128, 256, 256), (256, 512, 512), (512, 1376, 512), (512, 512, 1376), (1024, 2048, 512))
_GEMMS_QUICK = ((128, 256, 256), (512, 1376, 512), (1024, 2048, 512))
# (batch, heads, seq, head_dim)
_ATTN = ((1, 4, 128, 64), (2, 8, 256, 64), (2, 8, 512, 64))
_ATTN_QUICK = ((1, 4, 128, 64), (2, 8, 256, 64))
_MEM_OPS = MEMORY_BOUND_OPS


def kernel_plan(dtypes: tuple[str, ...], quick: bool) -> list[tuple[str, str, tuple]]:
    """The measurements to take, in order: (kind, dtype, shape)."""
    gemms, attn = (_GEMMS_QUICK, _ATTN_QUICK) if quick else (_GEMMS, _ATTN)
    out: list[tuple[str, str, tuple]] = []
    for dt in dtypes:
        # No fast half-precision path on most CPUs: keep fp16 short (its GEMMs run at 1-5
        # GFLOP/s there). bf16 takes every shape: with the torch backend's 16-bit linear
        # layer (`ratrain.kernels.cpu_half`) its largest quick GEMM's window is ~1 s.
        small = dt == "fp16"
        out += [("gemm", dt, s) for s in (gemms[:2] if small else gemms)]
        out += [("attention", dt, s) for s in (attn[:1] if small else attn)]
        out += [("memory", dt, (op,)) for op in _MEM_OPS]
    out += [("optimizer", "fp32", ()), ("threads", "fp32", ())]
    return out


def _fwd_bwd(timer: Timer, make: Callable[[], tuple[Callable, list[torch.Tensor]]]):
    """Forward time and backward time (the timer's statistic), each timed directly: the backward
    of a fresh forward (run untimed before each repetition), not (forward + backward) -
    forward, whose difference of two separately timed figures moved a backward GEMM's
    efficiency 2.5x between calibrations."""
    fwd, leaves = make()
    with torch.no_grad():
        t_f = timer.time_s(fwd)
    held: list = []

    def forward():
        for t in leaves:
            t.grad = None
        out = fwd()
        grad = torch.ones_like(out) if out.ndim else None  # the next stage's gradient
        held[:] = [out, grad]

    def backward():
        out, grad = held
        out.backward(grad)

    t_b = timer.time_s(backward, setup=forward)
    held.clear()
    return t_f, max(t_b, t_f * 0.05)


def _gemm(timer, dev, dtype, m, n, k):
    be = get_backend("torch")

    def make():
        x = torch.randn(m, k, device=dev, dtype=dtype, requires_grad=True)
        w = torch.randn(n, k, device=dev, dtype=dtype, requires_grad=True)
        return (lambda: be.linear(x, w)), [x, w]

    return _fwd_bwd(timer, make)


def _attention(timer, dev, dtype, b, h, s, d):
    be = get_backend("torch")

    def make():
        q, k, v = (
            torch.randn(b, h, s, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3)
        )
        return (lambda: be.attention(q, k, v, causal=True)), [q, k, v]

    return _fwd_bwd(timer, make)


_MEM_TOKENS, _MEM_HIDDEN, _MEM_VOCAB = 512, 512, 8192


def _memory(timer, dev, dtype, op):
    """(elements, forward s, backward s) of one memory-bound op of the model."""
    T, H = _MEM_TOKENS, _MEM_HIDDEN
    spec = ModelSpec(
        name="calib", vocab=_MEM_VOCAB, hidden=H, n_layers=1, n_heads=8, n_kv_heads=8, ffn=4 * H
    )

    def make():
        if op == "rmsnorm":
            norm = RMSNorm(H, 1e-5, dtype=dtype).to(dev)
            torch.nn.init.ones_(norm.weight)
            x = torch.randn(T, H, device=dev, dtype=dtype, requires_grad=True)
            return (lambda: norm(x)), [x, norm.weight]
        if op == "rope":
            q = torch.randn(1, spec.n_heads, T, spec.head_dim, device=dev, dtype=dtype)
            q.requires_grad_(True)
            cos, sin = rope_cos_sin(spec, T, dev)
            return (lambda: _apply_rope(q, cos, sin)), [q]
        if op == "swiglu":
            g, u = (
                torch.randn(T, 4 * H, device=dev, dtype=dtype, requires_grad=True) for _ in "gu"
            )
            return (lambda: F.silu(g) * u), [g, u]
        if op == "add":
            a, b = (torch.randn(T, H, device=dev, dtype=dtype, requires_grad=True) for _ in "ab")
            return (lambda: a + b), [a, b]
        logits = torch.randn(1, T, _MEM_VOCAB, device=dev, dtype=dtype, requires_grad=True)
        targets = torch.randint(0, _MEM_VOCAB, (1, T), device=dev)
        return (lambda: cross_entropy(logits, targets)), [logits]

    if op == "grad_norm":  # NORM's local pass over a stage's gradients, one tensor at a time
        n = 16 * 2**20  # 64 MB at fp32: a stage's gradients, well beyond the caches
        buf = torch.randn(n, device=dev, dtype=dtype)
        views = list(buf.view(16, -1))  # 1M-element tensors, as a unit's weights
        t = timer.time_s(lambda: unit_sq_norm(views))
        return n, t, t
    if op == "grad_accumulate":  # the fp32 gradient buffer += a weight's new gradient
        n = 4 * H * H
        buf = torch.zeros(n, device=dev)
        new = torch.randn(n, device=dev, dtype=dtype)
        t = timer.time_s(lambda: buf.add_(new))
        return n, t, t
    elements = {"rope": T * H, "swiglu": T * 4 * H, "cross_entropy": T * _MEM_VOCAB}.get(op, T * H)
    t_f, t_b = _fwd_bwd(timer, make)
    return elements, t_f, t_b


def _optimizer(timer, dev, n_params=4_000_000):
    p, g, m, v = (torch.randn(n_params, device=dev) for _ in range(4))
    m.zero_()
    v.zero_()
    kw = dict(lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    t = timer.time_s(lambda: adamw_step_(p, g, m, v, step=1, **kw))
    return n_params * (24 + 4) / t  # bytes moved (`ratrain.cost.model`: 24 + g per param)


def _threads(timer, dev, cores: int) -> tuple[float, float]:
    """(one thread's, all cores') time of a mid-size fp32 GEMM; (1, 1) where it does not
    apply. `thread_efficiency` is derived from their medians (`threads_efficiency`)."""
    if dev.type == "cuda" or cores < 2:
        return 1.0, 1.0
    x, w = torch.randn(512, 1024, device=dev), torch.randn(2048, 1024, device=dev)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        t1 = timer.time_s(lambda: F.linear(x, w))
        torch.set_num_threads(cores)
        tc = timer.time_s(lambda: F.linear(x, w))
    finally:
        torch.set_num_threads(saved)
    return t1, tc


def threads_efficiency(t1: float, tc: float, cores: int) -> float:
    """Speed-up per extra thread, in [0.05, 1]."""
    if cores < 2:
        return 1.0
    return min(1.0, max(0.05, (t1 / tc - 1) / (cores - 1)))


def measure_kernel(item: tuple, device: torch.device, timer: Timer, cores: int) -> tuple:
    """One window of one `kernel_plan` item: its raw timed figures (seconds, or the
    optimizer's bytes/s), on one thread (the caller sets the threads)."""
    kind, dt, shape = item
    dtype = TORCH_DTYPES[dt]
    if kind == "gemm":
        return _gemm(timer, device, dtype, *shape)
    if kind == "attention":
        return _attention(timer, device, dtype, *shape)
    if kind == "memory":
        return _memory(timer, device, dtype, shape[0])
    if kind == "optimizer":
        return (_optimizer(timer, device),)
    return _threads(timer, device, cores)


def assemble_kernels(values: dict[tuple, tuple], cores: int) -> dict:
    """The raw kernel measurements from each item's (median) figures: {"gemm": {dtype:
    [(flops, fwd_s, bwd_s)]}, "attention": {dtype: [(fwd_flops, fwd_s, bwd_s)]}, "memory":
    {dtype: {op: (elements, fwd_s, bwd_s)}}, "optimizer_bytes_per_s", "thread_efficiency"}."""
    out: dict = {"gemm": {}, "attention": {}, "memory": {}}
    for (kind, dt, shape), v in values.items():
        if kind == "gemm":
            m, n, k = shape
            out["gemm"].setdefault(dt, []).append((2 * m * n * k, *v))
        elif kind == "attention":
            flops = attention_flops(*shape, causal=True, backward=False)
            out["attention"].setdefault(dt, []).append((flops, *v))
        elif kind == "memory":
            elements, t_f, t_b = v
            out["memory"].setdefault(dt, {})[shape[0]] = (int(elements), t_f, t_b)
        elif kind == "optimizer":
            out["optimizer_bytes_per_s"] = v[0]
        else:
            out["thread_efficiency"] = threads_efficiency(*v, cores)
    return out


def label(item: tuple) -> str:
    kind, dt, shape = item
    return f"{kind} {dt} {'x'.join(map(str, shape))}".strip()
