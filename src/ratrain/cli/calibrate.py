"""`ratrain calibrate`: measure this machine and write a platform file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, help="platform YAML file to write")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--nproc", type=int, default=None, help="local ranks for communication (default: 4)"
    )
    p.add_argument("--quick", action="store_true", help="fewer shapes and repetitions (< 3 min)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds per window of one kernel measurement (default 0.25; 0.08 with --quick)",
    )
    p.add_argument(
        "--windows",
        type=int,
        default=None,
        help="windows per measured quantity, interleaved across quantities; the value is "
        "their median (default 3)",
    )
    p.add_argument(
        "--max-spread",
        type=float,
        default=None,
        help="re-measure quantities whose windows disagree by more than this (max/min - 1; "
        "default 0.15), and warn about those still over",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse to write the file when a quantity's windows still disagree (exit 2)",
    )
    p.add_argument(
        "--dtypes", default="fp32,bf16,fp16", help="compute dtypes to measure (fp32 required)"
    )
    p.add_argument("--name", default=None, help="platform name (default: the file's stem)")
    p.add_argument("--description", default=None, help="the platform's description line")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="FILE",
        default=None,
        help="measure nothing: write the value-by-value median of these platform files, "
        "calibrations of this machine taken at different times (a machine whose speed "
        "drifts needs several)",
    )


def run(args) -> int:
    from ratrain.calibrate import calibrate, write_platform
    from ratrain.calibrate.windows import DEFAULT_MAX_SPREAD
    from ratrain.errors import RatrainError
    from ratrain.platforms import load

    if args.budget_s is not None and not args.budget_s > 0:
        raise RatrainError(f"--budget-s must be positive, got {args.budget_s}")
    if args.windows is not None and args.windows < 1:
        raise RatrainError(f"--windows must be >= 1, got {args.windows}")
    max_spread = DEFAULT_MAX_SPREAD if args.max_spread is None else args.max_spread
    if not max_spread > 0:
        raise RatrainError(f"--max-spread must be positive, got {args.max_spread}")
    out = Path(args.output)
    if out.suffix not in (".yaml", ".yml"):
        raise RatrainError(f"-o {args.output}: a platform file ends in .yaml or .yml")
    if args.merge:
        return _merge(args, out)
    data = calibrate(
        args.device,
        args.nproc if args.nproc is not None else 4,
        quick=args.quick,
        budget_s=args.budget_s,
        dtypes=tuple(d.strip() for d in args.dtypes.split(",") if d.strip()),
        name=args.name or out.stem,
        progress=not args.no_progress,
        windows=args.windows,
        max_spread=max_spread,
    )
    warnings = data.get("calibration_warnings", [])
    if warnings and args.strict:
        raise RatrainError(
            f"not writing {out} (--strict): {len(warnings)} measurement(s) did not repeat: "
            + _short(warnings)
        )
    if warnings:  # one line: the file's calibration_warnings holds them one by one
        print(
            f"ratrain calibrate: warning: {len(warnings)} measurement(s) did not repeat "
            f"(listed in the file's calibration_warnings): {_short(warnings)}",
            file=sys.stderr,
        )
    if args.description:
        data["description"] = f"{args.description} {data['description']}"
    path = write_platform(data, out)
    plat = load(path)  # what we wrote must load
    measured = sum(n.startswith("measured") for n in plat.notes.values())
    print(f"wrote {path}: {measured} of {len(plat.notes)} values measured")
    busy = _busy_signs(plat)
    if busy:
        print(
            f"ratrain calibrate: warning: {busy}: the machine was probably busy while "
            "measured; re-run calibrate when it is idle",
            file=sys.stderr,
        )
    return 0


def _merge(args, out: Path) -> int:
    from ratrain.calibrate import write_platform
    from ratrain.calibrate.merge import merge_platforms
    from ratrain.platforms import load

    data = merge_platforms(args.merge, name=args.name)
    if args.description:
        data["description"] = f"{args.description} {data['description']}"
    path = write_platform(data, out)
    plat = load(path)  # what we wrote must load
    merged = sum(n.startswith("measured: median of") for n in plat.notes.values())
    print(
        f"wrote {path}: {merged} of {len(plat.notes)} values the median of {len(args.merge)} files"
    )
    return 0


def _short(warnings: list[str], n: int = 4) -> str:
    text = "; ".join(warnings[:n])
    return text + (f"; and {len(warnings) - n} more" if len(warnings) > n else "")


def _busy_signs(plat) -> str:
    """Why the measurements look taken on a loaded machine ('' when they do not): one rank
    on all the cores slower per rank than several ranks sharing them, or a second thread
    worth almost nothing."""
    speeds = [v for _, v in plat.rank_speed]
    if len(speeds) > 1 and speeds[0] < max(speeds[1:]):
        return "one rank with all the threads measured slower than a rank sharing the node"
    if plat.cores_per_node and plat.cores_per_node > 1 and plat.thread_efficiency < 0.2:
        return f"a second thread measured worth {plat.thread_efficiency:.0%} of the first"
    return ""
