"""Communication cost: α–β models of collectives and point-to-point transfers.

A message of S bytes over a link of latency α and bandwidth B·η (η the link's achieved
fraction) costs α + S/(B·η) (calculon's network model; Hockney's α–β model). Collectives
over n ranks, after Thakur, Rabenseifner & Gropp 2005 ("Optimization of Collective
Communication Operations in MPICH") and the NCCL documentation (performance notes on
ring and tree algorithms, nccl-tests' bus bandwidth):

    ring all-reduce        2(n−1)/n · S/B + 2(n−1)·α
    ring reduce-scatter    (n−1)/n · S/B + (n−1)·α         (S: the full, unsharded size)
    ring all-gather        (n−1)/n · S/B + (n−1)·α         (S: the full, gathered size)
    tree all-reduce        2·S/B + 2·⌈log2 n⌉·α            (pipelined double binary tree)
    hierarchical           reduce-scatter within each node, the collective across nodes on
                           S/k (k ranks per node, all nodes' ranks in parallel), all-gather
                           within each node

Rank layouts (`RANK_LAYOUTS`, `rank_of`: defined once in `ratrain.ranks`, which the
runtime's grid places ranks by too; a plan's `rank_layout` picks one); consecutive ranks
fill a node:

- ``"pp-inner"`` (the default): ``rank = replica · pp + stage`` (picotron's
  ``arange(world).view(dp, pp)``): a pipeline's stages are neighbours, so stage-to-stage
  links stay in a node where it holds a pipeline, and each stage's DP group strides across
  nodes;
- ``"dp-inner"``: ``rank = stage · dp + replica``, Megatron-LM's order (data-parallel inside
  pipeline-parallel): a stage's DP peers share a node whenever it can hold them, and
  pipeline neighbours sit ``dp`` ranks apart.

A platform that measured its intra-node collectives (`Platform.collectives`, written by
`ratrain calibrate`) is costed by those fits instead: a measured α plus S over the
measured algorithm bandwidth, which is the collective's wall time (its bus time, the
formula above, leaves out the library's per-call and synchronisation costs).

Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ratrain.cost.measured import measured_collective_s
from ratrain.platforms import Link, Platform
from ratrain.ranks import RANK_LAYOUTS, rank_of

__all__ = [
    "RANK_LAYOUTS",
    "rank_of",
    "Group",
    "dp_group",
    "world_group",
    "p2p_link",
    "message_time_s",
    "ring_allreduce_s",
    "ring_reduce_scatter_s",
    "ring_all_gather_s",
    "tree_allreduce_s",
    "collective_time_s",
    "scalar_allreduce_s",
    "p2p_time_s",
    "COLLECTIVES",
]

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class Group:
    """Where a process group sits: `n` ranks over `nodes` nodes, at most `local` per node."""

    n: int
    nodes: int
    local: int


def _group_of(ranks, units_per_node: int) -> Group:
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[r // units_per_node] = per_node.get(r // units_per_node, 0) + 1
    return Group(n=len(ranks), nodes=len(per_node), local=max(per_node.values()))


@lru_cache(maxsize=4096)
def dp_group(stage: int, pp: int, dp: int, units_per_node: int, layout: str = "pp-inner") -> Group:
    """The DP group of one pipeline stage (memoised: the planner asks for it per action)."""
    ranks = [rank_of(stage, r, pp, dp, layout) for r in range(dp)]
    return _group_of(ranks, units_per_node)


def world_group(pp: int, dp: int, units_per_node: int) -> Group:
    return _group_of(range(pp * dp), units_per_node)


def p2p_link(
    stage: int, peer: int, pp: int, dp: int, platform: Platform, layout: str = "pp-inner"
) -> Link:
    """The link between two stages: inter-node if any replica's pair crosses a node (the
    step waits for the slowest replica)."""
    crosses = _crosses_node(stage, peer, pp, dp, platform.units_per_node, layout)
    return platform.inter_node if crosses else platform.intra_node


@lru_cache(maxsize=65536)
def _crosses_node(stage: int, peer: int, pp: int, dp: int, upn: int, layout: str) -> bool:
    """Whether any replica's pair of the two stages sits on two nodes (memoised: the
    planner asks per send of every plan it costs)."""
    return any(
        rank_of(stage, r, pp, dp, layout) // upn != rank_of(peer, r, pp, dp, layout) // upn
        for r in range(dp)
    )


def _bw(link: Link) -> float:
    return link.bandwidth_bytes_per_s * link.efficiency


def message_time_s(nbytes: float, link: Link) -> float:
    """One message: α + S/(B·η)."""
    return link.latency_s + nbytes / _bw(link)


def ring_allreduce_s(nbytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / _bw(link) + 2 * (n - 1) * link.latency_s


def ring_reduce_scatter_s(nbytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / _bw(link) + (n - 1) * link.latency_s


ring_all_gather_s = ring_reduce_scatter_s  # the same traffic in the other direction


def tree_allreduce_s(nbytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return 2 * nbytes / _bw(link) + 2 * math.ceil(math.log2(n)) * link.latency_s


def _flat(kind: str, nbytes: float, n: int, link: Link, algorithm: str) -> float:
    if kind == "all_reduce":
        fn = tree_allreduce_s if algorithm == "tree" else ring_allreduce_s
        return fn(nbytes, n, link)
    # NCCL runs reduce-scatter and all-gather as rings only.
    return ring_reduce_scatter_s(nbytes, n, link)


def _hierarchical(kind: str, nbytes: float, g: Group, platform: Platform) -> float:
    k, intra, inter = g.local, platform.intra_node, platform.inter_node
    shard = nbytes / k  # each of the node's k ranks carries one k-th across nodes
    if kind == "all_reduce":
        return (
            ring_reduce_scatter_s(nbytes, k, intra)
            + ring_allreduce_s(shard, g.nodes, inter)
            + ring_all_gather_s(nbytes, k, intra)
        )
    # reduce-scatter: within the node, then across; all-gather: the same steps reversed.
    return ring_reduce_scatter_s(nbytes, k, intra) + ring_reduce_scatter_s(shard, g.nodes, inter)


def collective_time_s(
    kind: str, nbytes: float, group: Group, platform: Platform
) -> tuple[float, str]:
    """Time of one collective of `nbytes` (the full, unsharded size) over `group`, and the
    algorithm used to cost it."""
    assert kind in COLLECTIVES, kind
    if group.n <= 1:
        return 0.0, "none"
    algorithm = platform.collective_algorithm
    if group.nodes == 1:
        t = measured_collective_s(kind, nbytes, group.n, platform)
        if t is not None:
            return t, "measured:intra"
        return _flat(kind, nbytes, group.n, platform.intra_node, algorithm), f"{algorithm}:intra"
    if group.local == 1 or algorithm != "hierarchical":
        # A flat ring or tree that crosses nodes runs at the pace of its inter-node hops.
        algo = "ring" if algorithm == "hierarchical" else algorithm
        return _flat(kind, nbytes, group.n, platform.inter_node, algo), f"{algo}:inter"
    return _hierarchical(kind, nbytes, group, platform), "hierarchical"


def scalar_allreduce_s(group: Group, platform: Platform) -> tuple[float, str]:
    """A reduction of a few bytes (gradient norm, overflow flag): latency only, over a tree,
    which NCCL picks for small messages."""
    if group.n <= 1:
        return 0.0, "none"
    if group.nodes == 1:
        t = measured_collective_s("all_reduce", 8, group.n, platform)
        if t is not None:
            return t, "measured:intra"
    link = platform.intra_node if group.nodes == 1 else platform.inter_node
    return 2 * math.ceil(math.log2(group.n)) * link.latency_s, "tree"


def p2p_time_s(nbytes: float, link: Link) -> float:
    """A point-to-point transfer: α + S/(B·η)."""
    return message_time_s(nbytes, link)
