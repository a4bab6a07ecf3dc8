"""The process grid: pp x dp ranks, their layout, validation and process groups.

Layout: the plan's `rank_layout` (`ratrain.ranks.rank_of`, the one definition the cost
model and the simulator use too). pp-inner, the default: `rank = replica * pp + stage`,
i.e. `arange(world).view(dp, pp)` (picotron's order): the stages of one pipeline replica
are neighbouring ranks, so the stage-to-stage links of a replica stay inside a node when a
node holds a whole pipeline, and each DP group (one per stage) strides across replicas.
dp-inner: `rank = stage * dp + replica` (Megatron-LM's order): a stage's DP group is
neighbouring ranks, inside a node when a node holds it, and the pipelines stride.

One `ParallelGrid` owns the degrees, the rank's coordinates and every process group; the
executor and the trainer receive it explicitly (no global state besides torch.distributed's
default group, which `ParallelGrid.init` creates and `destroy` tears down).

Rendezvous comes from the environment: torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT, or Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (with
MASTER_ADDR / MASTER_PORT exported by the job script). `ratrain train --nproc N` spawns its
own local ranks (see `ratrain.launch.spawn`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ratrain.errors import RatrainError
from ratrain.ranks import RANK_LAYOUTS, coords_of, rank_of

__all__ = [
    "Rendezvous",
    "ParallelGrid",
    "rank_layout",
    "rendezvous_from_env",
    "DEFAULT_TIMEOUT_S",
    "SHARE_DEVICE_ENV",
    "check_cuda",
    "device_kind",
]

DEFAULT_TIMEOUT_S = 300.0
"""Rendezvous and collective timeout: a missing or stuck rank fails the job instead of
hanging it (torch's own default is 30 minutes). It bounds every single wait, so it must
exceed the longest legitimate one: a stage waiting a pipeline's fill or drain."""


def rank_layout(pp: int, dp: int, layout: str = "pp-inner") -> list[list[int]]:
    """mesh[replica][stage] -> global rank under `layout` (`ratrain.ranks.rank_of`;
    pp-inner: `arange(pp * dp).view(dp, pp)`)."""
    return [[rank_of(s, r, pp, dp, layout) for s in range(pp)] for r in range(dp)]


@dataclass(frozen=True)
class Rendezvous:
    """Where this process sits in the job and how to find the others."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"


def _env_int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise RatrainError(f"environment: {key}={env[key]!r} is not an integer") from None


def rendezvous_from_env(env: Mapping[str, str] | None = None) -> Rendezvous | None:
    """The rendezvous of a launched job (torchrun or Slurm), or None outside one."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
        local = _env_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = _env_int(env, "SLURM_PROCID"), _env_int(env, "SLURM_NTASKS")
        local = _env_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else rank
    else:
        return None
    if world < 1 or not 0 <= rank < world:
        raise RatrainError(f"environment: rank {rank} is outside a world of {world} processes")
    addr = env.get("MASTER_ADDR")
    if not addr and world > 1:
        raise RatrainError(
            "environment: MASTER_ADDR is not set; export the address of rank 0 "
            "(torchrun sets it; in Slurm scripts use the first host of $SLURM_JOB_NODELIST)"
        )
    port = _env_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500
    return Rendezvous(rank, world, local, addr or "127.0.0.1", port)


def device_kind(device: str | None) -> str:
    """`Launch.device` resolved: None is cuda when a CUDA device is visible, else cpu."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


SHARE_DEVICE_ENV = "RATRAIN_SHARE_DEVICE"
"""Set to 1, local ranks beyond the visible CUDA devices share them (local rank i on device
i mod n) instead of being refused: for `benchmarks/gpu_check.py`'s probe of two ranks on
one GPU. NCCL usually refuses it ("Duplicate GPU detected")."""


def check_cuda(local_ranks: int = 1, world_size: int = 1) -> None:
    """RatrainError (one line) unless `local_ranks` ranks of a `world_size` job can run on
    CUDA here: a device visible, NCCL built into torch (the backend on CUDA), and one device
    per local rank (NCCL runs one rank per device). Asks the driver (cuInit); the ranks of a
    local launch come from a fork server started by exec, which that does not poison."""
    if not torch.cuda.is_available():
        raise RatrainError("device cuda requested but no CUDA device is visible; use --device cpu")
    if not dist.is_nccl_available():
        raise RatrainError(
            f"device cuda needs NCCL for its {world_size} rank(s), and this torch build has none "
            "(torch.distributed.is_nccl_available() is False); install a CUDA build of torch "
            "or use --device cpu"
        )
    n = torch.cuda.device_count()
    if local_ranks > n and os.environ.get(SHARE_DEVICE_ENV) != "1":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise RatrainError(
            f"{local_ranks} ranks on this node need {local_ranks} CUDA devices (NCCL runs one "
            f"rank per device), and {n} {'is' if n == 1 else 'are'} visible{shown}; launch at "
            f"most {n} ranks per node (pp x dp, or torchrun --nproc-per-node) or use --device cpu"
        )


def _pick_device(local_rank: int, device: str | None, world_size: int = 1) -> torch.device:
    """This rank's device: cuda:<local rank> on CUDA (after `check_cuda`), else `device`."""
    device = device_kind(device)
    if device == "cuda":
        check_cuda(local_rank + 1, world_size)
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(device)


class ParallelGrid:
    """pp x dp ranks; this rank's (stage, replica); the DP groups and neighbours."""

    def __init__(
        self,
        pp: int,
        dp: int,
        rank: int,
        world_size: int,
        device: torch.device,
        layout: str = "pp-inner",
    ):
        if layout not in RANK_LAYOUTS:
            raise RatrainError(
                f"rank layout must be one of {', '.join(RANK_LAYOUTS)}, got {layout!r}"
            )
        if pp * dp != world_size:
            raise RatrainError(
                f"world size {world_size} != pp x dp = {pp} x {dp} = {pp * dp}; "
                f"launch {pp * dp} processes or change --pp/--dp"
            )
        assert 0 <= rank < world_size, (rank, world_size)
        self.pp, self.dp, self.rank, self.world_size = pp, dp, rank, world_size
        self.device = device
        self.layout = layout
        self.mesh = rank_layout(pp, dp, layout)
        self.stage, self.replica = coords_of(rank, pp, dp, layout)
        self.dp_group: dist.ProcessGroup | None = None
        self.pp_group: dist.ProcessGroup | None = None
        """This replica's pipeline (its stages' ranks); the executor's p2p needs no group,
        torch.distributed.pipelining does."""
        self.p2p_groups: dict[tuple[int, int], dist.ProcessGroup] = {}
        """NCCL only: (sender, receiver) -> a two-rank group that carries that direction's
        stage-to-stage messages alone (`_build_groups`); empty on gloo."""
        self._owns_default_group = False

    # -- coordinates ----------------------------------------------------------------------
    def rank_of(self, stage: int, replica: int | None = None) -> int:
        return self.mesh[self.replica if replica is None else replica][stage]

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.pp - 1

    @property
    def prev_rank(self) -> int | None:
        return None if self.is_first_stage else self.rank_of(self.stage - 1)

    @property
    def next_rank(self) -> int | None:
        return None if self.is_last_stage else self.rank_of(self.stage + 1)

    @property
    def dp_ranks(self) -> list[int]:
        return [self.mesh[r][self.stage] for r in range(self.dp)]

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def __repr__(self) -> str:
        return (
            f"ParallelGrid(pp={self.pp}, dp={self.dp}, rank={self.rank}, stage={self.stage}, "
            f"replica={self.replica}, layout={self.layout}, device={self.device})"
        )

    # -- process groups -------------------------------------------------------------------
    @classmethod
    def init(
        cls,
        pp: int,
        dp: int,
        rdzv: Rendezvous,
        *,
        device: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        layout: str = "pp-inner",
    ) -> ParallelGrid:
        """Join the job's default group (rendezvous) and build the DP and pipeline groups,
        ranks placed by `layout` (a plan's `rank_layout`)."""
        dev = _pick_device(rdzv.local_rank, device, rdzv.world_size)
        grid = cls(pp, dp, rdzv.rank, rdzv.world_size, dev, layout)  # validates first
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            _init_default_group(grid.backend, rdzv, timeout_s, dev)
            grid._owns_default_group = True
        grid._build_groups(timeout_s)
        return grid

    def _build_groups(self, timeout_s: float) -> None:
        # Every rank creates every group, in the same order (torch.distributed requires it):
        # stage by stage, then replica by replica, whatever the layout.
        timeout = datetime.timedelta(seconds=timeout_s)
        for s in range(self.pp):
            ranks = [self.mesh[r][s] for r in range(self.dp)]
            group = dist.new_group(ranks, timeout=timeout) if self.dp > 1 else None
            if s == self.stage:
                self.dp_group = group
        for r in range(self.dp):
            group = dist.new_group(self.mesh[r], timeout=timeout) if self.pp > 1 else None
            if r == self.replica:
                self.pp_group = group
        if self.backend == "nccl":
            self._build_p2p_groups(timeout)

    def _build_p2p_groups(self, timeout: datetime.timedelta) -> None:
        """One group per direction between neighbouring stages, on NCCL. NCCL ignores tags:
        it matches a pair's sends and receives in issue order, and torch runs all of a
        pair's point-to-point operations on one communicator and one CUDA stream, in issue
        order. 1F1B's walk issues, on stage 0, SEND_F(1) before RECV_B(0) while stage 1
        issues SEND_B(0) before RECV_F(1): on one stream each send waits for a receive queued
        behind the other rank's send (a hang once a message outgrows NCCL's buffers). With a
        communicator per direction, each carries one rank's sends and the other's receives,
        both in the schedule's order, and the two directions never wait for each other.
        (gloo matches by tag and never blocks the issuing thread, so it keeps the default
        group.)"""
        for r in range(self.dp):
            for s in range(self.pp - 1):
                a, b = self.mesh[r][s], self.mesh[r][s + 1]
                for pair in ((a, b), (b, a)):
                    group = dist.new_group([a, b], timeout=timeout)  # every rank, same order
                    if self.rank in pair:
                        self.p2p_groups[pair] = group

    def p2p_group(self, src: int, dst: int) -> dist.ProcessGroup | None:
        """The group of messages from rank `src` to rank `dst` (None: the default group)."""
        return self.p2p_groups.get((src, dst))

    def destroy(self) -> None:
        if self._owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_default_group = False


@contextlib.contextmanager
def _cpp_logs_silenced():
    """Mute file descriptor 2 while the rendezvous runs: c10d logs every failed connection
    attempt with a C++ stack trace, and a failure is reported below in one line anyway."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _init_default_group(
    backend: str, rdzv: Rendezvous, timeout_s: float, device: torch.device | None = None
) -> None:
    # On CUDA the group is bound to this rank's device (`device_id`, torch's documented way):
    # NCCL's communicator forms here, so its errors come now and in one line, sub-groups are
    # split from it, and a barrier knows its device. gloo (CPU) is left as it always was.
    bound = {"device_id": device} if device is not None and device.type == "cuda" else {}
    try:
        with _cpp_logs_silenced():
            timeout = datetime.timedelta(seconds=timeout_s)
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
            if attempt is None:
                dist.init_process_group(
                    backend,
                    init_method=rdzv.init_method,
                    rank=rdzv.rank,
                    world_size=rdzv.world_size,
                    timeout=timeout,
                    **bound,
                )
            else:
                # torchrun keeps one store across restarts: without a per-attempt prefix a
                # restarted rank can read a dead rank's address from the previous attempt.
                url = f"{rdzv.init_method}?rank={rdzv.rank}&world_size={rdzv.world_size}"
                store, _, _ = next(dist.rendezvous(url, timeout=timeout))
                dist.init_process_group(
                    backend,
                    store=dist.PrefixStore(f"ratrain/attempt{attempt}", store),
                    rank=rdzv.rank,
                    world_size=rdzv.world_size,
                    timeout=timeout,
                    **bound,
                )
    except (dist.DistError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        if backend == "nccl" and "nccl" in str(e).lower():
            raise RatrainError(
                f"NCCL could not start rank {rdzv.rank} of {rdzv.world_size} on {device} "
                f"({first}); NCCL needs one CUDA device per rank (NCCL_DEBUG=INFO says more)"
            ) from None
        raise RatrainError(
            f"rendezvous at {rdzv.master_addr}:{rdzv.master_port} failed for rank {rdzv.rank} of "
            f"{rdzv.world_size} within {timeout_s:g} s ({first}); check MASTER_ADDR/MASTER_PORT and "
            "that every rank was started"
        ) from None
