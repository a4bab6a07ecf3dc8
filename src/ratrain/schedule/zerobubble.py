"""ZB-H1 and ZB-H2: zero-bubble pipeline schedules (Qi et al., ICLR 2024, "Zero Bubble
Pipeline Parallelism", §3.1), at layer granularity.

Pure Python (no torch). Each backward pass is split in two (`ratrain.schedule.ir`):

- the *input-gradient* pass of microbatch mb: ``RECV_B`` (s < p - 1), ``B_IN(u, mb)`` over
  the stage's units in reverse, then ``SEND_B`` (s > 0) — the critical path to the
  previous stage;
- the *weight-gradient* pass: ``B_W(u, mb)`` over the units in reverse; each B_W(u, mb)
  depends on its B_IN(u, mb) only, so it can be deferred to fill a bubble.

Pass order on stage s of p, m microbatches (`pass_order`): `warmup` forward passes, then
steady pairs (F, B_IN), then the cool-down's input-gradient passes. A weight pass is
deferred as long as the stage holds fewer than `inflight_limit` microbatches whose
forward ran and whose weight pass did not. In the cool-down, one deferred weight pass
follows each input-gradient pass (filling the wait for the next gradient); the rest end
the step, in microbatch order.

- **zb-h1**: 1F1B's warm-up, ``min(p - s - 1, m)``, and a limit of p on every stage: the
  number stage 0 holds under 1F1B, so the peak over stages is 1F1B's (the later stages,
  which held fewer under 1F1B, now hold up to p, partly as the smaller W-retained state).
  With equal F, B_IN and B_W times T, the bubble is (p - 1)·T per stage against 1F1B's
  3(p - 1)·T.
- **zb-h2**: twice 1F1B's warm-up, ``min(2(p - s - 1), m)``: the extra forwards fill the
  wait for microbatch 0's gradient, which is two passes per later stage (its F and its
  B_IN). The limit is the larger of p and the warm-up plus one: the early stages run
  F, B_IN, B_W in every steady step, the later ones defer as under zb-h1 (with the
  warm-up plus one alone, the last stage could defer nothing, and the step's drain
  waited on its weight passes: 104 T against zb-h1's 100 T at p = 2, m = 8). Stage s
  holds up to max(p, 2(p - s) - 1) microbatches, stage 0 2p - 1, about twice 1F1B's.
  With equal times per stage, it is no faster than zb-h1: what is left of the bubble
  is the step's ramp, (p - 1)·T per stage. It gains where a later stage's F + B_IN
  outlasts an earlier stage's forward, so that the earlier stage waits for its first
  gradient under zb-h1 (an unbalanced split, a heavy head): there the extra forwards
  fill that wait. The paper's ZB-H2 also removes the ramp, by letting the next step's
  forwards start before the optimizer step; here every step ends with its updates.

The lowerings (`ratrain.schedule.lowering`) then add the lifecycle actions as for 1F1B,
keyed on the last B_W of each unit instead of the last B (`ratrain.schedule.passes`).
"""

from __future__ import annotations

from functools import partial

from ratrain.config import SPLIT_PIPELINES, Plan
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Op, Schedule
from ratrain.schedule.onef1b import build_passes, warmup_passes

__all__ = [
    "pass_order",
    "order_of",
    "build_zb",
    "refuse_unsupported",
    "inflight_limit",
    "warmup",
]


def warmup(pp: int, m: int, stage: int, pipeline: str = "zb-h1") -> int:
    """Forward passes the stage runs before its first input-gradient pass (or backward
    pass: 1F1B's for 1f1b and zb-h1)."""
    if pipeline == "zb-h2":
        return min(2 * (pp - stage - 1), m)
    return warmup_passes(pp, m, stage)


def inflight_limit(pp: int, w: int, pipeline: str = "zb-h1") -> int:
    """Microbatches a stage whose warm-up is `w` may hold between their F and their last
    B_W: 1F1B's stage 0, p (zb-h1); and under zb-h2 at least the warm-up plus one (with
    w = m every forward is in the warm-up, and the limit is never reached)."""
    if pipeline == "zb-h2":
        return max(pp, w + 1)
    return pp


def pass_order(pp: int, m: int, stage: int, pipeline: str = "zb-h1") -> list[tuple[Op, int]]:
    """The stage's passes in order, as (Op.F, Op.B_IN or Op.B_W, microbatch)."""
    w = warmup(pp, m, stage, pipeline)
    return order_of(m, w, inflight_limit(pp, w, pipeline))


def order_of(m: int, w: int, limit: int) -> list[tuple[Op, int]]:
    """`pass_order` of a stage with warm-up `w` and in-flight limit `limit`."""
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


def build_zb(spec: ModelSpec, plan: Plan, kind: str) -> Schedule:
    """Compute and stage-boundary transfers of one zero-bubble step (``plan.pipeline``
    zb-h1 or zb-h2), with their dependencies (`ratrain.schedule.onef1b.build_passes` in
    this module's `pass_order`)."""
    sch = build_passes(spec, plan, kind, partial(pass_order, pipeline=plan.pipeline))
    sch.meta["pipeline"] = plan.pipeline
    return sch


_UNSUPPORTED = (
    (lambda p: p.schedule == "fsdp-pp", "schedule fsdp-pp"),
    (lambda p: p.chunks == 2 and p.offload_activations, "offload_activations"),
)


def refuse_unsupported(plan: Plan) -> None:
    """One line naming the first feature a zero-bubble plan (or a V-shaped one) asks for
    that its pass order does not support."""
    if plan.pipeline not in SPLIT_PIPELINES and plan.chunks == 1:
        return
    for test, name in _UNSUPPORTED:
        if test(plan):
            raise RatrainError(
                f"plan: pipeline {plan.pipeline} does not support {name} yet; use pipeline "
                f"1f1b or drop {name}"
            )
