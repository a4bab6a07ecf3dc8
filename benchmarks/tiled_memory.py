"""Tile plans of one transformer block on a tiered platform, and the tiled backend's memory.

    python benchmarks/tiled_memory.py [--platform mt3000] [--model llama2-7b] [--seq 4096]

Part 1 (the planner, no torch): for each GEMM and attention kernel of one block, forward and
backward, at micro-batch 1: the staging tier, tiles, core grid, main-memory traffic, and the
predicted time against the time at peak FLOP/s, with its bound. GEMMs also show their DDR
traffic over the I/O lower bound 2mnk/√M (Smith et al. 2019), M = the on-chip bytes the
plan holds (every core's buffers and the staging buffers) in 4-byte words.

Part 2 (the backend, CPU): attention backward run tile by tile on a small platform at
growing sequence lengths: the peak bytes the backend holds in main memory and on chip, and
whether the bytes it moved equal the plan's.
"""

from __future__ import annotations

import argparse
import time

from ratrain.cost.tiling import plan_attention, plan_attention_backward, plan_gemm
from ratrain.models import counts
from ratrain.models.presets import resolve_model
from ratrain.platforms import Link, Platform, Tier
from ratrain.platforms.load import load


def _gemm_rows(spec, tokens: int):
    for name, m, n, k in counts.block_gemms(spec, tokens):
        yield name, (m, n, k)
        yield f"{name}.dx", (m, k, n)
        yield f"{name}.dw", (n, k, m)


def _on_chip_words(plan, platform) -> float:
    copies = {t.name: t.copies for t in platform.tiers}
    cores = plan.grid[0] * plan.grid[1] if plan.stage else copies[plan.leaf]
    held = plan.buffer_bytes[plan.leaf] * min(cores, copies[plan.leaf])
    return (held + (plan.buffer_bytes[plan.stage] if plan.stage else 0)) / 4


def planner_table(platform: Platform, model: str, seq: int, dtype: str) -> None:
    spec = resolve_model(model)
    print(f"{spec.name} block, micro-batch 1, seq {seq}, {dtype}, on {platform.name}")
    head = f"{'kernel':<18}{'stage':>6}  {'tile':<20}{'grid':>8}{'DDR MB':>9}"
    print(head + f"{'time ms':>9}{'peak ms':>9}{'eff':>6}  bound  DDR/bound  plan s")
    total = peak = 0.0
    for name, (m, n, k) in _gemm_rows(spec, seq):
        t0 = time.perf_counter()
        p = plan_gemm(m, n, k, dtype, platform)
        wall = time.perf_counter() - t0
        ratio = p.ddr_bytes / 2 / (2 * m * n * k / _on_chip_words(p, platform) ** 0.5)
        tile = f"{p.tile['m']}x{p.tile['n']}x{p.tile['k']}"
        _row(name, p, tile, f"{ratio:9.2f}", wall)
        total, peak = total + p.time_s, peak + p.compute_time_s
    a = (1, spec.n_heads, spec.n_kv_heads, seq, spec.head_dim, dtype, platform)
    for name, fn in (("attention", plan_attention), ("attention.bwd", plan_attention_backward)):
        t0 = time.perf_counter()
        p = fn(*a, causal=True)
        tile = f"{p.tile['heads']}h x {p.tile['q']}q x {p.tile['kv']}kv"
        _row(name, p, tile, f"{'':9}", time.perf_counter() - t0)
        total, peak = total + p.time_s, peak + p.compute_time_s
    print(
        f"block total: {total * 1e3:.1f} ms predicted, {peak * 1e3:.1f} ms at peak ({peak / total:.0%})"
    )


def _row(name, p, tile, extra, wall) -> None:
    grid = f"{p.grid[0]}x{p.grid[1]}"
    print(
        f"{name:<18}{p.stage or '-':>6}  {tile:<20}{grid:>8}{p.ddr_bytes / 1e6:9.1f}"
        f"{p.time_s * 1e3:9.2f}{p.compute_time_s * 1e3:9.2f}{p.compute_time_s / p.time_s:6.0%}"
        f"  {p.bound:<7}{extra}  {wall:6.2f}"
    )


def backend_memory(seqs: list[int]) -> None:
    import torch

    from ratrain.kernels.tiled import TiledBackend

    torch.set_num_threads(1)
    link = Link(1e9, 1e-6)
    tiers = (Tier("l1", 32 * 1024, 50e9, 1e-6, 4), Tier("l2", 256 * 1024, 40e9, 1e-6, 1))
    platform = Platform(
        "small", 10**9, 0, {"fp16": 1e12, "bf16": 1e12, "fp32": 5e11}, 0.5,
        (*tiers, Tier("mem", 10**9, 10e9, 1e-6, 1)), link, link, link, 1,
    )  # fmt: skip
    print("\nattention backward, 1 x 4 heads (2 kv) x d=32, fp16, causal, on 4 x 32 KiB + 256 KiB")
    print(
        f"{'seq':>6}{'main-memory peak':>18}{'on-chip peak':>14}  tiles           counted == planned"
    )
    for s in seqs:
        be = TiledBackend(platform)
        q, k, v = (torch.randn(1, x, s, 32, dtype=torch.float16) for x in (4, 2, 2))
        out, lse = be.attention_forward(q, k, v)
        plan = plan_attention_backward(1, 4, 2, s, 32, "fp16", platform)
        be.counter.reset()
        be.engine.reset_peak()
        be.attention_backward(q, k, v, out, lse, torch.randn_like(out), plan=plan)
        on_chip = {t: b for t, b in be.engine.peak_bytes.items() if t != "mem"}
        same = be.counter.bytes_moved == plan.bytes_moved and be.counter.flops == plan.flops
        tile = f"{plan.tile['q']}q x {plan.tile['kv']}kv"
        print(
            f"{s:>6}{be.engine.peak_bytes['mem']:>18,}{max(on_chip.values()):>14,}  {tile:<16}{same}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="mt3000")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--no-run", action="store_true", help="skip part 2 (the CPU backend)")
    args = ap.parse_args()
    planner_table(load(args.platform), args.model, args.seq, args.dtype)
    if not args.no_run:
        backend_memory([128, 256, 512])


if __name__ == "__main__":
    main()
