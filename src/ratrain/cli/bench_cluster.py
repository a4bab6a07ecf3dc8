"""`ratrain bench cluster`: ratrain, its planned families and its peers, measured on an
emulated bandwidth-constrained network (`ratrain emulate`'s) under memory caps
(`ratrain.bench.cluster`). The benchmark keeps its name "cluster", its output folder and
its JSON keys.

    ratrain bench cluster --quick --json out/bench-cluster/result.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ratrain.bench.cluster import MEASURE
from ratrain.cli.common import local_processes, name_list, nonempty, nonneg_int, positive_int
from ratrain.errors import RatrainError
from ratrain.validate.trial import DEFAULT_MARGIN, DEFAULT_ROUNDS

__all__ = ["add_cluster_arguments", "run_cluster"]


def _float_list(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
        raise argparse.ArgumentTypeError(f"expected finite positive numbers, got {text!r}")
    return vals


def _layout(text: str) -> tuple[int, int]:
    try:
        pp, dp = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PPxDP such as 2x2, got {text!r}") from None
    if pp < 1 or dp < 1:
        raise argparse.ArgumentTypeError(f"expected PPxDP of positive numbers, got {text!r}")
    return pp, dp


def _layouts(text: str) -> tuple[tuple[int, int], ...]:
    layouts = tuple(_layout(x) for x in text.split(",") if x.strip())
    if not layouts:
        raise argparse.ArgumentTypeError(f"expected PPxDP such as 2x2,4x1, got {text!r}")
    return layouts


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("bench cluster (see docs/paper_eval.md)")
    g.add_argument(
        "--model", type=nonempty, default="bench-256", help="cluster: the model (default bench-256)"
    )
    g.add_argument(
        "--caps",
        type=_float_list,
        help="cluster: memory caps per rank in GiB of live tensors, comma-separated "
        "(default 0.25,0.12,0.08)",
    )
    g.add_argument(
        "--link-mbit",
        type=_float_list,
        help="cluster: link rates in Mbit/s, comma-separated (default 100,400; with "
        "--predict 10,25,50,100,200,1000)",
    )
    g.add_argument("--nodes", type=positive_int, default=2, help="cluster: nodes (default 2)")
    g.add_argument(
        "--ranks-per-node",
        type=local_processes,
        default=2,
        help="cluster: ranks per node (default 2)",
    )
    g.add_argument("--seq", type=positive_int, default=128, help="cluster: tokens per sequence")
    g.add_argument(
        "--global-batch", type=positive_int, default=16, help="cluster: sequences per step"
    )
    g.add_argument(
        "--peer-layouts",
        type=_layouts,
        default=((2, 2), (4, 1)),
        help="cluster: the peers' pp x dp, comma-separated, each one of their knobs "
        "(default 2x2,4x1)",
    )
    g.add_argument("--steps", type=positive_int, help="cluster: steps per run (default 6)")
    g.add_argument("--warmup", type=nonneg_int, default=2, help="cluster: untimed first steps")
    g.add_argument("--repeats", type=positive_int, help="cluster: interleaved repeats (default 2)")
    g.add_argument(
        "--quick",
        action="store_true",
        help="cluster: fewer torch pipelines (1F1B, Interleaved1F1B, ZBV), 1 repeat, 5 steps",
    )
    g.add_argument(
        "--systems",
        type=name_list,
        help="cluster: only these (ratrain, gpu-style, zero1-pp, fsdp-pp, torch-pp, "
        "deepspeed, or a peer configuration such as torch-1f1b)",
    )
    g.add_argument(
        "--base-platform",
        default=MEASURE,
        help="cluster: the platform of this machine that the emulated network's is made "
        "from: a "
        "preset or file, or 'measure' (default): calibrate this machine first "
        "(ratrain calibrate --quick, fp32, about 2 minutes)",
    )
    g.add_argument(
        "--predict",
        action="store_true",
        help="cluster: no runs, no root: the simulator's answer; the best plan of every "
        "family per --model (comma-separated here), --link-mbit and --caps, on this "
        "machine's platform with links assumed (each rank pair across a link gets its share "
        "of it), ratrain's predicted speedup and where each step goes",
    )
    g.add_argument(
        "--trial",
        type=nonneg_int,
        default=3,
        metavar="K",
        help="cluster: ratrain's entry is measured before it is chosen: the best plans of "
        "its K best structures, and each other family's best structure and best plan under "
        "ratrain's lifecycle, run --warmup + --trial-steps steps on the emulated network and the "
        "fastest measured is kept; the prediction-only pick is timed beside it and its "
        "regret reported (default 3; 0: the prediction-only pick)",
    )
    g.add_argument(
        "--trial-steps",
        type=positive_int,
        default=3,
        metavar="N",
        help="cluster: timed steps per trial run (default 3)",
    )
    g.add_argument(
        "--trial-rounds",
        type=positive_int,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help="cluster: runs per trial plan at most: after the first round, the plans within "
        f"{DEFAULT_MARGIN:.0%}% of the fastest run again, interleaved, and the median of a "
        f"plan's runs is its measure (default {DEFAULT_ROUNDS}; 1: one run each)",
    )
    g.add_argument("--json", metavar="OUT", help="cluster: also write all results to OUT")
    g.add_argument(
        "--from-json",
        metavar="FILE",
        help="cluster: no runs; write the report (Markdown, plot) of a --json file again",
    )


def run_cluster(args: argparse.Namespace) -> int:
    from ratrain.bench.cluster import Setup, run_bench
    from ratrain.cli.outputs import check_output_dir, prepare_output_dir, prepare_output_file
    from ratrain.models.presets import resolve_model
    from ratrain.platforms import load

    out = Path(args.out or "out/bench-cluster")
    check_output_dir(str(out), "--out")  # created once the flags are checked
    prepare_output_file(args.json, "--json")  # before minutes of runs, not after them
    if args.from_json:
        results = _read_results(args.from_json)
        prepare_output_dir(str(out), "--out")
        return _report(results, out)
    if args.predict:
        return _predict(args, out)
    resolve_model(args.model)
    if args.base_platform != MEASURE:
        load(args.base_platform)
    world = args.nodes * args.ranks_per_node
    for pp, dp in args.peer_layouts:
        if pp * dp != world:
            raise RatrainError(
                f"--peer-layouts {pp}x{dp} must use the emulated network's {world} ranks "
                "(--nodes x --ranks-per-node)"
            )
        if args.global_batch % dp != 0:
            raise RatrainError(
                f"--global-batch {args.global_batch} must divide among {dp} replicas "
                f"(--peer-layouts {pp}x{dp})"
            )
    setup = Setup(
        model=args.model,
        seq=args.seq,
        global_batch=args.global_batch,
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
        link_mbits=args.link_mbit or Setup.link_mbits,
        caps_gib=args.caps or Setup.caps_gib,
        peer_layouts=args.peer_layouts,
        steps=args.steps or (5 if args.quick else 6),
        warmup=args.warmup,
        repeats=args.repeats or (1 if args.quick else 2),
        quick=args.quick,
        base_platform=args.base_platform,
        out=out,
        systems=args.systems,
        progress=not args.quiet,
        trial=args.trial,
        trial_steps=args.trial_steps,
        trial_rounds=args.trial_rounds,
    )
    if setup.warmup >= setup.steps:
        raise RatrainError(f"--warmup {setup.warmup} leaves no timed step of {setup.steps}")
    prepare_output_dir(str(out), "--out")
    results = run_bench(setup)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return _report(results, out)


def _predict(args: argparse.Namespace, out: Path) -> int:
    import sys
    import time

    from ratrain.bench.cluster import FAMILIES, Setup, calibrate_base
    from ratrain.bench.platform import base_platform_dict
    from ratrain.bench.whatif import markdown, whatif_grid
    from ratrain.cli.outputs import prepare_output_dir
    from ratrain.models.presets import resolve_model
    from ratrain.platforms import load

    models = tuple(m.strip() for m in args.model.split(",") if m.strip())
    for m in models:
        resolve_model(m)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if not args.quiet:
            dt = time.perf_counter() - t0
            print(f"ratrain bench cluster --predict: {msg} ({dt:.0f} s)", file=sys.stderr)

    families = tuple(f for f in FAMILIES if args.systems is None or f in args.systems)
    if "ratrain" not in families:  # before minutes of calibration
        raise RatrainError("--predict needs ratrain among --systems (its speedup is the answer)")
    base = args.base_platform
    if base != MEASURE:
        load(base)
    prepare_output_dir(str(out), "--out")
    if base == MEASURE:
        setup = Setup(nodes=args.nodes, ranks_per_node=args.ranks_per_node, progress=not args.quiet)
        base = str(calibrate_base(setup, out))
    rows = whatif_grid(
        base_platform_dict(base),
        models,
        args.link_mbit or (10.0, 25.0, 50.0, 100.0, 200.0, 1000.0),
        args.caps or Setup.caps_gib,
        args.nodes,
        args.ranks_per_node,
        args.seq,
        args.global_batch,
        families,
        say=say,
    )
    md = (
        f"Predicted on {base} with links assumed ({args.nodes} nodes x {args.ranks_per_node} "
        f"ranks, seq {args.seq}, global batch {args.global_batch}, fp32):\n\n"
        + markdown(rows, families)
    )
    (out / "whatif.md").write_text(md)
    if args.json:
        Path(args.json).write_text(json.dumps({"base_platform": base, "rows": rows}, indent=2))
    print(md)
    print(f"written: {out / 'whatif.md'}")
    return 0


def _read_results(path: str) -> list[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise RatrainError(f"--from-json {path}: cannot read it ({e})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) and "caps" in r for r in data):
        raise RatrainError(f"--from-json {path}: not a list of results written by --json")
    return data


def _report(results: list[dict], out: Path) -> int:
    from ratrain.bench.report import markdown, plot

    md = markdown(results)
    lines = picks_lines(results)
    if lines:
        md = md.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"
    (out / "cluster.md").write_text(md)
    plotted = plot(results, out / "cluster.png")
    print(md)
    written = [str(out / "cluster.md")] + ([str(out / "cluster.png")] if plotted else [])
    print(f"written: {', '.join(written)}")
    return 0


def picks_lines(results: list[dict]) -> list[str]:
    """ratrain's two picks per link rate and cap (`ratrain.bench.cluster.picks`): the
    prediction-only pick, the trial's, their tokens/s and the regret, as a Markdown table
    (none without a trial)."""
    rows = []
    for res in results:
        rate = res["link_bits_per_s"] / 1e6
        for cap in res["caps"]:
            p = cap.get("picks")
            if not p:
                continue
            pred, trial = p["prediction"], p["trial"]
            same = pred["plan"] == trial["plan"]
            rows.append(
                f"| {rate:g} | {cap['cap_bytes'] / 2**20:.0f} | `{pred['plan']}` "
                f"| {_n(pred['predicted_tokens_per_s'])} | {_n(pred['tokens_per_s'])} "
                f"| {'same' if same else '`' + trial['plan'] + '`'} "
                f"| {_n(trial['predicted_tokens_per_s'])} | {_n(trial['tokens_per_s'])} "
                f"| {_pct(p['regret'])} | {len(p['trial_plans'])} in {p['trial_wall_s']:.0f} s |"
            )
    if not rows:
        return []
    return [
        "### ratrain's pick: prediction only, and measured (the trial)",
        "",
        "The prediction-only pick is the search's first plan; the trial's is the fastest "
        "measured of the plans tried. tokens/s: median of the repeats. Regret: how much "
        "slower the prediction-only pick measured than the trial's (by the repeats where "
        "both were timed, else by the trial's steps).",
        "",
        "| Mbit/s | cap MiB | prediction-only pick | predicted | measured | trial pick "
        "| predicted | measured | regret | plans tried |",
        "| ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | --- |",
        *rows,
    ]


def _n(x) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"
