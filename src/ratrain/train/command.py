"""`ratrain train` on pp x dp ranks: a `TrainRequest` as a Job, the launch (local ranks, or
this rank of a torchrun/Slurm job), one-line failures and the summary line."""

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
from ratrain.launch.grid import DEFAULT_TIMEOUT_S, rendezvous_from_env
from ratrain.launch.host_memory import resolve_host_allocator
from ratrain.models.spec import ModelSpec
from ratrain.train.failures import last_checkpoint_note, run_job_one_line, stop_line, stopped_run
from ratrain.train.job import (
    Job,
    RankResult,
    check_cap,
    check_local,
    eval_batches,
)
from ratrain.train.request import TrainRequest
from ratrain.train.summary import memory_note, summary_line

__all__ = ["run_distributed"]


def run_distributed(
    request: TrainRequest,
    spec: ModelSpec,
    plan: Plan,
    cfg: TrainConfig,
    source: Callable[[], TokenSource],
    eval_source: Callable[[], TokenSource] | None = None,
) -> int:
    """`ratrain train` on pp x dp ranks: spawned locally (or this rank of a torchrun/Slurm
    job), progress bar and metrics from the metrics rank, a summary line at the end.
    `source` builds the token source (on each rank, and here for the header); `eval_source`
    the held-out one of `request.eval_every` (`ratrain.train.job.held_out_source`). Stopped by
    SIGTERM/SIGINT, the ranks finish a step, save with `--save`, and it returns
    `STOP_EXIT_CODE` after one line; a second signal aborts (`Interrupted`, 128 + signal)."""
    with signals_interrupt():
        try:
            resume_from = resume_dir(
                spec, plan, save_dir=request.save_dir, resume=request.resume, cfg=cfg
            )
            job = _job(request, spec, plan, cfg, source, resume_from)
            return _train(dataclasses.replace(job, eval_source=eval_source), resume_from)
        except Interrupted as e:  # outside the ranks' run: before they start, or after
            if str(e):
                raise
            last = last_checkpoint_note(request.save_dir)
            raise Interrupted(e.signum, f"interrupted by {signal_name(e.signum)}; {last}") from None


def _train(job: Job, resume_from) -> int:
    """Launch `job` (resuming from `resume_from`, None: a fresh start) with its header, its
    summary and its last line; the exit code."""
    launched = rendezvous_from_env() is not None
    if not launched:
        check_local(job)  # before the header: a plan for a cluster is one line, nothing else
    check_cap(job)  # --memory-cap: refused before the header, too
    src = job.source()
    held_out = _eval_line(job)  # a bad held-out source is one line here, not one per rank
    if not launched or is_rank0():
        _print_header(job, src, resume_from)
        if held_out:
            print(held_out, flush=True)
    results = run_job_one_line(job, checkpoints=True)
    _print_summaries(results, job.plan, src, job.memory_cap_bytes)
    stopped = stopped_run(results)
    if stopped is not None:
        if not launched or is_rank0():
            print(f"ratrain train: {stop_line(*stopped, job.save_dir)}", file=sys.stderr)
        return STOP_EXIT_CODE
    if job.save_dir and (not launched or is_rank0()):
        done = complete_checkpoints(job.save_dir)
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
    """The Job that `request` asks for, resuming from `resume_from` (None: a fresh start).
    The request's fields fill the Job's fields of the same name, but for those set here."""
    own = dict(
        timeout_s=request.timeout_s or DEFAULT_TIMEOUT_S,
        trace_steps=(cfg.steps - 1,) if request.trace_path else (),
        resume_from=str(resume_from) if resume_from else None,
        fault=os.environ.get("RATRAIN_FAULT"),
        stop_on_signal=True,
    )
    job_fields = {f.name for f in dataclasses.fields(Job)}
    same = {
        f.name: getattr(request, f.name)
        for f in dataclasses.fields(TrainRequest)
        if f.name in job_fields and f.name not in own
    }
    return Job(spec, plan, cfg, source, **same, **own)


def _print_header(job: Job, src: TokenSource, resume_from) -> None:
    spec, plan, cfg = job.spec, job.plan, job.cfg
    allocator = resolve_host_allocator(
        job.host_allocator,
        job.malloc_mmap_threshold_bytes,
        launched=rendezvous_from_env() is not None,
    )
    ranks = f"pp={plan.pp} dp={plan.dp} ({plan.pp * plan.dp} ranks)"
    if job.run_steps == 0:  # --steps 0: a conversion, no step taken
        print(
            f"converting {spec.name} into a checkpoint in {job.save_dir}: no training "
            f"(--steps 0)\n  {ranks}, {plan.compute_dtype}"
        )
    else:
        print(
            f"training {spec.name} on {src.describe()}\n"
            f"  {cfg.steps} steps x {plan.global_batch} seqs x {plan.seq} tokens, {ranks}, "
            f"micro-batch {plan.micro_batch}, {plan.microbatches} microbatches per pipeline, "
            f"{plan.compute_dtype}, schedule {plan.schedule}\n"
            f"  host allocator: {allocator.describe()}"
        )
    if resume_from:
        print(f"  resuming from {resume_from}")
    elif job.init_from:
        print(f"  weights from {job.init_from}")
    elif job.run_steps == 0:
        print(f"  initial weights (seed {cfg.seed})")
    sys.stdout.flush()


def _eval_line(job: Job) -> str | None:
    """The header's line on the evaluations of `job` (None: none), its held-out source and
    set built once here so that their errors are one line before any rank starts."""
    if not job.eval_every or job.eval_source is None or job.run_steps == 0:
        return None
    batches = eval_batches(job.eval_source(), job.plan, job.eval_tokens)
    n = batches.global_batch
    return (
        f"  evaluating every {job.eval_every} steps and after the last on {n} sequences "
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
