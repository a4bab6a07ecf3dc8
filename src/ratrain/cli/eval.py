"""`ratrain eval CKPT --data SOURCE`: the held-out loss of a checkpoint, computed through the
pipeline as `ratrain train --eval-every` computes it (a forward-only schedule on pp x dp
ranks, `ratrain.runtime.executor.StageExecutor.evaluate`), so the two agree on the same
data: a directory `ratrain prepare` wrote gives its val split, any other source (synthetic,
a text or token file) itself. The plan is the checkpoint's, or --plan's, with --pp/--dp
over it; the batch shape (global batch, seq) stays the checkpoint's."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from ratrain.cli.common import nonempty, positive_int, seed, timeout_s
from ratrain.errors import RatrainError

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        type=nonempty,
        metavar="CKPT",
        help="a step-* checkpoint or a --save directory",
    )
    p.add_argument(
        "--data",
        type=nonempty,
        required=True,
        help="the held-out data: a directory `ratrain prepare` wrote (its val split), "
        "synthetic, a .txt/.jsonl file or a token file (.bin/.u16/.u32)",
    )
    p.add_argument(
        "--eval-tokens",
        type=positive_int,
        metavar="T",
        help="ceil(T / seq) sequences, rounded up to whole microbatches of every replica "
        "(default 32 sequences), as `train --eval-tokens`",
    )
    p.add_argument("--plan", type=nonempty, help="a plan file: its pp, dp, split, schedule...")
    p.add_argument("--pp", type=positive_int, help="pipeline stages (default the checkpoint's)")
    p.add_argument(
        "--dp", type=positive_int, help="data-parallel replicas (default the checkpoint's)"
    )
    p.add_argument(
        "--tokenizer",
        type=nonempty,
        help="for text data: a tokenizer.json or its folder (default: the checkpoint's copy)",
    )
    p.add_argument("--data-dtype", choices=("uint16", "uint32"), help="token dtype of a token file")
    p.add_argument(
        "--seed", type=seed, help="seed of the data's windows (default the checkpoint's)"
    )
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument("--timeout", type=timeout_s, help="collective timeout in s (default 300)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _checkpoint(text: str) -> tuple[Path, dict]:
    from ratrain.checkpoint import read_meta, resolve_resume

    try:
        ckpt = resolve_resume(text, None)
    except RatrainError as e:  # worded for train's --resume: name CKPT instead
        raise RatrainError(str(e).replace("--resume ", "CKPT ", 1)) from None
    return ckpt, read_meta(ckpt)


def _plan(args: argparse.Namespace, meta: dict, spec):
    """The checkpoint's plan (or --plan's) with --pp/--dp over it and the checkpoint's batch
    shape (loading a checkpoint needs it)."""
    from ratrain.config import Plan, load_plan

    saved = meta["plan"]
    plan = load_plan(args.plan)[0] if args.plan else Plan.from_dict(saved)
    over = {"global_batch": saved["global_batch"], "seq": saved["seq"]}
    if args.pp is not None:
        rc = plan.recompute  # per stage: of another pp (an evaluation recomputes nothing)
        rc = rc if isinstance(rc, str) else (rc[0] if len(set(rc)) == 1 else "none")
        over.update(pp=args.pp, layer_split=None, recompute=rc)
    if args.dp is not None:
        over["dp"] = args.dp
    plan = plan.replace(**over)
    plan.check_for(spec)
    return plan


def _tokenizer(args: argparse.Namespace, ckpt: Path) -> str | None:
    """--tokenizer, else for a text file the checkpoint's copy of its tokenizer (if any)."""
    from ratrain.data import TEXT_SUFFIXES

    if args.tokenizer is not None:
        return args.tokenizer
    text = Path(args.data).suffix.lower() in TEXT_SUFFIXES
    return str(ckpt / "tokenizer.json") if text and (ckpt / "tokenizer.json").is_file() else None


def run(args: argparse.Namespace) -> int:
    from ratrain.checkpoint.hooks import is_rank0
    from ratrain.checkpoint.io import check_compatible
    from ratrain.config import TrainConfig
    from ratrain.models.spec import ModelSpec
    from ratrain.train.failures import run_job_one_line
    from ratrain.train.job import (
        CheckpointOpts,
        EvalOpts,
        Job,
        Launch,
        Outputs,
        eval_batches,
        held_out_source,
    )

    ckpt, meta = _checkpoint(args.checkpoint)
    spec = ModelSpec.from_dict(meta["model"])
    plan = _plan(args, meta, spec)
    check_compatible(meta, ckpt, spec, plan)
    seed = args.seed if args.seed is not None else int(meta.get("data", {}).get("seed", 0))
    source = functools.partial(
        held_out_source,
        args.data,
        spec,
        plan.seq,
        seed,
        tokenizer=_tokenizer(args, ckpt),
        dtype=args.data_dtype,
    )
    batches = eval_batches(source(), plan, args.eval_tokens)  # data errors: one line, here
    job = Job(
        spec,
        plan,
        TrainConfig(steps=1, seed=seed),
        source,
        launch=Launch(device=args.device, timeout_s=args.timeout),
        outputs=Outputs(progress=False),
        checkpoints=CheckpointOpts(resume_from=str(ckpt)),
        evaluation=EvalOpts(source=source, tokens=args.eval_tokens, only=True),
    )
    results = run_job_one_line(job)  # checked once there, before any rank starts
    if not is_rank0():
        return 0
    (step, loss), *_ = [e for r in results for run_ in r.runs.values() for e in run_.evals]
    _report(args, ckpt, step, loss, batches, plan)
    return 0


def _report(args, ckpt: Path, step: int, loss: float, batches, plan) -> None:
    n = batches.global_batch
    if args.json:
        report = {
            "eval_loss": loss,
            "checkpoint": str(ckpt),
            "step": step,
            "sequences": n,
            "tokens": n * plan.seq,
            "data": batches.source.describe(),
            "pp": plan.pp,
            "dp": plan.dp,
        }
        print(json.dumps(report))
        return
    print(
        f"eval_loss {loss:.6f} of {ckpt} (after {step} steps) on {n} sequences "
        f"({n * plan.seq:,} tokens) of {batches.source.describe()}; pp={plan.pp} dp={plan.dp}"
    )
