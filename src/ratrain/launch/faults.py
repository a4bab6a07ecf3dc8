"""Surviving a dying rank: where each rank is, a one-line account of a failure, and the
test hook that kills a real rank process.

Each rank marks the step it is working on (`StepMarker`): in memory, and, for spawned
jobs, in a small file the launcher's parent reads after a rank died without reporting
(SIGKILL, the kernel's OOM killer). `JobFailed` is the one line the CLI prints: the rank,
what happened, the step and the last complete checkpoint to resume from
(`ratrain.train.command.failure_message` words it).

Test hook (read when the job starts, carried to the ranks in the `Job`):
`RATRAIN_FAULT=RANK:STEP` makes rank RANK kill itself with SIGKILL as it starts
step STEP; `RANK:STEP:save` does it inside the checkpoint save that follows step STEP - 1,
after its DCP files are written and before the checkpoint is published; `step-raise` and
`save-raise` raise a RuntimeError there instead (a failing rank). It fires only in a
job's first attempt (TORCHELASTIC_RESTART_COUNT unset or 0), so a restarted job runs on.
The process really dies: nothing is raised, no handler runs.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ratrain.errors import RatrainError

__all__ = ["JobFailed", "StepMarker", "fault_hook", "current_step", "read_steps"]

_current: dict[str, int] = {}


class JobFailed(RatrainError):
    """A rank of the job died or failed; not a user mistake, so exit code 1."""

    exit_code = 1


def current_step() -> int | None:
    return _current.get("step")


class StepMarker:
    def __init__(self, status_dir: str | None, rank: int):
        self.path = Path(status_dir) / f"rank{rank}.step" if status_dir else None

    def mark(self, step: int) -> None:
        _current["step"] = step
        if self.path is not None:
            self.path.write_text(str(step))


def read_steps(status_dir: str) -> dict[int, int]:
    out = {}
    for f in Path(status_dir).glob("rank*.step"):
        try:
            out[int(f.stem[4:])] = int(f.read_text() or -1)
        except (OSError, ValueError):
            continue
    return out


def fault_hook(spec: str | None, rank: int, step: int, where: str) -> None:
    """Kill this process if `spec` (the RATRAIN_FAULT value the job started with) says so."""
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    parts = spec.split(":")
    at = parts[2] if len(parts) > 2 else "step"
    if int(parts[0]) == rank and int(parts[1]) == step and at in (where, where + "-raise"):
        if at.endswith("-raise"):  # an ordinary exception, as a bug or a failed op would be
            raise RuntimeError(f"injected fault on rank {rank} at step {step}")
        os.kill(os.getpid(), signal.SIGKILL)
