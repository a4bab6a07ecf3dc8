"""Local launcher: spawn N ranks on this machine and bring back what each returns.

`spawn(fn, nprocs, *args)` starts `fn(rdzv, *args)` in `nprocs` fresh processes with a free
127.0.0.1 port as the rendezvous, waits for them with a deadline, and returns the list of
their return values, rank order.

Ranks are forked from a fork server that has imported torch once (the parent's own torch
state is never inherited): a 4-rank job starts in well under a second after the first,
instead of ~3 s of `import torch` per rank per job with the plain "spawn" method.

No hangs: if any rank fails, the others are terminated; if the deadline passes, all are;
if the launcher itself dies, every rank notices within a second and exits. A
`RatrainError` raised in a rank comes back as the same one-line `RatrainError` in the
parent; any other failure as a `RuntimeError` carrying the failing rank's traceback tail.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from ratrain.errors import RatrainError
from ratrain.launch.grid import Rendezvous

__all__ = ["free_port", "spawn", "DEFAULT_DEADLINE_S", "RankFailure"]


class RankFailure(RuntimeError):
    """A rank crashed or died. `rank` is the root cause as far as it can be told (a rank
    killed by a signal we did not send, else the earliest crash); `cause` is one line."""

    def __init__(self, rank: int | None, cause: str, detail: str):
        super().__init__(detail)
        self.rank, self.cause = rank, cause


DEFAULT_DEADLINE_S = 3600.0
# Imported once by the fork server, not by every rank. symbolic_shapes (and sympy, ~2 s) is
# what autograd imports lazily at a process's first backward.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.fx.experimental.symbolic_shapes",
    "ratrain.train.job",
]


def _start_method() -> str:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(_PRELOAD)
    return "forkserver"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_WATCH_PERIOD_S = 1.0


def _exit_with(launcher_pid: int) -> None:
    """End this rank if the launcher is gone. Ranks are the fork server's children, not the
    launcher's, so nothing else stops them when the launcher is killed (SIGKILL, a closed
    terminal): they would run, or wait on a collective, forever."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(_WATCH_PERIOD_S)
            try:
                os.kill(launcher_pid, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:  # alive, owned by someone else: not ours to judge
                pass

    threading.Thread(target=watch, name="ratrain-launcher-watch", daemon=True).start()


def _child(
    local_rank: int,
    fn: Callable[..., Any],
    nprocs: int,
    port: int,
    out_dir: str,
    threads: int,
    args: tuple,
    launcher_pid: int,
) -> None:
    _exit_with(launcher_pid)
    torch.set_num_threads(threads)
    rdzv = Rendezvous(local_rank, nprocs, local_rank, "127.0.0.1", port)
    out = Path(out_dir) / f"rank{local_rank}.pkl"
    try:
        result = {"ok": fn(rdzv, *args)}
    except RatrainError as e:
        result, code = {"user_error": str(e), "t": time.time()}, 2
    except Exception:
        result, code = {"error": traceback.format_exc(), "t": time.time()}, 1
    else:
        code = 0
    # Written under a temporary name and renamed: a rank stopped mid-write (the launcher
    # SIGTERMs the others when one fails) leaves no truncated result behind.
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(out)
    if code:
        raise SystemExit(code)


def _threads_per_rank(nprocs: int) -> int:
    """OMP_NUM_THREADS where set (`ratrain train --threads` sets it), else the CPUs this
    process may run on (its affinity: a container or `taskset` limit, not the machine's
    count, which would oversubscribe them) shared by the ranks."""
    if "OMP_NUM_THREADS" in os.environ:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, _cpus() // nprocs)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    *args: Any,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> list[Any]:
    """Run `fn(rdzv, *args)` on `nprocs` local ranks; their return values, rank order."""
    if nprocs < 1:
        raise RatrainError(f"--nproc must be >= 1, got {nprocs}")
    with tempfile.TemporaryDirectory(prefix="ratrain-ranks-") as out_dir:
        port = free_port()
        threads = _threads_per_rank(nprocs)
        ctx = mp.start_processes(
            _child,
            args=(fn, nprocs, port, out_dir, threads, args, os.getpid()),
            nprocs=nprocs,
            join=False,
            start_method=_start_method(),
        )
        failure, stopped = _join(ctx, deadline_s)
        results = _read_results(Path(out_dir), nprocs)
    if failure is not None or any(r is None or "ok" not in r for r in results):
        _raise_failure(results, failure, _signalled(ctx, stopped))
    return [r["ok"] for r in results]


def _join(ctx: mp.ProcessContext, deadline_s: float) -> tuple[str | None, set[int]]:
    """Wait for every rank: (a failure description or None, the ranks we stopped)."""
    end = time.monotonic() + deadline_s
    # torch logs each peer it stops ("Terminating process ... via SIGTERM"); the failure is
    # reported once, in one line, by the caller.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        while not ctx.join(timeout=0.2):
            if time.monotonic() > end:
                stopped = _terminate(ctx)
                return f"ranks did not finish within {deadline_s:g} s and were stopped", stopped
    except ProcessException as e:  # one rank failed; join already stopped the others
        # (torch's join SIGTERMs the others; those it stopped and those we stop are ours)
        stopped = _terminate(ctx) | {
            i for i, p in enumerate(ctx.processes) if i != e.error_index and p.exitcode == -15
        }
        return str(e).strip().splitlines()[0], stopped
    return None, set()


def _terminate(ctx: mp.ProcessContext) -> set[int]:
    stopped = {i for i, p in enumerate(ctx.processes) if p.is_alive()}
    for i in stopped:
        ctx.processes[i].terminate()
    for p in ctx.processes:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return stopped


def _signalled(ctx: mp.ProcessContext, stopped: set[int]) -> dict[int, str]:
    """Ranks killed by a signal the launcher did not send (SIGKILL, the OOM killer)."""
    import signal

    out = {}
    for i, p in enumerate(ctx.processes):
        if i not in stopped and p.exitcode is not None and p.exitcode < 0:
            try:
                out[i] = signal.Signals(-p.exitcode).name
            except ValueError:
                out[i] = f"signal {-p.exitcode}"
    return out


def _read_results(out_dir: Path, nprocs: int) -> list[dict | None]:
    results: list[dict | None] = []
    for r in range(nprocs):
        f = out_dir / f"rank{r}.pkl"
        try:
            results.append(pickle.loads(f.read_bytes()) if f.exists() else None)
        except (EOFError, pickle.UnpicklingError):  # a result cut short: no result
            results.append(None)
    return results


def _raise_failure(
    results: list[dict | None], failure: str | None, signalled: dict[int, str] | None = None
) -> None:
    # A rank killed by a signal is the root cause (its peers' errors are consequences); then
    # a user mistake (every rank usually finds the same one); then the earliest crash.
    if signalled:
        rank = min(signalled)
        raise RankFailure(rank, f"was killed ({signalled[rank]})", failure or "")
    user = [(r["t"], r["user_error"]) for r in results if r and "user_error" in r]
    if user:
        raise RatrainError(min(user)[1])
    crashes = sorted((r["t"], i, r["error"]) for i, r in enumerate(results) if r and "error" in r)
    if crashes:
        _, rank, tb = crashes[0]
        tail = "\n".join(tb.strip().splitlines()[-12:])
        last = tb.strip().splitlines()[-1] if tb.strip() else "an error"
        raise RankFailure(rank, f"failed ({last[:300]})", f"rank {rank} failed:\n{tail}")
    raise RankFailure(None, failure or "exited without a result", failure or "")
