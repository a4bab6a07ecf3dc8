"""ZB-H1: the zero-bubble pipeline schedule with 1F1B's memory (Qi et al., ICLR 2024, "Zero
Bubble Pipeline Parallelism", §3.1 "ZB-H1"), at layer granularity.

Pure Python (no torch). Each backward pass is split in two (`ratrain.schedule.ir`):

- the *input-gradient* pass of microbatch mb: ``RECV_B`` (s < p - 1), ``B_IN(u, mb)`` over
  the stage's units in reverse, then ``SEND_B`` (s > 0) — the critical path to the
  previous stage;
- the *weight-gradient* pass: ``B_W(u, mb)`` over the units in reverse; each B_W(u, mb)
  depends on its B_IN(u, mb) only, so it can be deferred to fill a bubble.

Pass order on stage s of p, m microbatches (`pass_order`): the same warm-up as 1F1B,
``min(p - s - 1, m)`` forward passes, then steady pairs (F, B_IN), then the cool-down's
input-gradient passes. A weight pass is deferred as long as the stage holds fewer than
`inflight_limit` = p microbatches whose forward ran and whose weight pass did not: the
number stage 0 holds under 1F1B, so the peak over stages is 1F1B's (the later stages,
which held fewer under 1F1B, now hold up to p, partly as the smaller W-retained state).
In the cool-down, one deferred weight pass follows each input-gradient pass (filling the
wait for the next gradient); the rest end the step, in microbatch order. With equal F,
B_IN and B_W times T, the bubble is (p - 1)·T per stage against 1F1B's 3(p - 1)·T.

The lowerings (`ratrain.schedule.lowering`) then add the lifecycle actions as for 1F1B,
keyed on the last B_W of each unit instead of the last B (`ratrain.schedule.passes`).
"""

from __future__ import annotations

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Op, Schedule
from ratrain.schedule.onef1b import build_passes, warmup_passes

__all__ = ["pass_order", "build_zb_h1", "refuse_unsupported", "inflight_limit"]


def inflight_limit(pp: int) -> int:
    """Microbatches a stage may hold between their F and their last B_W: 1F1B's stage 0."""
    return pp


def pass_order(pp: int, m: int, stage: int) -> list[tuple[Op, int]]:
    """The stage's passes in order, as (Op.F, Op.B_IN or Op.B_W, microbatch)."""
    w = warmup_passes(pp, m, stage)
    limit = inflight_limit(pp)
    order = [(Op.F, mb) for mb in range(w)]
    f_next, bi_next, w_next = w, 0, 0
    while f_next < m:  # steady: one forward, one input-gradient pass
        order.append((Op.F, f_next))
        f_next += 1
        order.append((Op.B_IN, bi_next))
        bi_next += 1
        if f_next - w_next >= limit:  # room for the next forward (or the cool-down)
            order.append((Op.B_W, w_next))
            w_next += 1
    while bi_next < m:  # cool-down: a deferred weight pass fills each wait for a gradient
        order.append((Op.B_IN, bi_next))
        bi_next += 1
        if w_next < bi_next:
            order.append((Op.B_W, w_next))
            w_next += 1
    order += [(Op.B_W, mb) for mb in range(w_next, m)]
    return order


def build_zb_h1(spec: ModelSpec, plan: Plan, kind: str = "zb-h1") -> Schedule:
    """Compute and stage-boundary transfers of one ZB-H1 step, with their dependencies
    (`ratrain.schedule.onef1b.build_passes` in this module's `pass_order`)."""
    sch = build_passes(spec, plan, kind, pass_order)
    sch.meta["pipeline"] = "zb-h1"
    return sch


_UNSUPPORTED = (
    (lambda p: p.schedule == "fsdp-pp", "schedule fsdp-pp"),
    (lambda p: p.offload_activations, "offload_activations"),
)


def refuse_unsupported(plan: Plan) -> None:
    """One line naming the first feature a zb-h1 plan asks for that ZB-H1 does not support."""
    if plan.pipeline != "zb-h1":
        return
    for test, name in _UNSUPPORTED:
        if test(plan):
            raise RatrainError(
                f"plan: pipeline zb-h1 does not support {name} yet; use pipeline 1f1b or drop {name}"
            )
