"""Activation recovery helpers of the lifecycle: what offloading and selective recompute
need below the executor.

- `Stash` holds the tensors autograd saves for one (unit, microbatch) through
  `torch.autograd.graph.saved_tensors_hooks`, so OFFLOAD/RELOAD can move them between the
  device and the host tier without autograd noticing. Parameters are never stashed (they
  stay where the view lives). On CUDA the copies run on a side stream into pinned host
  memory and the consumer waits on an event; on a CPU device there is one tier, so
  nothing moves.
- `CheckpointedAttention` wraps a backend so that a block's attention core is recomputed
  in its backward instead of stored (selective recompute).
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn

__all__ = ["Stash", "CheckpointedAttention", "move_tensors"]


class Stash:
    """The tensors autograd saves for one (unit, microbatch), parameters excepted, so they
    can move between tiers; autograd holds indices into it instead of the tensors."""

    def __init__(self, params):
        self.skip = {id(p) for p in params}
        self.tensors: list[torch.Tensor] = []
        self.ready: torch.cuda.Event | None = None

    def pack(self, t: torch.Tensor):
        if id(t) in self.skip or isinstance(t, nn.Parameter):
            return (False, t)
        self.tensors.append(t)
        return (True, len(self.tensors) - 1)

    def unpack(self, handle):
        kept, v = handle
        if not kept:
            return v
        if self.ready is not None:
            torch.cuda.current_stream().wait_event(self.ready)
        return self.tensors[v]

    def move(self, device: torch.device, stream: torch.cuda.Stream | None) -> None:
        """Copy every tensor to `device` (`move_tensors`)."""
        moved = move_tensors(self.tensors, device, stream)
        if moved is not None:
            self.tensors, self.ready = moved


def move_tensors(
    tensors: list[torch.Tensor], device: torch.device, stream: torch.cuda.Stream | None
) -> tuple[list[torch.Tensor], torch.cuda.Event] | None:
    """Copies of `tensors` on `device`, made on the copy `stream` (pinned on the host), and
    the event a reader waits on; None where there is no copy stream (a CPU device: the
    host tier is the device memory, nothing moves).

    Streams and the caching allocator (torch's `Tensor.record_stream` docs): the allocator
    knows only the stream a block was allocated on. A device copy is therefore allocated
    on the compute stream, which reads it (after waiting on the event), and marked as used
    by the copy stream, which writes it; a device source is marked the same way, so neither
    block is reused while the copy may still run. (Allocated on the copy stream, a reloaded
    block freed after the backward read it could go to the next reload while that backward
    still ran.) Pinned host blocks are held by the host allocator until the copies that
    use them are done."""
    if stream is None:
        return None
    stream.wait_stream(torch.cuda.current_stream())
    to_host = device.type == "cpu"
    dsts = [
        torch.empty(t.shape, dtype=t.dtype, device=device, pin_memory=to_host) for t in tensors
    ]  # on the current stream: where a device copy is consumed
    with torch.cuda.stream(stream):
        for t, dst in zip(tensors, dsts, strict=True):
            dst.copy_(t, non_blocking=True)
            for used in (t, dst):
                if used.is_cuda:  # keep the device block from reuse until the copy is done
                    used.record_stream(stream)
        ready = torch.cuda.Event()
        ready.record(stream)
    return dsts, ready


class CheckpointedAttention:
    """A backend whose attention core is recomputed in backward instead of stored
    (selective recompute, Korthikanti et al. 2022 §4.2); GEMMs pass through."""

    def __init__(self, inner):
        self.inner = inner
        self.name = f"{getattr(inner, 'name', 'backend')}+selective"

    def linear(self, x, weight, bias=None):
        return self.inner.linear(x, weight, bias)

    def attention(self, q, k, v, *, causal=True, alibi_slopes=None):
        return torch.utils.checkpoint.checkpoint(
            self.inner.attention,
            q,
            k,
            v,
            use_reentrant=False,
            causal=causal,
            alibi_slopes=alibi_slopes,
        )
