"""Local launcher: spawn N ranks on this machine and bring back what each returns.

`spawn(fn, nprocs, *args)` starts `fn(rdzv, *args)` in `nprocs` fresh processes with a free
127.0.0.1 port as the rendezvous, waits for them with a deadline, and returns the list of
their return values, rank order.

Ranks are forked from a fork server that has imported torch once (the parent's own torch
state is never inherited): a 4-rank job starts in well under a second after the first,
instead of ~3 s of `import torch` per rank per job with the plain "spawn" method.

The ranks' malloc: `spawn(..., allocator_library=PATH)` preloads that shared library
(jemalloc or tcmalloc, `ratrain.launch.host_memory`) into them; None runs them on glibc's
malloc. LD_PRELOAD takes effect when a process starts, so it must be in the fork server's
environment when the fork server starts: a fork server already running with another
LD_PRELOAD (an earlier job of this process asked for another allocator, or something else
started it) is stopped, within a bounded wait, and a fresh one started.

No hangs: if any rank fails, the others are SIGKILLed; if the deadline passes, all are;
if the launcher itself dies, every rank notices within a second and exits. A
`RatrainError` raised in a rank comes back as the same one-line `RatrainError` (same exit
code) in the parent; any other failure as a `RuntimeError` carrying the failing rank's
traceback tail.

Stop signals (`spawn(..., stop_signals=True)`): SIGTERM and SIGINT to the launcher while its
ranks start and run are forwarded to them once; each rank only records them
(`ratrain.launch.faults.StopRequest`) and the function it runs decides when to stop. A
second signal SIGKILLs the ranks (`RanksInterrupted`). A signal to the whole process group
(`timeout`, `kill -- -PGID`) reaches the ranks directly as well, as the same request: the
fork server ignores SIGTERM and SIGINT, and so do the ranks it forks until they take them
over. `check_local_launch` refuses a rank
count (or predicted memory) this machine cannot sensibly run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from ratrain.errors import RatrainError
from ratrain.launch.faults import StopRequest, watch_stop_signals
from ratrain.launch.forkserver_signals import FORK_SERVER_MARK
from ratrain.launch.grid import Rendezvous
from ratrain.launch.host_memory import preload_value

__all__ = [
    "free_port",
    "spawn",
    "DEFAULT_DEADLINE_S",
    "RankFailure",
    "RanksInterrupted",
    "check_local_launch",
    "local_rank_limit",
]


class RankFailure(RuntimeError):
    """A rank crashed or died. `rank` is the root cause as far as it can be told (a rank
    killed by a signal we did not send, else the earliest crash, one whose collective lost a
    peer last); `cause` is one line."""

    def __init__(self, rank: int | None, cause: str, detail: str):
        super().__init__(detail)
        self.rank, self.cause = rank, cause


class RanksInterrupted(RuntimeError):
    """The launcher got SIGTERM/SIGINT (`signum`) and the ranks did not all finish: a second
    signal made it SIGKILL them (`aborted`), or a rank died while they were stopping."""

    def __init__(self, signum: int, aborted: bool, detail: str):
        super().__init__(detail)
        self.signum, self.aborted = signum, aborted


DEFAULT_DEADLINE_S = 3600.0
# Imported once by the fork server, not by every rank. symbolic_shapes (and sympy, ~2 s) is
# what autograd imports lazily at a process's first backward. forkserver_signals makes the
# fork server ignore SIGTERM (a signal to the whole process group must not kill it).
_PRELOAD = [
    "ratrain.launch.forkserver_signals",
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


_FORK_SERVER_STOP_S = 10.0


@contextlib.contextmanager
def _rank_environment(allocator_library: str | None):
    """LD_PRELOAD as the ranks need it (`allocator_library` first, any other jemalloc or
    tcmalloc out) in this process's environment while they start, and a fork server started
    with it (and with `FORK_SERVER_MARK`: it ignores SIGTERM); this process's own
    environment is restored after."""
    saved = os.environ.get("LD_PRELOAD")
    wanted = preload_value(saved, allocator_library)
    if wanted:
        os.environ["LD_PRELOAD"] = wanted
    else:
        os.environ.pop("LD_PRELOAD", None)
    os.environ[FORK_SERVER_MARK] = "1"
    try:
        if _start_method() == "forkserver":
            _fork_server_with(wanted)
        yield
    finally:
        os.environ.pop(FORK_SERVER_MARK, None)
        if saved is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = saved


def _fork_server_with(ld_preload: str) -> None:
    """Make the running fork server (if any) one started with `ld_preload` and by this
    launcher (`FORK_SERVER_MARK`: it ignores SIGTERM): another one is stopped (the next fork
    starts a fresh one from this process's environment)."""
    server = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or _initial_preload(pid, FORK_SERVER_MARK) == (ld_preload, "1"):
        return
    # `_stop` closes the server's "alive" pipe and waits for it to exit, which it does once
    # every process holding the pipe has (ranks of an earlier job); bounded here, then killed.
    stopper = threading.Thread(target=server._stop, name="ratrain-forkserver-stop", daemon=True)
    stopper.start()
    stopper.join(_FORK_SERVER_STOP_S)
    if stopper.is_alive():
        print(
            f"ratrain: the fork server of an earlier job (pid {pid}) did not stop within "
            f"{_FORK_SERVER_STOP_S:g} s; killing it",
            file=sys.stderr,
            flush=True,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        stopper.join(_FORK_SERVER_STOP_S)


def _initial_preload(pid: int, mark: str) -> tuple[str, str] | None:
    """The LD_PRELOAD and the `mark` variable process `pid` was started with ("" for none),
    None where they cannot be read (then it is restarted: no setting is kept unverified)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    found = {}
    for entry in env:
        name, eq, value = entry.partition(b"=")
        if eq and name in (b"LD_PRELOAD", mark.encode()):
            found[name.decode()] = value.decode(errors="replace")
    return found.get("LD_PRELOAD", ""), found.get(mark, "")


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
    stop_signals: bool = False,
) -> None:
    if stop_signals:  # first thing: SIGTERM/SIGINT only ask for a stop from here on
        watch_stop_signals()  # (till here SIGTERM was ignored, as by the fork server)
    else:  # the fork server's ignores are not for ranks that the launcher does not stop
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _exit_with(launcher_pid)
    torch.set_num_threads(threads)
    rdzv = Rendezvous(local_rank, nprocs, local_rank, "127.0.0.1", port)
    out = Path(out_dir) / f"rank{local_rank}.pkl"
    try:
        result = {"ok": fn(rdzv, *args)}
    except RatrainError as e:
        result, code = {"user_error": str(e), "code": e.exit_code, "t": time.time()}, 2
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


LOCAL_RANKS_PER_CORE, LOCAL_RANKS_MIN = 4, 8


def local_rank_limit() -> int:
    """The most ranks a local launch starts: max(8, 4 x the CPUs this process may use).
    Beyond that every rank waits for a core most of the time, and a plan for a cluster
    would start hundreds of processes on a workstation."""
    return max(LOCAL_RANKS_MIN, LOCAL_RANKS_PER_CORE * _cpus())


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_local_launch(
    ranks: int, tensor_bytes: Callable[[], int] | None = None, what: str = "this job"
) -> None:
    """RatrainError (one line) unless this machine can sensibly run `ranks` local ranks: at
    most `local_rank_limit()` of them, and their predicted tensor bytes (`tensor_bytes()`,
    e.g. the memory ledger's peaks summed over the ranks; asked only when the count passes)
    within the memory available now. `what` names the job in the line."""
    cluster = (
        f"launch it on a cluster: torchrun --nnodes N --nproc-per-node M -m ratrain train ... "
        f"on each of N nodes (N x M = {ranks}), or srun -n {ranks} python -m ratrain train ... "
        "(see README and docs/runtime.md)"
    )
    limit = local_rank_limit()
    if ranks > limit:
        raise RatrainError(
            f"{what} has {ranks} ranks, more than this machine runs locally (at most {limit}: "
            f"max({LOCAL_RANKS_MIN}, {LOCAL_RANKS_PER_CORE} x {_cpus()} CPUs)); {cluster}"
        )
    need, avail = (tensor_bytes() if tensor_bytes else 0), available_memory_bytes()
    if avail is not None and need > avail:
        raise RatrainError(
            f"{what} has {ranks} ranks that need at least {need / 2**30:.3g} GiB for their "
            f"tensors (memory ledger), more than the {avail / 2**30:.3g} GiB available on this "
            f"machine; {cluster}"
        )


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    *args: Any,
    deadline_s: float = DEFAULT_DEADLINE_S,
    allocator_library: str | None = None,
    stop_signals: bool = False,
) -> list[Any]:
    """Run `fn(rdzv, *args)` on `nprocs` local ranks; their return values, rank order.
    `allocator_library` is preloaded into the ranks (None: glibc's malloc). With
    `stop_signals`, SIGTERM/SIGINT only ask the ranks to stop (`_launcher_signals`)."""
    if nprocs < 1:
        raise RatrainError(f"--nproc must be >= 1, got {nprocs}")
    with (
        _launcher_signals(stop_signals) as stop,
        tempfile.TemporaryDirectory(prefix="ratrain-ranks-") as out_dir,
    ):
        port = free_port()
        threads = _threads_per_rank(nprocs)
        with _rank_environment(allocator_library):
            ctx = mp.start_processes(
                _child,
                args=(fn, nprocs, port, out_dir, threads, args, os.getpid(), stop_signals),
                nprocs=nprocs,
                join=False,
                start_method=_start_method(),
            )
        failure, stopped = _join(ctx, deadline_s, stop)
        results = _read_results(Path(out_dir), nprocs)
    incomplete = failure is not None or any(r is None or "ok" not in r for r in results)
    if stop is not None and stop.signum and incomplete:
        raise RanksInterrupted(stop.signum, bool(stop.repeated), failure or "")
    if incomplete:
        _raise_failure(results, failure, _signalled(ctx, stopped))
    return [r["ok"] for r in results]


@contextlib.contextmanager
def _launcher_signals(on: bool):
    """With `on`: SIGTERM and SIGINT to this process, while its ranks start and run, are a
    `StopRequest` (`_join` forwards the first to the ranks, SIGKILLs them on a second: the
    launcher is signalled once per event, so any second one counts)."""
    if not on:
        yield None
        return
    stop = StopRequest(same_request_s=0.0).install()
    try:
        yield stop
    finally:
        stop.restore()


def _join(
    ctx: mp.ProcessContext, deadline_s: float, stop: StopRequest | None = None
) -> tuple[str | None, set[int]]:
    """Wait for every rank: (a failure description or None, the ranks we stopped). A rank
    that fails, a deadline passed or a second stop signal SIGKILLs the others (a SIGTERM
    would only ask them to stop): at once, but after a crash only once they have had
    `_SETTLE_S` to end on their own and leave their records."""
    end = time.monotonic() + deadline_s
    procs = ctx.processes
    forwarded = False
    try:
        while True:
            if stop is not None and stop.signum and not forwarded:
                _signal_ranks(procs, stop.signum)
                forwarded = True
            if stop is not None and stop.repeated:
                return f"stopped by a second signal ({stop.repeated})", _terminate(ctx)
            failed = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                i, code = failed[0]
                if code > 0:  # a crash, its record written: the others' too, if failing
                    _settle(procs, _SETTLE_S)
                return _exit_description(i, code), _terminate(ctx)
            live = [p for p in procs if p.exitcode is None]
            if not live:
                return None, set()
            if time.monotonic() > end:
                stopped = _terminate(ctx)
                return f"ranks did not finish within {deadline_s:g} s and were stopped", stopped
            multiprocessing.connection.wait([p.sentinel for p in live], timeout=0.2)
    except BaseException:
        _terminate(ctx)  # never leave ranks behind
        raise


_SETTLE_S = 2.0
"""assumed: after a rank crashes, how long the others may take to end on their own (a
peer whose collective lost the crashed rank fails within moments) before they are
SIGKILLed. The crashed rank's record can come after its peer's exit: unwinding its
exception closes its sockets first, so killing the others at once could lose the record
of the crash itself and name the peer instead (`_raise_failure`)."""


def _settle(procs: list, within_s: float) -> None:
    """Wait up to `within_s` for every rank to exit."""
    end = time.monotonic() + within_s
    while True:
        live = [p for p in procs if p.exitcode is None]
        left = end - time.monotonic()
        if not live or left <= 0:
            return
        multiprocessing.connection.wait([p.sentinel for p in live], timeout=left)


def _exit_description(i: int, code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"<Unknown signal {-code}>"
        return f"process {i} terminated with signal {name}"
    return f"process {i} terminated with exit code {code}"


def _signal_ranks(procs: list, signum: int) -> None:
    for p in procs:
        if p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signum)


def _terminate(ctx: mp.ProcessContext) -> set[int]:
    """SIGKILL every live rank: the ranks we stopped."""
    stopped = {i for i, p in enumerate(ctx.processes) if p.is_alive()}
    for i in stopped:
        ctx.processes[i].kill()
    for p in ctx.processes:
        p.join(timeout=10)
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


_PEER_GONE = ("gloo/transport", "Connection closed by peer", "Connection reset by peer", "NCCL")
"""What the last line of a collective's error says when a peer went away."""


def _peer_gone(tb: str) -> bool:
    """Whether a rank's traceback ends in a collective that failed because a peer went away:
    a consequence of another rank's crash, whose own record may come later (it is stamped
    once its exception has unwound, and the unwinding closes its sockets first)."""
    lines = tb.strip().splitlines()
    return bool(lines) and any(k in lines[-1] for k in _PEER_GONE)


def _raise_failure(
    results: list[dict | None], failure: str | None, signalled: dict[int, str] | None = None
) -> None:
    # A rank killed by a signal is the root cause (its peers' errors are consequences); then
    # a user mistake (every rank usually finds the same one); then the earliest crash, one
    # whose collective lost a peer (`_peer_gone`) only where no other crashed.
    if signalled:
        rank = min(signalled)
        raise RankFailure(rank, f"was killed ({signalled[rank]})", failure or "")
    user = [(r["t"], r["user_error"], r.get("code", 2)) for r in results if r and "user_error" in r]
    if user:
        _, line, code = min(user)
        err = RatrainError(line)
        err.exit_code = code  # e.g. 1 for a JobFailed (a failed save), not a user mistake
        raise err
    crashes = sorted(
        (_peer_gone(r["error"]), r["t"], i, r["error"])
        for i, r in enumerate(results)
        if r and "error" in r
    )
    if crashes:
        *_, rank, tb = crashes[0]
        tail = "\n".join(tb.strip().splitlines()[-12:])
        last = tb.strip().splitlines()[-1] if tb.strip() else "an error"
        raise RankFailure(rank, f"failed ({last[:300]})", f"rank {rank} failed:\n{tail}")
    raise RankFailure(None, failure or "exited without a result", failure or "")
