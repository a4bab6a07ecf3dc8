"""Where RATrain's gain comes from: its family with one lifecycle mechanism switched off.

Each ablation is the ``ratrain`` family (`ratrain.planner.families.FAMILIES`) with one of its
knobs taken away, searched (re-planned) under the same memory cap as the full family:

- ``no-layer-sync``: no per-layer gradient sync and update. The step uses the gpu-style
  lowering's bucketed, overlapped syncs and one optimizer step per stage after them. The
  lifecycle lowering's transient views and offload exist only with per-layer updates, so
  they go with it; sharding, per-stage recompute and uneven splits stay.
- ``no-transient-views``: views persistent between steps.
- ``no-per-stage-recompute``: one recompute policy for every stage.
- ``no-offload``: no activation offload.
- ``no-uneven-split``: blocks split evenly over the stages.
- ``no-zb``: the 1F1B pass order only (no zero-bubble ZB-H1 or ZB-H2,
  `ratrain.schedule.zerobubble`): what the split backward adds where it is supported.

Pure Python.
"""

from __future__ import annotations

from dataclasses import replace

from ratrain.planner.families import FAMILIES, Family

__all__ = ["ABLATIONS", "ablation_families"]


def ablation_families() -> dict[str, Family]:
    full = FAMILIES["ratrain"]
    variants = {
        "no-layer-sync": dict(schedule="gpu-style", views=(("persistent", 1),), offload=(False,)),
        "no-transient-views": dict(views=(("persistent", 1),)),
        "no-per-stage-recompute": dict(per_stage_recompute=False),
        "no-offload": dict(offload=(False,)),
        "no-uneven-split": dict(split_modes=("even",)),
        "no-zb": dict(pipelines=("1f1b",)),
    }
    return {
        f"ratrain-{k}": replace(full, name=f"ratrain-{k}", description=f"ratrain, {k}", **kw)
        for k, kw in variants.items()
    }


ABLATIONS: dict[str, Family] = ablation_families()
"""Family name -> the ratrain family with one mechanism off (searchable like a family)."""
