"""`ratrain calibrate`: measure this machine and write a platform file.

Values that do not repeat are settled while measuring (`ratrain.calibrate.windows`); those
still noisy after that, or a machine that looked busy, are written anyway, named in the
file's `calibration_warnings` and its description, with one line on stderr saying what was
re-measured and what is still noisy: minutes of measuring are never thrown away. `--strict`
refuses instead (exit 2), having saved the measured data beside the output as
`<stem>.noisy.yaml` (to `--merge` with a later run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ratrain.calibrate import DTYPES as _DTYPES
from ratrain.cli.common import nonempty, positive_float, positive_int, timeout_s

__all__ = ["add_arguments", "run"]


def _dtypes(text: str) -> tuple[str, ...]:
    """argparse type of --dtypes: comma-separated among fp32, bf16, fp16, fp32 among them."""
    got = tuple(dict.fromkeys(d.strip() for d in text.split(",") if d.strip()))
    if not got or "fp32" not in got or any(d not in _DTYPES for d in got):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated dtypes among {', '.join(_DTYPES)}, fp32 included, "
            f"got {text!r}"
        )
    return got


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o", "--output", type=nonempty, required=True, help="platform YAML file to write"
    )
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--nproc",
        type=positive_int,
        default=None,
        help="local ranks for communication (default: 4)",
    )
    p.add_argument("--quick", action="store_true", help="fewer shapes and repetitions (< 3 min)")
    p.add_argument(
        "--budget-s",
        type=timeout_s,
        default=None,
        help="seconds per window of one kernel measurement (default 0.25; 0.08 with --quick)",
    )
    p.add_argument(
        "--windows",
        type=positive_int,
        default=None,
        help="windows per measured quantity, interleaved across quantities; the value is "
        "their median (default 3)",
    )
    p.add_argument(
        "--max-spread",
        type=positive_float,
        default=None,
        help="re-measure quantities whose windows disagree by more than this (max/min - 1; "
        "default 0.15), in rounds within a time limit, and warn about those still over",
    )
    noisy = p.add_mutually_exclusive_group()
    noisy.add_argument(
        "--allow-noisy",
        action="store_true",
        help="write the file even when values did not repeat or the machine was busy, "
        "saying so in its description and calibration_warnings: the default now; kept for "
        "scripts",
    )
    noisy.add_argument(
        "--strict",
        action="store_true",
        help="refuse to write values that did not repeat or were taken under load (exit 2); "
        "the measured data are saved beside -o as <stem>.noisy.yaml, to --merge later",
    )
    p.add_argument(
        "--dtypes",
        type=_dtypes,
        default=_DTYPES,
        help="compute dtypes to measure, comma-separated (default fp32,bf16,fp16; fp32 required)",
    )
    p.add_argument(
        "--name", type=nonempty, default=None, help="platform name (default: the file's stem)"
    )
    p.add_argument(
        "--description", type=nonempty, default=None, help="the platform's description line"
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--merge",
        nargs="+",
        type=nonempty,
        metavar="FILE",
        default=None,
        help="measure nothing: write the value-by-value median of these platform files, "
        "calibrations of this machine taken at different times (a machine whose speed "
        "drifts needs several)",
    )


def run(args) -> int:
    from ratrain.calibrate import busy_signs, calibrate
    from ratrain.calibrate.windows import DEFAULT_MAX_SPREAD
    from ratrain.cli.outputs import prepare_output_file
    from ratrain.errors import RatrainError

    max_spread = DEFAULT_MAX_SPREAD if args.max_spread is None else args.max_spread
    out = Path(args.output)
    if out.suffix not in (".yaml", ".yml"):
        raise RatrainError(f"-o {args.output}: a platform file ends in .yaml or .yml")
    prepare_output_file(args.output, "-o")  # before minutes of measuring
    if args.merge:
        return _merge(args, out)
    _check_nproc(args.nproc)
    settling = []  # what settling the noisy values did (calibrate tells it once)
    data = calibrate(
        args.device,
        args.nproc if args.nproc is not None else 4,
        quick=args.quick,
        budget_s=args.budget_s,
        dtypes=args.dtypes,
        name=args.name or out.stem,
        progress=not args.no_progress,
        windows=args.windows,
        max_spread=max_spread,
        on_settle=settling.append,
    )
    warnings = list(data.get("calibration_warnings", []))
    busy = [b for b in busy_signs(data) if b not in warnings]
    if args.description:
        data["description"] = f"{args.description} {data['description']}"
    if not (warnings or busy):
        return _write(data, out)
    _mark_noisy(data, warnings + busy)
    if args.strict:
        raise RatrainError(
            f"not writing {out} (--strict): {_problems(warnings, busy)}; {_save_noisy(data, out)}"
        )
    rc = _write(data, out)
    did = settling[0].text() if settling else ""
    print(
        f"ratrain calibrate: warning: wrote {out} with {len(warnings + busy)} calibration "
        f"warning(s): {_still_noisy(warnings, busy, did)}; `ratrain validate --platform "
        f"{out}` shows what they cost, and a second run later, merged with this one "
        "(--merge), improves them",
        file=sys.stderr,
    )
    return rc


def _still_noisy(warnings: list[str], busy: list[str], did: str) -> str:
    """What settling did and what is still noisy, in one clause: 're-measured 48 quantities
    in up to 4 rounds, 36 settled; still noisy: a, b, ... and 8 more; the machine was busy
    while measured (...)'."""
    repeat = [w.split(": ", 1)[0] for w in warnings if "disagree" in w]
    load = [w for w in warnings if "disagree" not in w] + busy
    parts = [did] if did else []
    if repeat:
        parts.append(f"still noisy ({len(repeat)}): {_short(repeat, sep=', ')}")
    if load:
        parts.append(f"the machine was busy while measured ({_short(load)})")
    return "; ".join(parts)


def _save_noisy(data: dict, out: Path) -> str:
    """Save what --strict refuses to write beside it (`<stem>.noisy.yaml`): the clause
    saying where, or why not."""
    from ratrain.calibrate import write_platform
    from ratrain.errors import RatrainError

    kept = out.with_name(f"{out.stem}.noisy.yaml")
    try:
        write_platform(data, kept)
    except RatrainError as e:
        return f"the measured values could not be saved either ({e})"
    return (
        f"the measured values are saved in {kept} (merge it with a later calibration: "
        f"ratrain calibrate --merge {kept} LATER.yaml -o {out})"
    )


def _problems(warnings: list[str], busy: list[str]) -> str:
    """The values that did not repeat and the signs of load, in one line."""
    parts = []
    repeat = [w for w in warnings if "disagree" in w]
    load = [w for w in warnings if w not in repeat] + busy
    if repeat:
        parts.append(f"{len(repeat)} measurement(s) did not repeat ({_short(repeat)})")
    if load:
        parts.append(f"the machine was busy while measured ({_short(load)})")
    return " and ".join(parts)


def _mark_noisy(data: dict, problems: list[str]) -> None:
    """The note a file written with noisy values carries: in its description (what a
    reader sees first) and its calibration_warnings (each problem)."""
    data["calibration_warnings"] = problems
    data["description"] = (
        f"{data.get('description', '')} WRITTEN NOISY: {len(problems)} value(s) "
        "did not repeat or were measured under load (calibration_warnings lists them); "
        "predictions from this file may be far off"
    ).strip()


def _check_nproc(nproc: int | None) -> None:
    """--nproc: at most the ranks a local launch starts."""
    from ratrain.errors import RatrainError
    from ratrain.launch.spawn import local_rank_limit

    if nproc is not None and nproc > local_rank_limit():
        raise RatrainError(
            f"--nproc {nproc}: more ranks than this machine runs locally (at most "
            f"{local_rank_limit()})"
        )


def _write(data: dict, out: Path) -> int:
    from ratrain.calibrate import write_platform
    from ratrain.platforms import load

    path = write_platform(data, out)
    plat = load(path)  # what we wrote must load
    measured = sum(n.startswith("measured") for n in plat.notes.values())
    print(f"wrote {path}: {measured} of {len(plat.notes)} values measured")
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


def _short(warnings: list[str], n: int = 4, sep: str = "; ") -> str:
    text = sep.join(warnings[:n])
    return text + (f"{sep}and {len(warnings) - n} more" if len(warnings) > n else "")
