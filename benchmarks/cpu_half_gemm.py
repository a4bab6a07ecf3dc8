"""A linear layer's GEMM layouts in 16 bits on this CPU, side by side.

For each shape (m tokens, n x k weight) and dtype, GFLOP/s of:
  fwd      X @ Wᵀ           (the forward, "NT")
  dx NN    dY @ W           (autograd's input gradient of F.linear)
  dx TN    (dYᵀ)ᵀ @ W       (`ratrain.kernels.cpu_half.HalfLinear`: dYᵀ made contiguous first,
                             the copy included in the time)
  dw TN    dYᵀ @ X          (the weight gradient)
one thread, each the median over --rounds rounds of the fastest of --reps calls, the layouts
interleaved within a round so that a slow spell of the machine hits all of them alike.

    python benchmarks/cpu_half_gemm.py [--dtypes bf16 fp16 fp32] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SHAPES = ((256, 384, 384), (256, 1024, 384), (256, 384, 1024), (256, 4096, 384),
          (512, 1376, 512), (512, 512, 1376), (1024, 2048, 512))  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _fastest_s(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(dtype: torch.dtype, m: int, n: int, k: int, rounds: int, reps: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    dy = torch.randn(m, n, generator=gen).to(dtype)
    layouts = {
        "fwd": lambda: torch.nn.functional.linear(x, w),
        "dx NN": lambda: dy @ w,
        "dx TN": lambda: dy.t().contiguous().t() @ w,
        "dw TN": lambda: dy.t() @ x,
    }
    times: dict[str, list[float]] = {name: [] for name in layouts}
    for _ in range(rounds):
        for name, fn in layouts.items():
            times[name].append(_fastest_s(fn, reps))
    flops = 2 * m * n * k
    return {name: flops / statistics.median(ts) / 1e9 for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for dt in args.dtypes:
        for m, n, k in SHAPES:
            gfs = measure(DTYPES[dt], m, n, k, args.rounds, args.reps)
            rows.append({"dtype": dt, "m": m, "n": n, "k": k, "gflop_s": gfs})
            if not args.json:
                cells = "  ".join(f"{name} {v:6.1f}" for name, v in gfs.items())
                print(f"{dt:5} {m:5}x{n:5}x{k:5}  {cells}  (GFLOP/s)", flush=True)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
