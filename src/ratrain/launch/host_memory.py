"""Host memory: give freed tensor memory back to the OS instead of keeping it in malloc's heap.

On a CPU device every tensor is a malloc allocation (torch's CPU allocator calls
`posix_memalign`). glibc serves a request from its heap unless it is at least the *mmap
threshold*, in which case it maps the block on its own and unmaps it when freed. The
threshold starts at 128 KiB but is dynamic: each time a mapped block is freed, glibc raises
it to that block's size (up to 32 MiB on 64-bit), so after the first freed tensor of a few
MiB every later activation, gradient and optimizer temporary of up to that size comes from
the heap. A training step allocates and frees such blocks in an order no heap packs well:
on the issue-12 job (`benchmarks/rss_breakdown.py`, pp=2, split 5,3) rank 0's heap grew to
728 MiB for a peak of 529 MiB of live tensors, and freed heap memory stays resident.

`fix_mmap_threshold(n)` sets the threshold once for the process (`mallopt(M_MMAP_THRESHOLD,
n)`), which also turns the dynamic raise off: every block of at least `n` bytes is mapped
on its own and returned when freed, so the resident set follows live tensor bytes. The
price is a page fault per first touch of every such block, each time it is allocated (they
come zeroed from the kernel): on the issue's job rank 0 took 1.1 million minor faults per
step with `n` = 128 KiB against a few hundred without, and lost tokens/s in every
interleaved pair measured. So the runtime leaves glibc as it is unless asked
(`ratrain train --malloc-mmap-threshold 131072`, `Job.malloc_mmap_threshold_bytes`): a
trade of speed for resident memory. The runtime's default for CPU ranks is the caching
allocator instead (`ratrain.launch.cpu_allocator`), which serves every tensor of 128 KiB
and more from its own pools without faults, so the threshold matters only with that off
(`--no-cpu-caching-allocator`, or no C++ compiler). `docs/runtime.md` ("Host memory") has
the figures.

Other C libraries (musl, macOS) have no such knob: the call does nothing there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

from ratrain.errors import RatrainError

__all__ = [
    "LOW_RSS_MMAP_THRESHOLD_BYTES",
    "MAX_MMAP_THRESHOLD_BYTES",
    "check_mmap_threshold",
    "fix_mmap_threshold",
]

LOW_RSS_MMAP_THRESHOLD_BYTES = 128 * 1024
"""The value to ask for when resident memory matters more than speed. sourced: glibc's own
starting threshold (DEFAULT_MMAP_THRESHOLD_MIN, malloc/malloc.c), kept fixed: tensors of
128 KiB and more are mapped; smaller ones (norm weights, scalars) stay in the heap. Larger
values (2 and 4 MiB) measured no smaller peak RSS on the issue's job: the 1 MiB activations
are the ones that fragment the heap."""

MAX_MMAP_THRESHOLD_BYTES = 32 * 2**20
"""sourced: glibc's HEAP_MAX_SIZE / 2 on 64-bit, the largest value mallopt accepts."""

_M_MMAP_THRESHOLD = -3  # sourced: glibc malloc.h


@functools.cache
def _mallopt():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def check_mmap_threshold(threshold_bytes: int) -> None:
    """RatrainError unless `threshold_bytes` is 0 (glibc's own) or a value mallopt takes."""
    if not 0 <= threshold_bytes <= MAX_MMAP_THRESHOLD_BYTES:
        raise RatrainError(
            f"--malloc-mmap-threshold must be 0 (glibc's own) or 1..{MAX_MMAP_THRESHOLD_BYTES} "
            f"bytes, got {threshold_bytes}"
        )


def fix_mmap_threshold(threshold_bytes: int) -> bool:
    """Fix glibc's mmap threshold for this process: whether it was set (False for 0, which
    leaves glibc's dynamic threshold, and where there is no glibc)."""
    check_mmap_threshold(threshold_bytes)
    if threshold_bytes == 0:
        return False
    fn = _mallopt()
    return bool(fn is not None and fn(_M_MMAP_THRESHOLD, threshold_bytes) == 1)
