"""`ratrain train` on pp x dp ranks: the command line's flags as a Job, the launch (local
ranks, or this rank of a torchrun/Slurm job), one-line failures and the summary line."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import tempfile

from ratrain.checkpoint import complete_checkpoints
from ratrain.checkpoint.hooks import is_rank0, resume_dir
from ratrain.config import Plan, TrainConfig
from ratrain.data.base import TokenSource
from ratrain.errors import RatrainError
from ratrain.launch.faults import JobFailed, current_step, read_steps
from ratrain.launch.grid import DEFAULT_TIMEOUT_S, rendezvous_from_env
from ratrain.launch.spawn import RankFailure
from ratrain.models.spec import ModelSpec
from ratrain.train.job import Job, RunResult, run_job

__all__ = ["run_distributed", "train_config_of"]


def train_config_of(args) -> TrainConfig:
    """`ratrain train`'s training flags (steps, lr, min_lr, warmup, weight_decay, seed) as a
    TrainConfig, with its defaults: min_lr = lr / 10, warmup = steps / 15."""
    steps, lr = args.steps, args.lr
    min_lr = getattr(args, "min_lr", None)
    warmup = getattr(args, "warmup", None)
    return TrainConfig(
        steps=steps,
        lr=lr,
        min_lr=lr / 10 if min_lr is None else min_lr,
        warmup_steps=steps // 15 if warmup is None else warmup,
        weight_decay=getattr(args, "weight_decay", 0.1),
        seed=getattr(args, "seed", 0),
    )


def run_distributed(args, spec: ModelSpec, plan: Plan, cfg: TrainConfig | None = None) -> int:
    """`ratrain train` on pp x dp ranks: spawned locally (or this rank of a torchrun/Slurm
    job), progress bar and metrics from the metrics rank, a summary line at the end."""
    from ratrain.data import make_source

    cfg = cfg or train_config_of(args)
    world = plan.pp * plan.dp
    nproc = getattr(args, "nproc", None)
    if nproc is not None and nproc != world:
        raise RatrainError(
            f"--nproc {nproc} does not match pp x dp = {world}; drop --nproc or fix it"
        )
    source = functools.partial(
        make_source,
        getattr(args, "data", "synthetic"),
        spec,
        plan.seq,
        cfg.seed,
        tokenizer=getattr(args, "tokenizer", None),
        dtype=getattr(args, "data_dtype", None),
    )
    cap = getattr(args, "memory_cap", None)
    resume_from = resume_dir(args, spec, plan, cfg)
    job = Job(
        spec,
        plan,
        cfg,
        source,
        device=getattr(args, "device", None),
        backend=getattr(args, "backend", "torch"),
        compile_units=bool(getattr(args, "compile", False)),
        pin_cores=bool(getattr(args, "pin_cores", False)),
        cpu_caching_allocator=getattr(args, "cpu_caching_allocator", False),
        malloc_mmap_threshold_bytes=getattr(args, "malloc_mmap_threshold", 0),
        timeout_s=getattr(args, "timeout", None) or DEFAULT_TIMEOUT_S,
        metrics_path=getattr(args, "metrics", None),
        tensorboard_dir=getattr(args, "tensorboard", None),
        trace_path=getattr(args, "trace", None),
        trace_steps=(cfg.steps - 1,) if getattr(args, "trace", None) else (),
        measure_memory=bool(getattr(args, "measure_memory", False)),
        progress=not getattr(args, "quiet", False),
        memory_cap_bytes=int(cap * 2**30) if cap else None,
        memory_cap_label="--memory-cap",
        save_dir=getattr(args, "save", None),
        save_every=getattr(args, "save_every", None),
        keep=getattr(args, "keep", None),
        resume_from=str(resume_from) if resume_from else None,
        init_from=getattr(args, "init_from", None),
        run_steps=0 if getattr(args, "steps", None) == 0 else None,
        fault=os.environ.get("RATRAIN_FAULT"),
    )
    launched = rendezvous_from_env() is not None
    status = None if launched else tempfile.TemporaryDirectory(prefix="ratrain-status-")
    if status is not None:
        job = dataclasses.replace(job, status_dir=status.name)
    src = source()
    if not launched or int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0:
        print(
            f"training {spec.name} on {src.describe()}\n"
            f"  {cfg.steps} steps x {plan.global_batch} seqs x {plan.seq} tokens, pp={plan.pp} "
            f"dp={plan.dp} ({world} ranks), micro-batch {plan.micro_batch}, {plan.microbatches} "
            f"microbatches per pipeline, {plan.compute_dtype}, schedule {plan.schedule}"
        )
        if resume_from:
            print(f"  resuming from {resume_from}")
        elif job.init_from:
            print(f"  weights from {job.init_from}")
        sys.stdout.flush()
    try:
        results = run_job(job)
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
    finally:
        if status is not None:
            status.cleanup()
    for r in results:
        run = r.runs[plan.schedule]
        if run.losses:
            elapsed = sum(run.step_times_s)  # training only, not the ranks' start-up
            print(_summary(run, src, elapsed, len(run.losses) * plan.tokens_per_step))
            if run.compile_s:
                print(f"compiled the block units in {run.compile_s:.1f} s (not in tokens/s)")
    if job.save_dir and (not launched or is_rank0()):
        from ratrain.checkpoint import complete_checkpoints

        done = complete_checkpoints(job.save_dir)
        if done:
            print(f"checkpoint {done[-1]}")
    return 0


def _summary(run: RunResult, source: TokenSource, elapsed_s: float, tokens: int) -> str:
    tail = run.losses[-10:]
    final = sum(tail) / len(tail)
    last = run.records[-1] if run.records else {}
    mem = ""
    if last.get("peak_bytes_per_rank") and None not in last["peak_bytes_per_rank"]:
        mib = ", ".join(f"{p / 2**20:.1f}" for p in last["peak_bytes_per_rank"])
        mem = f"; peak tensor memory per rank {mib} MiB"
    elif last.get("max_rss_bytes_per_rank"):
        mib = ", ".join(f"{p / 2**20:.0f}" for p in last["max_rss_bytes_per_rank"])
        mem = f"; peak RSS per rank {mib} MiB"
    rate = f"{len(run.losses)} steps in {elapsed_s:.1f} s ({tokens / elapsed_s:,.0f} tokens/s){mem}"
    floor = getattr(source, "entropy_floor_nats", None)
    head = f"final loss {final:.4f} (mean of the last {len(tail)} steps)"
    if floor is None:
        return f"{head}; {rate}"
    return (
        f"{head} vs entropy floor {floor:.4f} nats: {100 * (final - floor) / floor:+.1f}%; {rate}"
    )


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
