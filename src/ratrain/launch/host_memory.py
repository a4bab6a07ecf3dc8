"""Host memory: which allocator a CPU rank's tensors come from, and glibc's mmap threshold.

On a CPU device every tensor is a malloc allocation (torch's CPU allocator calls
`posix_memalign`, 64-byte aligned whatever serves it). glibc's malloc serves a training
step's activations from its heap, which fragments: on the rss_breakdown job
(`benchmarks/rss_breakdown.py`, pp=2, split 5,3) rank 0's heap grew to ~730 MiB for a peak
of 529 MiB of live tensors, and freed heap memory stays resident.

**The host allocator** (`ratrain train --host-allocator auto|tcmalloc|jemalloc|malloc`,
`Launch.host_allocator`): a maintained malloc, tcmalloc (gperftools') or jemalloc, preloaded
into the ranks the launcher spawns (`LD_PRELOAD`, `ratrain.launch.spawn`), as PyTorch's CPU
performance guide recommends. They replace malloc/free for the whole process, torch's
allocations and oneDNN's scratch memory included, so nothing in torch has to know. `auto`
(the default) takes tcmalloc if its library is found, else jemalloc, else glibc's malloc
(`AUTO_ORDER`); asking for one that is not installed is a one-line error naming the
Debian package.
Ranks started by torchrun or Slurm are not ours to preload: whoever launches them sets
`LD_PRELOAD`, and `loaded_host_allocator` reads what the process actually has
(/proc/self/maps). `docs/runtime.md` ("Host memory") has the figures.

**`fix_mmap_threshold(n)`** (`--malloc-mmap-threshold`, glibc's malloc only) sets glibc's
mmap threshold once for the process (`mallopt(M_MMAP_THRESHOLD, n)`), which also turns its
dynamic raise off: every block of at least `n` bytes is mapped on its own and returned
when freed, so the resident set follows live tensor bytes. glibc's threshold starts at
128 KiB but each freed mapped block raises it to that block's size (up to 32 MiB), so after
the first freed tensor of a few MiB every later activation comes from the heap. The price
of fixing it is a page fault per first touch of every such block, each time it is
allocated (they come zeroed from the kernel): 1.1 million minor faults per step on rank 0
of the issue's job with `n` = 128 KiB, and less tokens/s in every interleaved pair
measured. It is a trade of speed for resident memory, off unless asked; with it,
`--host-allocator auto` keeps glibc's malloc (tcmalloc and jemalloc have no such knob, and
asking for them with it is an error). Other C libraries (musl, macOS) have no such knob
either: the call does nothing there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import sysconfig
from dataclasses import dataclass

from ratrain.errors import RatrainError

__all__ = [
    "AUTO_ORDER",
    "DEBIAN_PACKAGES",
    "HOST_ALLOCATORS",
    "HostAllocator",
    "LOW_RSS_MMAP_THRESHOLD_BYTES",
    "MAX_MMAP_THRESHOLD_BYTES",
    "check_mmap_threshold",
    "find_allocator_library",
    "fix_mmap_threshold",
    "launched_host_allocator",
    "loaded_host_allocator",
    "preload_value",
    "resolve_host_allocator",
]

HOST_ALLOCATORS = ("auto", "tcmalloc", "jemalloc", "malloc")
"""`--host-allocator`'s choices; `auto` is the first of `AUTO_ORDER` found, else malloc
(glibc's, torch's default)."""

AUTO_ORDER = ("tcmalloc", "jemalloc")
"""measured (docs/runtime.md, "Host memory"; benchmarks/rss_breakdown.py, pp=2): both keep rank 0's
peak RSS ~100 MiB under glibc's (793 and 777 MiB against 890); jemalloc purges freed
pages and faults them back in, ~190,000 minor faults per step against tcmalloc's ~1,600,
and ran 0.95x glibc's tokens/s in every interleaved pair on the idle machine, where
tcmalloc ran level with it."""

DEBIAN_PACKAGES = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}
"""sourced: the Debian/Ubuntu packages of the shared libraries below."""

_LIBRARIES = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": (
        "libtcmalloc_minimal.so.4",
        "libtcmalloc.so.4",
        "libtcmalloc_minimal.so",
        "libtcmalloc.so",
    ),
}
"""The file names each allocator's library goes by (sourced: the Debian packages, conda's
jemalloc and gperftools); the minimal tcmalloc (no heap profiler) first."""


@dataclass(frozen=True)
class HostAllocator:
    """The malloc a job's ranks run on."""

    name: str
    """jemalloc | tcmalloc | malloc (glibc's)."""
    library: str | None = None
    """The shared library the launcher preloads into its ranks; None: nothing preloaded
    (glibc's malloc, or ranks launched by torchrun/Slurm, which have what they were
    started with)."""
    launched: bool = False
    """The ranks were started by torchrun/Slurm: `name` is what this process has."""

    def describe(self) -> str:
        """For the job's header: which allocator, and how the ranks got it."""
        label = _label(self.name)
        if self.launched:
            how = "LD_PRELOAD" if self.name != "malloc" else "no LD_PRELOAD"
            return f"{label} (this rank process's own: {how} of the launch)"
        if self.library:
            return f"{label} ({self.library}, preloaded into the ranks)"
        return label


def _label(name: str) -> str:
    return "glibc malloc" if name == "malloc" else name


def _library_dirs() -> list[str]:
    """Where a preloadable allocator is looked for: LD_LIBRARY_PATH, this Python's prefix
    (conda's jemalloc), then the system's library directories."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [os.path.join(sys.prefix, "lib"), "/usr/local/lib"]
    if multiarch:
        dirs += [f"/usr/local/lib/{multiarch}", f"/usr/lib/{multiarch}", f"/lib/{multiarch}"]
    return dirs + ["/usr/lib64", "/lib64", "/usr/lib", "/lib"]


def find_allocator_library(name: str) -> str | None:
    """The path of jemalloc's or tcmalloc's shared library, or None where it is not
    installed (or not on Linux, the only system the ranks are preloaded on)."""
    if not sys.platform.startswith("linux"):
        return None
    for d in _library_dirs():
        for file in _LIBRARIES[name]:
            path = os.path.join(d, file)
            if os.path.isfile(path):
                return path
    return None


def _check_choice(choice: str) -> None:
    if choice not in HOST_ALLOCATORS:
        raise RatrainError(
            f"--host-allocator must be one of {', '.join(HOST_ALLOCATORS)}, got {choice!r}"
        )


def _check_threshold_with(name: str, mmap_threshold_bytes: int) -> None:
    if mmap_threshold_bytes and name != "malloc":
        raise RatrainError(
            f"--malloc-mmap-threshold is a setting of glibc's malloc, and the ranks run on "
            f"{name}: drop it, or add --host-allocator malloc"
        )


def resolve_host_allocator(
    choice: str, mmap_threshold_bytes: int = 0, *, launched: bool = False
) -> HostAllocator:
    """The allocator the launcher preloads into its ranks for `--host-allocator choice`;
    RatrainError (one line, naming the package to install) for one that is not installed.
    With glibc's mmap threshold fixed, `auto` is glibc's malloc. `launched`: this process
    is a rank torchrun or Slurm started (`launched_host_allocator`)."""
    if launched:
        return launched_host_allocator(choice, mmap_threshold_bytes)
    _check_choice(choice)
    if choice == "malloc" or (choice == "auto" and mmap_threshold_bytes):
        return HostAllocator("malloc")
    _check_threshold_with(choice, mmap_threshold_bytes)
    for name in AUTO_ORDER if choice == "auto" else (choice,):
        library = find_allocator_library(name)
        if library is not None:
            return HostAllocator(name, library)
    if choice == "auto":
        return HostAllocator("malloc")
    raise RatrainError(
        f"--host-allocator {choice}: {_LIBRARIES[choice][0]} is not installed (Debian/Ubuntu: "
        f"apt-get install {DEBIAN_PACKAGES[choice]}); or use --host-allocator auto"
    )


def loaded_host_allocator(maps_path: str = "/proc/self/maps") -> str:
    """jemalloc | tcmalloc | malloc: the allocator this process has loaded, as its memory
    map shows (malloc where it cannot be read)."""
    try:
        with open(maps_path) as f:
            files = {os.path.basename(line.split()[-1]) for line in f if "/" in line}
    except OSError:
        return "malloc"
    for name in ("jemalloc", "tcmalloc"):
        if any(file.startswith(f"lib{name}") for file in files):
            return name
    return "malloc"


def launched_host_allocator(choice: str, mmap_threshold_bytes: int = 0) -> HostAllocator:
    """The allocator of a rank that torchrun or Slurm started (what this process has: its
    launcher set LD_PRELOAD, or did not); RatrainError where `choice` names another one."""
    _check_choice(choice)
    have = loaded_host_allocator()
    if choice not in ("auto", have):
        if choice == "malloc":
            hint = "launch them without LD_PRELOAD"
        else:
            path = find_allocator_library(choice) or f"the path of {_LIBRARIES[choice][0]}"
            hint = f"launch them with LD_PRELOAD={path}"
        raise RatrainError(
            f"--host-allocator {choice}: this rank process runs on {_label(have)}; ranks "
            f"started by torchrun or Slurm have the allocator they were launched with: {hint} "
            '(docs/runtime.md, "Host memory")'
        )
    _check_threshold_with(have, mmap_threshold_bytes)
    return HostAllocator(have, launched=True)


def _is_allocator(entry: str) -> bool:
    return os.path.basename(entry).startswith(("libjemalloc", "libtcmalloc"))


def preload_value(current: str | None, library: str | None) -> str:
    """LD_PRELOAD for ranks that run on `library` (None: glibc's malloc): `current`'s
    entries but any other jemalloc or tcmalloc, `library` first."""
    kept = [e for e in (current or "").replace(":", " ").split() if not _is_allocator(e)]
    return ":".join(([library] if library else []) + kept)


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
