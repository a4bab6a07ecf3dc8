"""Point-to-point and collective communication behind one interface (gloo on CPU, NCCL on CUDA).

Every call is asynchronous and returns a handle with `wait()` and `is_completed()`; a call
that has nothing to do (dp = 1, no neighbour) returns an already-completed handle, so the
executor never special-cases degenerate grids.

Determinism: a collective's summation order depends on the algorithm, which depends on
the message size and the group, never on timing. The executor therefore always reduces
the same tensors (one flat gradient buffer per unit) whatever the schedule, which keeps
Baseline-1F1B and RATrain bit-identical.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ratrain.launch.grid import ParallelGrid

__all__ = ["Handle", "Comm", "DONE", "join", "p2p_tag"]

# torch >= 2.13 renamed the tensor-in / tensor-out collectives; older releases have the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_TAG_F, _TAG_B = 0, 1 << 20


def p2p_tag(backward: bool, unit: int, mb: int) -> int:
    """The tag of a stage-to-stage message: the unit named on both sides of the transfer
    (`ratrain.schedule.ir`), its microbatch and its direction, so that the messages a pair
    of ranks exchange in a step are told apart however many chunks each holds (a V's
    stages exchange activations and gradients both ways). Within int32 for up to 2**14
    units at `MAX_MICROBATCHES` (2**16) microbatches."""
    return ((unit << 16 | mb) << 1) | backward


class Handle:
    """An in-flight operation (or several issued together)."""

    __slots__ = ("_works",)

    def __init__(self, *works: dist.Work | None):
        self._works = [w for w in works if w is not None]

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works = []

    def is_completed(self) -> bool:
        self._works = [w for w in self._works if not w.is_completed()]
        return not self._works


DONE = Handle()


def join(handles: list[Handle]) -> Handle:
    """One handle for several: complete when all are."""
    return Handle(*(w for h in handles for w in h._works))


class Comm:
    """The communication a stage rank does: with its neighbours, its DP group, everyone."""

    def __init__(self, grid: ParallelGrid):
        self.grid = grid

    # -- stage to stage -------------------------------------------------------------------
    def send_to(self, t: torch.Tensor, stage: int, tag: int) -> Handle:
        """To the rank of `stage` in this replica (the executor's transfers: `p2p_tag`). On
        NCCL through the group of that direction alone (`ParallelGrid.p2p_group`)."""
        dst = self.grid.rank_of(stage)
        group = self.grid.p2p_group(self.grid.rank, dst)
        return Handle(dist.isend(t.contiguous(), dst, group=group, tag=tag))

    def recv_from(self, buf: torch.Tensor, stage: int, tag: int) -> Handle:
        src = self.grid.rank_of(stage)
        group = self.grid.p2p_group(src, self.grid.rank)
        return Handle(dist.irecv(buf, src, group=group, tag=tag))

    # The neighbours' messages by microbatch alone (`ratrain.calibrate.comm`'s ping-pong).
    def send_activation(self, t: torch.Tensor, mb: int) -> Handle:
        return self.send_to(t, self.grid.stage + 1, _TAG_F + mb)

    def recv_activation(self, buf: torch.Tensor, mb: int) -> Handle:
        return self.recv_from(buf, self.grid.stage - 1, _TAG_F + mb)

    def send_grad(self, t: torch.Tensor, mb: int) -> Handle:
        return self.send_to(t, self.grid.stage - 1, _TAG_B + mb)

    def recv_grad(self, buf: torch.Tensor, mb: int) -> Handle:
        return self.recv_from(buf, self.grid.stage + 1, _TAG_B + mb)

    # -- data-parallel group --------------------------------------------------------------
    def dp_all_reduce(self, t: torch.Tensor) -> Handle:
        """Sum over the replicas of this stage, in place."""
        if self.grid.dp == 1:
            return DONE
        return Handle(dist.all_reduce(t, group=self.grid.dp_group, async_op=True))

    def dp_reduce_scatter(self, shard: torch.Tensor, full: torch.Tensor) -> Handle:
        """shard <- this replica's 1/dp of the sum of `full` over replicas."""
        if self.grid.dp == 1:
            shard.copy_(full)
            return DONE
        return Handle(_reduce_scatter_single(shard, full, group=self.grid.dp_group, async_op=True))

    def dp_all_gather(self, full: torch.Tensor, shard: torch.Tensor) -> Handle:
        """full <- the replicas' shards, replica order."""
        if self.grid.dp == 1:
            full.copy_(shard)
            return DONE
        return Handle(_all_gather_single(full, shard, group=self.grid.dp_group, async_op=True))

    # -- every rank -----------------------------------------------------------------------
    def world_all_gather(self, t: torch.Tensor) -> tuple[torch.Tensor, Handle]:
        """(world, *t.shape) tensor of every rank's `t`, rank order."""
        flat = t.new_empty(self.grid.world_size * t.numel())
        out = flat.view(self.grid.world_size, *t.shape)  # (world, *t.shape)
        if self.grid.world_size == 1:
            out[0].copy_(t)
            return out, DONE
        return out, Handle(_all_gather_single(flat, t.contiguous().view(-1), async_op=True))

    def world_all_reduce_max(self, t: torch.Tensor) -> Handle:
        if self.grid.world_size == 1:
            return DONE
        return Handle(dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True))

    def world_all_reduce_sum(self, t: torch.Tensor) -> Handle:
        if self.grid.world_size == 1:
            return DONE
        return Handle(dist.all_reduce(t, async_op=True))
