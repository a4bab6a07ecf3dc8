"""Tiled GEMM, C(m, n) = A(m, k) @ B(k, n) (+ bias), executed as a `TilePlan` says.

Output-stationary: each core keeps an fp32 C tile in its compute-tier copy for the whole k
loop and streams A and B through two buffers each. Staged plans bring the block's A and B
panels into the staging tier once per staged k-step and send each core its part from there.
The loops are the ones `ratrain.cost.tiling` counts; the cores of a block run one after
another here (on a chip they run at once).
"""

from __future__ import annotations

import torch

from ratrain.cost.tiling import TilePlan, steps
from ratrain.errors import RatrainError
from ratrain.kernels.tiled_engine import Engine, dtype_name

__all__ = ["run_gemm"]


class _Core:
    """One core's buffers: fp32 accumulator, A and B tiles (two each), the bias slice."""

    def __init__(self, eng: Engine, plan: TilePlan, copy: int, dtype: torch.dtype, bias: bool):
        mc, nc, kc = plan.tile["m"], plan.tile["n"], plan.tile["k"]
        self.acc = eng.alloc(plan.leaf, (mc, nc), torch.float32, copy)
        self.a = [eng.alloc(plan.leaf, (mc, kc), dtype, copy) for _ in range(2)]
        self.b = [eng.alloc(plan.leaf, (kc, nc), dtype, copy) for _ in range(2)]
        self.bias = eng.alloc(plan.leaf, (nc,), dtype, copy) if bias else None
        self.slot = 0

    def flip(self) -> int:
        self.slot ^= 1
        return self.slot


def _check(plan: TilePlan, a: torch.Tensor, b: torch.Tensor, bias) -> None:
    m, k = a.shape
    want = {"m": m, "n": b.shape[1], "k": k, "bias": int(bias is not None)}
    if plan.op != "gemm" or plan.shape != want or b.shape[0] != k:
        raise RatrainError(
            f"the tile plan is for {plan.op} {plan.shape}, the operands are A{tuple(a.shape)} "
            f"B{tuple(b.shape)} bias={bias is not None}; plan this shape"
        )
    if plan.dtype != dtype_name(a) or b.dtype != a.dtype:
        raise RatrainError(
            f"the tile plan is for {plan.dtype}, the operands are {a.dtype}/{b.dtype}"
        )


def run_gemm(
    eng: Engine, plan: TilePlan, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """A (m, k) and B (k, n), any strides, in main memory; returns C (m, n) in A's dtype."""
    _check(plan, a, b, bias)
    (m, k), n = a.shape, b.shape[1]
    mc, nc, kc = plan.tile["m"], plan.tile["n"], plan.tile["k"]
    pr, pc = plan.grid
    bm, bn, ks = pr * mc, pc * nc, plan.stage_step
    leaf, stage, main = plan.leaf, plan.stage, plan.main
    src = stage or main
    with eng.scope():
        out = eng.alloc(main, (m, n), a.dtype)
        if stage:
            panel_a = [eng.alloc(stage, (min(bm, m), min(ks, k)), a.dtype) for _ in range(2)]
            panel_b = [eng.alloc(stage, (min(ks, k), min(bn, n)), a.dtype) for _ in range(2)]
        cores = [_Core(eng, plan, i, a.dtype, bias is not None) for i in range(pr * pc)]
        for i0, i1 in steps(0, m, bm):
            for j0, j1 in steps(0, n, bn):
                tiles = [(r, c) for r in steps(i0, i1, mc) for c in steps(j0, j1, nc)]
                for core, ((a0, a1), (b0, b1)) in zip(cores, tiles, strict=False):
                    core.acc[: a1 - a0, : b1 - b0].zero_()
                for st, (k0, k1) in enumerate(steps(0, k, ks)):
                    if stage:  # the block's panels, once for all its cores
                        pa = eng.move(
                            a[i0:i1, k0:k1], main, panel_a[st % 2][: i1 - i0, : k1 - k0], stage
                        )
                        pb = eng.move(
                            b[k0:k1, j0:j1], main, panel_b[st % 2][: k1 - k0, : j1 - j0], stage
                        )
                        r0, c0, q0_ = i0, j0, k0
                    else:
                        pa, pb, r0, c0, q0_ = a, b, 0, 0, 0
                    for core, ((a0, a1), (b0, b1)) in zip(cores, tiles, strict=False):
                        acc = core.acc[: a1 - a0, : b1 - b0]
                        for q0, q1 in steps(k0, k1, kc):
                            s = core.flip()
                            at = core.a[s][: a1 - a0, : q1 - q0]
                            bt = core.b[s][: q1 - q0, : b1 - b0]
                            eng.move(pa[a0 - r0 : a1 - r0, q0 - q0_ : q1 - q0_], src, at, leaf)
                            eng.move(pb[q0 - q0_ : q1 - q0_, b0 - c0 : b1 - c0], src, bt, leaf)
                            acc.addmm_(at.float(), bt.float())  # fp32 accumulation
                            eng.add_flops(2 * (a1 - a0) * (b1 - b0) * (q1 - q0))
                for core, ((a0, a1), (b0, b1)) in zip(cores, tiles, strict=False):
                    acc = core.acc[: a1 - a0, : b1 - b0]
                    if bias is not None:
                        acc.add_(eng.move(bias[b0:b1], main, core.bias[: b1 - b0], leaf).float())
                    eng.move(acc, leaf, out[a0:a1, b0:b1], main)  # cast on the way out
    return out
