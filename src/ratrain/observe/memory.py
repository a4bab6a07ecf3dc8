"""Measured peak memory per rank.

On CUDA: the caching allocator's own counter (`torch.cuda.max_memory_allocated`), bytes
of live tensors. On a CPU device there is no allocator counter, so `LiveBytes` counts
the same thing itself: a TorchDispatchMode sees every tensor an operator returns (factory
functions, outputs, autograd's gradients, communication buffers) and adds the bytes of
its storage while the storage lives, like `torch.distributed._tools.mem_tracker` but
without its per-module bookkeeping. Tensors that existed before the mode was entered
(weights, optimizer states) are added with `track`. Storages are counted once, at their
full size, however many views share them.

Both count tensor bytes only: not the allocator's cached-but-free blocks, the CUDA
context, or the Python heap, which is what the ledger (`ratrain.memory`) predicts too.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveBytes", "PeakMemory", "resize_storage", "peaks_per_rank"]

_ACTIVE: list[LiveBytes] = []  # trackers entered on this process, innermost last


def resize_storage(t: torch.Tensor, nbytes: int) -> None:
    """Resize `t`'s storage in place (0 frees it; the tensor and its views stay valid for
    a later re-grow). Storage resizes bypass the dispatcher, so active trackers are told."""
    st = t.untyped_storage()
    st.resize_(nbytes)
    for tracker in _ACTIVE:
        tracker.resized(t)


class LiveBytes(TorchDispatchMode):
    """Bytes of live tensor storages, and their peak, on one device type."""

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            self._add(t)

    def resized(self, t: torch.Tensor) -> None:
        self._add(t)

    def __enter__(self) -> LiveBytes:
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)
        super().__exit__(*exc)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _add(self, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        st = t.untyped_storage()
        key = st._cdata
        size = st.nbytes()
        old = self._sizes.get(key)
        if old is not None:  # already counted (a view, an in-place result, a resize)
            if size != old:
                self._sizes[key] = size
                self._grow(size - old)
            return
        self._sizes[key] = size
        self._refs[key] = weakref.ref(st, lambda _, k=key: self._free(k))
        self._grow(size)

    def _grow(self, delta: int) -> None:
        self.live_bytes += delta
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def _free(self, key: int) -> None:
        size = self._sizes.pop(key, 0)
        self._refs.pop(key, None)
        self.live_bytes -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self._add(t)
        return out


class PeakMemory:
    """Peak tensor bytes of this rank over a region: the CUDA counter (always on: it costs
    nothing), or on other devices `LiveBytes` when `enabled` (it slows every operator);
    `peak_bytes()` is None where nothing counts them (then the step log reports peak RSS,
    `ratrain.train.step_log`)."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.device = device
        self.enabled = enabled or device.type == "cuda"
        self.tracker = LiveBytes(device.type) if enabled and device.type != "cuda" else None

    def __enter__(self) -> PeakMemory:
        if self.enabled and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.tracker is not None:
            self.tracker.__enter__()
        return self

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        if self.tracker is not None:
            self.tracker.track(tensors)

    def peak_bytes(self) -> int | None:
        if not self.enabled:
            return None
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return self.tracker.peak_bytes

    def __exit__(self, *exc) -> None:
        if self.tracker is not None:
            self.tracker.__exit__(*exc)


def peaks_per_rank(tensor_peaks: list[int | None], rss_peaks: list[int]) -> tuple[list[int], str]:
    """Every rank's peak memory and what it counts: `tensors` where every rank counted its
    tensor bytes (CUDA's allocator, or `LiveBytes` with `measure_memory`), else `rss`: each
    process's peak resident set (`ru_maxrss`: tensors plus the runtime, the Python heap and
    the allocator's free blocks), so that a CPU run without `measure_memory` still says."""
    if tensor_peaks and all(p is not None for p in tensor_peaks):
        return [int(p) for p in tensor_peaks], "tensors"
    return [int(p) for p in rss_peaks], "rss"
