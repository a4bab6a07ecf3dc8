"""Cost models: kernel time, tier moves and collectives of a plan's actions on a platform.

Pure Python (no torch). `CostModel` prices every schedule action; `compute` holds the only
two functions that decide kernel time (`gemm_time_s`, `attention_time_s`); `comm` the
α–β collective and point-to-point models and the rank layout.
"""

from ratrain.cost.comm import Group, collective_time_s, dp_group, p2p_link, p2p_time_s
from ratrain.cost.compute import Kernel, attention_time_s, gemm_time_s, unit_kernels
from ratrain.cost.model import COST_CATEGORIES, ActionCost, CostModel, only

__all__ = [
    "COST_CATEGORIES",
    "ActionCost",
    "CostModel",
    "Group",
    "Kernel",
    "attention_time_s",
    "collective_time_s",
    "dp_group",
    "gemm_time_s",
    "only",
    "p2p_link",
    "p2p_time_s",
    "unit_kernels",
]
