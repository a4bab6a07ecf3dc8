"""Surviving a dying rank: where each rank is, a one-line account of a failure, and the
test hook that kills a real rank process.

Each rank marks the step it is working on (`StepMarker`): in memory, and, for spawned
jobs, in a small file the launcher's parent reads after a rank died without reporting
(SIGKILL, the kernel's OOM killer). `JobFailed` is the one line the CLI prints: the rank,
what happened, the step and the last complete checkpoint to resume from
(`ratrain.train.failures.failure_message` words it).

Test hook (read when the job starts, carried to the ranks in the `Job`, `FaultHooks`):
`RATRAIN_FAULT=RANK:STEP` makes rank RANK kill itself with SIGKILL as it starts
step STEP; `RANK:STEP:save` does it inside the checkpoint save that follows step STEP - 1,
after its DCP files are written and before the checkpoint is published; `step-raise` and
`save-raise` raise a RuntimeError there instead (a failing rank). It fires only in a
job's first attempt (TORCHELASTIC_RESTART_COUNT unset or 0), so a restarted job runs on.
The process really dies: nothing is raised, no handler runs. `RANK:STEP:save-enospc` makes
that rank's DCP write in the save after step STEP - 1 fail with `OSError(ENOSPC)` after
writing its files, as a full disk does (`disk_fault`, called by the checkpoint writer).

Stopping on request (`StopRequest`): the first SIGTERM or SIGINT a rank gets asks it to
stop; the ranks agree on the step through the per-step all-gather of `ratrain.train.
step_log` and stop after the same one (saving a checkpoint with `--save`). A rank launched
by torchrun or Slurm aborts at once on a second signal more than `SAME_REQUEST_S` after the
first (closer ones are one request: Slurm signals every process and torchrun forwards the
signal too); a locally spawned rank leaves that to its launcher (`ratrain.launch.spawn`),
which forwards the first signal and SIGKILLs the ranks on a second.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ratrain.errors import RatrainError

__all__ = [
    "JobFailed",
    "PeerLost",
    "Interrupted",
    "StepMarker",
    "StopRequest",
    "STOP_EXIT_CODE",
    "SAME_REQUEST_S",
    "fault_hook",
    "disk_fault",
    "current_step",
    "read_steps",
    "watch_stop_signals",
    "forget_stop_signals",
    "signals_interrupt",
    "signal_name",
]

STOP_EXIT_CODE = 3
"""Exit code of a job stopped by SIGTERM/SIGINT after a clean stop (checkpoint saved with
`--save`): neither a failure (1) nor a user error (2)."""
SAME_REQUEST_S = 1.0
"""A rank launched by torchrun/Slurm takes a second signal this soon after the first as the
same request; a later one aborts it."""

_current: dict[str, int] = {}


class JobFailed(RatrainError):
    """A rank of the job died or failed; not a user mistake, so exit code 1."""

    exit_code = 1


class PeerLost(Exception):
    """A launched rank's collective failed and its heartbeat watch found why: `cause`, e.g.
    "lost node 1 (10.0.0.2; ranks 2, 3)" (`ratrain.launch.peers.PeerWatch.suspects`)."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


class Interrupted(KeyboardInterrupt):
    """A job ended by a signal without a clean stop: one line (`str`, may be empty) and the
    exit code 128 + the signal's number, as a shell reports it."""

    def __init__(self, signum: int, line: str = ""):
        super().__init__(line)
        self.signum, self.exit_code = signum, 128 + signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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


def disk_fault(spec: str | None, rank: int, step: int, path: str) -> None:
    """`RANK:STEP:save-enospc`: fail this rank's checkpoint write as a full disk would."""
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    parts = spec.split(":")
    if parts[2:3] == ["save-enospc"] and (int(parts[0]), int(parts[1])) == (rank, step):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


class StopRequest:
    """SIGTERM and SIGINT as a request to stop: `signum` is the first one's number (0: none
    yet), `repeated` a later one's. With `abort_line`, a repeated signal ends the process at
    once (exit 128 + signal) after writing that line on stderr: a watcher thread reads the
    signal from a wakeup fd, so this works while the main thread is blocked in a collective.
    Without it, the signals are only recorded (the caller polls them). A signal within
    `same_request_s` of the first is the same request, not a repeated one."""

    def __init__(
        self,
        abort_line: Callable[[int], str] | None = None,
        same_request_s: float = SAME_REQUEST_S,
    ):
        self.signum = 0
        self.same_request_s = same_request_s
        self.repeated = 0
        self._first_t = 0.0
        self._abort_line = abort_line
        self._saved: dict[int, object] = {}
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._old_fd = -1

    def install(self) -> StopRequest:
        """Take over SIGTERM and SIGINT (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._saved[sig] = signal.signal(sig, self._handler)
        if self._abort_line is not None:
            r, w = socket.socketpair()
            w.setblocking(False)
            self._old_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
            self._wakeup = (r, w)
            threading.Thread(
                target=self._watch, args=(r,), name="ratrain-stop", daemon=True
            ).start()
        return self

    def restore(self) -> None:
        """Give SIGTERM and SIGINT back to the handlers they had before `install`."""
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved = {}
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._old_fd)
            self._wakeup[1].close()  # the watcher reads EOF and ends
            self._wakeup = None

    def _handler(self, signum: int, frame) -> None:
        if self._wakeup is None:  # else the watcher has seen it already
            self.note(signum)

    def _watch(self, r: socket.socket) -> None:
        with r:
            while True:
                try:
                    data = r.recv(64)
                except OSError:
                    return
                if not data:
                    return
                for signum in data:
                    if signum in (signal.SIGTERM, signal.SIGINT):
                        self.note(signum)

    def note(self, signum: int) -> None:
        now = time.monotonic()
        if not self.signum:
            self.signum, self._first_t = signum, now
        elif not self.repeated and now - self._first_t >= self.same_request_s:
            self.repeated = signum
            if self._abort_line is not None:
                os.write(sys.stderr.fileno(), (self._abort_line(signum) + "\n").encode())
                os._exit(128 + signum)


_stop: dict[str, StopRequest] = {}


def watch_stop_signals(abort_line: Callable[[int], str] | None = None) -> tuple[StopRequest, bool]:
    """This process's `StopRequest`, installed on first use: (it, whether this call
    installed it). A locally spawned rank installs one without `abort_line` as it starts;
    a rank of a torchrun/Slurm job installs one with it."""
    if "rank" in _stop:
        return _stop["rank"], False
    _stop["rank"] = StopRequest(abort_line).install()
    return _stop["rank"], True


def forget_stop_signals() -> None:
    """Restore the handlers `watch_stop_signals` took over."""
    stop = _stop.pop("rank", None)
    if stop is not None:
        stop.restore()


@contextlib.contextmanager
def signals_interrupt():
    """Inside, SIGTERM and SIGINT raise `Interrupted` in the main thread (a launcher between
    its start and its ranks' start, and after them: `spawn` takes them over in between)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_it(signum: int, frame) -> None:
        raise Interrupted(signum)

    saved = {sig: signal.signal(sig, raise_it) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
