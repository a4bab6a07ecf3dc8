"""Output paths checked before any work starts: missing parent folders are created, and a
path that cannot be written is one line naming the flag, not a traceback after the run.

A path given as an empty string is refused (not taken as "not given"); a folder is probed
by creating (and at once removing) an unnamed file in it, since as root permission bits
say nothing; an existing file is opened for appending, which leaves it as it was; a path
on the kernel's virtual file systems (/proc, /sys) is refused: they take no files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ratrain.errors import RatrainError

__all__ = ["prepare_output_file", "prepare_output_dir", "check_output_dir", "PLOT_SUFFIXES"]

PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")
"""The image formats a --plot file may have (what matplotlib writes by suffix)."""

_VIRTUAL_FS = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "debugfs",
    "tracefs",
    "securityfs",
    "configfs",
    "pstore",
    "bpf",
    "devpts",
    "mqueue",
    "fusectl",
}


def _virtual_fs(p: Path) -> str | None:
    """The kernel file system `p` (or its nearest existing ancestor) is on, if it is one
    that takes no files (proc, sysfs, ...); None otherwise or where mounts cannot be read."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) > 2]
    except OSError:
        return None
    real = os.path.realpath(p)
    best, kind = "", None
    for point, fs in mounts:
        point = point.replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fs
    return kind if kind in _VIRTUAL_FS else None


def _why(e: BaseException) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def _probe(d: Path, flag: str, path: str) -> None:
    """Create and remove an unnamed file in folder `d`, or raise one line."""
    try:
        with tempfile.TemporaryFile(dir=d):
            pass
    except OSError as e:
        raise RatrainError(
            f"{flag} {path!r}: cannot write in folder {str(d)!r} ({_why(e)})"
        ) from None


def _check_path(path: str | None, flag: str) -> Path | None:
    """None for no flag; the path, or one line for an empty or a virtual-file-system one."""
    if path is None:
        return None
    if not str(path).strip():
        raise RatrainError(f"{flag}: empty path; give a path or leave {flag} out")
    p = Path(path)
    fs = _virtual_fs(p)
    if fs is not None:
        raise RatrainError(
            f"{flag} {path!r} is on the kernel's {fs} file system, which takes no files"
        )
    return p


def _mkdir(d: Path, flag: str, path: str) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as e:
        raise RatrainError(
            f"{flag} {path!r}: cannot create folder {str(d)!r} ({_why(e)})"
        ) from None
    _probe(d, flag, path)


def prepare_output_file(
    path: str | None, flag: str, suffixes: tuple[str, ...] | None = None
) -> None:
    """Make `path` writable as a file (create its parent folders) or raise one line. An
    existing file is not changed. `suffixes`: the ones the file may end in."""
    p = _check_path(path, flag)
    if p is None:
        return
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise RatrainError(f"{flag} {path!r}: expected a file ending in {', '.join(suffixes)}")
    if p.is_dir():
        raise RatrainError(f"{flag} {path!r} is a folder; give a file path")
    if p.exists() and not p.is_file():  # /dev/null, a FIFO: taken as it is (an open
        return  # of a FIFO would wait for its reader)
    if p.exists():  # a regular file: it must open for writing
        try:
            with open(p, "ab"):  # appending nothing: the file stays as it was
                pass
        except OSError as e:
            raise RatrainError(
                f"{flag} {path!r} exists and cannot be written ({_why(e)})"
            ) from None
        return
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise RatrainError(f"{flag} {path!r}: {str(parent)!r} is a file, not a folder")
    _mkdir(parent, flag, str(path))


def prepare_output_dir(path: str | None, flag: str) -> None:
    """Make `path` a writable folder (created with its parents) or raise one line."""
    p = _check_path(path, flag)
    if p is None:
        return
    if p.exists() and not p.is_dir():
        raise RatrainError(f"{flag} {path!r} is a file; give a folder")
    _mkdir(p, flag, str(path))


def check_output_dir(path: str | None, flag: str) -> None:
    """What `prepare_output_dir` checks, creating nothing: `path` is a folder, or could be
    created in the nearest folder above it that exists, which must be writable."""
    p = _check_path(path, flag)
    if p is None:
        return
    if p.exists() and not p.is_dir():
        raise RatrainError(f"{flag} {path!r} is a file; give a folder")
    d = p.absolute()
    while not d.exists():
        d = d.parent
    if not d.is_dir():
        raise RatrainError(f"{flag} {path!r}: {str(d)!r} is a file, not a folder")
    _probe(d, flag, str(path))
