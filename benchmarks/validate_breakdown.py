"""Measured / simulated time per kind of action over a validation grid.

Runs each plan of the grid through the runtime (as `ratrain validate` does, timing run
only: no memory run), traces its last step and sums, per kind of action (F, B, RC per
unit kind emb/block/head; UPD, SEND/RECV, SYNC, NORM, ...; idle = walk time outside
compute), the measured and the simulated seconds (`ratrain.calibrate.breakdown`). Prints
one row per plan (the step and the main kinds) and the grid's totals per kind with their
ratio measured / simulated: the term of the cost model that is off shows there.

    python benchmarks/validate_breakdown.py [--platform cpu-local] [--grid default|FILE]
        [--steps 3] [--warmup 1] [--quick] [--json]

`--quick`: the first 4 plans of the grid, 2 steps after 1 warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from ratrain.calibrate.breakdown import merge, step_breakdown
from ratrain.calibrate.grid import default_grid, load_grid
from ratrain.calibrate.validate import _job
from ratrain.platforms import load
from ratrain.runtime.distributed_train import run_job
from ratrain.sim import simulate

MAIN = ("F.block", "B.block", "F.head", "B.head", "UPD", "NORM", "idle")


def run(g, platform, steps: int, warmup: int) -> tuple[float, float, dict]:
    sim = simulate(g.spec, g.plan, platform, memory_timeline=False)
    kind = g.plan.schedule
    ranks = run_job(_job(g, warmup + steps, trace_steps=(warmup + steps - 1,)))
    measured = max(statistics.median(r.runs[kind].step_times_s[warmup:]) for r in ranks)
    trace = [rec for r in ranks for rec in r.runs[kind].trace]
    return sim.step_time_s, measured, step_breakdown(trace, sim, g.spec.n_layers)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="cpu-local")
    ap.add_argument("--grid", default="default")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--max-ranks", type=int, default=4)
    ap.add_argument("--only", default="", help="comma-separated plan names")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    grid = default_grid(a.max_ranks) if a.grid == "default" else load_grid(a.grid)
    if a.only:
        grid = [g for g in grid if g.name in a.only.split(",")]
    if a.quick:
        grid, a.steps, a.warmup = grid[:4], 2, 1
    platform = load(a.platform)
    rows = []
    for g in grid:
        pred, meas, parts = run(g, platform, a.steps, a.warmup)
        rows.append({"name": g.name, "predicted_s": pred, "measured_s": meas, "kinds": parts})
        if not a.json:
            cells = " ".join(
                f"{k}={parts[k][0] / parts[k][1]:.2f}" if parts.get(k, [0, 0])[1] else f"{k}=-"
                for k in MAIN
            )
            print(
                f"{g.name:22s} pred {pred:7.3f} s  meas {meas:7.3f} s  "
                f"({(pred - meas) / meas:+.1%})  measured/simulated: {cells}",
                flush=True,
            )
    total = merge([r["kinds"] for r in rows])
    if a.json:
        json.dump({"plans": rows, "total": total}, sys.stdout, indent=1)
        print()
        return 0
    print(f"\n{'kind':12s} {'measured s':>11s} {'simulated s':>12s} {'meas/sim':>9s}")
    for k, (m, s) in sorted(total.items(), key=lambda kv: -kv[1][0]):
        ratio = f"{m / s:9.2f}" if s else "        -"
        print(f"{k:12s} {m:11.3f} {s:12.3f} {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
