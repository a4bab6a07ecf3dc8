"""Save and load a distributed run's state with `torch.distributed.checkpoint` (DCP).

Every rank writes its own stage's tensors (keyed by global parameter names, see
`ratrain.checkpoint.state`) into a temporary directory; after a barrier the coordinator
(rank 0) writes `ratrain.json` (step, optimizer step count, loss scaler, LR schedule, data
position, plan, model spec, and the job `ratrain train` ran), renames the directory to `step-NNNNNNNN` and then replaces
`latest`. A rank killed at any point before the rename leaves only a `.tmp-*` directory,
which is never loaded and is removed by the next save. A save that fails (a full disk, an
I/O error) fails on every rank at once, removes its `.tmp-*` directory and names the
path and, for a full disk, the bytes the checkpoint needs.
"""

from __future__ import annotations

import errno
import shutil
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
from ratrain.launch.faults import JobFailed, disk_fault, fault_hook
from ratrain.models.counts import total_params
from ratrain.models.spec import ModelSpec
from ratrain.ranks import RANK_LAYOUTS, rank_of

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "check_compatible",
    "dcp_error_line",
    "checkpoint_bytes",
    "FORMAT",
]

FORMAT = "ratrain-dcp-1"


def dcp_error_line(e: BaseException) -> str:
    """One line for a DCP failure: a CheckpointException's text holds each failing rank's
    traceback; its last line is the underlying error."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    return (lines[-1] if lines else type(e).__name__)[:200]


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def checkpoint_bytes(spec: ModelSpec) -> int:
    """About what a checkpoint of `spec` takes on disk: every parameter's fp32 master and
    two AdamW moments (the state the stages hand DCP, each key once), without DCP's
    metadata and per-tensor headers (a few % for a tiny model, nothing for a large one)."""
    return 3 * 4 * total_params(spec)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = (
    "No space left on device",
    "Disk quota exceeded",
)
_NEARLY_FULL_BYTES = 2**20
"""A save that fails with less than this free on its file system failed for lack of space,
whatever the error says: torch's stream writer reports a short write as `unexpected pos`,
without the errno."""


def _free_bytes(d: Path) -> int | None:
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return None


def _is_disk_full(e: BaseException, free: int | None = None) -> bool:
    """A full disk (or quota): `free` (bytes free when the save failed) nearly nothing, or
    ENOSPC/EDQUOT anywhere in `e`: its causes, or each rank's failure that DCP gathered into
    a CheckpointException."""
    if free is not None and free < _NEARLY_FULL_BYTES:
        return True
    seen: list[BaseException] = [e]
    while seen:
        x = seen.pop()
        if isinstance(x, OSError) and x.errno in _DISK_FULL:
            return True
        if isinstance(x, CheckpointException):
            seen += [exc for exc, _ in x.failures.values()]
        seen += [c for c in (x.__cause__, x.__context__) if c is not None]
    return any(t in str(e) for t in _DISK_FULL_TEXT)


def _failure_line(e: BaseException, final: Path, need: int, free: int | None) -> str:
    """One line for a failed save, after its partial directory was removed; `free`: the
    bytes free on its file system when it failed."""
    root = final.parent
    done = layout.complete_checkpoints(root)
    last = (
        f"last complete checkpoint {done[-1]} (continue from it with --resume auto)"
        if done
        else "no complete checkpoint yet"
    )
    if not _is_disk_full(e, free):
        return f"saving checkpoint {final} failed ({dcp_error_line(e)}); {last}"
    now = _free_bytes(root)
    there = f", {_human(now)} free there without it" if now is not None else ""
    return (
        f"no space left on the device saving checkpoint {final}: it needs about "
        f"{_human(need)} ({need:,} bytes){there}; the partial save was removed; {last}"
    )


def _human(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _writer(tmp: Path, fault: str | None, rank: int, step: int):
    """DCP's file writer; with the `save-enospc` test hook, one whose write fails as a full
    disk does once this rank's files are written (None: DCP's default, the same writer)."""
    if not fault or "save-enospc" not in fault:
        return None

    class _FaultyWriter(dcp.FileSystemWriter):
        def write_data(self, plan, planner):
            written = super().write_data(plan, planner)
            disk_fault(fault, rank, step, str(self.path))
            return written

    return _FaultyWriter(str(tmp))


def _rank0(grid, fn, final: Path, tmp: Path, need: int) -> None:
    """Run `fn` (file-system work) on rank 0 and tell every rank how it went; a failure
    removes the partial save and raises the same `JobFailed` on every rank. Takes the place
    of a barrier: one small broadcast."""
    said: list[str | None] = [None]
    if grid.rank == 0:
        try:
            fn()
        except OSError as e:
            free = _free_bytes(final.parent)
            layout.remove_partial(tmp)
            said[0] = _failure_line(e, final, need, free)
    if grid.world_size > 1:
        dist.broadcast_object_list(said, src=0)
    if said[0] is not None:
        raise JobFailed(said[0])


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
    need = checkpoint_bytes(spec)

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        layout.clear_stale_tmp(root)
        tmp.mkdir()

    _rank0(grid, prepare, final, tmp, need)
    state = StageIO(model, grid.dp_group).tensors()
    state[f"rng/rank{grid.rank}"] = torch.get_rng_state()
    try:
        writer = _writer(tmp, fault, grid.rank, next_step)
        dcp.save(state, checkpoint_id=str(tmp), storage_writer=writer)
    except (Exception, CheckpointException) as e:  # the latter is a BaseException
        # DCP raises on every rank once all have written or failed: no rank writes now
        free = _free_bytes(root)  # before the partial save is removed
        _barrier_if_alive(grid.world_size)
        if grid.rank == 0:
            layout.remove_partial(tmp)
        _barrier_if_alive(grid.world_size)
        raise JobFailed(_failure_line(e, final, need, free)) from None
    fault_hook(fault, grid.rank, next_step, "save")
    _barrier(grid.world_size)  # every rank's files are on disk before the rename

    def finish() -> None:
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
        if cfg.extra.get("job") is not None:  # the job that `ratrain train --resume` restores
            meta["job"] = cfg.extra["job"]
        tok = getattr(getattr(executor, "batches", None), "source", None)
        tok = getattr(tok, "tokenizer_path", None)
        if tok is not None and Path(tok).is_file():  # the tokenizer travels with the model
            from ratrain.data.text import copy_tokenizer

            copy_tokenizer(tok, tmp)
        layout.publish(tmp, final, meta)
        layout.prune(root, keep)

    _rank0(grid, finish, final, tmp, need)  # on return it is published, on every rank
    return final


def _barrier_if_alive(world: int) -> None:
    """A barrier that a dead peer does not turn into a second error."""
    try:
        _barrier(world)
    except Exception:
        pass


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
    rng_key = _rng_key(meta, grid)
    if rng_key is not None:
        state[rng_key] = torch.get_rng_state()
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
    if rng_key is not None:
        torch.set_rng_state(state[rng_key])
    return meta


def _rng_key(meta: dict, grid) -> str | None:
    """The saved RNG state this rank continues: that of the rank which held the same
    (stage, replica) when the checkpoint's pp x dp is this run's (whatever either rank
    layout), else this rank's own number in a world of the same size; None otherwise."""
    if meta.get("world_size") != grid.world_size:
        return None
    p = meta.get("plan") if isinstance(meta.get("plan"), dict) else {}
    layout = p.get("rank_layout", "pp-inner")  # checkpoints from before the field
    if (p.get("pp"), p.get("dp")) == (grid.pp, grid.dp) and layout in RANK_LAYOUTS:
        return f"rng/rank{rank_of(grid.stage, grid.replica, grid.pp, grid.dp, layout)}"
    return f"rng/rank{grid.rank}"
