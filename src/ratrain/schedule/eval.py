"""The forward-only schedule of an evaluation: the loss on a held-out set, through the
pipeline, with no gradients and no state change.

Pure Python (no torch). `build_eval_schedule(spec, plan, n)` is the forward passes of the
1F1B step of `plan` over `n` microbatches per replica (`build_1f1b` with every backward
pass left out): per stage, for mb = 0..n-1, ``RECV_F`` (s > 0), ``F(u, mb)`` over its
units, ``SEND_F`` (s < p - 1); under zb-v, each stage's first chunk for every
microbatch, then its second's (`build_chunk_passes`). No B, RECOMPUTE, OFFLOAD/RELOAD, GRAD_SYNC, global check or
UPDATE. Views follow the training schedule's policy: persistent views are live between
steps, so nothing is fetched; transient views (ratrain's ``view_policy="transient"``,
fsdp-pp) are fetched ``view_lookahead`` uses ahead of each F and dropped after it
(`add_transient_views`), an all-gather of the shards when the optimizer is sharded.

``meta["forward_only"]`` is True: `check_schedule` then expects one F per (unit, mb) and
no backward or gradient action, and takes the microbatch count from
``meta["microbatches"]``; the memory ledger frees each F's activations at its end (under
no_grad nothing is kept for a backward). The other meta keys are those of a training
schedule (`ratrain.schedule.lowering`), with ``grad_sync`` None and no global checks.
"""

from __future__ import annotations

from ratrain.config import Plan
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Op, Schedule
from ratrain.schedule.onef1b import build_1f1b, build_chunk_passes
from ratrain.schedule.passes import add_transient_views, sync_buckets
from ratrain.sizes.states import view_bytes_per_param

__all__ = ["build_eval_schedule", "eval_plan", "FORWARD_OPS"]

FORWARD_OPS = (Op.F, Op.SEND_F, Op.RECV_F, Op.VIEW_FETCH, Op.VIEW_DROP)
"""The ops a forward-only schedule may hold."""


def eval_plan(plan: Plan, n_microbatches: int) -> Plan:
    """`plan` with `n_microbatches` microbatches per replica (its global batch changed)."""
    return plan.replace(global_batch=plan.dp * plan.micro_batch * n_microbatches)


def _view_policy(plan: Plan) -> str:
    """The view policy of `plan`'s training schedule (`lower_ratrain`, `lower_fsdp_pp`;
    baseline and gpu-style keep views persistent)."""
    if plan.schedule == "fsdp-pp":
        return "transient"
    if plan.schedule == "ratrain" and view_bytes_per_param(plan):
        return plan.view_policy
    return "persistent"


def build_eval_schedule(spec: ModelSpec, plan: Plan, n_microbatches: int) -> Schedule:
    """The forward passes of `n_microbatches` microbatches per replica, in order, on
    `plan`'s stages (see the module docstring)."""
    ev = eval_plan(plan, n_microbatches)
    ev.check_for(spec)
    if plan.chunks == 1:
        sch = build_1f1b(spec, ev, kind="eval")
    else:  # each stage's first chunk for every microbatch, then its second's
        orders = [
            [(Op.F, c, mb) for c in ev.stage_chunks(s) for mb in range(n_microbatches)]
            for s in range(ev.pp)
        ]
        sch = build_chunk_passes(spec, ev, "eval", orders)
    keep = (Op.F, Op.SEND_F, Op.RECV_F)
    sch.stages = [[a for a in acts if a.op in keep] for acts in sch.stages]
    sch.deps = {a: d for a, d in sch.deps.items() if a.op in keep}
    vb = view_bytes_per_param(plan)
    policy = _view_policy(plan)
    sch.meta.update(
        forward_only=True,
        grad_sync=None,
        view_fetch=None if vb == 0 else ("all-gather" if plan.shard_optimizer else "cast"),
        view_policy=policy,
        global_checks=(),
        sync_buckets=[sync_buckets(spec, plan, s) for s in range(plan.pp)],
    )
    if policy == "transient" and vb:
        add_transient_views(sch, plan.view_lookahead)
    return sch
