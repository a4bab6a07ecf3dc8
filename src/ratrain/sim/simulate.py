"""Simulate one training step of a plan on a platform: the schedule IR, timed by the cost
model on the event engine, with the memory ledger's bytes laid on the same clock. Where a
node's ranks share its cores, the engine runs with processor sharing (`ratrain.sim.sharing`):
a rank computes faster while the node's other ranks wait. Where the plan crosses nodes,
transfers and DP collectives also hold the links at both ends (`ratrain.cost.links`)."""

from __future__ import annotations

import itertools
import operator

from ratrain import deadline
from ratrain.config import Plan
from ratrain.cost.links import LinkUse, crosses_nodes, link_use
from ratrain.cost.model import CostModel, cost_key
from ratrain.gcpause import gc_paused
from ratrain.models.spec import ModelSpec
from ratrain.platforms import Platform, load
from ratrain.schedule.ir import _MB_OPS, Action, Op, Resource, Schedule
from ratrain.schedule.zerobubble import warmup
from ratrain.sim.engine import run_flat
from ratrain.sim.flat import Needed, graph, run_plain
from ratrain.sim.result import SimEvent, SimResult, stage_metrics_flat
from ratrain.sim.sharing import node_sharing, run_shared

__all__ = ["simulate", "simulate_schedule", "platform_ledger", "memory_microbatches"]

_COST_KEY = operator.attrgetter("op", "stage", "units")  # `cost_key` with no weight visit
_TIME_S = operator.attrgetter("time_s")
_BOUND = operator.attrgetter("bound")
_ALGORITHM = operator.attrgetter("algorithm")


def _timeline(
    schedule: Schedule, cost: CostModel, keep_events: bool = True, drops: bool = True
) -> tuple[list[SimEvent], list, float]:
    """Replay the schedule; return its events (none unless `keep_events`), the per-stage
    columns (actions, resource values, start_s, end_s, issue_s) that `stage_metrics_flat`
    and `_memory_starts` read, and the step's end.

    `drops=False`: the VIEW_DROPs are left out where they time nothing (`_untimed`); the
    events and columns then lack them."""
    sharing = node_sharing(cost)
    absent = _untimed(cost) if not drops and sharing is None else frozenset()
    try:
        g = graph(schedule, absent)
    except Needed:  # something waits for a drop: every action is replayed
        absent = frozenset()
        g = graph(schedule)
    deadline.check()  # between phases: a planner's deadline (`ratrain.deadline`)
    acts = g.acts
    costs = _costs(cost, acts)
    deadline.check()
    resources = _resources(cost, acts)
    durations = list(map(_TIME_S, costs))
    if cost.platform.collective_compute_s_per_byte:
        _charge_stolen_compute(g, cost, durations, resources)
    links = _links(schedule, cost, g)
    if sharing is not None:  # ranks share their node's cores: faster while others wait
        fixed = [c.fixed_s for c in costs]
        issue, start, end = run_shared(schedule, durations, resources, fixed, sharing, links)
    else:
        times = run_plain(g, durations, resources, links)
        if times is None:
            if absent:  # explained on every action
                return _timeline(schedule, cost, keep_events, drops=True)
            run_flat(schedule, durations, resources, links)  # raises, saying where
        issue, start, end = times
    deadline.check()
    res_values = [r._value_ for r in resources]  # Resource.value, without the enum descriptor
    columns = []
    for s in range(schedule.pp):
        lo, hi = g.first[s], g.first[s + 1]
        columns.append((acts[lo:hi], res_values[lo:hi], start[lo:hi], end[lo:hi], issue[lo:hi]))
    step_s = max(end, default=0.0)
    if not keep_events:
        return [], columns, step_s
    # SimEvent(stage, action, resource, start_s, end_s, issue_s, bound, algorithm), built by
    # tuple.__new__ on its fields in order (no Python-level constructor per event).
    fields = zip(
        g.stage,
        acts,
        res_values,
        start,
        end,
        issue,
        map(_BOUND, costs),
        map(_ALGORITHM, costs),
        strict=True,
    )
    events = list(map(tuple.__new__, itertools.repeat(SimEvent), fields))
    return events, columns, step_s


def _untimed(cost: CostModel) -> frozenset:
    """The ops whose actions time no other action, where the cost model is
    `CostModel`'s own: VIEW_DROP. It takes no time (`CostModel._raw_cost`), holds its
    stage's NONE queue, which no other op uses (`Action.resource`), and no action depends
    on one in the lowerings (`ratrain.sim.flat.graph` says so where one does: `Needed`).
    Leaving drops out then changes no other action's times, nor the step's end. A
    lowering's drop follows, in its stage's list, the one compute action it depends on (the
    view's last use: `passes.add_transient_views`, `fsdp`), and a stage runs its compute in
    list order, so its drops are ready in list order and none waits behind another: each
    ends at the later of its issue (when the stage's walk passed it) and its use's end,
    both times of other actions. So a step whose other actions repeat repeats with its
    drops too (the steady-state checks, `ratrain.sim.steady_one`, read the events of a
    short step timed without them). Their utilization (NONE's) is 0 either way."""
    return _DROPS if _own(cost, "action") and _own(cost, "resource") else frozenset()


_DROPS = frozenset({Op.VIEW_DROP})


def _own(cost: CostModel, name: str) -> bool:
    """Whether `cost`'s method `name` is `CostModel`'s own, not overridden."""
    return getattr(getattr(cost, name), "__func__", None) is getattr(CostModel, name)


def _links(schedule: Schedule, cost: CostModel, g) -> LinkUse | None:
    """The links between nodes each action holds (`ratrain.cost.links`), or None where the
    plan crosses no node (the engine's plain path, with no per-action work)."""
    if not crosses_nodes(cost):
        return None
    return link_use(cost, g.acts, g.peer)


def _memory_starts(columns: list) -> list[list[float]]:
    """Per stage, when each action takes its memory: a compute action when it starts, any
    other when it is issued (the ledger counts an async action's allocations from its
    issue). Both follow the stage's list."""
    compute = Resource.COMPUTE.value
    return [
        [t0 if r == compute else t for r, t0, t in zip(res, start, issue, strict=True)]
        for _, res, start, _, issue in columns
    ]


def _costs(cost: CostModel, acts: list) -> list:
    """`cost.action(a)` of every action. `CostModel.action` caches by `cost_key` (op, stage, units):
    where it is not overridden, it is called once per such key, on the key's first action
    and in the order of first occurrence (the calls the plain loop makes that miss its
    cache), and the cached costs are laid out by key."""
    if not _own(cost, "action"):
        return [cost.action(a) for a in acts]
    plan = cost.plan
    # What B_IN keeps for a deferred B_W moves under the OFFLOAD's own key (`cost_key`).
    keys = list(
        map(cost_key if plan.offload_activations and plan.split_backward else _COST_KEY, acts)
    )
    first = dict(zip(reversed(keys), reversed(acts), strict=True))  # key -> its first action
    memo = {k: cost.action(first[k]) for k in dict.fromkeys(keys)}
    return list(map(memo.__getitem__, keys))


def _resources(cost: CostModel, acts: list) -> list[Resource]:
    """`cost.resource(a)` of every action: looked up per op where the cost model's method
    is `CostModel.resource` (it depends on the op alone)."""
    if not _own(cost, "resource"):
        return [cost.resource(a) for a in acts]
    by_op = {op: cost.resource(_probe(op)) for op in Op}
    return [by_op[a.op] for a in acts]


def _probe(op: Op) -> Action:
    """Some action with op `op`, for what depends on the op alone."""
    mb = 0 if op in _MB_OPS else None
    return Action(op, 0, (0,), mb)


def _charge_stolen_compute(
    g, cost: CostModel, durations: list[float], resources: list[Resource]
) -> None:
    """Add each DP collective's CPU work (`CostModel.stolen_compute_s`) to the next compute
    action of its stage's list: the one the walk runs while the collective is in flight.
    A collective with no compute after it slows nothing (its wall time is its own)."""
    acts, first = g.acts, g.first
    for s in range(len(first) - 1):
        pending = 0.0
        for i in range(first[s], first[s + 1]):
            if resources[i] is Resource.COMPUTE:
                if pending:
                    durations[i] += pending
                    pending = 0.0
            else:
                pending += cost.stolen_compute_s(acts[i])


def _memory(ledger, starts: list[list[float]]):
    """The ledger's per-action bytes, placed on the simulated clock."""
    timeline, peaks, breakdowns = [], [], []
    for s, led in enumerate(ledger.stages):
        t_of = starts[s]
        timeline.append([(t_of[i] if 0 <= i < len(t_of) else 0.0, b) for i, b in led.trace])
        peaks.append(int(led.peak_bytes))
        breakdowns.append(dict(led.breakdown_at_peak))
    return timeline, peaks, breakdowns


@gc_paused()
def simulate_schedule(
    schedule: Schedule,
    cost: CostModel,
    *,
    ledger=None,
    keep_events: bool = True,
    drops: bool = True,
) -> SimResult:
    """Time a given schedule with a given cost model; `ledger` (from `ratrain.memory.replay`)
    adds memory over time, or None to leave memory out; `keep_events=False` leaves the
    per-action events out (a search reads the step's figures only); `drops=False` leaves
    the VIEW_DROPs out where they time nothing (`_untimed`: the same figures; the planner's
    steps), not where the ledger's trace is placed on the clock (it indexes every action)."""
    if ledger is not None and any(st.rows for st in ledger.stages):
        drops = True
    events, columns, step_s = _timeline(schedule, cost, keep_events, drops)
    bubble, util, exposed = stage_metrics_flat(columns, step_s)
    plan = cost.plan
    result = SimResult(
        step_time_s=step_s,
        tokens_per_s=plan.tokens_per_step / step_s if step_s > 0 else float("inf"),
        bubble_fraction=sum(bubble) / len(bubble),
        stage_bubble=bubble,
        utilization=util,
        exposed=exposed,
        events=events,
        memory_cap_bytes=cost.platform.usable_memory_bytes,
        workspace_bytes=cost.platform.workspace_bytes,
        headroom_bytes=cost.platform.headroom_bytes,
        schedule=schedule.kind or plan.schedule,
        platform=cost.platform.name,
        model=cost.spec.name,
        plan=plan.to_dict(),
    )
    if ledger is not None:
        result.memory_timeline, result.peak_memory_bytes, result.memory_breakdown = _memory(
            ledger, _memory_starts(columns)
        )
    return result


def simulate(
    spec: ModelSpec,
    plan: Plan,
    platform: Platform | str,
    *,
    schedule: Schedule | None = None,
    check: bool = False,
    cost_scale: dict[str, float] | None = None,
    rank_layout: str | None = None,
    memory_timeline: bool = True,
) -> SimResult:
    """Simulate one step of `plan` for `spec` on `platform` (a `Platform`, preset name or path).

    `schedule` defaults to `build_schedule(spec, plan)`; `check` validates it first;
    `cost_scale` scales cost categories (see `ratrain.cost.model.COST_CATEGORIES`);
    `rank_layout` places ranks on nodes (see `ratrain.ranks`; default: the plan's
    `rank_layout`, the layout the runtime places its ranks by);
    the ledger counts eager norms' tensors where the platform says its runtime runs them
    (`Platform.eager_kernels`); `memory_timeline=False` keeps the memory peaks and breakdowns but not memory over time
    (faster, for searches).
    """
    from ratrain.schedule import build_schedule, check_schedule

    platform = load(platform)
    plan.check_for(spec)
    if schedule is None:
        schedule = build_schedule(spec, plan)
        deadline.check()  # between phases: a planner's deadline (`ratrain.deadline`)
    if check:
        check_schedule(schedule, spec, plan)
    cost = CostModel(spec, plan, platform, scale=cost_scale, rank_layout=rank_layout)
    ledger = platform_ledger(schedule, spec, plan, platform, keep_trace=memory_timeline)
    return simulate_schedule(schedule, cost, ledger=ledger)


def platform_ledger(
    schedule: Schedule, spec: ModelSpec, plan: Plan, platform: Platform, *, keep_trace: bool
):
    """The memory ledger of `schedule` as `platform`'s runtime holds it: the eager kernels'
    tensors and the SEND buffers held to the step's end where the platform says its runtime
    keeps them. The simulator and the planner's memory pass both count memory this way, so
    a plan the planner finds to fit is not over the cap in its simulation."""
    from ratrain.memory.ledger import replay as ledger_replay

    return ledger_replay(
        schedule,
        spec,
        plan,
        keep_trace=keep_trace,
        eager_kernels=platform.eager_kernels,
        sends_held=platform.sends_held_until_waited,
        offload_frees=not platform.host_is_main_memory,
    )


def memory_microbatches(plan: Plan) -> int:
    """Microbatches of the shortened step whose per-stage peak equals the full step's: one
    steady pair past the longest warmup (pp - 1 forwards; 2(pp - 1) under zb-h2), one more
    for the receive posted one ahead, and, with views that live within the step
    (transient, fsdp-pp), room for a fetch placed `view_lookahead` uses back to reach into
    the previous pass. A 1F1B stage's memory repeats from one steady pair to the next
    (`tests/planner/test_search.py` checks the equality over schedules, policies and
    lookaheads): the planner's memory pass replays no more, the steady-state extrapolation
    (`ratrain.sim.steady`) simulates no fewer."""
    if plan.chunks == 2:  # a V's pass order is list-scheduled, with no warm-up formula
        return plan.microbatches
    # fsdp-pp's views live within the step under either policy (dropped after the last use)
    within_step = plan.view_policy == "transient" or plan.schedule == "fsdp-pp"
    extra = 2 + plan.view_lookahead if within_step else 1
    # the longest warm-up: stage 0's; one more for the receive posted one ahead
    # (`ratrain.schedule.rendezvous.post_receives_ahead`), whose buffer a steady pass holds
    # for the pass after it
    return min(plan.microbatches, warmup(plan.pp, plan.microbatches, 0, plan.pipeline) + 2 + extra)
