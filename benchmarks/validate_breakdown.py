"""Measured / simulated time per kind of action over a validation grid.

Runs each plan of the grid through the runtime (as `ratrain validate` does, timing run
only: no memory run), traces its last step and sums, per kind of action (F, B, RC per
unit kind emb/block/head; UPD, SEND/RECV, SYNC, NORM, ...; idle = walk time outside
compute), the measured and the simulated seconds (`ratrain.validate.breakdown`). Prints
one row per plan (the step and the main kinds) and the grid's totals per kind with their
ratio measured / simulated: the term of the cost model that is off shows there.

    python benchmarks/validate_breakdown.py [--platform cpu-local ...] [--grid default|FILE]
        [--steps 3] [--warmup 1] [--quick] [--json] [--save RUNS.json | --load RUNS.json]

`--quick`: the first 4 plans of the grid, 2 steps after 1 warm-up. `--save` keeps the
measured runs (step times and traces), `--load` re-predicts them without running: with
several `--platform`s, every platform's error per plan is printed side by side (the same
measurements, so a change of the cost model or of a platform file is compared without
the machine's run-to-run noise); the breakdown is the first platform's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from ratrain.platforms import load
from ratrain.sim import simulate
from ratrain.validate.breakdown import merge, step_breakdown
from ratrain.validate.grid import default_grid, load_grid
from ratrain.validate.run import _timing
from ratrain.validate.stats import kendall_tau

MAIN = ("F.block", "B.block", "F.head", "B.head", "UPD", "NORM", "idle")


def measure(g, steps: int, warmup: int) -> dict:
    """The plan's measured step (median after warm-up, slowest rank) and last step's trace
    (`ratrain validate`'s own timing run)."""
    times, trace = _timing(g, steps, warmup)
    measured = max(statistics.median(t[warmup:]) for t in times)
    return {"name": g.name, "measured_s": measured, "trace": trace}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", action="append", help="repeatable; default cpu-local")
    ap.add_argument("--grid", default="default")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--max-ranks", type=int, default=4)
    ap.add_argument("--only", default="", help="comma-separated plan names")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save", help="write the measured runs here")
    ap.add_argument("--load", help="re-predict these measured runs instead of running")
    a = ap.parse_args(argv)
    grid = default_grid(a.max_ranks) if a.grid == "default" else load_grid(a.grid)
    if a.only:
        grid = [g for g in grid if g.name in a.only.split(",")]
    if a.quick:
        grid, a.steps, a.warmup = grid[:4], 2, 1
    labels = a.platform or ["cpu-local"]
    platforms = [load(p) for p in labels]
    if a.load:
        with open(a.load) as f:
            runs = {r["name"]: r for r in json.load(f)}
        grid = [g for g in grid if g.name in runs]
    else:
        runs = {}
    rows = []
    for g in grid:
        run = runs.get(g.name) or measure(g, a.steps, a.warmup)
        runs[g.name] = run
        sims = [simulate(g.spec, g.plan, p, memory_timeline=False) for p in platforms]
        meas = run["measured_s"]
        parts = step_breakdown(run["trace"], sims[0], g.spec.n_layers)
        preds = [s.step_time_s for s in sims]
        rows.append({"name": g.name, "predicted_s": preds, "measured_s": meas, "kinds": parts})
        if not a.json:
            cells = " ".join(
                f"{k}={parts[k][0] / parts[k][1]:.2f}" if parts.get(k, [0, 0])[1] else f"{k}=-"
                for k in MAIN
            )
            errs = " ".join(f"{p:6.3f} ({(p - meas) / meas:+6.1%})" for p in preds)
            print(f"{g.name:20s} meas {meas:6.3f} s  pred {errs}  meas/sim: {cells}", flush=True)
    if a.save:
        with open(a.save, "w") as f:
            json.dump(list(runs.values()), f)
    total = merge([r["kinds"] for r in rows])
    if a.json:
        json.dump({"plans": rows, "total": total}, sys.stdout, indent=1)
        print()
        return 0
    meas = [r["measured_s"] for r in rows]
    for i, label in enumerate(labels):
        errs = [abs(r["predicted_s"][i] - r["measured_s"]) / r["measured_s"] for r in rows]
        tau = kendall_tau([r["predicted_s"][i] for r in rows], meas) if len(rows) > 1 else 1.0
        print(
            f"{label}: MAPE {sum(errs) / len(errs):.1%}, max {max(errs):.1%}, Kendall tau {tau:.2f}"
        )
    print(f"\n{'kind':12s} {'measured s':>11s} {'simulated s':>12s} {'meas/sim':>9s}")
    for k, (m, s) in sorted(total.items(), key=lambda kv: -kv[1][0]):
        ratio = f"{m / s:9.2f}" if s else "        -"
        print(f"{k:12s} {m:11.3f} {s:12.3f} {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
