"""`ratrain` command line. Each subcommand lives in its own module with
`add_arguments(parser)` and `run(args) -> int`; this package is the only place that
imports every layer. User mistakes (`RatrainError`) print one line and exit non-zero."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import warnings

from ratrain.errors import RatrainError

__all__ = ["main", "COMMANDS", "ALIASES", "STARTED_AT"]

STARTED_AT: float | None = None
"""When `main` started (perf_counter), before the subcommand's imports: the time a command's
answer is due from (`ratrain plan` counts its own start-up, imports and platform reading, in
its budget). None when a subcommand runs without `main`."""

COMMANDS = {
    "train": "train a model (default: a tiny model on the synthetic source, CPU, ~1 minute)",
    "simulate": "simulate one training step of a plan: step time, memory per stage, trace",
    "plan": "search the fastest configuration that fits the memory cap",
    "verify": "compare losses of the reference trainer, Baseline-1F1B and RATrain",
    "bench": "benchmarks (bench paper: the paper's evaluation by simulation)",
    "export": "write a checkpoint's weights as a Hugging Face model (config.json + safetensors)",
    "prepare": "tokenize text (.jsonl, .txt, .parquet) into token files for train --data",
    "generate": "continue a prompt with a checkpoint or a Hugging Face model (KV cache, CPU)",
    "eval": "the held-out loss of a checkpoint, through the pipeline (as train --eval-every)",
    "plot": "draw training curves (loss, tokens/s, peak memory) from train --metrics files",
    "calibrate": "measure this machine (kernels, communication, runtime costs): a platform file",
    "validate": "run a grid of plans for real and set each beside its prediction",
    "emulate": "run a ratrain command across an emulated network (namespaces, shaped links)",
    "link-probe": "measure an emulated network's links (under torchrun on every node)",
}

ALIASES = {"cluster": "emulate"}
"""Other names a command answers to (alias -> command): `ratrain cluster` was `emulate`'s."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (no usage dump), exit code 2.
    A flag is named in full: an abbreviation (the first letters of --global-batch) would change
    meaning, or stop working, when a flag beginning the same way is added."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    command_parser: argparse.ArgumentParser | None = None
    """The chosen subcommand's parser, which names an unknown flag of it (`_build_parser`)."""

    def error(self, message: str):  # type: ignore[override]
        if self.command_parser is not None and message.startswith("unrecognized arguments"):
            self.command_parser.error(message + _did_you_mean(self.command_parser, message))
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """The hint "; did you mean --global-batch?" for the first unknown flag of `message` that
    begins a flag of `parser` (an abbreviation) or is close to one (a typo)."""
    import difflib

    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for word in message.split(":", 1)[-1].split():
        name = word.split("=", 1)[0]
        if not name.startswith("--"):
            continue
        begun = [f for f in flags if f.startswith(name)]
        if begun:
            return f"; did you mean {' or '.join(begun[:2])}? (flags are not abbreviated)"
        close = difflib.get_close_matches(name, flags, n=2)
        if close:
            return f"; did you mean {' or '.join(close)}?"
    return ""


def _build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, object]:
    parser = _Parser(prog="ratrain", description="Resource-aware LLM training runtime (RATrain).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the chosen subcommand's module is imported, so `ratrain simulate` never loads torch.
    names = {**{c: c for c in COMMANDS}, **ALIASES}
    chosen = next((names[a] for a in argv if a in names), None)
    module = None
    for name, help_text in COMMANDS.items():
        aliases = [a for a, c in ALIASES.items() if c == name]
        said = "".join(f" (`ratrain {a}` is an alias of `ratrain {name}`)" for a in aliases)
        p = sub.add_parser(name, aliases=aliases, help=help_text, description=help_text + said)
        if name == chosen:
            module = importlib.import_module(f"ratrain.cli.{name.replace('-', '_')}")
            module.add_arguments(p)
            parser.command_parser = p
    return parser, module


def main(argv: list[str] | None = None) -> int:
    global STARTED_AT
    STARTED_AT = time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        argv = ["train"]  # the built-in default job
    # Warnings (e.g. a platform measured on another host) as one line each.
    warnings.formatwarning = lambda msg, cat, *a, **k: f"ratrain: warning: {msg}\n"
    parser, module = _build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (its one line printed: code 2) or --help (0)
        return e.code if isinstance(e.code, int) else 2
    if module is None:
        parser.print_help()
        return 2
    try:
        return int(module.run(args) or 0)
    except RatrainError as e:
        print(f"ratrain {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        # Ctrl-C, or a signal a command turned into one line and an exit code
        # (`ratrain.launch.faults.Interrupted`: 128 + the signal)
        print(f"ratrain {args.command}: {str(e) or 'interrupted'}", file=sys.stderr)
        return int(getattr(e, "exit_code", 130))
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
