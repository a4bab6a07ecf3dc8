"""One training step of a plan as a schedule: the dispatch to its lowering
(`ratrain.schedule.lowering` for baseline, gpu-style and ratrain, `ratrain.schedule.fsdp`
for fsdp-pp). Apart from both, so that neither lowering imports the other. Pure Python.
"""

from __future__ import annotations

from ratrain.config import Plan
from ratrain.gcpause import gc_paused
from ratrain.models.spec import ModelSpec
from ratrain.schedule.fsdp import lower_fsdp_pp
from ratrain.schedule.ir import Schedule
from ratrain.schedule.lowering import lower_baseline, lower_gpu_style, lower_ratrain
from ratrain.schedule.rendezvous import post_receives_ahead, post_receives_first
from ratrain.schedule.zerobubble import refuse_unsupported

__all__ = ["build_schedule"]

_LOWERINGS = {
    "baseline": lower_baseline,
    "gpu-style": lower_gpu_style,
    "ratrain": lower_ratrain,
    "fsdp-pp": lower_fsdp_pp,
}


@gc_paused()  # bulk building of acyclic data: see ratrain.gcpause
def build_schedule(spec: ModelSpec, plan: Plan) -> Schedule:
    """One training step of `plan`, lowered as ``plan.schedule`` says (with ``plan.pipeline``
    zb-h1, zb-h2, zb-v or 1f1b-v, a zero-bubble or V-shaped pass order:
    `ratrain.schedule.zerobubble.refuse_unsupported` first refuses in one line the features
    it does not support yet). Each stage posts its receives before the sends issued at the
    same moment, and each one receive ahead (`ratrain.schedule.rendezvous`'s
    `post_receives_first`, then `post_receives_ahead`)."""
    plan.check_for(spec)
    refuse_unsupported(plan)
    return post_receives_ahead(post_receives_first(_LOWERINGS[plan.schedule](spec, plan)))
