"""The families the planner searches: each a system (RATrain, the GPU-style baselines) as
the knobs it may turn. Apart from the search space (`ratrain.planner.space`), so that the
ablations (`ratrain.planner.ablation`) derive theirs from the catalogue below it. Pure
Python.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALL_FAMILIES", "COMPARED_FAMILIES", "FAMILIES", "Family"]


@dataclass(frozen=True)
class Family:
    """A system whose knobs the planner searches."""

    name: str
    schedule: str
    description: str
    per_stage_recompute: bool
    """True: each stage picks its own policy; False: one policy for every stage."""
    shard: tuple[bool, ...]
    views: tuple[tuple[str, int], ...]
    """(view_policy, view_lookahead) pairs."""
    offload: tuple[bool, ...]
    split_modes: tuple[str, ...]
    pipelines: tuple[str, ...] = ("1f1b",)
    """Pass orders (`Plan.pipeline`) searched where the pipeline has a bubble
    (`ratrain.planner.space.pipelines`); zb-h1 and zb-h2 only with the knobs they support;
    zb-v and 1f1b-v on the structures of the best plans found (`ratrain.planner.search`)."""


_ALL_VIEWS = (("persistent", 1), ("transient", 1), ("transient", 2))
_SPLITS = ("even", "compute", "params")

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "ratrain",
            "ratrain",
            "RATrain lifecycle schedule: per-layer sync, update and view prefetch",
            per_stage_recompute=True,
            shard=(False, True),
            views=_ALL_VIEWS,
            offload=(False, True),
            split_modes=(*_SPLITS, "memory"),
            # The baselines keep the 1F1B of the systems they stand for.
            pipelines=("1f1b", "zb-h1", "zb-h2", "zb-v", "1f1b-v"),
        ),
        Family(
            "gpu-style",
            "gpu-style",
            "Megatron-like 1F1B: uniform recompute, bucketed overlapped sync, end-of-step optimizer",
            per_stage_recompute=False,
            shard=(False, True),  # Megatron's distributed optimizer is one of its knobs
            views=(("persistent", 1),),
            offload=(False,),
            split_modes=_SPLITS,
        ),
        Family(
            "zero1-pp",
            "baseline",
            "DeepSpeed-like ZeRO-1 + PP: Baseline-1F1B with optimizer states sharded over DP",
            per_stage_recompute=False,
            shard=(True,),
            views=(("persistent", 1),),
            offload=(False,),
            split_modes=_SPLITS,
        ),
        Family(
            "fsdp-pp",
            "fsdp-pp",
            "torchtitan-like FSDP2 + 1F1B: per-layer sharded parameters all-gathered on use, "
            "reduce-scattered gradients, end-of-step optimizer",
            per_stage_recompute=False,
            shard=(True,),  # sharded parameters are the family
            # persistent: reshard_after_forward=False (gathered once per step);
            # transient: reshard_after_forward=True (gathered per use); see schedule/fsdp.py
            views=(("persistent", 1), ("transient", 1)),
            offload=(False,),
            split_modes=_SPLITS,
        ),
        Family(
            "baseline",
            "baseline",
            "Baseline-1F1B: sync after the flush, one optimizer step per stage",
            per_stage_recompute=False,
            shard=(False,),
            views=(("persistent", 1),),
            offload=(False,),
            split_modes=_SPLITS,
        ),
    ]
}
COMPARED_FAMILIES = ("gpu-style", "zero1-pp", "fsdp-pp")
"""The families ratrain's plan is compared against (`ratrain plan --baselines`, the paper's
tables). Not the "baseline" family: that is Baseline-1F1B, the reference schedule."""
ALL_FAMILIES = tuple(FAMILIES)
