"""One rank of a job: its stage of the plan's schedule, step after step, for each run of the
job (`job_variants`), each from the same initial weights.

The rank builds its stage (`StageModel`), lowers the plan (`build_schedule`, checked by
`check_schedule`) and walks its list (`StageExecutor`). Evaluation (`EvalOpts`): the
held-out set (`eval_batches`) walked through the forward-only schedule
(`build_eval_schedule`) by the same executor (`StageExecutor.evaluate`) after the steps due
and after the last one; the step's record carries `eval_loss`, of the weights after that
step (the checkpoint that step saves).

Metrics: at the end of each step every rank contributes (peak tensor bytes, peak RSS, step
time, its microbatch losses) to one small all-gather, issued asynchronously and read at the
end of the next step, so bookkeeping makes a rank wait only for ranks more than a step
behind. The metrics rank (the stage that computes the loss, replica 0) turns it into the
step's record: the global-batch loss summed in the reference trainer's order
(replica-major), lr, grad norm, tokens/s, step time (the period between step ends), peak
tensor bytes per rank (CUDA's allocator, or `LiveBytes` with `measure_memory`; else null)
and peak RSS per rank; it writes the JSONL, TensorBoard and the progress bar
(`ratrain.train.step_log`)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from ratrain.checkpoint.hooks import resume_stage, save_due, save_stage
from ratrain.config import Plan
from ratrain.data.base import Batches
from ratrain.errors import RatrainError
from ratrain.launch.faults import (
    JobFailed,
    PeerLost,
    StepMarker,
    StopRequest,
    current_step,
    fault_hook,
    forget_stop_signals,
    signal_name,
    watch_stop_signals,
)
from ratrain.launch.grid import DEFAULT_TIMEOUT_S, ParallelGrid, Rendezvous, rendezvous_from_env
from ratrain.launch.host_memory import fix_mmap_threshold
from ratrain.launch.peers import DEFAULT_PEER_TIMEOUT_S, PeerWatch
from ratrain.observe.memory import PeakMemory
from ratrain.observe.profile import StepProfile
from ratrain.observe.trace import Recorder, write_measured_trace
from ratrain.runtime.comm import Comm
from ratrain.runtime.compiled import compile_stage
from ratrain.runtime.executor import StageExecutor
from ratrain.runtime.stage import StageModel
from ratrain.schedule import Schedule, build_eval_schedule, build_schedule, check_schedule
from ratrain.train.evaluation import eval_batches
from ratrain.train.parts import Job, job_variants
from ratrain.train.step_log import StepLog

__all__ = ["RunResult", "RankResult", "rank_main", "train_schedule"]


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
    """This rank's time per bucket in `Outputs.profile_step` (`ratrain.observe.profile`)."""
    compile_s: float = 0.0
    """Time this rank spent compiling and warming up its units, before the first step."""
    save_times_s: list[float] = field(default_factory=list)
    """This rank's wall time in each checkpoint save (not part of `step_times_s`)."""
    stopped_by: int = 0
    """The signal (SIGTERM, SIGINT) the run stopped on before its end; 0: not stopped."""
    stopped_at: int | None = None
    """The step a stopped run would have run next (its checkpoint's step with `--save`)."""
    evals: list[tuple[int, float]] = field(default_factory=list)
    """(steps taken, held-out loss) of each evaluation, on every rank (`EvalOpts.every`)."""


@dataclass
class RankResult:
    rank: int
    stage: int
    replica: int
    runs: dict[str, RunResult]


def rank_main(rdzv: Rendezvous, job: Job) -> RankResult:
    """This process as rank `rdzv.rank` of `job`: every run of the job in turn, stopped
    after a run that a stop signal ended."""
    # SIGTERM/SIGINT from here on ask for a clean stop: a locally spawned rank took them over
    # as it started; a torchrun/Slurm rank takes them here and aborts on a second one
    launch = job.launch
    stop, mine = (
        watch_stop_signals(_abort_line(rdzv.rank)) if launch.stop_on_signal else (None, False)
    )
    # before the rank's first tensor: blocks already in the heap stay there
    fix_mmap_threshold(launch.malloc_mmap_threshold_bytes)
    grid = ParallelGrid.init(
        job.plan.pp,
        job.plan.dp,
        rdzv,
        device=launch.device,
        timeout_s=launch.timeout_s or DEFAULT_TIMEOUT_S,
        layout=job.plan.rank_layout,
    )
    watch = None
    try:
        watch = _watch_peers(rdzv, job)
        comm = Comm(grid)
        runs = {}
        for name, overrides in job_variants(job):
            plan = job.plan.replace(**overrides)
            runs[name] = train_schedule(grid, comm, job, name, plan, stop)
            if runs[name].stopped_by:
                break
        return RankResult(grid.rank, grid.stage, grid.replica, runs)
    except Exception as e:
        # a failed collective (or a save that failed in one): the heartbeat names the peers
        # lost, the cause; a user's mistake stays what it is
        mistake = isinstance(e, RatrainError) and not isinstance(e, JobFailed)
        if watch is not None and not mistake and watch.claim():
            cause = watch.suspects(str(e))
            if cause is not None:
                during = " during a checkpoint save" if isinstance(e, JobFailed) else ""
                raise PeerLost(cause + during) from e
        raise
    finally:
        if watch is not None:
            watch.leave()
        grid.destroy()
        if mine:
            forget_stop_signals()


def _watch_peers(rdzv: Rendezvous, job: Job) -> PeerWatch | None:
    """The heartbeat watch of a rank of a launched multi-rank job (torchrun, Slurm; a local
    launch has its launcher watch its ranks)."""
    if rdzv.world_size < 2 or rendezvous_from_env() is None:
        return None
    lost_after_s = job.launch.peer_timeout_s or DEFAULT_PEER_TIMEOUT_S
    save_dir = job.checkpoints.save_dir

    def report(cause: str) -> None:
        from ratrain.train.failures import failure_message

        command = sys.argv[1] if len(sys.argv) > 1 else "train"
        line = failure_message(rdzv.rank, cause, current_step(), save_dir)
        os.write(sys.stderr.fileno(), f"ratrain {command}: error: {line}\n".encode())

    try:
        watch = PeerWatch.connect(
            rdzv.master_addr, rdzv.master_port, rdzv.rank, rdzv.world_size, lost_after_s, report
        )
        return watch.start()
    except Exception as e:  # the job runs on, bounded by --timeout alone
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        said = f"rank {rdzv.rank} has no heartbeat watch ({first}); a lost peer is found by "
        print(f"ratrain: note: {said}the collective timeout (--timeout) alone", file=sys.stderr)
        return None


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
    with PeakMemory(grid.device, job.outputs.measure_memory) as mem:
        model, resumed = _build_stage(grid, job, plan, mem, result)
        _barrier(grid)
        rec = Recorder(grid.stage, grid.replica, time.perf_counter(), set(job.outputs.trace_steps))
        ex = StageExecutor(grid, comm, model, schedule, batches, spec, plan, cfg, rec)
        start = _restore(ex, resumed, plan)
        if ev is not None and job.evaluation.only:  # `ratrain eval`: the starting state, no step
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


def _lower_eval(job: Job, plan: Plan) -> tuple[Schedule, Batches] | None:
    """The checked forward-only schedule of the job's evaluations and its held-out set;
    None when the job evaluates nothing."""
    opts = job.evaluation
    if opts.source is None or not (opts.every or opts.only):
        return None
    batches = eval_batches(opts.source(), plan, opts.tokens)
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
    spec, backend = job.spec, job.launch.backend
    model = StageModel(spec, plan, job.cfg, grid.stage, grid.replica, grid.device, backend)
    mem.track(model.state_tensors())
    resumed = resume_stage(grid, model, job, plan) if job.checkpoints.resume_from else None
    if job.checkpoints.init_from and resumed is None:
        from ratrain.checkpoint.hf import load_stage_from_hf

        load_stage_from_hf(model, job.checkpoints.init_from)
    if job.launch.compile_units:
        result.compile_s = compile_stage(
            model.modules(),
            {u: plan.recompute_of(spec, grid.stage, u) for u in model.unit_ids},
            backend,
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
    cfg, run_steps = job.cfg, job.launch.run_steps
    t_last = time.perf_counter()
    end = cfg.steps if run_steps is None else min(cfg.steps, start + run_steps)
    if job.checkpoints.save_dir and end == start:
        save_stage(grid, model, ex, job, plan, start)
    marker = StepMarker(job.hooks.status_dir, grid.rank)
    for k in range(start, end):
        marker.mark(k)
        fault_hook(job.hooks.fault, grid.rank, k, "step")
        if k == job.outputs.profile_step:
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
        if ev is not None and (k + 1 == end or (k + 1) % job.evaluation.every == 0):
            res.eval_loss = ex.evaluate(*ev)
            result.evals.append((k + 1, res.eval_loss))
            t_last = time.perf_counter()  # the evaluation is no part of the next step's time
        log.push(res, mem.peak_bytes(), stop.signum if stop is not None else 0)
        due = save_due(job, k)
        if due:
            t_last = _save(grid, model, ex, log, job, plan, k + 1, result)
        # Every rank has read the same tables by now (`StepLog`), so all stop after step k.
        if log.stop_signum and k + 1 < end:
            if job.checkpoints.save_dir and not due:
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
    """The recorded actions of every stage's replica 0 on the metrics rank (written to the
    job's trace file, suffixed with the run's name when the job has several runs); [] on
    the other ranks and when no step is traced."""
    if not job.outputs.trace_steps:
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
    path = job.outputs.trace_path
    if path:
        path = path if len(job_variants(job)) == 1 else _suffixed(path, kind)
        write_measured_trace(records, path, meta={"schedule": kind, "model": job.spec.name})
    return records


def _suffixed(path: str, kind: str) -> str:
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{kind}.{ext}" if dot else f"{path}.{kind}"
