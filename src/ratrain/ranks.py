"""Rank layouts: which global rank holds (stage, replica) of a pp x dp grid.

Consecutive ranks fill a node (a launcher starts `ranks_per_node` of them per node), so the
layout decides which of the two dimensions crosses the links between nodes:

- ``"pp-inner"`` (the default): ``rank = replica · pp + stage`` (picotron's
  ``arange(world).view(dp, pp)``): a pipeline's stages are neighbours, so stage-to-stage
  links stay in a node where it holds a pipeline, and each stage's DP group strides
  across nodes;
- ``"dp-inner"``: ``rank = stage · dp + replica``, Megatron-LM's order (data-parallel
  inside pipeline-parallel): a stage's DP peers share a node whenever it can hold them,
  and pipeline neighbours sit ``dp`` ranks apart.

The one definition that the cost model (`ratrain.cost.comm`), the simulator and the
runtime's grid (`ratrain.launch.grid`) share. Pure Python, no imports.
"""

from __future__ import annotations

__all__ = ["RANK_LAYOUTS", "rank_of", "coords_of", "layouts_differ"]

RANK_LAYOUTS = ("pp-inner", "dp-inner")


def rank_of(stage: int, replica: int, pp: int, dp: int, layout: str = "pp-inner") -> int:
    """The global rank of (stage, replica) under a layout of `RANK_LAYOUTS`."""
    if layout == "pp-inner":
        return replica * pp + stage
    assert layout == "dp-inner", layout
    return stage * dp + replica


def coords_of(rank: int, pp: int, dp: int, layout: str = "pp-inner") -> tuple[int, int]:
    """(stage, replica) of a global rank: the inverse of `rank_of`."""
    if layout == "pp-inner":
        replica, stage = divmod(rank, pp)
        return stage, replica
    assert layout == "dp-inner", layout
    return divmod(rank, dp)


def layouts_differ(pp: int, dp: int, ranks_per_node: int) -> bool:
    """Whether the layouts place a pp x dp grid differently on nodes of `ranks_per_node`:
    not with one stage or one replica (the layouts are the same numbering), nor when every
    rank has a node of its own or all share one (every link is then alike)."""
    return pp > 1 and dp > 1 and 1 < ranks_per_node < pp * dp
