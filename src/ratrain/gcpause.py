"""Pausing Python's cyclic garbage collector around bulk building of acyclic data.

A simulated step builds and drops hundreds of thousands of small containers (actions,
tuples, lists) and creates no reference cycles; the collector, triggered by allocation
counts, would traverse the ever-growing set of live objects again and again (about a
third of a deep plan's simulation time). Pausing it changes no result: objects freed by
reference counting are freed as before, and any cycle is collected once it is resumed.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block (or, as a decorator, the function) with the cyclic collector off;
    nested uses and an already disabled collector are left as they are."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
