"""What an answer of `ratrain plan` cannot take less than: the command's start-up and one
ledger replay and one simulation of the plan it answers with, each timed on its own in a
fresh process, beside the answer's own wall time (the default budget).

    PYTHONPATH=src python benchmarks/plan_floor.py --wide --over 1.5 --json out.json
    PYTHONPATH=src python benchmarks/plan_floor.py --cases jobs.json

A search ranks a plan only once it has simulated it, so however the search is ordered, an
answer takes at least `floor_s` = start-up (the answer's wall time less its search time:
imports, the platform, printing) + the answer plan's memory replay + its simulation (the
planner's own `Evaluator`, steady-state shortcut included, a fresh one: no cache). Where
that floor is over a wall-time target, no search order meets the target on this machine:
only a faster evaluator (replay, lowering, simulation) or another machine does.

`--wide` takes `plan_grid.py --wide`'s jobs; `--over S` keeps the jobs whose answer took
more than S seconds (first run at the default budget, then the floor). Prints one row per
job and how many jobs' floors are over 2 s and 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

_CHILD = r"""
import json, sys, time
from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner import Request
from ratrain.planner.evaluate import Evaluator
from ratrain.platforms import load
case, plan = json.loads(sys.argv[1]), json.loads(sys.argv[2])
platform, model, clusters, gb, seq = case
plan = Plan.from_dict(plan)
ev = Evaluator(Request(get_preset(model), load(platform), clusters, gb, seq))
t0 = time.perf_counter(); ev.memory(plan); t1 = time.perf_counter()
res = ev.simulate(plan); t2 = time.perf_counter()
print(json.dumps({"memory_s": t1 - t0, "simulate_s": t2 - t1, "step_s": res.step_time_s}))
"""


def _plan(case: list) -> dict:
    platform, model, clusters, gb, seq = case
    cmd = [sys.executable, "-m", "ratrain", "plan", "--model", model, "--platform", platform]
    cmd += ["--clusters", str(clusters), "--global-batch", str(gb), "--seq", str(seq)]
    t0 = time.perf_counter()
    out = subprocess.run([*cmd, "--json", "--quiet"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    doc = json.loads(out.stdout) if out.stdout.strip() else {}
    return {
        "wall_s": wall,
        "search_s": doc.get("search_time_s"),
        "plan": doc.get("plan"),
        "step_s": (doc.get("predicted") or {}).get("step_time_s"),
    }


def _floor(case: list, plan: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(case), json.dumps(plan)],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    if out.returncode:
        raise SystemExit(f"plan_floor: the child failed on {case}: {out.stderr[-400:]}")
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wide", action="store_true", help="plan_grid.py --wide's jobs")
    ap.add_argument("--cases", help="a JSON list of [platform, model, clusters, global_batch, seq]")
    ap.add_argument("--over", type=float, default=0.0, help="only jobs whose answer took longer")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    if a.cases:
        cases = json.loads(Path(a.cases).read_text())
    elif a.wide:
        from plan_grid import wide_grid

        cases = [list(c) for c in wide_grid()]
    else:
        ap.error("give --wide or --cases")
    rows = []
    for case in cases:
        r = {"case": list(case), **_plan(case)}
        if r["plan"] is None or r["wall_s"] <= a.over:
            continue
        f = _floor(case, r.pop("plan"))
        r.update(f)
        r["startup_s"] = r["wall_s"] - (r["search_s"] or 0.0)
        r["floor_s"] = r["startup_s"] + f["memory_s"] + f["simulate_s"]
        rows.append(r)
        print(
            f"{' '.join(map(str, case)):44s} wall {r['wall_s']:5.2f}  floor {r['floor_s']:5.2f}"
            f"  (start-up {r['startup_s']:.2f}, replay {f['memory_s']:.2f}, "
            f"simulation {f['simulate_s']:.2f})",
            flush=True,
        )
    for lim in (2.0, 5.0):
        n = sum(r["floor_s"] > lim for r in rows)
        print(f"floor over {lim:g} s: {n} of {len(rows)} jobs timed ({len(cases)} in the grid)")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
