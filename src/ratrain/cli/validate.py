"""`ratrain validate`: run a grid of plans for real and set each beside its prediction."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ratrain.cli.common import nonempty, nonneg_int, positive_int

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--platform",
        type=nonempty,
        required=True,
        help="platform file (e.g. from ratrain calibrate)",
    )
    p.add_argument(
        "--grid", type=nonempty, default="default", help="default, or a grid YAML/JSON file"
    )
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps per plan (default 5)")
    p.add_argument("--warmup", type=nonneg_int, default=1, help="untimed steps first (default 1)")
    p.add_argument(
        "--passes",
        type=positive_int,
        default=2,
        help="passes through the grid the timed steps are split over, in alternating order "
        "(default 2: a drifting machine slows every plan alike)",
    )
    p.add_argument(
        "--max-ranks", type=positive_int, default=4, help="skip default-grid plans with more ranks"
    )
    p.add_argument(
        "--no-plan-pick",
        action="store_true",
        help="do not search and run `ratrain plan`'s pick per model (judge the grid only)",
    )
    p.add_argument(
        "--rescore",
        type=nonempty,
        metavar="PREV.json",
        default=None,
        help="re-predict the plans and measurements of an earlier `validate --json` output "
        "with --platform, without running anything (--grid FILE: the models, if the file "
        "lacks them)",
    )
    p.add_argument(
        "--cluster",
        nargs="?",
        const="default",
        default=None,
        metavar="GRID",
        help="run the grid on the emulated cluster instead (`ratrain emulate`; needs root): "
        "each plan with its links shaped and unshaped, interleaved, and what the links add "
        "set beside its prediction; GRID: default (13 plans on 4x1 and 2x2 nodes at 50-200 "
        "Mbit/s), or a YAML/JSON list of cases (docs/validation.md). --passes repeats the grid",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        default=None,
        help="predicted-vs-measured scatter; the worst plan's measured and simulated "
        "timelines go beside it (OUT-worst.png, OUT-worst-sim.json, OUT-worst-measured.json)",
    )


def _table(results, summary) -> str:
    from ratrain.validate.speed import describe

    lines = [
        f"{'plan':<22} {'pred s':>8} {'meas s':>8} {'err':>7}  ledger / measured peak MiB (per rank)"
    ]
    for r in results:
        mem = " ".join(
            f"{r.ledger_peak_bytes[s] / 2**20:.1f}/{m / 2**20:.1f}"
            for s, reps in enumerate(r.measured_peak_bytes)
            for m in reps
        )
        lines.append(
            f"{r.name:<22} {r.predicted_step_s:8.3f} {r.measured_step_s:8.3f} {r.error:+7.1%}  {mem}"
        )
    tau = summary["kendall_tau"]
    lines.append(
        f"step time: MAPE {summary['mape']:.1%}, max {summary['max_error']:.1%}, "
        f"Kendall tau {tau:.2f}"
        if tau is not None
        else f"step time: MAPE {summary['mape']:.1%}"
    )
    if summary["memory_min_error"] is not None:
        lines.append(
            f"ledger vs measured peak: {summary['memory_min_error']:+.1%} .. "
            f"{summary['memory_max_error']:+.1%} (target -0%/+10%: "
            f"{'met' if summary['memory_within'] else 'NOT met'})"
        )
    for model, p in summary["planner_pick"].items():
        lines.append(
            f"{model}: ratrain plan picks {p['pick']}, measured fastest {p['measured_fastest']} "
            f"(+{p['slower_than_fastest']:.1%}; within 5%: {'yes' if p['within_5pct'] else 'no'});"
            f" simulator's fastest of the grid {p['sim_pick']} (+{p['sim_pick_slower']:.1%})"
        )
    speed = describe(summary.get("machine_speed"))
    if speed:
        lines.append(speed)
    return "\n".join(lines)


class _Progress:
    """`validate [i/n] ...` redrawn on one stderr line; `end()` closes the line (before an
    error line, so that it stands on its own)."""

    def __init__(self) -> None:
        self.open = False

    def __call__(self, i: int, n: int, name: str, elapsed_s: float) -> None:
        sys.stderr.write(f"\rvalidate [{i}/{n}] {elapsed_s:6.0f}s {name:<40}")
        self.open = True
        if i == n:
            self.end()
        sys.stderr.flush()

    def end(self) -> None:
        if self.open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.open = False


def _check_plot(out: str | None) -> None:
    """--plot and the files written beside it, before anything is run."""
    from ratrain.cli.outputs import PLOT_SUFFIXES, prepare_output_file

    if out is None:
        return
    prepare_output_file(out, "--plot", PLOT_SUFFIXES)
    stem = Path(out).with_suffix("")
    for extra in ("-worst.png", "-worst-sim.json", "-worst-measured.json"):
        prepare_output_file(f"{stem}{extra}", "--plot")


def run(args) -> int:
    from ratrain.errors import RatrainError
    from ratrain.platforms import load

    if args.warmup < 0:
        raise RatrainError(f"--warmup must be >= 0, got {args.warmup}")
    if args.cluster is not None:
        return _cluster(args)
    _check_plot(args.plot)
    platform = load(args.platform)
    if args.rescore:  # runs nothing: no torch
        return _rescore(args, platform)
    return _validate(args, platform)


def _validate(args, platform) -> int:
    from ratrain.calibrate.probe import probe_s
    from ratrain.errors import RatrainError
    from ratrain.validate.grid import default_grid, load_grid
    from ratrain.validate.results import result_dict
    from ratrain.validate.run import validate

    grid = default_grid(args.max_ranks) if args.grid == "default" else load_grid(args.grid)
    if not grid:
        raise RatrainError("the grid has no plans")
    progress = _Progress()
    try:
        results, summary = validate(
            grid,
            platform,
            steps=args.steps,
            warmup=args.warmup,
            progress=progress,
            plan_picks=not args.no_plan_pick,
            passes=args.passes,
            probe=probe_s,
        )
    finally:
        progress.end()
    if args.plot:
        _plots(args.plot, results, summary, platform)
    if args.json:
        doc = {"platform": platform.name, "summary": summary}
        doc["models"] = {r.model: r.grid.spec.to_dict() for r in results}
        doc["results"] = [result_dict(r) for r in results]
        print(json.dumps(doc, indent=1))
    else:
        print(_table(results, summary))
    return 0


def _rescore(args, platform) -> int:
    from ratrain.validate.plot import scatter
    from ratrain.validate.rescore import rescore
    from ratrain.validate.results import result_dict

    results, summary, before = rescore(
        args.rescore, platform, grid=args.grid, plan_picks=not args.no_plan_pick
    )
    if args.plot:  # the measured traces are not in the file: the scatter only
        scatter(results, args.plot)
    if args.json:
        doc = {"platform": platform.name, "summary": summary, "previous_summary": before}
        doc["models"] = {r.model: r.grid.spec.to_dict() for r in results}
        doc["results"] = [result_dict(r) for r in results]
        print(json.dumps(doc, indent=1))
        return 0
    print(_table(results, summary))
    for model, p in summary["planner_pick"].items():
        if p["pick_plan"]:
            print(
                f"{model}: ratrain plan picks a plan the file did not measure "
                f"({p['pick_plan']}); judged above instead: the simulator's fastest measured "
                f"row, {p['pick']}"
            )
    if before.get("mape") is not None:
        tau = before.get("kendall_tau")
        print(
            f"as measured, with the file's own platform: MAPE {before['mape']:.1%}, "
            f"max {before['max_error']:.1%}"
            + (f", Kendall tau {tau:.2f}" if tau is not None else "")
        )
    return 0


def _plots(out: str, results, summary, platform) -> None:
    from ratrain.observe.trace import write_measured_trace
    from ratrain.sim import simulate
    from ratrain.sim.trace import write_trace
    from ratrain.validate.plot import scatter, traces_side_by_side

    scatter(results, out)
    worst = next(r for r in results if r.name == summary["worst_plan"])
    sim = simulate(worst.grid.spec, worst.grid.plan, platform)
    stem = Path(out).with_suffix("")
    traces_side_by_side(sim, worst.measured_trace, worst.name, f"{stem}-worst.png")
    write_trace(sim, f"{stem}-worst-sim.json")
    if worst.measured_trace:
        write_measured_trace(worst.measured_trace, f"{stem}-worst-measured.json")


def _cluster(args) -> int:
    """`validate --cluster`: `ratrain.bench.validate_cluster`."""
    from ratrain.bench.validate_cluster import (
        DEFAULT_CASES,
        load_cases,
        summarize,
        table,
        validate_cluster,
    )
    from ratrain.errors import RatrainError
    from ratrain.launch.emulate import unavailable
    from ratrain.platforms import load

    for flag, given in (
        ("--grid", args.grid != "default"),
        ("--plot", args.plot is not None),
        ("--rescore", args.rescore is not None),
        ("--no-plan-pick", args.no_plan_pick),
    ):
        if given:
            raise RatrainError(
                f"{flag} does not apply to --cluster (give the grid as --cluster GRID)"
            )
    load(args.platform)  # a bad platform file fails now, not after the first run
    cases = list(DEFAULT_CASES) if args.cluster == "default" else load_cases(args.cluster)
    why = unavailable()
    if why is not None:
        raise RatrainError(f"--cluster runs an emulated network and cannot here: {why}")
    progress = _Progress()
    try:
        rows = validate_cluster(
            cases,
            args.platform,
            passes=args.passes,
            steps=args.steps,
            warmup=args.warmup,
            progress=progress,
        )
    finally:
        progress.end()
    summary = summarize(rows)
    if args.json:
        print(
            json.dumps({"platform": args.platform, "summary": summary, "results": rows}, indent=1)
        )
    else:
        print(table(rows, summary))
    return 0
