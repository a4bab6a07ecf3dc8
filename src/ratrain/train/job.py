"""Distributed training: every rank runs its stage of the plan's schedule, step after step.

    results = run_job(Job(spec, plan, cfg, source))      # spawns pp*dp local ranks,
                                                         # or joins a torchrun/Slurm job

A `Job` is everything a rank needs (picklable: the data source comes as a factory). Each
rank builds its stage (`StageModel`), lowers the plan (`build_schedule`, checked by
`check_schedule`) and walks its list (`StageExecutor`). Several schedules can run one
after the other in one job (`Job.schedules`): `ratrain verify` runs Baseline-1F1B and
RATrain on the same ranks, each from the same initial weights.

Metrics: at the end of each step every rank contributes (peak tensor bytes, peak RSS,
step time, its microbatch losses) to one small all-gather, issued asynchronously and read
at the end of the next step, so bookkeeping makes a rank wait only for ranks more than a
step behind. The metrics rank (last stage, replica 0) turns it into the step's record: the
global-batch loss summed in the reference trainer's order (replica-major), lr, grad norm,
tokens/s, step time (the period between step ends), peak tensor bytes per rank (CUDA's
allocator, or `LiveBytes` with `measure_memory`; else null) and peak RSS per rank; it
writes the JSONL, TensorBoard and the progress bar (`ratrain.train.step_log`). The
`ratrain train` command's side (flags, launch, failures, summary) is
`ratrain.train.command`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from ratrain.checkpoint.hooks import (
    resume_stage,
    save_due,
    save_stage,
)
from ratrain.config import Plan, TrainConfig
from ratrain.data.base import Batches, TokenSource
from ratrain.errors import RatrainError
from ratrain.launch import cpu_allocator
from ratrain.launch.faults import (
    StepMarker,
    fault_hook,
)
from ratrain.launch.grid import DEFAULT_TIMEOUT_S, ParallelGrid, Rendezvous, rendezvous_from_env
from ratrain.launch.host_memory import (
    check_mmap_threshold,
    fix_mmap_threshold,
)
from ratrain.launch.spawn import spawn
from ratrain.memory import replay
from ratrain.models.spec import ModelSpec
from ratrain.observe.memory import PeakMemory
from ratrain.observe.profile import StepProfile
from ratrain.observe.trace import Recorder, write_measured_trace
from ratrain.runtime.comm import Comm
from ratrain.runtime.compiled import compile_stage
from ratrain.runtime.executor import StageExecutor
from ratrain.runtime.stage import StageModel, check_tied
from ratrain.schedule import build_schedule, check_schedule
from ratrain.train.step_log import StepLog

__all__ = [
    "Job",
    "RunResult",
    "RankResult",
    "run_job",
    "rank_main",
    "train_schedule",
    "job_variants",
    "check_fits",
    "runtime_ledger",
]


@dataclass(frozen=True)
class Job:
    spec: ModelSpec
    plan: Plan
    cfg: TrainConfig
    source: Callable[[], TokenSource]
    """Builds the token source on each rank (e.g. a `functools.partial` of `make_source`)."""
    schedules: tuple[str, ...] = ()
    """Schedules to run in turn, each from the initial weights; () runs `plan.schedule`."""
    variants: tuple[tuple[str, dict], ...] = ()
    """More general than `schedules`: (name, plan overrides) pairs, run in turn (e.g.
    ("ratrain-noclip", {"schedule": "ratrain", "clip_grad": None}))."""
    device: str | None = None
    """cpu | cuda; None: cuda when available."""
    backend: str = "torch"
    timeout_s: float = DEFAULT_TIMEOUT_S
    metrics_path: str | None = None
    tensorboard_dir: str | None = None
    trace_path: str | None = None
    """Write the measured timeline of `trace_steps` (replica 0) here."""
    trace_steps: tuple[int, ...] = ()
    measure_memory: bool = False
    """CPU: count live tensor bytes (slower); CUDA always reports the allocator's peak."""
    progress: bool = True
    deadline_s: float = 24 * 3600.0
    memory_cap_bytes: int | None = None
    """Declared usable memory per rank: a plan whose ledger peak exceeds it is refused."""
    memory_cap_label: str = "the declared cap"
    save_dir: str | None = None
    """Write checkpoints here (`ratrain.checkpoint`)."""
    save_every: int | None = None
    """Steps between checkpoints (None: only at the end)."""
    keep: int | None = None
    """Keep only the newest `keep` checkpoints (None: all)."""
    resume_from: str | None = None
    """A complete checkpoint directory to continue from (resolved by the caller)."""
    init_from: str | None = None
    """A Hugging Face directory (config.json + safetensors) to take the weights from."""
    fault: str | None = None
    """The RATRAIN_FAULT test hook (`ratrain.launch.faults`)."""
    status_dir: str | None = None
    """Each rank writes the step it is on here (`ratrain.launch.faults.StepMarker`)."""
    run_steps: int | None = None
    """Steps to run now (None: up to `cfg.steps`); 0 with `save_dir` saves the starting
    state (e.g. HF weights as a checkpoint) and stops."""
    profile_step: int | None = None
    """Profile this step on every rank (`ratrain.observe.profile`): `RunResult.profile`."""
    compile_units: bool = False
    """Run each block unit through `torch.compile` (`ratrain.runtime.compiled`)."""
    pin_cores: bool = False
    """Pin each locally spawned rank to one core of this process's affinity set
    (`cores_of`); ranks launched by torchrun or Slurm keep the launcher's placement."""
    cpu_caching_allocator: bool = False
    """CPU ranks serve tensors from a caching allocator (`ratrain.launch.cpu_allocator`):
    freed blocks are reused by size instead of fragmenting malloc's heap. Off by default:
    it does not serve oneDNN's raw allocations, which native-bf16 CPUs (AVX512-BF16) make,
    and it was measured to change no tokens/s (docs/runtime.md, "Host memory")."""
    malloc_mmap_threshold_bytes: int = 0
    """> 0: each rank fixes glibc's mmap threshold to this (`ratrain.launch.host_memory`),
    so freed tensors go back to the OS (less RSS, more page faults); 0 leaves glibc's own
    dynamic threshold."""


@dataclass
class RunResult:
    schedule: str
    losses: list[float] = field(default_factory=list)
    """Global-batch loss per step (metrics rank only)."""
    records: list[dict] = field(default_factory=list)
    """The per-step metric records (metrics rank only)."""
    peak_bytes: int | None = None
    """This rank's peak tensor bytes over the run (None when not measured)."""
    step_times_s: list[float] = field(default_factory=list)
    trace: list[dict] = field(default_factory=list)
    profile: dict[str, float] | None = None
    """This rank's time per bucket in `Job.profile_step` (`ratrain.observe.profile`)."""
    compile_s: float = 0.0
    """Time this rank spent compiling and warming up its units, before the first step."""
    save_times_s: list[float] = field(default_factory=list)
    """This rank's wall time in each checkpoint save (not part of `step_times_s`)."""


@dataclass
class RankResult:
    rank: int
    stage: int
    replica: int
    runs: dict[str, RunResult]


def run_job(job: Job) -> list[RankResult]:
    """Run the job: inside a launched job (torchrun / Slurm) as this process's rank, else by
    spawning pp*dp local ranks. Returns every rank's result (only this rank's when launched
    externally)."""
    job.plan.check_for(job.spec)
    check_tied(job.spec, job.plan)
    check_mmap_threshold(job.malloc_mmap_threshold_bytes)
    if job.cpu_caching_allocator and _on_cpu(job) and not cpu_allocator.build():
        # built once, here, rather than in every rank at once; without it, torch's own
        job = dataclasses.replace(job, cpu_caching_allocator=False)
    if job.compile_units and job.measure_memory and job.device != "cuda":
        # LiveBytes counts tensors through a dispatch mode; whether it sees every buffer of a
        # compiled graph is not established, so the two are not combined
        raise RatrainError(
            "--compile cannot be combined with --measure-memory on CPU: measure memory eagerly"
        )
    if job.memory_cap_bytes is not None:
        for _, overrides in job_variants(job):
            check_fits(
                job.spec, job.plan.replace(**overrides), job.memory_cap_bytes, job.memory_cap_label
            )
    rdzv = rendezvous_from_env()
    if rdzv is not None:
        return [rank_main(rdzv, job)]
    return spawn(_local_rank_main, job.plan.pp * job.plan.dp, job, deadline_s=job.deadline_s)


def cores_of(rank: int, world: int, pp: int, cpus: list[int]) -> set[int]:
    """The cores a local rank is pinned to (`Job.pin_cores`): an equal share each while
    there are enough (its threads stay on them); otherwise one, (stage + replica) mod the
    cores, so that each core mixes stages and one rank's pipeline waits can be filled by
    another stage's work."""
    if world <= len(cpus):
        k = len(cpus) // world
        return set(cpus[rank * k : (rank + 1) * k])
    stage, replica = rank % pp, rank // pp
    return {cpus[(stage + replica) % len(cpus)]}


def _local_rank_main(rdzv: Rendezvous, job: Job) -> RankResult:
    """A rank `run_job` spawned on this machine: pinned first when the job asks."""
    if job.pin_cores and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cores_of(rdzv.rank, rdzv.world_size, job.plan.pp, cpus))
    return rank_main(rdzv, job)


def rank_main(rdzv: Rendezvous, job: Job) -> RankResult:
    # before the rank's first tensor: blocks already in the heap stay there
    fix_mmap_threshold(job.malloc_mmap_threshold_bytes)
    if job.cpu_caching_allocator and _on_cpu(job):
        cpu_allocator.install()
    grid = ParallelGrid.init(
        job.plan.pp, job.plan.dp, rdzv, device=job.device, timeout_s=job.timeout_s
    )
    try:
        comm = Comm(grid)
        runs = {}
        for name, overrides in job_variants(job):
            runs[name] = train_schedule(grid, comm, job, name, job.plan.replace(**overrides))
        return RankResult(grid.rank, grid.stage, grid.replica, runs)
    finally:
        grid.destroy()


def _on_cpu(job: Job) -> bool:
    import torch

    return job.device == "cpu" or (job.device is None and not torch.cuda.is_available())


def runtime_ledger(spec: ModelSpec, plan: Plan):
    """The ledger of `plan` as this runtime holds its memory: the torch model's eager
    kernels count what they keep, and SEND buffers are held to the step's end (gloo's sends
    are; a polled NCCL send frees sooner)."""
    return replay(
        build_schedule(spec, plan),
        spec,
        plan,
        keep_trace=False,
        eager_kernels=True,
        sends_held=True,
    )


def check_fits(
    spec: ModelSpec, plan: Plan, cap_bytes: int, label: str = "the declared cap"
) -> None:
    """RatrainError unless every stage's ledger peak fits `cap_bytes`."""
    ledger = runtime_ledger(spec, plan)
    worst = max(ledger.stages, key=lambda m: m.peak_bytes)
    if worst.peak_bytes > cap_bytes:
        raise RatrainError(
            f"plan does not fit: stage {worst.stage} needs {worst.peak_bytes / 2**30:.3g} GiB "
            f"(memory ledger, {plan.schedule}), more than the {cap_bytes / 2**30:.3g} GiB of "
            f"{label}; use more stages, --recompute full, --shard-optimizer or a smaller "
            "--micro-batch (`ratrain plan` finds one that fits)"
        )


def job_variants(job: Job) -> list[tuple[str, dict]]:
    """The (name, plan overrides) runs of a job, in order."""
    if job.variants:
        return list(job.variants)
    return [(kind, {"schedule": kind}) for kind in job.schedules or (job.plan.schedule,)]


def _metrics_rank(grid: ParallelGrid) -> int:
    return grid.rank_of(grid.pp - 1, 0)


def train_schedule(grid: ParallelGrid, comm: Comm, job: Job, kind: str, plan: Plan) -> RunResult:
    """Train `job.cfg.steps` steps of `plan` (run name `kind`) from the initial weights."""
    spec, cfg = job.spec, job.cfg
    schedule, batches = _lower(job, kind, plan)
    is_metrics = grid.rank == _metrics_rank(grid)
    result = RunResult(kind)
    with PeakMemory(grid.device, job.measure_memory) as mem:
        model, resumed = _build_stage(grid, job, plan, mem, result)
        _barrier(grid)
        rec = Recorder(grid.stage, grid.replica, time.perf_counter(), set(job.trace_steps))
        ex = StageExecutor(grid, comm, model, schedule, batches, spec, plan, cfg, rec)
        start = _restore(ex, resumed, plan)
        log = (
            StepLog(grid, comm, plan, spec, job, kind, start)
            if is_metrics
            else StepLog(grid, comm, plan, spec)
        )
        try:
            _train_steps(grid, model, ex, log, mem, job, plan, start, result)
        finally:
            log.close()
        result.peak_bytes = mem.peak_bytes()
    result.losses = log.losses
    result.records = log.records
    result.trace = _gather_trace(grid, rec, job, kind)
    return result


def _lower(job: Job, kind: str, plan: Plan):
    """The checked schedule of `plan` and its batches of the job's data."""
    spec = job.spec
    if (plan.pp, plan.dp) != (job.plan.pp, job.plan.dp):
        raise RatrainError(f"run {kind!r}: a variant cannot change pp or dp")
    schedule = build_schedule(spec, plan)
    check_schedule(schedule, spec, plan)
    batches = Batches.from_plan(job.source(), plan)
    if batches.source.vocab > spec.vocab:
        raise RatrainError(
            f"data vocab {batches.source.vocab} exceeds {spec.name}'s vocab {spec.vocab}"
        )
    return schedule, batches


def _build_stage(
    grid: ParallelGrid, job: Job, plan: Plan, mem: PeakMemory, result: RunResult
) -> tuple[StageModel, dict | None]:
    """This rank's stage: its weights from the checkpoint resumed (also returned, None on a
    fresh start), else from `init_from`, else initial; compiled when the job asks
    (`result.compile_s`)."""
    spec = job.spec
    model = StageModel(spec, plan, job.cfg, grid.stage, grid.replica, grid.device, job.backend)
    mem.track(model.state_tensors())
    resumed = resume_stage(grid, model, job, plan) if job.resume_from else None
    if job.init_from and resumed is None:
        from ratrain.checkpoint.hf import load_stage_from_hf

        load_stage_from_hf(model, job.init_from)
    if job.compile_units:
        result.compile_s = compile_stage(
            model.modules(),
            {u: plan.recompute_of(spec, grid.stage, u) for u in model.unit_ids},
            job.backend,
            (plan.micro_batch, plan.seq, spec.hidden),  # (B, T, H)
            model.dtype,
            grid.device,
        )
    return model, resumed


def _restore(ex: StageExecutor, resumed: dict | None, plan: Plan) -> int:
    """The step to start from, with the executor's optimizer count and loss scale as the
    checkpoint left them."""
    if resumed is None:
        return 0
    ex.updates = resumed["optimizer_updates"]
    if resumed["plan"].get("compute_dtype") == plan.compute_dtype:
        # (another dtype keeps its own initial scale: bf16/fp32 store a disabled one)
        ex.scaler.load_state_dict(resumed["loss_scaler"])
    return resumed["step"]


def _train_steps(
    grid: ParallelGrid,
    model: StageModel,
    ex: StageExecutor,
    log: StepLog,
    mem: PeakMemory,
    job: Job,
    plan: Plan,
    start: int,
    result: RunResult,
) -> None:
    """Steps `start` up to the job's end: each logged, profiled if asked, saved when due."""
    cfg = job.cfg
    t_last = time.perf_counter()
    end = cfg.steps if job.run_steps is None else min(cfg.steps, start + job.run_steps)
    if job.save_dir and end == start:
        save_stage(grid, model, ex, job, plan, start)
    marker = StepMarker(job.status_dir, grid.rank)
    for k in range(start, end):
        marker.mark(k)
        fault_hook(job.fault, grid.rank, k, "step")
        if k == job.profile_step:
            with StepProfile() as prof:
                res = ex.step(k)
            result.profile = prof.finish(ex.wait_s)
        else:
            res = ex.step(k)
        # The step time is the period between step ends: it includes waiting for the
        # other stages, which the walk of one step alone may not.
        now = time.perf_counter()
        res.time_s, t_last = now - t_last, now
        result.step_times_s.append(res.time_s)
        log.push(res, mem.peak_bytes())
        cpu_allocator.trim()  # sizes this step no longer asked for go back
        if save_due(job, k):
            log.flush()  # no collective in flight while DCP runs its own
            save_stage(grid, model, ex, job, plan, k + 1)
            t_last, t_save = time.perf_counter(), t_last
            result.save_times_s.append(t_last - t_save)  # not part of a step's time
    log.flush()


def _barrier(grid: ParallelGrid) -> None:
    if grid.world_size > 1:
        dist.barrier()


def _gather_trace(grid: ParallelGrid, rec: Recorder, job: Job, kind: str) -> list[dict]:
    if not job.trace_steps:
        return []
    mine = rec.records() if grid.replica == 0 else []
    dst = _metrics_rank(grid)
    gathered: list | None = [None] * grid.world_size if grid.rank == dst else None
    if grid.world_size > 1:
        dist.gather_object(mine, gathered, dst=dst)
    else:
        gathered = [mine]
    if grid.rank != dst:
        return []
    records = [r for part in gathered for r in part]
    if job.trace_path:
        path = job.trace_path if len(job_variants(job)) == 1 else _suffixed(job.trace_path, kind)
        write_measured_trace(records, path, meta={"schedule": kind, "model": job.spec.name})
    return records


def _suffixed(path: str, kind: str) -> str:
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{kind}.{ext}" if dot else f"{path}.{kind}"
