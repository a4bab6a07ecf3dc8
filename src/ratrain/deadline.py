"""A wall-clock deadline that long pure computations check between their phases.

The planner's first simulation of a deep pipeline can take seconds. Where the search has
a hard deadline and no plan yet, it runs that simulation under `until(t)`; the simulator,
the schedule lowering and the steady-state extrapolation call `check()` between their
phases (never inside a phase's inner loop), which raises `DeadlinePassed` once the clock
is past `t`, so a simulation overruns the deadline by at most one phase. Outside `until`
`check()` costs one list test. Pure Python.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DeadlinePassed", "until", "check"]

_STACK: list[float] = []


class DeadlinePassed(Exception):
    """Raised by `check()` past the innermost `until` deadline."""


@contextmanager
def until(deadline: float | None) -> Iterator[None]:
    """Within the block, `check()` raises once `time.perf_counter()` passes `deadline`
    (None: no deadline)."""
    if deadline is None:
        yield
        return
    _STACK.append(deadline)
    try:
        yield
    finally:
        _STACK.pop()


def check() -> None:
    if _STACK and time.perf_counter() > _STACK[-1]:
        raise DeadlinePassed
