"""`ratrain prepare INPUT... --tokenizer DIR -o OUT`: tokenize text (.jsonl, .txt, .parquet)
once, on every core, into memory-mapped token files plus a held-out split and a manifest
that `ratrain train --data OUT` reads (see `ratrain.data.prepare`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ratrain.cli.common import local_processes, nonempty, nonneg_float, nonneg_int, seed

__all__ = ["add_arguments", "run", "usable_cpus"]

DEFAULT_VAL_FRACTION = 0.005


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "inputs",
        nargs="+",
        type=nonempty,
        metavar="INPUT",
        help=".jsonl, .txt (.text, .md) or .parquet files",
    )
    p.add_argument(
        "--tokenizer",
        required=True,
        type=nonempty,
        metavar="DIR",
        help="a Hugging Face tokenizer.json or its folder",
    )
    p.add_argument(
        "-o",
        "--out",
        required=True,
        type=nonempty,
        metavar="OUT",
        help="write the prepared data here",
    )
    p.add_argument(
        "--field",
        default="text",
        help='the text field of .jsonl / column of .parquet (default "text")',
    )
    p.add_argument(
        "--txt-docs",
        choices=("file", "paragraph", "line"),
        default="file",
        help="what a document of a .txt file is (default file: the whole file)",
    )
    split = p.add_mutually_exclusive_group()
    split.add_argument(
        "--val-fraction",
        type=nonneg_float,
        default=DEFAULT_VAL_FRACTION,
        help=f"hold out this fraction of the tokens, whole documents (default {DEFAULT_VAL_FRACTION})",
    )
    split.add_argument(
        "--val-tokens",
        type=nonneg_int,
        help="hold out at least this many tokens instead (whole documents)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the held-out split (default 0)")
    p.add_argument(
        "--workers",
        type=local_processes,
        default=usable_cpus(),
        help=f"processes that tokenize (default the usable CPUs, here {usable_cpus()})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")


class _ProgressLine:
    """`prepare 45% 45.1/100.0 MB  11,234,567 tokens  2.1M tok/s  ETA 0:26` on stderr: redrawn
    on a terminal (at most 10 times a second), else a line every 10 s and at the end."""

    def __init__(self, quiet: bool):
        self.quiet, self.tty = quiet, sys.stderr.isatty()
        self.t0, self.last = time.perf_counter(), -1e9
        self.shown = False

    def __call__(self, done: int, total: int, tokens: int, docs: int) -> None:
        now = time.perf_counter()
        if self.quiet or (now - self.last < (0.1 if self.tty else 10.0) and done < total):
            return
        from ratrain.observe.metrics import format_duration

        self.last, el = now, now - self.t0
        rate = tokens / el if el > 0 else 0.0
        eta = (total - done) * el / done if done else float("inf")
        line = (
            f"prepare {100 * done / max(total, 1):3.0f}% {done / 1e6:.1f}/{total / 1e6:.1f} MB  "
            f"{docs:,} documents  {tokens:,} tokens  {rate / 1e6:.2f}M tok/s  "
            f"ETA {format_duration(eta)}"
        )
        sys.stderr.write(("\r\033[K" + line) if self.tty else line + "\n")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\n")


def run(args: argparse.Namespace) -> int:
    from ratrain.cli.outputs import prepare_output_dir
    from ratrain.data.prepare import PrepareRequest, check_request, prepare

    req = PrepareRequest(
        inputs=tuple(Path(p) for p in args.inputs),
        tokenizer=Path(args.tokenizer),
        out=Path(args.out),
        field=args.field,
        txt_docs=args.txt_docs,
        val_fraction=args.val_fraction,
        val_tokens=args.val_tokens,
        seed=args.seed,
        workers=args.workers,
    )
    check_request(req)  # bad input is one line before anything is created
    prepare_output_dir(args.out, "-o")
    bar = _ProgressLine(args.quiet)
    try:
        res = prepare(req, progress=bar)
    finally:
        bar.close()
    m = res.manifest
    if res.up_to_date:
        print(
            f"{args.out} is up to date ({args.out}/manifest.json matches the inputs and tokenizer)"
        )
    else:
        print(
            f"prepared {len(m['inputs'])} file(s) in {m['seconds']:.1f} s on {args.workers} "
            f"worker(s): {m['tokens_per_s']:,} tokens/s"
        )
    for name, s in m["splits"].items():
        print(
            f"  {name}: {s['tokens']:,} tokens, {s['documents']:,} documents  {args.out}/{s['file']}"
        )
    if m["tokenizer"].get("eos_token_id") is None:
        print(
            "ratrain prepare: note: the tokenizer has no end-of-text token; documents are "
            "joined with nothing between them",
            file=sys.stderr,
        )
    return 0
