"""`ratrain simulate`: one training step of a plan on a platform, by simulation.

Prints the step time, tokens/s, the pipeline bubble and each stage's peak memory against
the platform's cap; `--json` prints the same as one JSON object; `--trace` writes a
Chrome/Perfetto trace and `--plot` a PNG timeline. Never imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys

from ratrain.cli.common import (
    add_memory_cap_arg,
    add_model_arg,
    add_plan_args,
    nonempty,
    plan_from_args,
    plan_platform,
    with_memory_cap,
)
from ratrain.cli.outputs import PLOT_SUFFIXES, prepare_output_file
from ratrain.models.presets import resolve_model
from ratrain.platforms import PLATFORM_PRESETS, Platform, load

__all__ = ["add_arguments", "run"]

_MODEL, _PP, _SEQ, _MB_PER_STAGE = "llama2-7b", 8, 4096, 4
_DEFAULT_PLATFORM = "mt3000"
# What --help shows; `_set_defaults` puts the values in (they depend on model and platform).
_HELP_DEFAULTS = {
    "pp": f"min({_PP}, layers)",
    "seq": f"min({_SEQ}, the model's max)",
    "global_batch": f"{_MB_PER_STAGE} x pp x dp x micro-batch",
    "compute_dtype": "the platform's faster 16-bit one",
    "recompute": "full",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)  # default: the plan file's model, else _MODEL
    p.add_argument(
        "--platform",
        type=nonempty,
        help=f"a preset ({', '.join(PLATFORM_PRESETS)}) or a path to a platform YAML file "
        "(default: the plan file's platform, else mt3000)",
    )
    add_plan_args(p, defaults=_HELP_DEFAULTS)  # with --rank-layout, the plan's field
    add_memory_cap_arg(p)
    p.add_argument("--check", action="store_true", help="validate the schedule before simulating")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace")
    p.add_argument("--plot", metavar="OUT.png", help="write a PNG timeline with memory over time")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _fast_half(platform: Platform) -> str:
    return max(("bf16", "fp16"), key=lambda dt: (platform.peak_flops[dt], dt == "bf16"))


def _set_defaults(args: argparse.Namespace, platform: Platform) -> None:
    """Defaults that depend on the model and the platform (a plan file sets its own)."""
    if getattr(args, "plan", None):
        return
    spec = resolve_model(args.model or _MODEL)
    pp = args.pp or (len(args.layer_split) if args.layer_split else min(_PP, spec.n_layers))
    mb = args.micro_batch or 1
    args._plan_defaults = {
        **args._plan_defaults,
        "recompute": "full",
        "pp": pp,
        "seq": min(_SEQ, spec.max_seq),
        "global_batch": _MB_PER_STAGE * pp * (args.dp or 1) * mb,
        "compute_dtype": _fast_half(platform),
    }


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _table(r, platform: Platform) -> str:
    p = r.plan
    rec = ",".join(sorted(set(p["recompute"])))
    lines = [
        f"{r.model} on {platform.name}, schedule {r.schedule}: pp={p['pp']} dp={p['dp']} "
        f"micro-batch={p['micro_batch']} global-batch={p['global_batch']} seq={p['seq']} "
        f"{p['compute_dtype']} recompute={rec}",
        f"step time   {r.step_time_s:.4g} s",
        f"tokens/s    {r.tokens_per_s:,.1f} ({r.tokens_per_s / (p['pp'] * p['dp']):,.1f} per unit)",
        f"bubble      {r.bubble_fraction:.1%}",
        "",
        f"stage  peak memory  {_USABLE_LABEL if r.headroom_bytes else _USABLE_LABEL_NO_HEADROOM}"
        "  compute  tail after last B: update / sync / global checks / other",
    ]
    cap = r.memory_cap_bytes - r.workspace_bytes - r.headroom_bytes
    for s in range(r.pp):
        e = r.exposed[s]
        over = "  OVER" if s in r.over_cap() else ""
        lines.append(
            f"{s:>5}  {_gb(r.peak_memory_bytes[s]):>11}  "
            f"{_gb(cap):>{len(_USABLE_LABEL if r.headroom_bytes else _USABLE_LABEL_NO_HEADROOM)}}  "
            f"{r.utilization[s]['compute']:>7.1%}  {e['tail_s']:.3g} s: {e['update_s']:.3g} / "
            f"{e['sync_s']:.3g} / {e['global_s']:.3g} / {e['other_s']:.3g} s{over}"
        )
    return "\n".join(lines)


_USABLE_LABEL = "usable (cap - workspace - headroom)"
_USABLE_LABEL_NO_HEADROOM = "usable (cap - workspace)"


def run(args: argparse.Namespace) -> int:
    from ratrain.sim import plot, simulate, write_trace

    prepare_output_file(args.trace, "--trace")
    prepare_output_file(args.plot, "--plot", PLOT_SUFFIXES)
    platform = with_memory_cap(load(plan_platform(args, default=_DEFAULT_PLATFORM)), args)
    _set_defaults(args, platform)
    spec, plan = plan_from_args(args, default_model=_MODEL)
    r = simulate(spec, plan, platform, check=args.check)
    if args.trace:
        write_trace(r, args.trace)
    if args.plot:
        plot(r, args.plot)
    if args.json:
        print(json.dumps(r.to_json()))
    else:
        print(_table(r, platform))
        for path, what in ((args.trace, "trace"), (args.plot, "plot")):
            if path:
                print(f"{what} written to {path}")
    for s in r.over_cap():
        print(
            f"warning: stage {s} peaks at {_gb(r.peak_memory_bytes[s])}, over the "
            f"{_gb(r.memory_cap_bytes - r.workspace_bytes - r.headroom_bytes)} "
            f"{platform.name} leaves after its workspace and headroom; use more stages, "
            "recompute, or --shard-optimizer",
            file=sys.stderr,
        )
    return 0
