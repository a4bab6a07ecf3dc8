"""A training job, built from parts: the model, the plan, the training config and the
data, then small frozen records for the rest.

    Job(spec, plan, cfg, source,
        launch=Launch(device="cpu"),            # how the ranks start and how long they run
        outputs=Outputs(metrics_path="m.jsonl"),  # what they write besides checkpoints
        checkpoints=CheckpointOpts(save_dir="ckpt", save_every=100),
        evaluation=EvalOpts(every=50, source=held_out),
        memory_cap=MemoryCap(2**30, "--memory-cap"),
        hooks=FaultHooks(fault="1:3"))             # RATRAIN_FAULT: rank 1 dies at step 3

`ratrain.train.request.TrainRequest` is made of the same records, so `ratrain train`
hands them on as they are. Pure Python (no torch): the CLI imports it before it knows
whether it will train."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ratrain.config import Plan, TrainConfig
from ratrain.models.spec import ModelSpec

if TYPE_CHECKING:
    from ratrain.data.base import TokenSource

__all__ = [
    "Launch",
    "Outputs",
    "CheckpointOpts",
    "EvalOpts",
    "MemoryCap",
    "FaultHooks",
    "Job",
    "job_variants",
]


@dataclass(frozen=True)
class Launch:
    """How the ranks start, where they run and how long."""

    device: str | None = None
    """cpu | cuda; None: cuda when available."""
    backend: str = "torch"
    """Kernel backend (`ratrain.kernels`)."""
    compile_units: bool = False
    """Run each block unit through `torch.compile` (`ratrain.runtime.compiled`)."""
    timeout_s: float | None = None
    """Rendezvous/collective timeout; None or 0: the launcher's default
    (`ratrain.launch.grid.DEFAULT_TIMEOUT_S`, 300 s)."""
    peer_timeout_s: float | None = None
    """A launched job's rank ends this long after a peer's heartbeat stopped or the store
    went out of reach (`ratrain.launch.peers`); None: `DEFAULT_PEER_TIMEOUT_S`, 30 s."""
    deadline_s: float = 24 * 3600.0
    """Locally spawned ranks are stopped after this long (`ratrain.launch.spawn`)."""
    pin_cores: bool = False
    """Pin each locally spawned rank to one core of this process's affinity set
    (`ratrain.train.job.cores_of`); ranks launched by torchrun or Slurm keep the launcher's
    placement."""
    host_allocator: str = "auto"
    """The ranks' malloc (`ratrain.launch.host_memory`): auto | tcmalloc | jemalloc |
    malloc; tcmalloc or jemalloc is preloaded into locally spawned ranks; `auto` takes the
    first found (`AUTO_ORDER`), else glibc's malloc. Ranks launched by torchrun/Slurm keep
    what they were started with (an explicit choice must match it)."""
    malloc_mmap_threshold_bytes: int = 0
    """> 0: each rank fixes glibc's mmap threshold to this (`ratrain.launch.host_memory`),
    so freed tensors go back to the OS (less RSS, more page faults); 0 leaves glibc's own
    dynamic threshold."""
    stop_on_signal: bool = False
    """SIGTERM/SIGINT stop the run cleanly: every rank finishes the same step and saves
    (with a save directory), `RunResult.stopped_by` says so; a second signal aborts
    (`ratrain train` sets it; off, a signal ends the job as it always did)."""
    run_steps: int | None = None
    """Steps to run now (None: up to `cfg.steps`); 0 with a save directory saves the
    starting state (e.g. HF weights as a checkpoint) and stops."""


@dataclass(frozen=True)
class Outputs:
    """What the job writes besides checkpoints, and what it measures."""

    metrics_path: str | None = None
    """Write per-step metrics as JSON lines here."""
    tensorboard_dir: str | None = None
    """Also log to TensorBoard here."""
    wandb_project: str | None = None
    """Also log to Weights & Biases, offline, as this project (files beside the metrics)."""
    progress: bool = True
    """Show the progress bar."""
    trace_path: str | None = None
    """Write the measured timeline of `trace_steps` (replica 0) here."""
    trace_steps: tuple[int, ...] = ()
    """The steps whose timeline is recorded (`RunResult.trace`)."""
    measure_memory: bool = False
    """CPU: count live tensor bytes (slower); CUDA always reports the allocator's peak."""
    profile_step: int | None = None
    """Profile this step on every rank (`ratrain.observe.profile`): `RunResult.profile`."""


@dataclass(frozen=True)
class CheckpointOpts:
    """Where the job's weights come from and where its checkpoints go."""

    save_dir: str | None = None
    """Write checkpoints here (`ratrain.checkpoint`)."""
    save_every: int | None = None
    """Steps between checkpoints (None: only at the end)."""
    keep: int | None = None
    """Keep only the newest `keep` checkpoints (None: all)."""
    resume_from: str | None = None
    """A complete checkpoint directory to continue from (resolved by the caller, e.g.
    `ratrain.checkpoint.hooks.resume_dir`)."""
    init_from: str | None = None
    """A Hugging Face directory (config.json + safetensors) to take the weights from."""


@dataclass(frozen=True)
class EvalOpts:
    """Evaluation on a held-out set (`ratrain.train.evaluation`)."""

    every: int | None = None
    """Evaluate after every `every` steps and after the last step (the step's record
    carries `eval_loss`); None: never."""
    source: Callable[[], TokenSource] | None = None
    """Builds the held-out token source on each rank (`held_out_source`)."""
    tokens: int | None = None
    """The held-out set's size in tokens (`eval_batches`); None: `EVAL_SEQUENCES`
    sequences."""
    only: bool = False
    """Evaluate the starting state (e.g. the checkpoint resumed from) once and train no
    step (`ratrain eval`): `RunResult.evals` holds the loss."""


@dataclass(frozen=True)
class MemoryCap:
    """Declared usable memory per rank: a plan whose ledger peak exceeds it is refused."""

    cap_bytes: int
    label: str = "the declared cap"
    """Where the cap came from, as the refusal names it (a flag, or the plan file's)."""


@dataclass(frozen=True)
class FaultHooks:
    """Where ranks report their step, and the fault the tests inject
    (`ratrain.launch.faults`)."""

    fault: str | None = None
    """The RATRAIN_FAULT test hook."""
    status_dir: str | None = None
    """Each rank writes the step it is on here (`ratrain.launch.faults.StepMarker`)."""


@dataclass(frozen=True)
class Job:
    """Everything a rank needs (picklable: the data sources come as factories)."""

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
    launch: Launch = Launch()
    outputs: Outputs = Outputs()
    checkpoints: CheckpointOpts = CheckpointOpts()
    evaluation: EvalOpts = EvalOpts()
    memory_cap: MemoryCap | None = None
    """None: no cap is declared, no plan is refused for its ledger peak."""
    hooks: FaultHooks = FaultHooks()


def job_variants(job: Job) -> list[tuple[str, dict]]:
    """The (name, plan overrides) runs of a job, in order."""
    if job.variants:
        return list(job.variants)
    return [(kind, {"schedule": kind}) for kind in job.schedules or (job.plan.schedule,)]
