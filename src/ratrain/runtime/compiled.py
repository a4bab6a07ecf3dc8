"""Block units through `torch.compile`, so each block's elementwise chains (RMSNorm, RoPE,
SiLU·mul, residual adds) fuse into generated kernels while the GEMMs stay library calls.

`compile_stage(model, recompute, shape)` compiles a stage's block units in place
(`nn.Module.compile`: attribute names, parameters and hooks are unchanged) and warms them
up once — the forward with autograd, its backward, and the no-grad forward full recompute
uses — on a zero input of the boundary shape, so compilation happens before the first
step and its time is reported apart (`RunResult.compile_s`), never in tokens/s. The warm-up
takes the gradient of the input only (`torch.autograd.grad`), so no parameter gradient,
accumulate hook or flat gradient buffer is touched.

What stays as it is, because it works unchanged around a compiled unit:
- per-unit autograd: a compiled block is one autograd node with its own compiled backward;
- full recompute: F runs the compiled forward under no_grad, RECOMPUTE the autograd one;
- transient views: the parameters keep their tensor objects; dropping a view resizes
  their storage and fetching refills it, and the compiled graphs take the parameters as
  inputs at every call, so they read the refilled values;
- offload: the compiled node's saved tensors are packed by the executor's
  `saved_tensors_hooks` like any autograd node's.

Excluded, and run eagerly:
- units under selective recompute: their attention core is a `torch.utils.checkpoint`
  region inside the block (`CheckpointedAttention`), which would put a second
  recomputation inside a compiled graph;
- the embedding and the head (a lookup; the head's loss is already fused and chunked,
  `ratrain.nn.chunked_loss`);
- backends other than "torch": the tiled backend runs its own Python tile engine.

CPU inductor needs a C++ compiler: without one (`ratrain.launch.toolchain.cxx_compiler()` is None) the units run
eagerly after one line on stderr.
"""

from __future__ import annotations

import sys
import time

import torch

from ratrain.launch.toolchain import cxx_compiler

__all__ = ["compile_stage", "compilable"]


def compilable(unit_module: torch.nn.Module, policy: str, backend: str) -> str | None:
    """Why this unit runs eagerly under --compile, or None if it is compiled."""
    from ratrain.nn.llama import Block

    if not isinstance(unit_module, Block):
        return "not a block"
    if backend != "torch":
        return f"backend {backend!r} is not traceable"
    if policy == "selective":
        return "selective recompute checkpoints inside the block"
    return None


def compile_stage(
    modules: dict[int, torch.nn.Module],
    recompute: dict[int, str],
    backend: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> float:
    """Compile the compilable block units in place and warm them up; seconds it took (0.0
    when nothing was compiled)."""
    todo = [u for u, m in modules.items() if compilable(m, recompute[u], backend) is None]
    if not todo:
        return 0.0
    if device.type == "cpu" and cxx_compiler() is None:
        print(
            "ratrain: --compile needs a C++ compiler for CPU kernels (set CXX or install "
            "g++); running the units eagerly",
            file=sys.stderr,
        )
        return 0.0
    import torch._inductor.config as inductor_config

    # One rank per core already: a pool of compile workers per rank would only contend.
    inductor_config.compile_threads = 1
    t0 = time.perf_counter()
    for u in todo:
        modules[u].compile(dynamic=False)
    for u in todo:
        x = torch.zeros(shape, dtype=dtype, device=device, requires_grad=True)
        y = modules[u](x)
        torch.autograd.grad(y, x, torch.ones_like(y))
        if recompute[u] == "full":
            with torch.no_grad():
                modules[u](x)
    return time.perf_counter() - t0
