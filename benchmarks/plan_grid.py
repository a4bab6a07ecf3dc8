"""Planner speed over the grid a user might ask for: every preset platform x the paper's
models (and llama2-13b) x clusters x global batch, at seq 4096, each case a fresh
`ratrain plan --json` process (so the wall time includes start-up, as a user sees it).

    PYTHONPATH=src python benchmarks/plan_grid.py            # the whole grid (300 cases)
    PYTHONPATH=src python benchmarks/plan_grid.py --quick    # 16 cases
    PYTHONPATH=src python benchmarks/plan_grid.py --json out.json --jobs 1
    PYTHONPATH=src python benchmarks/plan_grid.py --quick --time-budget 0  # exact searches
    PYTHONPATH=src python benchmarks/plan_grid.py --paper   # the paper's 4 models, 1024 mt3000
    PYTHONPATH=src python benchmarks/plan_grid.py --case h100-80g:qwen2.5-32b:8:4096[:SEQ]
    PYTHONPATH=src python benchmarks/plan_grid.py --wide    # the jobs people ask about today
    PYTHONPATH=src python benchmarks/plan_grid.py --wide --exact 600  # and each exact answer

`--wide` (288 cases): models from 1B to 405B (llama3.2-1b, llama2-7b, qwen2.5-32b,
llama2-70b, llama3-405b) x mt3000, a100-80g, h100-80g x 24, 96 and 1000 clusters (not
powers of two) x sequences of 2k-32k (as far as each model's max_seq goes) x global batches
of 256k and 16M tokens. Each row gives the time to the first fitting plan (`first_fit_s`)
and to the answer, and the certified gap. `--exact SECONDS` also runs each case's exact
search (`--time-budget 0`) for up to that long and reports how far the answer's step is
from the exact optimum's where that search ended in time.

Prints one row per case (wall seconds, the child's CPU seconds, search seconds, plan or
infeasible) and the p50, p95 and max of the wall times (and of the CPU times), the slowest
infeasible answer and the paper's four models on 1024 mt3000 clusters, against the targets
(p95 <= 2 s, max <= 5 s, infeasible <= 1 s, paper cases <= 2 s). Wall times on a loaded
machine are inflated; the CPU times much less so. A case whose search was cut at
`ratrain plan --time-budget` is marked with its gap (how much longer the best step may be
than the optimum, by the smallest step-time bound left); `not_exact` counts them. A case
whose search stopped at the budget before any plan fitted is "no fit yet" (`unfinished`),
not infeasible; one whose first fitting plan could not be simulated before the hard
deadline is "untimed fit" (`ratrain plan` names that plan, untimed).

Bytecode: by default the ratrain package the children import is byte-compiled first
(`compileall`), as `pip install` does for an installed package, so that start-up is what a
user of an installed ratrain sees. An editable install run with PYTHONDONTWRITEBYTECODE=1
(this project's development machine) otherwise recompiles every module in every process,
about 0.1 s more per case; `--bytecode source` measures that (it removes the package's
`__pycache__` first).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PLATFORMS = ("mt3000", "a100-80g", "h100-80g", "cpu-local")
PAPER_MODELS = ("llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b")
MODELS = (*PAPER_MODELS, "llama2-13b")
CLUSTERS = (8, 64, 256, 1024, 4096)
GLOBAL_BATCHES = (256, 1024, 4096)
SEQ = 4096
TARGETS = {"p95_s": 2.0, "max_s": 5.0, "infeasible_max_s": 1.0, "paper_1024_max_s": 2.0}


WIDE_MODELS = ("llama3.2-1b", "llama2-7b", "qwen2.5-32b", "llama2-70b", "llama3-405b")
WIDE_PLATFORMS = ("mt3000", "a100-80g", "h100-80g")
WIDE_CLUSTERS = (24, 96, 1000)
WIDE_SEQS = (2048, 4096, 8192, 32768)
WIDE_TOKENS = (2**18, 2**24)
"""Global batches in tokens: 256k and 16M."""


def wide_grid() -> list[tuple[str, str, int, int, int]]:
    from ratrain.models.presets import get_preset

    out = []
    for model, platform, clusters, seq, tokens in itertools.product(
        WIDE_MODELS, WIDE_PLATFORMS, WIDE_CLUSTERS, WIDE_SEQS, WIDE_TOKENS
    ):
        if seq <= get_preset(model).max_seq:
            out.append((platform, model, clusters, tokens // seq, seq))
    return out


def grid(quick: bool, paper: bool = False) -> list[tuple]:
    if paper:  # the paper's four models at 1024 MT-3000 clusters, LLaMA 2's 4M-token batch
        return [("mt3000", m, 1024, 1024) for m in PAPER_MODELS]
    if quick:
        return list(
            itertools.product(
                ("mt3000", "a100-80g"), ("llama2-7b", "llama2-70b"), (64, 1024), (256, 1024)
            )
        )
    return list(itertools.product(PLATFORMS, MODELS, CLUSTERS, GLOBAL_BATCHES))


def run_case(case: tuple, timeout_s: float, extra: list[str] = ()) -> dict:
    platform, model, clusters, gb, *rest = case
    seq = rest[0] if rest else SEQ
    cmd = [
        sys.executable,
        "-m",
        "ratrain",
        "plan",
        "--model",
        model,
        "--platform",
        platform,
        "--clusters",
        str(clusters),
        "--global-batch",
        str(gb),
        "--seq",
        str(seq),
        "--json",
        "--quiet",
        *extra,
    ]
    row = {
        "platform": platform,
        "model": model,
        "clusters": clusters,
        "global_batch": gb,
        "seq": seq,
    }
    t0 = time.perf_counter()
    # The child's CPU seconds (user + system): steadier than wall time on a shared machine.
    # Exact with --jobs 1; with more jobs the children's times mix.
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:  # killed and reaped: its CPU time is counted
        out = None
    row["wall_s"] = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    row["cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if out is None:
        return {**row, "wall_s": timeout_s, "result": "timeout", "plan": ""}
    try:
        d = json.loads(out.stdout)
    except json.JSONDecodeError:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {**row, "result": "error", "plan": err[:100]}
    row["search_s"] = d.get("search_time_s")
    row["first_fit_s"] = d.get("first_fit_s")
    # Cut at the time budget: the best is within `gap` of the optimum (by the bound left).
    row["exact"] = not d.get("cut", False)
    row["gap"] = d.get("gap", 0.0)
    if d.get("feasible"):
        p = d["plan"]
        row["result"] = "plan"
        row["family"] = d.get("family")
        row["tokens_per_s"] = d["predicted"]["tokens_per_s"]
        row["step_s"] = d["predicted"]["step_time_s"]
        row["plan"] = (
            f"{d.get('family')} pp={p['pp']} dp={p['dp']} mb={p['micro_batch']} "
            f"rec={_rec(p['recompute'])} views={p['view_policy']}"
        )
    elif d.get("untimed_fit"):  # a plan fits by the ledger; not simulated in time
        row["result"] = "untimed fit"
        u, p = d["untimed_fit"], d["untimed_fit"]["plan"]
        row["plan"] = (
            f"{u['family']} pp={p['pp']} dp={p['dp']} mb={p['micro_batch']} "
            f"rec={_rec(p['recompute'])} views={p['view_policy']} (not timed)"
        )
    elif d.get("unfinished"):
        row["result"] = "no fit yet"
        ex = d.get("explanation") or {}
        row["plan"] = (ex.get("text") or [""])[0][:100] if isinstance(ex, dict) else ""
    else:
        row["result"] = "infeasible"
        ex = d.get("explanation") or {}
        row["plan"] = (ex.get("text") or [""])[0][:100] if isinstance(ex, dict) else ""
        row["explained"] = bool(ex)
    return row


def _rec(r) -> str:
    return r if isinstance(r, str) else (r[0] if len(set(r)) == 1 else ",".join(r))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return 0.0
    k = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[k]


def summary(rows: list[dict]) -> dict:
    planned = [r for r in rows if r["result"] == "plan"]
    off = [r["off_exact"] for r in rows if r.get("off_exact") is not None]
    walls = [r["wall_s"] for r in rows]
    cpus = [r["cpu_s"] for r in rows if r.get("cpu_s") is not None]
    infeasible = [r["wall_s"] for r in rows if r["result"] == "infeasible"]
    paper = [
        r["wall_s"]
        for r in rows
        if r["platform"] == "mt3000" and r["clusters"] == 1024 and r["model"] in PAPER_MODELS
    ]
    return {
        "cases": len(rows),
        "p50_s": _pct(walls, 0.5),
        "p95_s": _pct(walls, 0.95),
        "max_s": max(walls, default=0.0),
        "cpu_p50_s": _pct(cpus, 0.5),
        "cpu_p95_s": _pct(cpus, 0.95),
        "cpu_max_s": max(cpus, default=0.0),
        "infeasible": len(infeasible),
        "infeasible_max_s": max(infeasible, default=0.0),
        "paper_1024_max_s": max(paper, default=0.0),
        "not_answered": sum(r["result"] in ("timeout", "error") for r in rows),
        "unfinished": sum(r["result"] == "no fit yet" for r in rows),
        "untimed_fit": sum(r["result"] == "untimed fit" for r in rows),
        "not_exact": sum(not r.get("exact", True) for r in rows),
        "max_gap": max((r.get("gap") or 0.0 for r in rows), default=0.0),
        "gap_le_5pct_share": _share([(r.get("gap") or 0.0) <= 0.05 for r in planned]),
        "first_fit_p95_s": _pct([r["first_fit_s"] for r in planned if r.get("first_fit_s")], 0.95),
        "exact_done": len(off),
        "max_off_exact": max(off, default=0.0),
        "within_5pct_of_exact_share": _share([o <= 0.05 for o in off]),
    }


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 1.0


def prepare_bytecode(mode: str) -> str:
    """Compile the imported ratrain package's modules (`installed`) or remove their caches
    (`source`); returns the package directory."""
    spec = importlib.util.find_spec("ratrain")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("plan_grid: ratrain is not importable (run with PYTHONPATH=src)")
    pkg = list(spec.submodule_search_locations)[0]
    if mode == "installed":
        compileall.compile_dir(pkg, quiet=1)
    else:
        for root, dirs, _ in os.walk(pkg):
            if "__pycache__" in dirs:
                shutil.rmtree(os.path.join(root, "__pycache__"))
    return pkg


def _parse_case(text: str) -> tuple:
    try:
        platform, model, clusters, gb, *seq = text.split(":")
        if len(seq) > 1:
            raise ValueError
        return (platform, model, int(clusters), int(gb), *(int(s) for s in seq))
    except ValueError:
        raise SystemExit(
            f"plan_grid: --case wants PLATFORM:MODEL:CLUSTERS:GB[:SEQ], got {text!r}"
        ) from None


def with_exact(row: dict, case: tuple, timeout_s: float) -> dict:
    """`row` with its case's exact search (`--time-budget 0`, up to `timeout_s`): the
    exact optimum's step, its search time, and how much longer the answer's step is
    (`off_exact`); none where it did not end in time."""
    ex = run_case(case, timeout_s, ["--time-budget", "0"])
    row["exact_wall_s"] = ex["wall_s"]
    if ex["result"] == "plan" and row.get("step_s"):
        row["exact_step_s"] = ex["step_s"]
        row["off_exact"] = row["step_s"] / ex["step_s"] - 1
    elif ex["result"] == "timeout":
        row["exact_wall_s"] = None
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 cases instead of 300")
    ap.add_argument(
        "--wide", action="store_true", help="the jobs people ask about today (288 cases)"
    )
    ap.add_argument(
        "--exact",
        type=float,
        metavar="SECONDS",
        help="also run each case's exact search for up to SECONDS and compare",
    )
    ap.add_argument(
        "--paper", action="store_true", help="the paper's four models on 1024 mt3000 clusters"
    )
    ap.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="PLATFORM:MODEL:CLUSTERS:GB",
        help="run only these cases (repeatable)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--json", metavar="OUT.json", help="also write the rows and summary")
    ap.add_argument(
        "--time-budget",
        type=float,
        metavar="SECONDS",
        help="passed to ratrain plan --time-budget (default: the CLI's; 0 = exact search)",
    )
    ap.add_argument(
        "--bytecode",
        choices=("installed", "source"),
        default="installed",
        help="installed: byte-compile the package first, as pip install does (default); "
        "source: remove its bytecode, every process compiles it",
    )
    args = ap.parse_args(argv)
    pkg = prepare_bytecode(args.bytecode)
    cases = [_parse_case(c) for c in args.case] or (
        wide_grid() if args.wide else grid(args.quick, args.paper)
    )
    env_note = os.environ.get("PYTHONPATH", "")
    print(
        f"{len(cases)} cases, jobs {args.jobs} (PYTHONPATH={env_note or '-'}; "
        f"bytecode {args.bytecode}: {pkg})"
    )
    hdr = (
        f"{'platform':10} {'model':14} {'clust':>5} {'gb':>5} {'seq':>5} {'wall s':>7} "
        f"{'cpu s':>7} {'search':>7} {'1st fit':>7}  result"
    )
    print(hdr)
    rows = []

    extra = [] if args.time_budget is None else ["--time-budget", str(args.time_budget)]

    def one(case):
        row = run_case(case, args.timeout, extra)
        return with_exact(row, case, args.exact) if args.exact else row

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for r in pool.map(one, cases):
            rows.append(r)
            search = "-" if r.get("search_s") is None else f"{r['search_s']:.2f}"
            cpu = "-" if r.get("cpu_s") is None else f"{r['cpu_s']:.2f}"
            cut = "" if r.get("exact", True) else f" [cut, within {r.get('gap') or 0.0:.1%}]"
            cut = "" if r["result"] in ("no fit yet", "untimed fit") else cut
            first = "-" if r.get("first_fit_s") is None else f"{r['first_fit_s']:.2f}"
            exact = ""
            if r.get("off_exact") is not None:
                exact = f" [exact in {r['exact_wall_s']:.0f} s: {r['off_exact']:+.1%}]"
            elif args.exact:
                exact = " [exact: not within --exact]"
            print(
                f"{r['platform']:10} {r['model']:14} {r['clusters']:>5} {r['global_batch']:>5} "
                f"{r['seq']:>5} {r['wall_s']:>7.2f} {cpu:>7} {search:>7} {first:>7}  "
                f"{r['result']:10} {r['plan']}{cut}{exact}",
                flush=True,
            )
    s = summary(rows)
    print()
    for k, v in s.items():
        target = TARGETS.get(k)
        mark = "" if target is None else (" ok" if v <= target else f" OVER target {target}")
        print(f"{k:18} {v:.2f}{mark}" if isinstance(v, float) else f"{k:18} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"rows": rows, "summary": s, "targets": TARGETS, "bytecode": args.bytecode},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
