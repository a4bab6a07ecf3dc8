"""Save and load a distributed run's state with `torch.distributed.checkpoint` (DCP).

Every rank writes its own stage's tensors (keyed by global parameter names, see
`ratrain.checkpoint.state`) into a temporary directory; after a barrier the coordinator
(rank 0) writes `ratrain.json` (step, optimizer step count, loss scaler, LR schedule, data
position, plan, model spec), renames the directory to `step-NNNNNNNN` and then replaces
`latest`. A rank killed at any point before the rename leaves only a `.tmp-*` directory,
which is never loaded and is removed by the next save.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ratrain.checkpoint import layout
from ratrain.checkpoint.state import StageIO
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.launch.faults import JobFailed, fault_hook
from ratrain.models.spec import ModelSpec

__all__ = ["save_checkpoint", "load_checkpoint", "check_compatible", "dcp_error_line", "FORMAT"]

FORMAT = "ratrain-dcp-1"


def dcp_error_line(e: BaseException) -> str:
    """One line for a DCP failure: a CheckpointException's text holds each failing rank's
    traceback; its last line is the underlying error."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    return (lines[-1] if lines else type(e).__name__)[:200]


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def save_checkpoint(
    save_dir: str | Path,
    *,
    next_step: int,
    grid,
    model,
    executor,
    spec: ModelSpec,
    plan: Plan,
    cfg: TrainConfig,
    data: dict,
    keep: int | None = None,
    fault: str | None = None,
) -> Path:
    """Collective: every rank of the job calls it after step `next_step - 1`."""
    t0 = time.perf_counter()
    root = Path(save_dir)
    tmp, final = root / layout.tmp_dir_name(next_step), root / layout.step_dir_name(next_step)
    if grid.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        layout.clear_stale_tmp(root)
        tmp.mkdir()
    _barrier(grid.world_size)
    state = StageIO(model, grid.dp_group).tensors()
    state[f"rng/rank{grid.rank}"] = torch.get_rng_state()
    try:
        dcp.save(state, checkpoint_id=str(tmp))
    except (Exception, CheckpointException) as e:  # the latter is a BaseException
        raise JobFailed(
            f"saving checkpoint {final} failed ({dcp_error_line(e)}); earlier checkpoints "
            "are intact"
        ) from None
    fault_hook(fault, grid.rank, next_step, "save")
    _barrier(grid.world_size)  # every rank's files are on disk before the rename
    if grid.rank == 0:
        meta = {
            "format": FORMAT,
            "step": next_step,
            "optimizer_updates": executor.updates,
            "loss_scaler": executor.scaler.state_dict(),
            "lr_schedule": {k: v for k, v in asdict(cfg).items() if k != "extra"},
            "data": {**data, "next_sequence": next_step * plan.global_batch},
            "plan": plan.to_dict(),
            "model": spec.to_dict(),
            "world_size": grid.world_size,
            "saved_at_unix_s": time.time(),
            "save_time_s": time.perf_counter() - t0,
        }
        layout.publish(tmp, final, meta)
        layout.prune(root, keep)
    _barrier(grid.world_size)  # on return the checkpoint is published, on every rank
    return final


def check_compatible(meta: dict, ckpt: Path, spec: ModelSpec, plan: Plan) -> None:
    """One-line errors for a checkpoint that cannot continue this run."""
    try:
        saved = ModelSpec.from_dict(meta["model"])
    except (KeyError, TypeError, RatrainError) as e:
        raise RatrainError(f"checkpoint {str(ckpt)!r}: unreadable model spec ({e})") from None
    if saved != spec:
        diff = [k for k, v in spec.to_dict().items() if saved.to_dict().get(k) != v]
        raise RatrainError(
            f"checkpoint {str(ckpt)!r} is of model {saved.name!r}, not {spec.name!r} "
            f"(differs in {', '.join(diff)}); pass the model it was trained with"
        )
    p = meta.get("plan", {})
    for f in ("global_batch", "seq"):
        if p.get(f) != getattr(plan, f):
            raise RatrainError(
                f"checkpoint {str(ckpt)!r} was trained with {f.replace('_', '-')} {p.get(f)}, "
                f"this run has {getattr(plan, f)}; resuming needs the same batch shape"
            )


def load_checkpoint(ckpt: str | Path, *, grid, model, spec: ModelSpec, plan: Plan) -> dict:
    """Collective: fill this rank's stage from `ckpt` (any plan's checkpoint of the same
    model); returns the checkpoint's metadata (step, optimizer_updates, loss_scaler...)."""
    ckpt = Path(ckpt)
    meta = layout.read_meta(ckpt)
    check_compatible(meta, ckpt, spec, plan)
    io = StageIO(model, grid.dp_group)
    # Unsharded on the CPU, DCP reads straight into the masters and moments; otherwise into
    # full-shape buffers that are then sliced (sharded) or copied to the device.
    in_place = not model.sharded and model.device.type == "cpu"
    state = io.tensors() if in_place else io.empty()
    same_world = meta.get("world_size") == grid.world_size
    if same_world:
        state[f"rng/rank{grid.rank}"] = torch.get_rng_state()
    try:
        dcp.load(state, checkpoint_id=str(ckpt))
    except (Exception, CheckpointException) as e:  # a BaseException, per rank
        raise RatrainError(
            f"checkpoint {str(ckpt)!r} is corrupt or incomplete ({dcp_error_line(e)})"
        ) from None
    if in_place:
        io.refresh_views()
    else:
        io.apply(state)
    if same_world:
        torch.set_rng_state(state[f"rng/rank{grid.rank}"])
    return meta
