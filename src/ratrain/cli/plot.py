"""`ratrain plot m.jsonl [b.jsonl ...] -o curves.png`: training curves from the metrics
files `ratrain train --metrics` writes, several runs on one figure (`ratrain.observe.curves`).
Never imports torch."""

from __future__ import annotations

import argparse
from pathlib import Path

from ratrain.cli.common import bounded_float, nonempty, positive_float
from ratrain.cli.outputs import PLOT_SUFFIXES, prepare_output_file
from ratrain.errors import RatrainError

__all__ = ["add_arguments", "run"]

MAX_DPI = 1200.0
"""assumed: print resolution; at 10**6 dpi matplotlib would allocate terabytes for the
figure."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "metrics",
        nargs="+",
        metavar="METRICS.jsonl",
        help="metrics files of ratrain train --metrics (a resumed run's file: the later "
        "record of a repeated step wins)",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT.png", help="the figure to write")
    p.add_argument(
        "--label",
        action="append",
        type=nonempty,
        metavar="NAME",
        help="a run's name in the legend, once per file in order (default: the file's name)",
    )
    p.add_argument(
        "--cap",
        type=positive_float,
        metavar="GIB",
        help="draw this memory cap per rank (default: the records' own, where a run had "
        "--memory-cap)",
    )
    p.add_argument(
        "--dpi",
        type=bounded_float(MAX_DPI, "dots per inch"),
        default=100,
        help="resolution of the figure (default 100)",
    )


def run(args: argparse.Namespace) -> int:
    from ratrain.observe.curves import plot_curves, read_run

    labels = args.label or []
    if len(labels) > len(args.metrics):
        raise RatrainError(
            f"{len(labels)} --label for {len(args.metrics)} metrics files; give at most one each"
        )
    prepare_output_file(args.output, "-o", PLOT_SUFFIXES)
    names = _default_labels(args.metrics)
    runs = [
        read_run(path, labels[i] if i < len(labels) else names[i])
        for i, path in enumerate(args.metrics)
    ]
    cap = args.cap * 2**30 if args.cap is not None else None
    plot_curves(runs, args.output, cap_bytes=cap, dpi=args.dpi)
    print(f"wrote {args.output} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    return 0


def _default_labels(paths: list[str]) -> list[str]:
    """Each file's name without its suffix; with its folder where two names are the same
    (two runs' m.jsonl)."""
    stems = [Path(p).stem for p in paths]
    return [
        str(Path(Path(p).resolve().parent.name) / s) if stems.count(s) > 1 else s
        for p, s in zip(paths, stems, strict=True)
    ]
