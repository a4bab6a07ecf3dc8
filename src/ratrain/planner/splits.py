"""Layer splits: how many blocks each stage (or each chunk of a V) holds. The planner
tries a few per pipeline depth (`splits`: even, or balancing compute, parameters or memory
with `balanced_split`) and, for the V orders, the chunk splits nearest an even load
(`v_splits`). Pure Python.
"""

from __future__ import annotations

import heapq
from functools import lru_cache
from typing import TYPE_CHECKING

from ratrain.config import Plan, even_split, v_stage_of_chunk
from ratrain.models import counts
from ratrain.models.spec import ModelSpec
from ratrain.planner.cache import Memo

if TYPE_CHECKING:
    from ratrain.planner.space import Request

__all__ = ["balanced_split", "splits", "v_splits"]


def balanced_split(costs: list[tuple[float, float]], n_layers: int, pp: int) -> tuple[int, ...]:
    """Blocks per stage minimising the largest stage cost a·n + b, for per-stage (a, b).

    Stage 0 and the last may hold no block (they hold the embedding and the head); middle
    stages hold at least one. Ties keep blocks away from the end stages.
    """
    assert len(costs) == pp
    lows = [0 if (s in (0, pp - 1) and pp > 1) else 1 for s in range(pp)]
    split = list(lows)

    def key(s: int) -> tuple[float, bool, int]:
        return (costs[s][0] * (split[s] + 1) + costs[s][1], s in (0, pp - 1), s)

    # Give each next block to the stage whose cost after taking it is smallest: a heap of
    # those keys (only the stage that takes a block changes its key).
    heap = [key(s) for s in range(pp)]
    heapq.heapify(heap)
    for _ in range(n_layers - sum(lows)):
        s = heap[0][2]
        split[s] += 1
        heapq.heapreplace(heap, key(s))
    return tuple(split)


def _split_costs(req: Request, pp: int, mode: str) -> list[tuple[float, float]]:
    """Per-stage (per-block cost, fixed cost) for a balanced split.

    compute: forward + backward FLOPs of one microbatch (as time at the dtype's peak); params: the
    parameters held; memory: model states (fp32 master, Adam, 16-bit view and gradient:
    16 B per parameter, assumed unsharded) plus the activations of the min(pp - s, m)
    microbatches a 1F1B stage holds at once without recompute.
    """
    spec = req.spec
    head, emb = counts.head_unit(spec), counts.embedding_unit(spec)
    if mode == "compute":
        from ratrain.planner.time_bound import peak_unit_times

        ut = peak_unit_times(spec, req.platform, 1, req.seq, req.compute_dtype)
        block, first, last = ut.f_block + ut.b_block, ut.f_emb + ut.b_emb, ut.f_head + ut.b_head
        return _edges([(block, 0.0)] * pp, first, last)
    if mode == "params":
        block = float(counts.unit_params(spec, 1))
        return _edges(
            [(block, 0.0)] * pp, counts.unit_params(spec, emb), counts.unit_params(spec, head)
        )
    from ratrain.sizes.activations import activation_bytes

    plan = Plan(global_batch=1, seq=req.seq, compute_dtype=req.compute_dtype)
    m = _memory_split_m(req, pp)

    act = {u: activation_bytes(spec, plan, u, "none", flash=True) for u in (emb, 1, head)}

    def cost(u: int, s: int) -> float:
        return 16.0 * counts.unit_params(spec, u) + min(pp - s, m) * act[u]

    costs = [(cost(1, s), 0.0) for s in range(pp)]
    return _edges(costs, cost(emb, 0), cost(head, pp - 1))


def _memory_split_m(req: Request, pp: int) -> int:
    """The microbatches the memory split assumes per pipeline (the most replicas)."""
    return max(1, req.global_batch // max(1, req.clusters // pp))


def _edges(
    costs: list[tuple[float, float]], first: float, last: float
) -> list[tuple[float, float]]:
    costs = list(costs)
    costs[0] = (costs[0][0], costs[0][1] + first)
    costs[-1] = (costs[-1][0], costs[-1][1] + last)
    return costs


_SPLIT_MEMO: Memo[tuple[int, ...]] = Memo(100_000)
"""Balanced layer splits by what they read (`_split`)."""


@lru_cache(maxsize=4096)
def _even_split(n_layers: int, pp: int) -> tuple[int, ...]:
    """`even_split`, memoised (every cluster count the explanation tries asks again)."""
    return tuple(even_split(n_layers, pp))


def splits(req: Request, pp: int, modes: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Distinct layer splits for `pp` stages under the split modes of a family."""
    out: list[tuple[int, ...]] = []
    for mode in modes:
        s = _split(req, pp, mode)
        if s not in out:
            out.append(s)
    return out


def _split(req: Request, pp: int, mode: str) -> tuple[int, ...]:
    if mode == "even":
        return _even_split(req.spec.n_layers, pp)
    # Only the memory mode reads the clusters and the batch, through the microbatches a
    # stage holds at once, min(pp - s, m): m past pp splits alike (one entry for the many
    # cluster counts the explanation tries).
    key = (req.spec, req.platform.name, req.seq, req.compute_dtype, pp, mode)
    if mode == "memory":
        key += (min(pp, _memory_split_m(req, pp)),)
    return _SPLIT_MEMO.get_or(key, _balanced_split_of, req, pp, mode)


def _balanced_split_of(req: Request, pp: int, mode: str) -> tuple[int, ...]:
    return balanced_split(_split_costs(req, pp, mode), req.spec.n_layers, pp)


def v_splits(spec: ModelSpec, pp: int, tries: int = 3) -> list[tuple[int, ...]]:
    """Chunk splits (`Plan.layer_split` under zb-v: blocks per chunk, 2pp) to try for a V
    of `pp` stages: stage 0 holds the embedding and the head, so it gets fewer blocks.
    The stage-0 block counts whose stages come nearest an even load in FLOPs
    (`ratrain.models.counts`, forward and backward per token; the head counted in full)
    are tried, `tries` of them, the rest of the blocks spread evenly over the other
    stages (at least 2 each: a chunk of a middle stage holds a block); each stage's
    blocks split between its two chunks, the earlier chunk the smaller half."""
    n, head = spec.n_layers, spec.n_layers + 1
    if pp < 2 or n < 2 * pp:
        return []
    per_block = counts.unit_fwd_flops(spec, 1, 1, 1) + counts.unit_bwd_flops(spec, 1, 1, 1)
    per_head = counts.unit_fwd_flops(spec, head, 1, 1) + counts.unit_bwd_flops(spec, head, 1, 1)
    loads = []
    for b0 in range(0, n - 2 * (pp - 1) + 1):
        rest = even_split(n - b0, pp - 1)
        if min(rest) < 2:
            continue
        worst = max(b0 * per_block + per_head, max(rest) * per_block)
        loads.append((worst, b0, rest))
    out = []
    for _, b0, rest in sorted(loads)[:tries]:
        per_stage = (b0, *rest)
        split = [0] * (2 * pp)
        for c in range(2 * pp):  # each stage's blocks halved between its two chunks
            b = per_stage[v_stage_of_chunk(pp, c)]
            split[c] = b // 2 if c < pp else b - b // 2
        out.append(tuple(split))
    return out
