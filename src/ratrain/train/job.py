"""Distributed training: every rank runs its stage of the plan's schedule, step after step.

    results = run_job(Job(spec, plan, cfg, source))      # spawns pp*dp local ranks,
                                                         # or joins a torchrun/Slurm job

A `Job` is the model, the plan, the training config, the data and a few small records
(`ratrain.train.parts`: `Launch`, `Outputs`, `CheckpointOpts`, `EvalOpts`, `MemoryCap`,
`FaultHooks`). It is checked once, before any rank starts (`check_job`,
`ratrain.train.checks`); each rank then runs `rank_main` (`ratrain.train.rank`). Several
schedules can run one after the other in one job (`Job.schedules`, `Job.variants`):
`ratrain verify` runs Baseline-1F1B and RATrain on the same ranks, each from the same
initial weights. The held-out set of the evaluations is `ratrain.train.evaluation`. The
`ratrain train` command's side (launch, failures, summary) is `ratrain.train.command`.
"""

from __future__ import annotations

import os

from ratrain.launch.grid import Rendezvous
from ratrain.launch.spawn import spawn
from ratrain.ranks import coords_of
from ratrain.train.checks import (
    CheckedJob,
    check_cap,
    check_fits,
    check_job,
    check_local,
    runtime_ledger,
)
from ratrain.train.evaluation import EVAL_SEQUENCES, eval_batches, held_out_source
from ratrain.train.parts import (
    CheckpointOpts,
    EvalOpts,
    FaultHooks,
    Job,
    Launch,
    MemoryCap,
    Outputs,
    job_variants,
)
from ratrain.train.rank import RankResult, RunResult, rank_main, train_schedule

__all__ = [
    "Job",
    "Launch",
    "Outputs",
    "CheckpointOpts",
    "EvalOpts",
    "MemoryCap",
    "FaultHooks",
    "CheckedJob",
    "RunResult",
    "RankResult",
    "run_job",
    "check_job",
    "rank_main",
    "train_schedule",
    "job_variants",
    "cores_of",
    "check_fits",
    "check_cap",
    "check_local",
    "runtime_ledger",
    "held_out_source",
    "eval_batches",
    "EVAL_SEQUENCES",
]


def run_job(job: Job | CheckedJob) -> list[RankResult]:
    """Run the job: inside a launched job (torchrun / Slurm) as this process's rank, else by
    spawning pp*dp local ranks. Returns every rank's result (only this rank's when launched
    externally). A `Job` is checked first (`check_job`); a `CheckedJob` is not again."""
    checked = job if isinstance(job, CheckedJob) else check_job(job)
    job = checked.job
    if checked.rdzv is not None:
        _launched_threads()
        return [rank_main(checked.rdzv, job)]
    return spawn(
        _local_rank_main,
        job.plan.pp * job.plan.dp,
        job,
        deadline_s=job.launch.deadline_s,
        allocator_library=checked.allocator.library,
        stop_signals=job.launch.stop_on_signal,  # SIGTERM/SIGINT: a clean stop (`rank_main`)
    )


def _launched_threads() -> None:
    """A torchrun/Slurm rank takes `ratrain train --threads` (OMP_NUM_THREADS, which the
    command sets for the ranks it launches) as a spawned rank does (`ratrain.launch.spawn`):
    torch sized its pool when imported, before the flag was read. Without it, 4 ranks of
    one thread asked for on 2 emulated nodes' shared cores ran 2 threads each and their
    steps took 5-6.5 s instead of 1.9 s."""
    n = os.environ.get("OMP_NUM_THREADS", "")
    if n.isdigit() and int(n) > 0:
        import torch

        torch.set_num_threads(int(n))


def cores_of(rank: int, world: int, pp: int, cpus: list[int], layout: str = "pp-inner") -> set[int]:
    """The cores a local rank is pinned to (`Launch.pin_cores`): an equal share each while
    there are enough (its threads stay on them); otherwise one, (stage + replica) mod the
    cores, so that each core mixes stages and one rank's pipeline waits can be filled by
    another stage's work (the rank's coordinates under the plan's `layout`)."""
    if world <= len(cpus):
        k = len(cpus) // world
        return set(cpus[rank * k : (rank + 1) * k])
    stage, replica = coords_of(rank, pp, world // pp, layout)
    return {cpus[(stage + replica) % len(cpus)]}


def _local_rank_main(rdzv: Rendezvous, job: Job) -> RankResult:
    """A rank `run_job` spawned on this machine: pinned first when the job asks."""
    if job.launch.pin_cores and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        pp, layout = job.plan.pp, job.plan.rank_layout
        os.sched_setaffinity(0, cores_of(rdzv.rank, rdzv.world_size, pp, cpus, layout))
    return rank_main(rdzv, job)
