"""`ratrain bench paper`: the paper's evaluation, by planning and simulation.

On a platform (default mt3000): for LLaMA-2-7B, Baichuan2-13B, Qwen2.5-32B and
LLaMA-2-70B at 1024 clusters, the best RATrain plan against the best GPU-style
(Megatron-like), ZeRO-1 + PP (DeepSpeed-like) and FSDP + PP (torchtitan-like) plans under
the same memory cap; RATrain re-planned with each lifecycle mechanism off (the ablation);
and the LLaMA-2-7B scaling curve from 8 to 1024 clusters. Writes a Markdown table, a JSON file and
a PNG to --out, and prints the paper's figures beside ours. Never imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ratrain.cli.common import name_list, nonempty, positive_int_list
from ratrain.platforms import PLATFORM_PRESETS

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "what",
        choices=("paper", "cluster"),
        help="paper: the paper's evaluation by simulation; cluster: ratrain and its peers "
        "measured on an emulated bandwidth-constrained network (ratrain emulate's) under "
        "memory caps (root)",
    )
    p.add_argument(
        "--out",
        type=nonempty,
        help="output folder (default out/bench-paper, out/bench-cluster)",
    )
    p.add_argument(
        "--platform",
        type=nonempty,
        default="mt3000",
        help=f"a preset ({', '.join(PLATFORM_PRESETS)}) or a platform YAML file (default mt3000)",
    )
    p.add_argument(
        "--models", type=name_list, help="comma-separated models (default: the paper's four)"
    )
    p.add_argument(
        "--clusters",
        type=positive_int_list,
        default=(8, 16, 32, 64, 128, 256, 512, 1024),
        help="cluster counts of the LLaMA-2-7B scaling curve (comma-separated)",
    )
    p.add_argument(
        "--weak",
        action="store_true",
        help="weak scaling (one sequence per cluster per step) instead of a fixed 4M-token batch",
    )
    p.add_argument(
        "--no-ablation",
        action="store_true",
        help="skip the ablation of RATrain's lifecycle mechanisms (faster)",
    )
    p.add_argument(
        "--zb-only",
        action="store_true",
        help="only what the zero-bubble pass orders (zb-h1, zb-h2) add to RATrain per model "
        "(no baselines, ablation "
        "or scaling curve; writes the Markdown and JSON files)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    from ratrain.cli.bench_cluster import add_cluster_arguments

    add_cluster_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.what == "cluster":
        from ratrain.cli.bench_cluster import run_cluster

        return run_cluster(args)
    args.out = args.out or "out/bench-paper"
    from ratrain.cli.bench_ablation import ablation_json, zb_json
    from ratrain.planner.paper import (
        PAPER_MODELS,
        ablate,
        compare_models,
        scaling_curve,
        zero_bubble,
    )
    from ratrain.platforms import load

    out = Path(args.out)
    files = [out / f"paper_eval.{ext}" for ext in ("md", "json", "png")]
    _check_args(args, files)
    platform = load(args.platform)
    models = args.models or PAPER_MODELS
    clusters = args.clusters
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(
                f"ratrain bench: {msg} ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    if args.zb_only:
        return _zb_only(platform, models, files, progress, t0)
    rows = compare_models(platform, models, progress=progress)
    ablations = [] if args.no_ablation else ablate(platform, rows, progress=progress)
    zbs = zero_bubble(platform, rows, ablations, progress=progress)
    points = scaling_curve(platform, clusters=clusters, weak=args.weak, progress=progress)
    elapsed = time.perf_counter() - t0
    md = _markdown(rows, points, platform.name, args.weak, elapsed, ablations, zbs)
    files[0].write_text(md)
    data = _json(rows, points, platform.name)
    data["ablation"] = ablation_json(ablations)
    data["zero_bubble"] = zb_json(zbs)
    files[1].write_text(json.dumps(data, indent=2))
    _plot(rows, points, files[2], platform.name)
    print(md)
    print(f"written: {', '.join(map(str, files))}")
    return 0


def _zb_only(platform, models, files: list[Path], progress, t0: float) -> int:
    """`--zb-only`: RATrain with the pipeline searched, with 1F1B only, and with each
    zero-bubble pipeline pinned, per model."""
    from ratrain.cli.bench_ablation import zb_json, zb_markdown
    from ratrain.planner.paper import compare_models, zero_bubble

    rows = compare_models(platform, models, progress=progress, baselines=())
    zbs = zero_bubble(platform, rows, progress=progress)
    md = "\n".join(zb_markdown(zbs, platform.name)[1:])
    md += f"\n\nTook {time.perf_counter() - t0:.0f} s.\n"
    files[0].write_text(md)
    files[1].write_text(
        json.dumps({"platform": platform.name, "zero_bubble": zb_json(zbs)}, indent=2)
    )
    print(md)
    print(f"written: {files[0]}, {files[1]}")
    return 0


def _check_args(args: argparse.Namespace, files: list[Path]) -> None:
    """--out, --models and --clusters, in one line each before the minutes of planning."""
    from ratrain.cli.outputs import prepare_output_dir, prepare_output_file
    from ratrain.config import MAX_RANKS
    from ratrain.errors import RatrainError
    from ratrain.models.presets import resolve_model

    prepare_output_dir(args.out, "--out")
    for f in files:
        prepare_output_file(str(f), "--out")
    for name in args.models or ():
        resolve_model(name)
    too_many = [n for n in args.clusters if n > MAX_RANKS]
    if too_many:
        raise RatrainError(
            f"--clusters {too_many[0]:,}: more than the {MAX_RANKS:,} compute units ratrain "
            "plans for"
        )


def _fmt(x, spec: str = ",.0f") -> str:
    return "—" if x is None else format(x, spec)


def _plan(c) -> str:
    from ratrain.planner.report import describe

    return "none fits" if c is None else describe(c.plan)


def _markdown(
    rows, points, platform: str, weak: bool, elapsed_s: float, ablations=(), zbs=()
) -> str:
    from ratrain.cli.bench_ablation import ablation_markdown, zb_markdown
    from ratrain.planner.paper import PAPER

    lines = [
        f"## Best plans on {platform} at 1024 clusters (global batch 1024 x 4096 tokens)",
        "",
        "| model | RATrain tokens/s | GPU-style tokens/s | ZeRO-1 + PP tokens/s "
        "| FSDP + PP tokens/s | vs GPU-style | vs ZeRO-1 + PP | vs FSDP + PP "
        "| speedup vs best baseline |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        g, z, f = (r.baselines.get(k) for k in ("gpu-style", "zero1-pp", "fsdp-pp"))
        lines.append(
            f"| {r.model} | {_fmt(r.ratrain and r.ratrain.tokens_per_s)} | {_fmt(g and g.tokens_per_s)} "
            f"| {_fmt(z and z.tokens_per_s)} | {_fmt(f and f.tokens_per_s)} "
            f"| {_fmt(r.speedup('gpu-style'), '.3f')}x "
            f"| {_fmt(r.speedup('zero1-pp'), '.3f')}x | {_fmt(r.speedup('fsdp-pp'), '.3f')}x "
            f"| {_fmt(r.speedup(), '.3f')}x |"
        )
    best = max((r.speedup() or 0.0) for r in rows) if rows else 0.0
    lines += [
        "",
        f"Paper: up to {PAPER['max_speedup']:.2f}x over MT-3000-adapted GPU-style strategies. "
        f"Ours: up to {best:.3f}x over the best of the three baseline families.",
        "",
        "Plans:",
        "",
    ]
    for r in rows:
        lines.append(f"- {r.model}: RATrain `{_plan(r.ratrain)}`")
        for fam, c in r.baselines.items():
            lines.append(f"  - {fam}: `{_plan(c)}`")
    lines += ablation_markdown(ablations, platform)
    lines += zb_markdown(zbs, platform)
    kind = (
        "weak scaling, one 4096-token sequence per cluster per step"
        if weak
        else ("strong scaling, global batch fixed at 1024 x 4096 tokens")
    )
    lines += [
        "",
        f"## LLaMA-2-7B scaling on {platform} ({kind})",
        "",
        "| clusters | global batch | tokens/s | tokens/s per cluster | scaling efficiency | plan |",
        "| ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for p in points:
        tps = p.best.tokens_per_s if p.best else None
        lines.append(
            f"| {p.clusters} | {p.global_batch} | {_fmt(tps, ',.2f')} | {_fmt(tps and tps / p.clusters, ',.1f')} "
            f"| {_fmt(p.efficiency, '.1%')} | `{_plan(p.best)}` |"
        )
    last = points[-1] if points else None
    if last is not None and last.clusters == 1024:
        lines += [
            "",
            f"Paper at 1024 clusters: {PAPER['llama2_7b_1024_tokens_per_s']:,.2f} tokens/s, "
            f"{PAPER['llama2_7b_1024_scaling_efficiency']:.1%} scaling efficiency. "
            f"Ours: {_fmt(last.best and last.best.tokens_per_s, ',.2f')} tokens/s, "
            f"{_fmt(last.efficiency, '.1%')}.",
        ]
    lines += [
        "",
        f"Scaling efficiency = (tokens/s at N / N) / (tokens/s at {points[0].clusters if points else 8} "
        f"/ {points[0].clusters if points else 8}). Predictions of ratrain's simulator from sourced "
        f"or assumed platform constants, not fitted to the paper. Took {elapsed_s:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def _cand(c):
    return (
        None
        if c is None
        else {
            "tokens_per_s": c.tokens_per_s,
            "step_time_s": c.step_time_s,
            "peak_memory_bytes": list(c.peak_memory_bytes),
            "plan": c.plan.to_dict(),
        }
    )


def _json(rows, points, platform: str) -> dict:
    from ratrain.planner.paper import PAPER

    return {
        "platform": platform,
        "paper": PAPER,
        "models": [
            {
                "model": r.model,
                "ratrain": _cand(r.ratrain),
                "baselines": {k: _cand(v) for k, v in r.baselines.items()},
                "speedup": {
                    "gpu-style": r.speedup("gpu-style"),
                    "zero1-pp": r.speedup("zero1-pp"),
                    "fsdp-pp": r.speedup("fsdp-pp"),
                    "best_baseline": r.speedup(),
                },
            }
            for r in rows
        ],
        "scaling": [
            {
                "clusters": p.clusters,
                "global_batch": p.global_batch,
                "efficiency": p.efficiency,
                "best": _cand(p.best),
            }
            for p in points
        ],
    }


def _plot(rows, points, path: Path, platform: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ratrain.planner.paper import PAPER

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r.model for r in rows]
    for i, fam in enumerate(("gpu-style", "zero1-pp", "fsdp-pp")):
        vals = [r.speedup(fam) or 0.0 for r in rows]
        a.bar([x + 0.27 * i for x in range(len(rows))], vals, width=0.27, label=f"vs {fam}")
    a.axhline(PAPER["max_speedup"], color="gray", linestyle=":", label="paper: up to 1.35x")
    a.axhline(1.0, color="black", linewidth=0.5)
    a.set_xticks([x + 0.27 for x in range(len(rows))], names, fontsize=8)
    a.set_ylabel("RATrain speedup (predicted)")
    a.set_title(f"best plans, 1024 clusters, {platform}", fontsize=9)
    a.legend(fontsize=7)
    ok = [p for p in points if p.best is not None]
    b.plot(
        [p.clusters for p in ok], [p.best.tokens_per_s for p in ok], "o-", label="ours (predicted)"
    )
    if ok:
        first = ok[0]
        b.plot(
            [p.clusters for p in ok],
            [first.best.tokens_per_s * p.clusters / first.clusters for p in ok],
            ":",
            color="gray",
            label="linear from the first point",
        )
    b.plot(
        [1024], [PAPER["llama2_7b_1024_tokens_per_s"]], "r*", markersize=10, label="paper at 1024"
    )
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("clusters")
    b.set_ylabel("tokens/s")
    b.set_title("LLaMA-2-7B scaling", fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
