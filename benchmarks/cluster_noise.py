"""How far apart two measurements of one plan fall on the emulated cluster: the
resolution that `ratrain bench cluster`'s ratios can have on this machine.

One structure is timed as several systems, interleaved (the order reversed every other
round), each run a fresh job as `ratrain bench cluster` times its systems:

- `A` and `A'`: the same plan file under ratrain's lifecycle, twice (an A/A pair: any
  ratio between them is the measurement's noise);
- `gpu-style`: the same structure under the gpu-style schedule (what the sweep sets
  beside ratrain's entry where both run one structure).

Each run's tokens/s is the sweep's (global-batch tokens over the median step after the
warm-up). It prints every run, each system's median, and the ratio the sweep would
report between two systems from R repeats each (the median of each system's R runs; for
R = 2, the mean of two), over every pair of disjoint R-subsets of the rounds where R <= 3:
its median, 5th and 95th percentiles, and the share of draws under 0.98.

    python benchmarks/cluster_noise.py [--nodes 4 --ranks-per-node 1 --link-mbit 50]
        [--pp 4 --micro-batch 1 --split 2,2,2,2 --pipeline 1f1b --rank-layout pp-inner]
        [--rounds 8]
        [--json out.json]

Needs root (network namespaces); about 20 s per run at the defaults.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def ratio_draws(a: list[float], b: list[float], r: int) -> list[float]:
    """The ratio of `a`'s median to `b`'s over every pair of disjoint r-subsets of the
    rounds (a[i] and b[i] measured in round i): what a sweep of r repeats would report."""
    n = min(len(a), len(b))
    out = []
    for sa in itertools.combinations(range(n), r):
        rest = [i for i in range(n) if i not in sa]
        for sb in itertools.combinations(rest, r):
            out.append(statistics.median(a[i] for i in sa) / statistics.median(b[i] for i in sb))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--link-mbit", type=float, default=50.0)
    ap.add_argument("--model", default="bench-256")
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--split", default="2,2,2,2")
    ap.add_argument("--pipeline", default="1f1b")
    ap.add_argument("--rank-layout", default="pp-inner", choices=("pp-inner", "dp-inner"))
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from ratrain.bench.cluster import Setup, _tokens_per_s, ratrain_timed
    from ratrain.config import Plan, save_plan
    from ratrain.launch.emulate import EmulatedNetwork, unavailable

    why = unavailable()
    if why:
        print(f"cluster_noise: {why}", file=sys.stderr)
        return 2
    world = args.nodes * args.ranks_per_node
    dp = world // args.pp
    split = [int(x) for x in args.split.split(",")]

    def plan(schedule: str) -> Plan:
        return Plan(pp=args.pp, dp=dp, micro_batch=args.micro_batch,
                    global_batch=args.global_batch, seq=args.seq, schedule=schedule,
                    layer_split=split, recompute=["none"] * args.pp, compute_dtype="fp32",
                    grad_dtype="fp32", clip_grad=None, model=args.model,
                    pipeline=args.pipeline, rank_layout=args.rank_layout)  # fmt: skip

    tmp = Path(tempfile.mkdtemp(prefix="cluster-noise-"))
    setup = Setup(model=args.model, seq=args.seq, global_batch=args.global_batch,
                  nodes=args.nodes, ranks_per_node=args.ranks_per_node, steps=args.steps,
                  warmup=args.warmup, out=tmp, progress=False)  # fmt: skip
    files = {"ratrain": tmp / "ratrain.yaml", "gpu-style": tmp / "gpu-style.yaml"}
    save_plan(plan("ratrain"), files["ratrain"])
    save_plan(plan("gpu-style"), files["gpu-style"])
    systems = [("A", files["ratrain"]), ("A'", files["ratrain"]), ("gpu-style", files["gpu-style"])]
    runs: dict[str, list[float]] = {name: [] for name, _ in systems}
    t0 = time.perf_counter()
    with EmulatedNetwork(args.nodes, args.link_mbit) as net:
        for rnd in range(args.rounds):
            order = systems if rnd % 2 == 0 else list(reversed(systems))
            for name, f in order:
                got = ratrain_timed(net, setup, f, world, tmp / f"{name}.metrics.jsonl")
                if "error" in got:
                    print(f"cluster_noise: {name} failed: {got['error']}", file=sys.stderr)
                    return 1
                tps = _tokens_per_s(setup, got["times"])
                runs[name].append(tps)
                dt = time.perf_counter() - t0
                print(f"round {rnd + 1}/{args.rounds} {name:<10} {tps:8,.0f} tokens/s ({dt:.0f} s)",
                      flush=True)  # fmt: skip

    report: dict = {"setup": vars(args) | {"json": None}, "runs": runs, "ratios": {}}
    print()
    for name, xs in runs.items():
        spread = max(xs) / min(xs) - 1
        print(f"{name:<10} median {statistics.median(xs):8,.0f} tokens/s, "
              f"max/min - 1 = {spread:.1%} over {len(xs)} runs")  # fmt: skip
    for num, den in (("A", "A'"), ("A", "gpu-style"), ("A'", "gpu-style")):
        for r in (1, 2, 3):
            if 2 * r > args.rounds:
                continue
            d = ratio_draws(runs[num], runs[den], r)
            below = sum(x < 0.98 for x in d) / len(d)
            row = {"median": statistics.median(d), "p05": _quantile(d, 0.05),
                   "p95": _quantile(d, 0.95), "below_0.98": below, "draws": len(d)}  # fmt: skip
            report["ratios"][f"{num}/{den} r={r}"] = row
            print(f"{num}/{den}, {r} repeat(s) each: median {row['median']:.3f}, "
                  f"5-95% {row['p05']:.3f}-{row['p95']:.3f}, under 0.98 in {below:.0%} "
                  f"of {len(d)} draws")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
