"""How long the tile planner takes to plan new kernel shapes (cold caches).

    python benchmarks/tiling_speed.py [--repeat 3]

Plans the model part of the regression set of `benchmarks/tiling_regress.py` (every GEMM and
attention kernel of a block and the LM head of llama2-7b, llama2-70b, qwen2.5-32b and
baichuan2-13b at micro-batch 1, 2, 4 and seq 4096 on mt3000, forward and backward), each
repeat in a fresh process so that no plan or cache survives. Reports the median over the
repeats of the CPU seconds (on a shared machine, what the wall time would be on an idle
core): in all, per shape (mean and slowest), per kernel kind, and for llama2-7b at
micro-batch 1 (the shapes a cold `ratrain simulate --model llama2-7b` plans).
Target: well under 0.1 s per shape.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def _child() -> None:
    """One cold run: plan every case once; print [(label, op, cpu_s), ...] as JSON."""
    sys.path.insert(0, str(HERE))
    import tiling_regress as regress

    from ratrain.models.presets import get_preset

    cases, rows = [], []
    for name in regress.MODELS:
        for mb in regress.MICRO_BATCHES:
            cases += [(f"{name}/mb{mb}", c) for c in regress.model_cases_of(get_preset(name), mb)]
    seen = set()
    for label, case in cases:
        key = json.dumps(case, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        t0 = time.process_time()
        regress.plan(case)
        rows.append((label, case["op"], time.process_time() - t0))
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child()
        return
    runs = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, __file__, "--child"], check=True, capture_output=True, text=True
        ).stdout
        runs.append((json.loads(out), time.perf_counter() - t0))
    n = len(runs[0][0])

    def med(f) -> float:
        return statistics.median(f(rows) for rows, _ in runs)

    print(f"{n} kernel shapes, {args.repeat} cold runs (median CPU seconds):")
    print(f"  all shapes          {med(lambda r: sum(x[2] for x in r)):8.3f} s")
    print(f"  per shape, mean     {med(lambda r: sum(x[2] for x in r) / len(r)):8.4f} s")
    print(f"  per shape, slowest  {med(lambda r: max(x[2] for x in r)):8.4f} s")
    for op in ("gemm", "attention", "attention_backward"):
        count = sum(1 for x in runs[0][0] if x[1] == op)
        mean = med(lambda r, op=op, n=count: sum(x[2] for x in r if x[1] == op) / n)
        worst = med(lambda r, op=op: max(x[2] for x in r if x[1] == op))
        print(f"  {op:19s} {count:3d} shapes, mean {mean:.4f} s, slowest {worst:.4f} s")
    sub = "llama2-7b/mb1"
    k = sum(1 for x in runs[0][0] if x[0] == sub)
    print(f"  {sub} ({k} shapes) {med(lambda r: sum(x[2] for x in r if x[0] == sub)):8.3f} s")
    print(f"  wall per run (with start-up) {statistics.median(w for _, w in runs):.2f} s")


if __name__ == "__main__":
    main()
