"""The ``fsdp-pp`` lowering: FSDP2-style sharded parameters under 1F1B (torchtitan's
FSDP2 + pipeline parallelism), a baseline the planner searches like the others.

Pure Python (no torch). Modelled on torchtitan's composition of ``fully_shard`` with
``torch.distributed.pipelining``:

- Sharding unit: one *layer* (torchtitan wraps each transformer block, the embedding and
  the head with ``fully_shard``). The fp32 master weights and Adam states of a layer are
  sharded over the data-parallel group (``plan.shard_optimizer`` must be set).
- Views: a compute-dtype view of a layer is all-gathered from the shards before its use
  and freed after it (``meta["view_fetch"] = "all-gather"``, views never outlive a step).
  ``plan.view_policy`` chooses FSDP2's ``reshard_after_forward``:

  * ``"persistent"`` = ``reshard_after_forward=False`` (torchtitan's default under PP):
    the layer is gathered once per step, ``view_lookahead`` uses ahead of its first use
    (FSDP2 prefetches the next layer), and freed after its last use in the step (its last
    microbatch's backward, when FSDP2's post-backward reshards);
  * ``"transient"`` = ``reshard_after_forward=True``: gathered before, and freed after,
    every use (each microbatch's forward, recompute and backward), ``view_lookahead`` uses
    ahead, as the ratrain lowering's transient views (`add_transient_views`).

- Gradients: accumulated unsharded over the step's microbatches (FSDP2 under PP turns
  gradient sync off until the last backward), then one reduce-scatter per layer issued
  right after the layer's last backward. Per layer, not per stage: the reduce-scatters
  overlap the rest of the backward, which is FSDP2's per-module post-backward and the
  stronger choice of the two for a baseline.
- Optimizer: one step for the whole stage at the end of the step, after every
  reduce-scatter and the global checks (``optimizer.step()`` after the schedule's step),
  as in `lower_baseline`; no view refresh after it (the next step gathers on use).
- Recompute: the planner gives the family one policy for every stage (uniform, as
  torchtitan's activation checkpointing); RECOMPUTE is placed as in the other lowerings.

The memory ledger, the simulator and the runtime read the result as any other schedule:
``meta["view_policy"]`` is ``"transient"`` (views live only from VIEW_FETCH to VIEW_DROP),
``meta["grad_sync"]`` is ``"reduce-scatter"``, and ``meta["reshard_after_forward"]``
records the choice.
"""

from __future__ import annotations

from ratrain.config import Plan
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Action, Op, Schedule
from ratrain.schedule.onef1b import splice
from ratrain.schedule.passes import (
    add_transient_views,
    base_schedule,
    bucket_syncs,
    stage_checks,
    view_uses,
)

__all__ = ["lower_fsdp_pp"]


def lower_fsdp_pp(spec: ModelSpec, plan: Plan) -> Schedule:
    assert plan.shard_optimizer, "Plan validation requires shard_optimizer for fsdp-pp"
    reshard = plan.view_policy == "transient"
    sch = base_schedule(spec, plan, "fsdp-pp", "transient")
    sch.meta["reshard_after_forward"] = reshard
    if reshard:
        add_transient_views(sch, plan.view_lookahead)
    else:
        _add_step_views(sch, plan.view_lookahead)
    m = plan.microbatches
    for s, acts in enumerate(sch.stages):
        units = sch.meta["stage_units"][s]
        after, syncs = bucket_syncs(sch, s, acts, m)  # the reduce-scatters, one per unit
        checks = stage_checks(sch, plan, s, syncs)
        upd = Action(Op.UPDATE, s, units)
        sch.add_dep(upd, *syncs, *checks)
        sch.stages[s] = splice(acts, after=after) + [*checks, upd]
    return sch


def _add_step_views(sch: Schedule, lookahead: int) -> None:
    """Gather each unit's view `lookahead` uses ahead of its first use in the step and free
    it after its last use (``reshard_after_forward=False``)."""
    deps = sch.deps
    for s, acts in enumerate(sch.stages):
        uses = view_uses(acts)
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for k, (_, u) in enumerate(uses):
            first.setdefault(u, k)
            last[u] = k
        before: dict[int, list[Action]] = {}
        after: dict[int, list[Action]] = {}
        for u, k in first.items():
            vf = Action(Op.VIEW_FETCH, s, (u,))
            before.setdefault(uses[max(0, k - lookahead)][0], []).append(vf)
            use = acts[uses[k][0]]
            deps[use] = deps.get(use, ()) + (vf,)
            vd = Action(Op.VIEW_DROP, s, (u,))
            end = acts[uses[last[u]][0]]
            deps[vd] = (end,)
            after.setdefault(uses[last[u]][0], []).append(vd)
        sch.stages[s] = splice(acts, before, after)
