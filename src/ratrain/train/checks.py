"""The checks a job passes once, before any rank starts (`check_job`): the plan against the
model, the flags that cannot go together, the host allocator, whether this machine can run
the ranks locally, and the memory cap. Each run's memory ledger is replayed at most once
for all of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.launch.grid import Rendezvous, check_cuda, device_kind, rendezvous_from_env
from ratrain.launch.host_memory import HostAllocator, check_mmap_threshold, resolve_host_allocator
from ratrain.launch.spawn import check_local_launch
from ratrain.memory import replay
from ratrain.models.spec import ModelSpec
from ratrain.runtime.stage import check_tied
from ratrain.schedule import build_schedule
from ratrain.train.parts import Job, job_variants

__all__ = [
    "CheckedJob",
    "check_job",
    "check_local",
    "check_cap",
    "check_fits",
    "runtime_ledger",
]


@dataclass(frozen=True)
class CheckedJob:
    """A job that passed `check_job`, with what the checks found out: the rendezvous of a
    torchrun/Slurm launch (None: ranks are spawned here) and the ranks' host allocator.
    `ratrain.train.job.run_job` launches it without checking it again."""

    job: Job
    rdzv: Rendezvous | None
    allocator: HostAllocator


def check_job(job: Job) -> CheckedJob:
    """RatrainError (one line) unless `job` can start: its plan fits its model
    (`Plan.check_for`, `check_tied`), its flags go together, its host allocator is there,
    this machine can run its ranks (`check_local`, unless torchrun/Slurm launched this
    process) and each of its runs fits its memory cap (`check_cap`)."""
    spec, plan, launch = job.spec, job.plan, job.launch
    plan.check_for(spec)
    check_tied(spec, plan)
    check_mmap_threshold(launch.malloc_mmap_threshold_bytes)
    if launch.compile_units and job.outputs.measure_memory and launch.device != "cuda":
        # LiveBytes counts tensors through a dispatch mode; whether it sees every buffer of a
        # compiled graph is not established, so the two are not combined
        raise RatrainError(
            "--compile cannot be combined with --measure-memory on CPU: measure memory eagerly"
        )
    rdzv = rendezvous_from_env()
    allocator = resolve_host_allocator(
        launch.host_allocator, launch.malloc_mmap_threshold_bytes, launched=rdzv is not None
    )
    ledger = _ledgers(spec, launch.device)
    if rdzv is None:
        check_local(job, ledger)
    check_cap(job, ledger)
    return CheckedJob(job, rdzv, allocator)


def _ledgers(spec: ModelSpec, device: str | None) -> Callable[[Plan], object]:
    """`runtime_ledger` of `spec` on `device`, replayed once per plan however often asked."""
    seen: dict[Plan, object] = {}

    def ledger(plan: Plan):
        if plan not in seen:
            seen[plan] = runtime_ledger(spec, plan, device)
        return seen[plan]

    return ledger


def check_local(job: Job, ledger: Callable[[Plan], object] | None = None) -> None:
    """RatrainError unless this machine can run the job's pp x dp ranks locally
    (`ratrain.launch.spawn.check_local_launch`): not too many for its CPUs, and the memory
    ledger's peaks summed over the ranks within its available memory; on CUDA instead a
    device per rank and NCCL (`ratrain.launch.grid.check_cuda`). `ledger`: the
    ledger of a plan (default: `runtime_ledger` on the job's device)."""
    plan = job.plan
    ledger = ledger or _ledgers(job.spec, job.launch.device)
    ranks, what = plan.pp * plan.dp, f"the plan (pp {plan.pp} x dp {plan.dp})"
    if device_kind(job.launch.device) == "cuda":
        # The tensors live on the devices, one per rank: not in this machine's memory.
        check_local_launch(ranks, None, what)
        check_cuda(ranks, ranks)
        return

    def tensor_bytes() -> int:
        return plan.dp * sum(m.peak_bytes for m in ledger(plan).stages)

    check_local_launch(ranks, tensor_bytes, what)


def runtime_ledger(spec: ModelSpec, plan: Plan, device: str | None = "cpu"):
    """The ledger of `plan` as this runtime holds its memory on `device` (None: cuda when
    available, as `Launch.device`): the torch model's eager kernels count what they keep,
    SEND buffers are held to the step's end (gloo's sends are; a polled NCCL send frees
    sooner), and on a CPU an OFFLOAD frees nothing (the host tier is the same memory:
    nothing moves)."""
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
    *,
    ledger=None,
) -> None:
    """RatrainError unless every stage's ledger peak on `device` fits `cap_bytes`.
    `ledger`: the plan's `runtime_ledger`, when it was replayed already."""
    ledger = ledger or runtime_ledger(spec, plan, device)
    worst = max(ledger.stages, key=lambda m: m.peak_bytes)
    if worst.peak_bytes > cap_bytes:
        raise RatrainError(
            f"plan does not fit: stage {worst.stage} needs {worst.peak_bytes / 2**30:.3g} GiB "
            f"(memory ledger, {plan.schedule}), more than the {cap_bytes / 2**30:.3g} GiB of "
            f"{label}; use more stages, --recompute full, --shard-optimizer or a smaller "
            "--micro-batch (`ratrain plan` finds one that fits)"
        )


def check_cap(job: Job, ledger: Callable[[Plan], object] | None = None) -> None:
    """`check_fits` for each run of the job (`job_variants`) under its memory cap, if it
    has one, on its device. `ledger`: as in `check_local`."""
    cap = job.memory_cap
    if cap is None:
        return
    ledger = ledger or _ledgers(job.spec, job.launch.device)
    for _, overrides in job_variants(job):
        plan = job.plan.replace(**overrides)
        check_fits(job.spec, plan, cap.cap_bytes, cap.label, job.launch.device, ledger=ledger(plan))
