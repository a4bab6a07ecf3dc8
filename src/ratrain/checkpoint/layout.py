"""Checkpoint directories on disk: names, completeness, the `latest` pointer, pruning.

    SAVE_DIR/
      step-00000100/        a complete checkpoint (DCP files + .metadata + ratrain.json)
      step-00000200/
      .tmp-step-00000300/   being written (or left by a killed save): never loaded
      latest                "step-00000200\n", replaced atomically after the rename

A checkpoint is published by renaming its temporary directory once every rank has
written its part and the coordinator has written DCP's `.metadata` and `ratrain.json`
(`ratrain.json` last): a directory named `step-*` is complete by construction, and is
checked again on load. Pure file-system code, no torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ratrain.errors import RatrainError

__all__ = [
    "META_NAME",
    "step_dir_name",
    "tmp_dir_name",
    "is_complete",
    "read_meta",
    "complete_checkpoints",
    "publish",
    "resolve_resume",
    "prune",
    "clear_stale_tmp",
    "remove_partial",
    "write_json_durably",
]

META_NAME = "ratrain.json"
_STEP = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def tmp_dir_name(step: int) -> str:
    return f".tmp-{step_dir_name(step)}"


def is_complete(d: Path) -> bool:
    return (d / META_NAME).is_file() and (d / ".metadata").is_file()


def read_meta(d: str | Path) -> dict:
    """The checkpoint's `ratrain.json`, or one-line errors for what is not a checkpoint."""
    d = Path(d)
    if not d.exists():
        raise RatrainError(f"checkpoint {str(d)!r} not found")
    if not d.is_dir():
        raise RatrainError(f"checkpoint {str(d)!r} is not a directory")
    if d.name.startswith(".tmp-"):
        raise RatrainError(f"checkpoint {str(d)!r} is a partial save (never published)")
    if not is_complete(d):
        raise RatrainError(
            f"{str(d)!r} is not a complete ratrain checkpoint (no {META_NAME} or .metadata); "
            "pass a step-* directory or its parent with --resume auto"
        )
    try:
        meta = json.loads((d / META_NAME).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RatrainError(f"checkpoint {str(d)!r}: corrupt {META_NAME} ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != "ratrain-dcp-1":
        raise RatrainError(f"checkpoint {str(d)!r}: {META_NAME} is not a ratrain checkpoint")
    return meta


def complete_checkpoints(save_dir: str | Path) -> list[Path]:
    """The complete step directories under `save_dir`, oldest first."""
    root = Path(save_dir)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP.match(d.name)
        if m and d.is_dir() and is_complete(d):
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_durably(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def publish(tmp: Path, final: Path, meta: dict) -> None:
    """Coordinator only, after every rank has written: meta, rename, then `latest`."""
    write_json_durably(tmp / META_NAME, meta)
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (a rerun): replace it whole
        gone = final.with_name(f".del-{final.name}")
        os.rename(final, gone)
        shutil.rmtree(gone)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    latest = final.parent / "latest"
    tmp_latest = final.parent / ".latest.tmp"
    with tmp_latest.open("w") as f:
        f.write(final.name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_latest, latest)
    _fsync_dir(final.parent)


def resolve_resume(resume: str, save_dir: str | None) -> Path | None:
    """The checkpoint directory `--resume` names: a step directory, a save directory (its
    newest complete checkpoint), or `auto` (the newest under --save; None if there is none
    yet, so a first run and a restarted run use the same command line)."""
    if resume == "auto":
        if not save_dir:
            raise RatrainError("--resume auto needs --save DIR (the checkpoints to look in)")
        return _newest(Path(save_dir))
    d = Path(resume)
    if not d.exists():
        raise RatrainError(f"--resume {resume!r}: no such checkpoint directory")
    if d.name.startswith(".tmp-"):
        read_meta(d)  # raises: a partial save
    if d.is_dir() and not _STEP.match(d.name) and not is_complete(d):
        newest = _newest(d)
        if newest is None:
            raise RatrainError(f"--resume {resume!r}: no complete checkpoint in this directory")
        return newest
    read_meta(d)
    return d


def _newest(root: Path) -> Path | None:
    # The newest complete step directory, not `latest`: a kill between the rename and the
    # pointer update leaves `latest` one behind, and published directories are complete.
    found = complete_checkpoints(root)
    return found[-1] if found else None


def prune(save_dir: Path, keep: int | None) -> None:
    """Delete all but the newest `keep` complete checkpoints (None: keep all)."""
    if not keep:
        return
    for d in complete_checkpoints(save_dir)[:-keep]:
        # Renamed first: a kill during the deletion must not leave a `step-*` directory
        # that looks complete but lacks data files.
        gone = d.with_name(f".del-{d.name}")
        os.rename(d, gone)
        shutil.rmtree(gone, ignore_errors=True)


def remove_partial(tmp: Path) -> None:
    """After a failed save (e.g. a full disk): its temporary directory and a `latest`
    pointer half written beside it, so that the space is free again and nothing of it
    remains; `latest` and the complete checkpoints are left as they were."""
    shutil.rmtree(tmp, ignore_errors=True)
    for leftover in (tmp.parent / ".latest.tmp",):
        try:
            leftover.unlink()
        except OSError:
            pass


def clear_stale_tmp(save_dir: Path) -> None:
    """Remove directories left by saves (or prunes) that were killed."""
    for d in [*save_dir.glob(".tmp-step-*"), *save_dir.glob(".del-step-*")]:
        shutil.rmtree(d, ignore_errors=True)
