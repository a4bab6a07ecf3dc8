"""`ratrain verify`: the reference trainer, Baseline-1F1B and RATrain on the same seed and
data, and the maximum relative loss deviation between each pair. RATrain runs the plan's
pipeline (`--pipeline zb-h1`: zero bubble); Baseline-1F1B is always 1F1B.

Default: the tiny model, pp=2 x dp=2 on 4 local gloo ranks (CPU), fp32. The two
distributed schedules run in one job on the same ranks, each from the initial weights; the
reference trainer runs in this process. The check passes (exit 0) when RATrain stays
within `--tolerance` of Baseline-1F1B (default 0.081%, the paper's figure over 1.028B
tokens); otherwise exit 1.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

from ratrain.cli.common import (
    add_model_arg,
    add_plan_args,
    memory_cap,
    nonempty,
    nonneg_float,
    plan_from_args,
    positive_float,
    positive_int,
    seed,
    timeout_s,
)
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError

__all__ = ["add_arguments", "run", "max_rel_dev"]

PLAN_DEFAULTS = {
    "pp": 2,
    "dp": 2,
    "micro_batch": 1,
    "global_batch": 8,
    "seq": 32,
    "compute_dtype": "fp32",
}
DEFAULT_TOKENS = 50 * 8 * 32  # 50 steps of the default plan
PAPER_TOLERANCE = 8.1e-4  # RATrain paper: max relative loss deviation 0.081% vs Baseline-1F1B
_PAIRS = {
    "ratrain_vs_baseline": ("ratrain", "baseline"),
    "ratrain_vs_reference": ("ratrain", "reference"),
    "baseline_vs_reference": ("baseline", "reference"),
}
_LABELS = {"reference": "reference trainer", "baseline": "Baseline-1F1B", "ratrain": "RATrain"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)  # default: the plan file's model, else tiny
    add_plan_args(p, defaults=PLAN_DEFAULTS)
    g = p.add_argument_group("verification")
    g.add_argument(
        "--tokens",
        type=positive_int,
        default=DEFAULT_TOKENS,
        help=f"train at least this many tokens (default {DEFAULT_TOKENS:,}: 50 steps)",
    )
    g.add_argument("--steps", type=positive_int, help="train this many steps (overrides --tokens)")
    g.add_argument(
        "--lr", type=positive_float, default=3e-3, help="peak learning rate (default 3e-3)"
    )
    g.add_argument("--seed", type=seed, default=0, help="seed of the weights and data (default 0)")
    g.add_argument(
        "--data", type=nonempty, default="synthetic", help="synthetic (default) or a data file"
    )
    g.add_argument(
        "--tolerance",
        type=nonneg_float,
        default=PAPER_TOLERANCE,
        help="largest RATrain vs Baseline-1F1B deviation that passes (default 8.1e-4)",
    )
    g.add_argument("--no-reference", action="store_true", help="skip the reference trainer")
    g.add_argument(
        "--memory-cap", type=positive_float, metavar="GIB", help="refuse plans over this"
    )
    g.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    g.add_argument(
        "--timeout",
        type=timeout_s,
        default=120.0,
        help="rendezvous/collective timeout, s (120)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--quiet", action="store_true", help="no progress bar (stderr)")


def max_rel_dev(a: list[float], b: list[float]) -> float:
    """max_k |a_k - b_k| / |b_k| over the steps both have."""
    if len(a) != len(b) or not a:
        raise ValueError(f"loss curves of different lengths {len(a)} and {len(b)}")
    return max(abs(x - y) / abs(y) if y else abs(x - y) for x, y in zip(a, b, strict=True))


def _config(args: argparse.Namespace, plan: Plan) -> TrainConfig:
    steps = args.steps or math.ceil(args.tokens / plan.tokens_per_step)
    if not args.lr > 0:
        raise RatrainError(f"--lr must be positive, got {args.lr}")
    return TrainConfig(
        steps=steps,
        lr=args.lr,
        min_lr=args.lr / 10,
        warmup_steps=min(10, steps // 10),
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    from ratrain.data import make_source
    from ratrain.train.failures import run_job_one_line
    from ratrain.train.job import FaultHooks, Job, Launch, MemoryCap, Outputs
    from ratrain.train.reference import ReferenceTrainer

    spec, plan = plan_from_args(args, default_model="tiny")
    cfg = _config(args, plan)
    source = functools.partial(make_source, args.data, spec, plan.seq, cfg.seed)
    source()  # a data error is one line here, not one per rank
    cap, cap_label = memory_cap(args)  # --memory-cap, else the plan file's
    job = Job(
        spec,
        plan,
        cfg,
        source,
        # Baseline-1F1B is 1F1B whatever the plan's pipeline; RATrain runs the plan's
        variants=(
            ("baseline", {"schedule": "baseline", "pipeline": "1f1b"}),
            ("ratrain", {"schedule": "ratrain"}),
        ),
        launch=Launch(device=args.device, timeout_s=args.timeout),
        outputs=Outputs(progress=not args.quiet),
        memory_cap=MemoryCap(int(cap * 2**30), cap_label) if cap else None,
        hooks=FaultHooks(fault=os.environ.get("RATRAIN_FAULT")),
    )
    losses: dict[str, list[float]] = {}
    skipped: dict[str, int] = {}
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    results = run_job_one_line(job)
    times["distributed"] = time.perf_counter() - t0
    for r in results:
        for kind, run_ in r.runs.items():
            if run_.losses:
                losses[kind] = run_.losses
                skipped[kind] = sum(bool(rec.get("skipped")) for rec in run_.records)
    if set(losses) != {"baseline", "ratrain"}:
        return 0  # a rank of a torchrun job that is not the metrics rank: nothing to report
    if not args.no_reference:
        t0 = time.perf_counter()
        losses["reference"] = ReferenceTrainer(spec, plan, cfg, source()).train()
        times["reference"] = time.perf_counter() - t0
    devs = {k: max_rel_dev(losses[a], losses[b]) for k, (a, b) in _PAIRS.items() if b in losses}
    report = {
        "max_rel_dev": devs,
        "tokens": cfg.steps * plan.tokens_per_step,
        "steps": cfg.steps,
        "bit_identical": losses["ratrain"] == losses["baseline"],
        "final_loss": {k: v[-1] for k, v in losses.items()},
        "skipped_steps": skipped,
        "plan": plan.to_dict(),
        "model": spec.name,
        "time_s": times,
        "tolerance": args.tolerance,
    }
    ok = devs["ratrain_vs_baseline"] <= args.tolerance
    if args.json:
        print(json.dumps(report))
    else:
        print(_text(report, ok))
    return 0 if ok else 1


def _text(r: dict, ok: bool) -> str:
    p = r["plan"]
    lines = [
        f"verify {r['model']}: pp={p['pp']} dp={p['dp']} micro-batch {p['micro_batch']} "
        f"global-batch {p['global_batch']} seq {p['seq']} {p['compute_dtype']}"
        f"{', pipeline ' + p['pipeline'] if p['pipeline'] != '1f1b' else ''}, "
        f"{r['steps']} steps ({r['tokens']:,} tokens)",
    ]
    for k, v in r["final_loss"].items():
        lines.append(f"  {_LABELS[k]:<18} final loss {v:.6f}")
    lines.append("max relative loss deviation")
    for k, v in r["max_rel_dev"].items():
        a, b = _PAIRS[k]
        same = "  (bit-identical)" if k == "ratrain_vs_baseline" and r["bit_identical"] else ""
        lines.append(f"  {_LABELS[a] + ' vs ' + _LABELS[b]:<36} {v:.3e}{same}")
    verdict = "OK" if ok else "FAIL"
    lines.append(
        f"{verdict}: RATrain vs Baseline-1F1B {r['max_rel_dev']['ratrain_vs_baseline']:.3e} "
        f"{'<=' if ok else '>'} {r['tolerance']:.3e}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    from ratrain.cli import main

    sys.exit(main(["verify", *sys.argv[1:]]))
