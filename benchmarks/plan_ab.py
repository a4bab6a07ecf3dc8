"""Two planner trees side by side on the same jobs: `ratrain plan` at the default budget,
each job run by both trees in turn (fresh processes, interleaved, so the machine's drift
falls on both), with each answer's step set beside a reference where one is given.

    PYTHONPATH=src python benchmarks/plan_ab.py --before-src /tmp/old/src --wide --stride 2
    PYTHONPATH=src python benchmarks/plan_ab.py --before-src /tmp/old/src --cases jobs.json \\
        --reference ref.json --json out.json
    PYTHONPATH=src python benchmarks/plan_ab.py --reference-only --cases jobs.json \\
        --reference-budget 60 --json ref.json    # the reference answers themselves

`--before-src` is another tree's `src` folder (`git archive REV src | tar -x -C DIR`); the
"after" tree is the one this script is run from (its `PYTHONPATH`). `--cases` is a JSON list
of [platform, model, clusters, global_batch, seq]; `--wide` takes `plan_grid.py --wide`'s
jobs (`--stride N`: every N-th). `--reference` is a JSON written by `--reference-only`:
the answers of a longer budget (`--reference-budget`; 0 searches to the end), each with
its certified gap where it was cut.

Reports, per tree: wall p50 / p95 / max, the share of answers with a certified gap of at
most 5%, when the first plan was in hand, how many answers took over 2 s and how many of
those were found apart (`ratrain plan --json`'s `found_apart`), and, against the
reference, the geometric mean and max of the answer's step over the reference's and how
many answers are within 5% of it; then the after/before step ratio per job (geometric
mean, better and worse by over 1%).

`--repeat N` runs each job N times per tree, in rounds that alternate which tree goes
first; a job's figures are then those of its median run, its wall the median wall. The
after/before wall ratio per job is reported beside the step's.

Each tree's `src` is byte-compiled first (`compileall`), as `pip install` does and as
`plan_grid.py` does by default: a tree checked out fresh and run with
PYTHONDONTWRITEBYTECODE=1 (this project's development machine) otherwise recompiles every
module in every process, 0.15-0.2 s of each answer that an installed ratrain does not pay."""

from __future__ import annotations

import argparse
import compileall
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_grid import wide_grid  # noqa: E402


def _run(src: str, case: list, budget: float | None, timeout_s: float) -> dict:
    platform, model, clusters, gb, seq = case
    cmd = [sys.executable, "-m", "ratrain", "plan", "--model", model, "--platform", platform]
    cmd += ["--clusters", str(clusters), "--global-batch", str(gb), "--seq", str(seq)]
    cmd += ["--json", "--quiet"]
    if budget is not None:
        cmd += ["--time-budget", f"{budget:g}"]
    env = {**os.environ, "PYTHONPATH": src}
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        doc = json.loads(out.stdout) if out.stdout.strip() else {"error": out.stderr[-300:]}
    except subprocess.TimeoutExpired:
        doc = {"error": "timeout"}
    except json.JSONDecodeError:
        doc = {"error": "no JSON"}
    pred = doc.get("predicted") or {}
    return {
        "case": list(case),
        "wall_s": time.perf_counter() - t0,
        "feasible": doc.get("feasible"),
        "step_s": pred.get("step_time_s"),
        "gap": doc.get("gap"),
        "first_fit_s": doc.get("first_fit_s"),
        "found_apart": bool(doc.get("found_apart")),
        "error": doc.get("error"),
    }


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def _geo(xs: list[float]) -> float:
    return math.exp(statistics.mean(math.log(x) for x in xs)) if xs else float("nan")


def _collapsed(rows: list[dict]) -> list[dict]:
    """One row per tree and job: with `--repeat`, the run of the median wall (the lower
    median for an even count), its wall the median of the runs', all of them in `walls`."""
    runs: dict[tuple, list[dict]] = {}
    for r in rows:
        runs.setdefault((r["tree"], tuple(r["case"])), []).append(r)
    out = []
    for rs in runs.values():
        if len(rs) == 1:
            out.append(rs[0])
            continue
        walls = [r["wall_s"] for r in rs]
        mid = sorted(rs, key=lambda r: r["wall_s"])[(len(rs) - 1) // 2]
        out.append({**mid, "wall_s": statistics.median(walls), "walls": walls})
    return out


def summary(rows: list[dict], ref: dict[tuple, float]) -> list[str]:
    lines = []
    rows = _collapsed(rows)
    names = list(dict.fromkeys(r["tree"] for r in rows))
    for name in names:
        rs = [r for r in rows if r["tree"] == name]
        walls = [r["wall_s"] for r in rs]
        plans = [r for r in rs if r["step_s"]]
        gaps = [r["gap"] or 0.0 for r in plans]
        ff = [r["first_fit_s"] for r in plans if r["first_fit_s"] is not None]
        line = (
            f"{name}: {len(rs)} jobs, {len(plans)} plans; wall p50 {statistics.median(walls):.2f}"
            f" p95 {_pct(walls, 0.95):.2f} max {max(walls):.2f} s"
        )
        if gaps:
            ok = sum(g <= 0.05 for g in gaps)
            line += f"; gap <= 5%: {ok}/{len(gaps)}"
        if ff:
            line += f"; first fit p50 {statistics.median(ff):.2f} p95 {_pct(ff, 0.95):.2f} s"
        slow = [r for r in rs if r["wall_s"] > 2.0]
        if slow:  # the answers found apart wait for the search's own plan (DIVE_GRACE)
            apart = sum(bool(r.get("found_apart")) for r in slow)
            line += f"; over 2 s: {len(slow)} ({apart} found apart)"
        vs = [r["step_s"] / ref[tuple(r["case"])] for r in plans if ref.get(tuple(r["case"]))]
        if vs:
            within = sum(x <= 1.05 for x in vs)
            line += (
                f"; step / reference: geo-mean {_geo(vs):.3f}, max {max(vs):.3f},"
                f" within 5%: {within}/{len(vs)}"
            )
        lines.append(line)
    if len(names) == 2:
        a, b = names
        by: dict[tuple, dict] = {}
        for r in rows:
            by.setdefault(tuple(r["case"]), {})[r["tree"]] = r
        ratio = [
            d[b]["step_s"] / d[a]["step_s"]
            for d in by.values()
            if d.get(a, {}).get("step_s") and d.get(b, {}).get("step_s")
        ]
        if ratio:
            lines.append(
                f"{b} / {a} step per job: geo-mean {_geo(ratio):.3f}; better by over 1%: "
                f"{sum(x < 0.99 for x in ratio)}, worse: {sum(x > 1.01 for x in ratio)} of "
                f"{len(ratio)}; range {min(ratio):.3f}-{max(ratio):.3f}"
            )
        walls = [d[b]["wall_s"] / d[a]["wall_s"] for d in by.values() if a in d and b in d]
        if walls:
            lines.append(
                f"{b} / {a} wall per job: median {statistics.median(walls):.3f}, geo-mean "
                f"{_geo(walls):.3f}, range {min(walls):.3f}-{max(walls):.3f}"
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-src", help="the other tree's src folder")
    ap.add_argument("--cases", help="JSON list of [platform, model, clusters, gb, seq]")
    ap.add_argument("--wide", action="store_true", help="plan_grid.py --wide's jobs")
    ap.add_argument("--stride", type=int, default=1, help="with --wide: every N-th job")
    ap.add_argument("--reference", help="a JSON written by --reference-only")
    ap.add_argument("--reference-only", action="store_true", help="write the reference")
    ap.add_argument("--reference-budget", type=float, default=60.0, help="0: to the end")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per job and tree, in rounds that alternate which tree goes first; each "
        "job's figures are its median run's",
    )
    ap.add_argument("--json", metavar="OUT.json")
    args = ap.parse_args()
    if args.cases:
        cases = [list(c[:5]) for c in json.loads(Path(args.cases).read_text())]
    elif args.wide:
        cases = [list(c) for c in wide_grid()[:: args.stride]]
    else:
        ap.error("give --cases FILE or --wide")
    here = os.environ.get("PYTHONPATH", "src").split(os.pathsep)[0]
    if args.reference_only:
        compileall.compile_dir(str(Path(here) / "ratrain"), quiet=1)
        timeout = max(args.timeout, 3 * args.reference_budget + 60)
        rows = []
        for case in cases:
            rows.append({"tree": "reference", **_run(here, case, args.reference_budget, timeout)})
            print(*case, f"{rows[-1]['wall_s']:.1f} s", rows[-1]["step_s"], flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    trees = [("before", args.before_src)] if args.before_src else []
    trees.append(("after", here))
    for _, src in trees:
        compileall.compile_dir(str(Path(src) / "ratrain"), quiet=1)
    ref = {}
    if args.reference:
        ref = {tuple(r["case"]): r["step_s"] for r in json.loads(Path(args.reference).read_text())}
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")
    rows = []
    for i, case in enumerate(cases):
        for k in range(args.repeat):
            for name, src in trees if k % 2 == 0 else trees[::-1]:
                rows.append({"tree": name, "round": k, **_run(src, case, None, args.timeout)})
            got = " ".join(
                f"{r['tree']}={r['wall_s']:.2f}s/{r['step_s'] and round(r['step_s'], 4)}"
                for r in sorted(rows[-len(trees) :], key=lambda r: r["tree"] != "before")
            )
            print(i, *case, *([f"round {k}"] if args.repeat > 1 else []), got, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\n".join(summary(rows, ref)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
