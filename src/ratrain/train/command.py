"""`ratrain train` on pp x dp ranks: a `TrainRequest` as a Job, the launch (local ranks, or
this rank of a torchrun/Slurm job), one-line failures and the summary line."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable

from ratrain.checkpoint import complete_checkpoints
from ratrain.checkpoint.hooks import is_rank0, resume_dir
from ratrain.config import Plan, TrainConfig
from ratrain.data.base import TokenSource
from ratrain.errors import RatrainError
from ratrain.launch.faults import JobFailed, current_step, read_steps
from ratrain.launch.grid import DEFAULT_TIMEOUT_S, rendezvous_from_env
from ratrain.launch.spawn import RankFailure
from ratrain.models.spec import ModelSpec
from ratrain.train.job import Job, RankResult, run_job
from ratrain.train.request import TrainRequest
from ratrain.train.summary import memory_note, summary_line

__all__ = ["run_distributed", "failure_message"]


def run_distributed(
    request: TrainRequest,
    spec: ModelSpec,
    plan: Plan,
    cfg: TrainConfig,
    source: Callable[[], TokenSource],
) -> int:
    """`ratrain train` on pp x dp ranks: spawned locally (or this rank of a torchrun/Slurm
    job), progress bar and metrics from the metrics rank, a summary line at the end.
    `source` builds the token source (on each rank, and here for the header)."""
    resume_from = resume_dir(spec, plan, save_dir=request.save_dir, resume=request.resume, cfg=cfg)
    job = _job(request, spec, plan, cfg, source, resume_from)
    launched = rendezvous_from_env() is not None
    status = None if launched else tempfile.TemporaryDirectory(prefix="ratrain-status-")
    if status is not None:
        job = dataclasses.replace(job, status_dir=status.name)
    src = source()
    if not launched or is_rank0():
        _print_header(job, src, resume_from)
    try:
        results = _run(job, launched)
    finally:
        if status is not None:
            status.cleanup()
    _print_summaries(results, plan, src)
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
        memory_cap_label="--memory-cap",
        resume_from=str(resume_from) if resume_from else None,
        fault=os.environ.get("RATRAIN_FAULT"),
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
    print(
        f"training {spec.name} on {src.describe()}\n"
        f"  {cfg.steps} steps x {plan.global_batch} seqs x {plan.seq} tokens, pp={plan.pp} "
        f"dp={plan.dp} ({plan.pp * plan.dp} ranks), micro-batch {plan.micro_batch}, "
        f"{plan.microbatches} microbatches per pipeline, {plan.compute_dtype}, "
        f"schedule {plan.schedule}"
    )
    if resume_from:
        print(f"  resuming from {resume_from}")
    elif job.init_from:
        print(f"  weights from {job.init_from}")
    sys.stdout.flush()


def _run(job: Job, launched: bool) -> list[RankResult]:
    """`run_job`, with a rank's failure as one line (`JobFailed`)."""
    try:
        return run_job(job)
    except RatrainError:
        raise
    except RankFailure as e:
        steps = read_steps(job.status_dir) if job.status_dir else {}
        step = steps.get(e.rank) if e.rank is not None else None
        if step is None and steps:
            step = max(steps.values())
        raise JobFailed(failure_message(e.rank, e.cause, step, job.save_dir)) from None
    except Exception as e:  # launched by torchrun/Slurm: this rank saw the failure
        if not launched:
            raise
        rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
        first = (str(e).strip().splitlines() or [""])[0][:200]
        cause = f"stopped ({type(e).__name__}: {first}; a peer rank may have died)"
        raise JobFailed(failure_message(rank, cause, current_step(), job.save_dir)) from None


def _print_summaries(results: list[RankResult], plan: Plan, src: TokenSource) -> None:
    """The summary line of each rank that holds the losses (the metrics rank)."""
    for r in results:
        run = r.runs[plan.schedule]
        if run.losses:
            elapsed = sum(run.step_times_s)  # training only, not the ranks' start-up
            tokens = len(run.losses) * plan.tokens_per_step
            memory = memory_note(run.records[-1] if run.records else {})
            print(summary_line(run.losses, src, elapsed, tokens, memory))
            if run.compile_s:
                print(f"compiled the block units in {run.compile_s:.1f} s (not in tokens/s)")


def failure_message(rank: int | None, cause: str, step: int | None, save_dir: str | None) -> str:
    """The one line a failed job ends with: who, what, when, and where to resume from."""
    who = f"rank {rank}" if rank is not None else "a rank"
    where = f" at step {step}" if step is not None else ""
    if not save_dir:
        last = "no checkpoints (run with --save DIR to keep progress)"
    else:
        done = complete_checkpoints(save_dir)
        last = (
            f"last complete checkpoint {done[-1]} (continue with --resume auto)"
            if done
            else f"no complete checkpoint in {save_dir} yet"
        )
    return f"{who} {cause}{where}; {last}"
