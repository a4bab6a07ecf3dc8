"""Which machine a measured platform file describes, and whether this is it.

A file written by `ratrain calibrate` records the CPU model and core count it was measured
on (`measured_on`). Loading it on a different host warns once (`HostMismatchWarning`):
its figures describe another machine, and `ratrain calibrate` measures this one. Pure
Python (reads /proc/cpuinfo; no torch).
"""

from __future__ import annotations

import os
import platform as pyplatform
import warnings
from pathlib import Path

__all__ = ["HostMismatchWarning", "host_fingerprint", "check_host"]

_WARNED: set[str] = set()


class HostMismatchWarning(UserWarning):
    """A measured platform file is used on a machine other than the one it measured."""


def host_fingerprint() -> dict:
    """{"cpu": CPU model name, "cores": CPUs this process may run on}."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return {"cpu": cpu or pyplatform.processor() or pyplatform.machine(), "cores": cores}


def check_host(name: str, measured_on: dict | None) -> str | None:
    """A warning message when `measured_on` is not this host (warned once per name)."""
    if not measured_on:
        return None
    here = host_fingerprint()
    same = str(measured_on.get("cpu")) == here["cpu"] and int(measured_on.get("cores", 0)) == int(
        here["cores"]
    )
    if same:
        return None
    msg = (
        f"platform {name} was measured on {measured_on.get('cpu')} "
        f"({measured_on.get('cores')} cores); this host is {here['cpu']} ({here['cores']} "
        f"cores): its predictions may be far off here; run `ratrain calibrate -o "
        f"my-machine.yaml` and pass --platform my-machine.yaml"
    )
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(msg, HostMismatchWarning, stacklevel=3)
    return msg
