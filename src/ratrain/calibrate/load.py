"""How much of the machine other processes took while calibration measured it.

A calibration measures the machine it runs on, including whatever else runs there: a
leftover process from an earlier job, another user's build, the hypervisor's other guests
(steal time). `OthersLoad` reads the kernel's CPU accounting (`/proc/stat`) when created
and when asked, and subtracts the CPU time of this process and of every process below it:
its waited-for children, and its live descendants with theirs (the spawned ranks are
children of the launcher's forkserver, which lives on and reaps them: counting only this
process's waited-for children put every rank's CPU time among the others', and an idle
2-core machine read as 25-27% taken by other processes). The rest is other processes' share
of the machine's CPU time over the calibration. Linux only; elsewhere `share()` is None.
"""

from __future__ import annotations

import os
import resource
import time

__all__ = ["OthersLoad", "others_share_now"]


def _stat_s() -> tuple[float, float] | None:
    """(busy CPU seconds, total CPU seconds) summed over the machine's CPUs, steal time
    counted busy (another guest had the core)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy / hz, (busy + idle + iowait) / hz


def _procs() -> dict[int, tuple[int, float]]:
    """{pid: (parent pid, CPU seconds of it and its waited-for children)} of every live
    process (`/proc/<pid>/stat`: utime + stime + cutime + cstime)."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            out[pid] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / hz)
        except (OSError, IndexError, ValueError):  # gone meanwhile, or unreadable
            continue
    return out


def _descendants_s(root: int, procs: dict[int, tuple[int, float]]) -> float:
    """CPU seconds of root's live descendants, each with its waited-for children."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0.0, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        total += procs[pid][1]
        todo += kids.get(pid, [])
    return total


def _own_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = _descendants_s(os.getpid(), _procs())
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + live


class OthersLoad:
    """Other processes' share of the CPU time since creation."""

    WARN_SHARE = 0.10
    """assumed: a tenth of the machine taken by others moves single measurements by more
    than the 5-10% the validation targets resolve."""

    def __init__(self) -> None:
        self.start, self.own0, self.t0 = _stat_s(), _own_s(), time.monotonic()

    def share(self) -> float | None:
        end = _stat_s()
        if self.start is None or end is None:
            return None
        total = end[1] - self.start[1]
        if total <= 0:
            return None
        others = (end[0] - self.start[0]) - (_own_s() - self.own0)
        return min(max(others / total, 0.0), 1.0)


def others_share_now(seconds: float = 1.0) -> float | None:
    """Other processes' share of the machine's CPU time over the next `seconds` (this
    process idle meanwhile): whether the machine is busy before a calibration starts."""
    load = OthersLoad()
    time.sleep(seconds)
    return load.share()
