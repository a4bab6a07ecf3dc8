"""Output paths checked before any work starts: missing parent folders are created, and a
path that cannot be written is one line naming the flag, not a traceback after the run."""

from __future__ import annotations

import os
from pathlib import Path

from ratrain.errors import RatrainError

__all__ = ["prepare_output_file", "prepare_output_dir"]


def _mkdir(d: Path, flag: str, path: str) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise RatrainError(f"{flag} {path!r}: cannot create folder {str(d)!r} ({why})") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise RatrainError(f"{flag} {path!r}: folder {str(d)!r} is not writable")


def prepare_output_file(path: str | None, flag: str) -> None:
    """Make `path` writable as a file (create its parent folders) or raise one line."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise RatrainError(f"{flag} {path!r} is a folder; give a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise RatrainError(f"{flag} {path!r} exists and is not writable")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise RatrainError(f"{flag} {path!r}: {str(parent)!r} is a file, not a folder")
    _mkdir(parent, flag, path)


def prepare_output_dir(path: str | None, flag: str) -> None:
    """Make `path` a writable folder (created with its parents) or raise one line."""
    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise RatrainError(f"{flag} {path!r} is a file; give a folder")
    _mkdir(p, flag, path)
