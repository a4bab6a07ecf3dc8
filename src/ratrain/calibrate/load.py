"""How much of the machine other processes took while calibration measured it.

A calibration measures the machine it runs on, including whatever else runs there: a
leftover process from an earlier job, another user's build, the hypervisor's other guests
(steal time). `OthersLoad` reads the kernel's CPU accounting (`/proc/stat`) when created
and when asked, and subtracts this process's own CPU time and its waited-for children's
(the spawned ranks): the rest is other processes' share of the machine's CPU time over the
calibration. Linux only; elsewhere `share()` is None.
"""

from __future__ import annotations

import os
import resource
import time

__all__ = ["OthersLoad"]


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


def _own_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


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
