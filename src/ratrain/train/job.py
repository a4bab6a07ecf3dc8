"""Distributed training: every rank runs its stage of the plan's schedule, step after step.

    results = run_job(Job(spec, plan, cfg, source))      # spawns pp*dp local ranks,
                                                         # or joins a torchrun/Slurm job

A `Job` is everything a rank needs (picklable: the data source comes as a factory). Each
rank builds its stage (`StageModel`), lowers the plan (`build_schedule`, checked by
`check_schedule`) and walks its list (`StageExecutor`). Several schedules can run one
after the other in one job (`Job.schedules`): `ratrain verify` runs Baseline-1F1B and
RATrain on the same ranks, each from the same initial weights.

Evaluation (`Job.eval_every`, `Job.eval_only`): the held-out set (`held_out_source`,
`eval_batches`) walked through the forward-only schedule (`build_eval_schedule`) by the
same executor (`StageExecutor.evaluate`) after the steps due and after the last one; the
step's record carries `eval_loss`, of the weights after that step (the checkpoint that
step saves).

Metrics: at the end of each step every rank contributes (peak tensor bytes, peak RSS,
step time, its microbatch losses) to one small all-gather, issued asynchronously and read
at the end of the next step, so bookkeeping makes a rank wait only for ranks more than a
step behind. The metrics rank (the stage that computes the loss, replica 0) turns it into the step's record: the
global-batch loss summed in the reference trainer's order (replica-major), lr, grad norm,
tokens/s, step time (the period between step ends), peak tensor bytes per rank (CUDA's
allocator, or `LiveBytes` with `measure_memory`; else null) and peak RSS per rank; it
writes the JSONL, TensorBoard and the progress bar (`ratrain.train.step_log`). The
`ratrain train` command's side (flags, launch, failures, summary) is
`ratrain.train.command`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from ratrain.checkpoint.hooks import (
    resume_stage,
    save_due,
    save_stage,
)
from ratrain.config import MAX_MICROBATCHES, Plan, TrainConfig
from ratrain.data.base import Batches, TokenSource
from ratrain.errors import RatrainError
from ratrain.launch.faults import (
    StepMarker,
    StopRequest,
    current_step,
    fault_hook,
    forget_stop_signals,
    signal_name,
    watch_stop_signals,
)
from ratrain.launch.grid import (
    DEFAULT_TIMEOUT_S,
    ParallelGrid,
    Rendezvous,
    device_kind,
    rendezvous_from_env,
)
from ratrain.launch.host_memory import (
    check_mmap_threshold,
    fix_mmap_threshold,
    resolve_host_allocator,
)
from ratrain.launch.spawn import check_local_launch, spawn
from ratrain.memory import replay
from ratrain.models.spec import ModelSpec
from ratrain.observe.memory import PeakMemory
from ratrain.observe.profile import StepProfile
from ratrain.observe.trace import Recorder, write_measured_trace
from ratrain.ranks import coords_of
from ratrain.runtime.comm import Comm
from ratrain.runtime.compiled import compile_stage
from ratrain.runtime.executor import StageExecutor
from ratrain.runtime.stage import StageModel, check_tied
from ratrain.schedule import Schedule, build_eval_schedule, build_schedule, check_schedule
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
    "check_cap",
    "check_local",
    "runtime_ledger",
    "held_out_source",
    "eval_batches",
    "EVAL_SEQUENCES",
]

EVAL_SEQUENCES = 32
"""The held-out set's default size, in sequences (`eval_batches`)."""
EVAL_INDEX_BASE = 1 << 40
"""The held-out set is sequences EVAL_INDEX_BASE + n of its source: indices no training
step reaches, so an evaluation on the training source itself (e.g. `--eval-data
synthetic`) does not score sequences the model was trained on."""


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
    host_allocator: str = "auto"
    """The ranks' malloc (`ratrain.launch.host_memory`): auto | tcmalloc | jemalloc |
    malloc; tcmalloc or jemalloc is preloaded into locally spawned ranks; `auto` takes the
    first found (`AUTO_ORDER`), else glibc's malloc. Ranks launched by torchrun/Slurm keep what they were
    started with (an explicit choice must match it)."""
    malloc_mmap_threshold_bytes: int = 0
    """> 0: each rank fixes glibc's mmap threshold to this (`ratrain.launch.host_memory`),
    so freed tensors go back to the OS (less RSS, more page faults); 0 leaves glibc's own
    dynamic threshold."""
    stop_on_signal: bool = False
    """SIGTERM/SIGINT stop the run cleanly: every rank finishes the same step and saves
    (with `save_dir`), `RunResult.stopped_by` says so; a second signal aborts (`ratrain
    train` sets it; off, a signal ends the job as it always did)."""
    eval_every: int | None = None
    """Evaluate on the held-out set (`eval_source`) after every `eval_every` steps and
    after the last step (the step's record carries `eval_loss`); None: never."""
    eval_source: Callable[[], TokenSource] | None = None
    """Builds the held-out token source on each rank (`held_out_source`)."""
    eval_tokens: int | None = None
    """The held-out set's size in tokens (`eval_batches`); None: `EVAL_SEQUENCES` sequences."""
    eval_only: bool = False
    """Evaluate the starting state (e.g. the checkpoint `resume_from`) once and train no
    step (`ratrain eval`): `RunResult.evals` holds the loss."""


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
    stopped_by: int = 0
    """The signal (SIGTERM, SIGINT) the run stopped on before its end; 0: not stopped."""
    stopped_at: int | None = None
    """The step a stopped run would have run next (its checkpoint's step with `--save`)."""
    evals: list[tuple[int, float]] = field(default_factory=list)
    """(steps taken, held-out loss) of each evaluation, on every rank (`Job.eval_every`)."""


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
    rdzv = rendezvous_from_env()
    allocator = resolve_host_allocator(
        job.host_allocator, job.malloc_mmap_threshold_bytes, launched=rdzv is not None
    )
    if job.compile_units and job.measure_memory and job.device != "cuda":
        # LiveBytes counts tensors through a dispatch mode; whether it sees every buffer of a
        # compiled graph is not established, so the two are not combined
        raise RatrainError(
            "--compile cannot be combined with --measure-memory on CPU: measure memory eagerly"
        )
    check_cap(job)
    if rdzv is not None:
        return [rank_main(rdzv, job)]
    check_local(job)
    return spawn(
        _local_rank_main,
        job.plan.pp * job.plan.dp,
        job,
        deadline_s=job.deadline_s,
        allocator_library=allocator.library,
        stop_signals=job.stop_on_signal,  # SIGTERM/SIGINT: a clean stop (`_train_steps`)
    )


def cores_of(rank: int, world: int, pp: int, cpus: list[int], layout: str = "pp-inner") -> set[int]:
    """The cores a local rank is pinned to (`Job.pin_cores`): an equal share each while
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
    if job.pin_cores and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        pp, layout = job.plan.pp, job.plan.rank_layout
        os.sched_setaffinity(0, cores_of(rdzv.rank, rdzv.world_size, pp, cpus, layout))
    return rank_main(rdzv, job)


def rank_main(rdzv: Rendezvous, job: Job) -> RankResult:
    # SIGTERM/SIGINT from here on ask for a clean stop: a locally spawned rank took them over
    # as it started; a torchrun/Slurm rank takes them here and aborts on a second one
    stop, mine = watch_stop_signals(_abort_line(rdzv.rank)) if job.stop_on_signal else (None, False)
    # before the rank's first tensor: blocks already in the heap stay there
    fix_mmap_threshold(job.malloc_mmap_threshold_bytes)
    grid = ParallelGrid.init(
        job.plan.pp,
        job.plan.dp,
        rdzv,
        device=job.device,
        timeout_s=job.timeout_s,
        layout=job.plan.rank_layout,
    )
    try:
        comm = Comm(grid)
        runs = {}
        for name, overrides in job_variants(job):
            plan = job.plan.replace(**overrides)
            runs[name] = train_schedule(grid, comm, job, name, plan, stop)
            if runs[name].stopped_by:
                break
        return RankResult(grid.rank, grid.stage, grid.replica, runs)
    finally:
        grid.destroy()
        if mine:
            forget_stop_signals()


def _abort_line(rank: int):
    """What a torchrun/Slurm rank says as a second signal aborts it."""

    def line(signum: int) -> str:
        step = current_step()
        at = f" at step {step}" if step is not None else ""
        return (
            f"ratrain train: rank {rank} aborted by a second {signal_name(signum)}{at}; a "
            "checkpoint being saved is not published (--resume auto takes the last complete one)"
        )

    return line


def check_local(job: Job) -> None:
    """RatrainError unless this machine can run the job's pp x dp ranks locally
    (`ratrain.launch.spawn.check_local_launch`): not too many for its CPUs, and the memory
    ledger's peaks summed over the ranks within its available memory."""
    plan = job.plan

    def tensor_bytes() -> int:
        ledger = runtime_ledger(job.spec, plan, job.device)
        return plan.dp * sum(m.peak_bytes for m in ledger.stages)

    check_local_launch(plan.pp * plan.dp, tensor_bytes, f"the plan (pp {plan.pp} x dp {plan.dp})")


def runtime_ledger(spec: ModelSpec, plan: Plan, device: str | None = "cpu"):
    """The ledger of `plan` as this runtime holds its memory on `device` (None: cuda when
    available, as `Job.device`): the torch model's eager kernels count what they keep, SEND
    buffers are held to the step's end (gloo's sends are; a polled NCCL send frees sooner),
    and on a CPU an OFFLOAD frees nothing (the host tier is the same memory: nothing
    moves)."""
    return replay(
        build_schedule(spec, plan),
        spec,
        plan,
        keep_trace=False,
        eager_kernels=True,
        sends_held=True,
        offload_frees=device_kind(device) == "cuda",
    )


def check_fits(
    spec: ModelSpec,
    plan: Plan,
    cap_bytes: int,
    label: str = "the declared cap",
    device: str | None = "cpu",
) -> None:
    """RatrainError unless every stage's ledger peak on `device` fits `cap_bytes`."""
    ledger = runtime_ledger(spec, plan, device)
    worst = max(ledger.stages, key=lambda m: m.peak_bytes)
    if worst.peak_bytes > cap_bytes:
        raise RatrainError(
            f"plan does not fit: stage {worst.stage} needs {worst.peak_bytes / 2**30:.3g} GiB "
            f"(memory ledger, {plan.schedule}), more than the {cap_bytes / 2**30:.3g} GiB of "
            f"{label}; use more stages, --recompute full, --shard-optimizer or a smaller "
            "--micro-batch (`ratrain plan` finds one that fits)"
        )


def check_cap(job: Job) -> None:
    """`check_fits` for each run of the job (`job_variants`) under its `--memory-cap`, if
    it has one, on its device."""
    if job.memory_cap_bytes is None:
        return
    for _, overrides in job_variants(job):
        plan = job.plan.replace(**overrides)
        check_fits(job.spec, plan, job.memory_cap_bytes, job.memory_cap_label, job.device)


def job_variants(job: Job) -> list[tuple[str, dict]]:
    """The (name, plan overrides) runs of a job, in order."""
    if job.variants:
        return list(job.variants)
    return [(kind, {"schedule": kind}) for kind in job.schedules or (job.plan.schedule,)]


def _metrics_rank(grid: ParallelGrid, plan: Plan) -> int:
    """Replica 0's rank of the stage that computes the loss (`Plan.head_stage`)."""
    return grid.rank_of(plan.head_stage(), 0)


def train_schedule(
    grid: ParallelGrid,
    comm: Comm,
    job: Job,
    kind: str,
    plan: Plan,
    stop: StopRequest | None = None,
) -> RunResult:
    """Train `job.cfg.steps` steps of `plan` (run name `kind`) from the initial weights;
    `stop`, the rank's stop signals: all ranks stop after the same step once one got one."""
    spec, cfg = job.spec, job.cfg
    schedule, batches = _lower(job, kind, plan)
    ev = _lower_eval(job, plan)
    is_metrics = grid.rank == _metrics_rank(grid, plan)
    result = RunResult(kind)
    with PeakMemory(grid.device, job.measure_memory) as mem:
        model, resumed = _build_stage(grid, job, plan, mem, result)
        _barrier(grid)
        rec = Recorder(grid.stage, grid.replica, time.perf_counter(), set(job.trace_steps))
        ex = StageExecutor(grid, comm, model, schedule, batches, spec, plan, cfg, rec)
        start = _restore(ex, resumed, plan)
        if ev is not None and job.eval_only:  # `ratrain eval`: the starting state, no step
            result.evals.append((start, ex.evaluate(*ev)))
            result.peak_bytes = mem.peak_bytes()
            return result
        log = (
            StepLog(grid, comm, plan, spec, job, kind, start)
            if is_metrics
            else StepLog(grid, comm, plan, spec)
        )
        try:
            _train_steps(grid, model, ex, log, mem, job, plan, start, result, stop, ev)
        finally:
            log.close()
        result.peak_bytes = mem.peak_bytes()
    result.losses = log.losses
    result.records = log.records
    result.trace = _gather_trace(grid, rec, job, kind, plan)
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


def held_out_source(
    kind_or_path: str,
    spec: ModelSpec,
    seq: int,
    seed: int = 0,
    *,
    tokenizer: str | None = None,
    dtype: str | None = None,
) -> TokenSource:
    """The held-out source `kind_or_path` names: a directory `ratrain prepare` wrote gives
    its val split; anything else `make_source` takes (synthetic, a text or token file)
    gives itself."""
    from ratrain.data import make_source
    from ratrain.data.prepare import prepared_source, read_manifest

    path = Path(kind_or_path)
    if kind_or_path == "synthetic" or not path.is_dir():
        return make_source(kind_or_path, spec, seq, seed, tokenizer=tokenizer, dtype=dtype)
    if "val" not in read_manifest(path)["splits"]:
        raise RatrainError(
            f"data: {kind_or_path!r} has no held-out (val) split to evaluate on; prepare it "
            "with --val-fraction or --val-tokens > 0, or pass --eval-data SOURCE"
        )
    return prepared_source(
        path, spec.vocab, seq, seed, split="val", tokenizer=tokenizer, dtype=dtype
    )


class _HeldOut(TokenSource):
    """Sequences `EVAL_INDEX_BASE` + n of `source` (see there)."""

    def __init__(self, source: TokenSource):
        self.source, self.name = source, source.name
        self.vocab, self.seq, self.seed = source.vocab, source.seq, source.seed

    def sequences(self, indices):
        return self.source.sequences([EVAL_INDEX_BASE + int(i) for i in indices])

    def describe(self) -> str:
        return self.source.describe()


def eval_batches(source: TokenSource, plan: Plan, tokens: int | None = None) -> Batches:
    """The held-out set of `source` as one step of `plan`'s replicas and microbatches: the
    first ceil(tokens / seq) sequences (default `EVAL_SEQUENCES`) of its held-out indices,
    rounded up to whole microbatches of every replica; the same sequences at every
    evaluation. Its step 0 in replica-major order is what the reference trainer reads."""
    if source.seq != plan.seq:
        raise RatrainError(f"data: held-out source has seq {source.seq}, the plan {plan.seq}")
    per = plan.dp * plan.micro_batch
    n = EVAL_SEQUENCES if tokens is None else -(-tokens // plan.seq)
    m = -(-n // per)
    if m > MAX_MICROBATCHES:
        raise RatrainError(
            f"--eval-tokens {tokens}: {m:,} microbatches per replica, more than the "
            f"{MAX_MICROBATCHES:,} a schedule holds; give at most "
            f"{MAX_MICROBATCHES * per * plan.seq:,}"
        )
    return Batches(_HeldOut(source), plan.micro_batch, m, plan.dp)


def _lower_eval(job: Job, plan: Plan) -> tuple[Schedule, Batches] | None:
    """The checked forward-only schedule of the job's evaluations and its held-out set;
    None when the job evaluates nothing."""
    if job.eval_source is None or not (job.eval_every or job.eval_only):
        return None
    batches = eval_batches(job.eval_source(), plan, job.eval_tokens)
    if batches.source.vocab > job.spec.vocab:
        raise RatrainError(
            f"held-out data vocab {batches.source.vocab} exceeds {job.spec.name}'s vocab "
            f"{job.spec.vocab}"
        )
    schedule = build_eval_schedule(job.spec, plan, batches.microbatches)
    check_schedule(schedule, job.spec, plan)
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
    stop: StopRequest | None = None,
    ev: tuple[Schedule, Batches] | None = None,
) -> None:
    """Steps `start` up to the job's end: each logged, profiled if asked, evaluated on `ev`
    (the eval schedule and held-out set) when due, saved when due; stopped early (and saved,
    with `--save`) once the step log shows a stop request."""
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
        if ev is not None and (k + 1 == end or (k + 1) % job.eval_every == 0):
            res.eval_loss = ex.evaluate(*ev)
            result.evals.append((k + 1, res.eval_loss))
            t_last = time.perf_counter()  # the evaluation is no part of the next step's time
        log.push(res, mem.peak_bytes(), stop.signum if stop is not None else 0)
        due = save_due(job, k)
        if due:
            t_last = _save(grid, model, ex, log, job, plan, k + 1, result)
        # Every rank has read the same tables by now (`StepLog`), so all stop after step k.
        if log.stop_signum and k + 1 < end:
            if job.save_dir and not due:
                _save(grid, model, ex, log, job, plan, k + 1, result)
            result.stopped_by, result.stopped_at = log.stop_signum, k + 1
            break
    log.flush()


def _save(grid, model, ex, log: StepLog, job: Job, plan: Plan, step: int, result: RunResult):
    """Checkpoint the state before `step`; the time it took goes to `result.save_times_s`
    (not to a step's time). Returns when it ended."""
    t0 = time.perf_counter()
    log.flush()  # no collective in flight while DCP runs its own
    save_stage(grid, model, ex, job, plan, step)
    t1 = time.perf_counter()
    result.save_times_s.append(t1 - t0)
    return t1


def _barrier(grid: ParallelGrid) -> None:
    if grid.world_size > 1:
        dist.barrier()


def _gather_trace(grid: ParallelGrid, rec: Recorder, job: Job, kind: str, plan: Plan) -> list[dict]:
    if not job.trace_steps:
        return []
    mine = rec.records() if grid.replica == 0 else []
    dst = _metrics_rank(grid, plan)
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
