"""`ratrain train` on pp x dp ranks: a `TrainRequest` as a Job, checked once before the
header, the launch (local ranks, or this rank of a torchrun/Slurm job), one-line failures
and the summary line."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable

from ratrain.checkpoint import complete_checkpoints
from ratrain.checkpoint.hooks import is_rank0, resume_dir
from ratrain.config import Plan, TrainConfig
from ratrain.data.base import TokenSource
from ratrain.launch.faults import (
    STOP_EXIT_CODE,
    Interrupted,
    signal_name,
    signals_interrupt,
)
from ratrain.models.spec import ModelSpec
from ratrain.train.failures import last_checkpoint_note, run_job_one_line, stop_line, stopped_run
from ratrain.train.job import CheckedJob, FaultHooks, Job, RankResult, check_job, eval_batches
from ratrain.train.request import TrainRequest
from ratrain.train.summary import memory_note, summary_line

__all__ = ["run_distributed"]


def run_distributed(
    request: TrainRequest,
    spec: ModelSpec,
    plan: Plan,
    cfg: TrainConfig,
    source: Callable[[], TokenSource],
) -> int:
    """`ratrain train` on pp x dp ranks: spawned locally (or this rank of a torchrun/Slurm
    job), progress bar and metrics from the metrics rank, a summary line at the end.
    `source` builds the token source (on each rank, and here for the header); the held-out
    one of the evaluations is `request.evaluation.source`
    (`ratrain.train.job.held_out_source`). Stopped by SIGTERM/SIGINT, the ranks finish a
    step, save with `--save`, and it returns `STOP_EXIT_CODE` after one line; a second
    signal aborts (`Interrupted`, 128 + signal)."""
    save_dir = request.checkpoints.save_dir
    with signals_interrupt():
        try:
            resume_from = resume_dir(spec, plan, save_dir=save_dir, resume=request.resume, cfg=cfg)
            return _train(_job(request, spec, plan, cfg, source, resume_from))
        except Interrupted as e:  # outside the ranks' run: before they start, or after
            if str(e):
                raise
            last = last_checkpoint_note(save_dir)
            raise Interrupted(e.signum, f"interrupted by {signal_name(e.signum)}; {last}") from None


def _train(job: Job) -> int:
    """Check `job` (before the header: a plan for a cluster, or over its memory cap, is one
    line, nothing else), launch it with its header, its summary and its last line; the exit
    code."""
    checked = check_job(job)
    launched = checked.rdzv is not None
    src = job.source()
    held_out = _eval_line(job)  # a bad held-out source is one line here, not one per rank
    if not launched or is_rank0():
        _print_header(checked, src)
        if held_out:
            print(held_out, flush=True)
    results = run_job_one_line(checked, checkpoints=True)
    cap = job.memory_cap.cap_bytes if job.memory_cap else None
    _print_summaries(results, job.plan, src, cap)
    save_dir = job.checkpoints.save_dir
    stopped = stopped_run(results)
    if stopped is not None:
        if not launched or is_rank0():
            print(f"ratrain train: {stop_line(*stopped, save_dir)}", file=sys.stderr)
        return STOP_EXIT_CODE
    if save_dir and (not launched or is_rank0()):
        done = complete_checkpoints(save_dir)
        if done:
            print(f"checkpoint {done[-1]}")
    return 0


def _job(
    request: TrainRequest,
    spec: ModelSpec,
    plan: Plan,
    cfg: TrainConfig,
    source: Callable[[], TokenSource],
    resume_from,
) -> Job:
    """The Job that `request` asks for, resuming from `resume_from` (None: a fresh start):
    its records, with a clean stop on SIGTERM/SIGINT, the last step traced when it writes
    a trace and none is named, and the RATRAIN_FAULT test hook."""
    outputs = request.outputs
    if outputs.trace_path and not outputs.trace_steps:
        outputs = dataclasses.replace(outputs, trace_steps=(cfg.steps - 1,))
    checkpoints = dataclasses.replace(
        request.checkpoints, resume_from=str(resume_from) if resume_from else None
    )
    if request.job is not None:  # the ranks' checkpoints store it (`save_checkpoint`)
        cfg = dataclasses.replace(cfg, extra={**cfg.extra, "job": request.job})
    return Job(
        spec,
        plan,
        cfg,
        source,
        launch=dataclasses.replace(request.launch, stop_on_signal=True),
        outputs=outputs,
        checkpoints=checkpoints,
        evaluation=request.evaluation,
        memory_cap=request.memory_cap,
        hooks=FaultHooks(fault=os.environ.get("RATRAIN_FAULT")),
    )


def _print_header(checked: CheckedJob, src: TokenSource) -> None:
    """What is trained on what, how (ranks, batch, dtype, schedule, host allocator), and
    where its weights come from; or, for `--steps 0`, what is converted."""
    job = checked.job
    spec, plan, cfg = job.spec, job.plan, job.cfg
    run_steps, opts = job.launch.run_steps, job.checkpoints
    ranks = f"pp={plan.pp} dp={plan.dp} ({plan.pp * plan.dp} ranks)"
    if run_steps == 0:  # --steps 0: a conversion, no step taken
        print(
            f"converting {spec.name} into a checkpoint in {opts.save_dir}: no training "
            f"(--steps 0)\n  {ranks}, {plan.compute_dtype}"
        )
    else:
        print(
            f"training {spec.name} on {src.describe()}\n"
            f"  {cfg.steps} steps x {plan.global_batch} seqs x {plan.seq} tokens, {ranks}, "
            f"micro-batch {plan.micro_batch}, {plan.microbatches} microbatches per pipeline, "
            f"{plan.compute_dtype}, schedule {plan.schedule}\n"
            f"  host allocator: {checked.allocator.describe()}"
        )
    if opts.resume_from:
        print(f"  resuming from {opts.resume_from}")
    elif opts.init_from:
        print(f"  weights from {opts.init_from}")
    elif run_steps == 0:
        print(f"  initial weights (seed {cfg.seed})")
    sys.stdout.flush()


def _eval_line(job: Job) -> str | None:
    """The header's line on the evaluations of `job` (None: none), its held-out source and
    set built once here so that their errors are one line before any rank starts."""
    opts = job.evaluation
    if not opts.every or opts.source is None or job.launch.run_steps == 0:
        return None
    batches = eval_batches(opts.source(), job.plan, opts.tokens)
    n = batches.global_batch
    return (
        f"  evaluating every {opts.every} steps and after the last on {n} sequences "
        f"({n * job.plan.seq:,} tokens) of {batches.source.describe()}"
    )


def _print_summaries(
    results: list[RankResult], plan: Plan, src: TokenSource, cap_bytes: int | None = None
) -> None:
    """The summary line of each rank that holds the losses (the metrics rank); with a
    `--memory-cap`, the cap beside the measured peaks."""
    for r in results:
        run = r.runs[plan.schedule]
        if run.losses:
            elapsed = sum(run.step_times_s)  # training only, not the ranks' start-up
            tokens = len(run.losses) * plan.tokens_per_step
            memory = memory_note(_memory_record(run.records[-1] if run.records else {}))
            if cap_bytes is not None:
                memory += f" (--memory-cap {cap_bytes / 2**30:.4g} GiB per rank)"
            print(summary_line(run.losses, src, elapsed, tokens, memory))
            if run.evals:
                print(f"eval_loss {run.evals[-1][1]:.4f} after {run.evals[-1][0]} steps")
            if run.compile_s:
                print(f"compiled the block units in {run.compile_s:.1f} s (not in tokens/s)")


def _memory_record(record: dict) -> dict:
    """`record` as `memory_note` reads it: peak bytes counted as RSS are said as RSS (its
    `max_rss_bytes_per_rank`), not as tensor memory."""
    if record.get("peak_bytes_source") == "tensors":
        return record
    return {k: v for k, v in record.items() if k != "peak_bytes_per_rank"}
