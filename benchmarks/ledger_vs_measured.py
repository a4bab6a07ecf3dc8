"""The memory ledger against the runtime's measured peak, rank by rank, over a grid.

Runs each plan for 2 steps with `measure_memory` (`LiveBytes`: every live tensor's bytes)
and prints (ledger - measured) / measured for every rank, stage-major. Bytes do not
depend on the machine's load, so these figures are the same on a busy machine.

    python benchmarks/ledger_vs_measured.py [--grid default|benchmarks/ledger_grid.yaml]
        [--platform cpu-local] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from ratrain.platforms import load
from ratrain.sim import simulate
from ratrain.train.job import run_job
from ratrain.validate.grid import default_grid, load_grid
from ratrain.validate.run import _job


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="default")
    ap.add_argument("--platform", default="cpu-local")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    grid = default_grid() if a.grid == "default" else load_grid(a.grid)
    platform = load(a.platform)
    rows = []
    for g in grid:
        ledger = simulate(g.spec, g.plan, platform, memory_timeline=False).peak_memory_bytes
        ranks = sorted(run_job(_job(g, 2, measure_memory=True)), key=lambda r: (r.stage, r.replica))
        errs = []
        for r in ranks:
            m = r.runs[g.plan.schedule].peak_bytes
            errs.append((ledger[r.stage] - m) / m)
        rows.append({"name": g.name, "errors": errs})
        if not a.json:
            print(f"{g.name:22s} " + ", ".join(f"{e:+.2%}" for e in errs), flush=True)
    flat = [e for r in rows for e in r["errors"]]
    if a.json:
        json.dump({"plans": rows, "min": min(flat), "max": max(flat)}, sys.stdout, indent=1)
        print()
    else:
        print(
            f"every rank of every plan: {min(flat):+.2%} ... {max(flat):+.2%} (target +0% ... +10%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
