"""Which parameter views a stage holds, as the lowerings place them: read by the planner's
memory bound and its memory-saving order, which must agree with the schedule. Pure Python.

A view (the compute-dtype working copy of a unit's weights, `ratrain.schedule.passes`) is
*transient* when it lives only from a VIEW_FETCH to a VIEW_DROP within the step (ratrain's
transient views, fsdp-pp's under either resharding policy), else persistent between steps.
"""

from __future__ import annotations

__all__ = ["PREFETCHING", "prefetched_views_of", "transient_views_of", "view_rank"]

PREFETCHING = ("ratrain", "fsdp-pp")
"""The lifecycles whose transient views are fetched ahead of their use."""


def transient_views_of(schedule: str, view_policy: str) -> bool:
    """Whether a plan with this lifecycle and view policy holds views only from a
    VIEW_FETCH to a VIEW_DROP within the step."""
    return schedule == "fsdp-pp" or (schedule == "ratrain" and view_policy == "transient")


def prefetched_views_of(schedule: str, view_policy: str, view_lookahead: int) -> bool:
    """Whether, while B(u) runs, the view of the unit the backward pass reads next is held
    too: views fetched at least one use ahead and dropped after the use
    (`passes.add_transient_views`: ratrain's transient views, fsdp-pp resharding), or
    gathered before their first use of the step and freed after their last (fsdp-pp
    without resharding, `fsdp._add_step_views`: the unit below was used in the forward
    passes and its last backward pass is still ahead)."""
    if schedule == "fsdp-pp" and view_policy == "persistent":
        return True
    return view_lookahead >= 1 and view_policy == "transient" and schedule in PREFETCHING


def view_rank(schedule: str, view_policy: str, view_lookahead: int) -> int:
    """How many views the planner's memory bound holds, as an order (a lower rank holds no
    more, all else equal): 0 the running unit's alone, 1 with the next unit's fetched
    ahead, 2 every view of the stage for the whole step."""
    if not transient_views_of(schedule, view_policy):
        return 2
    return int(prefetched_views_of(schedule, view_policy, view_lookahead))
