"""Simulate one training step of a plan on a platform: the schedule IR, timed by the cost
model on the event engine, with the memory ledger's bytes laid on the same clock."""

from __future__ import annotations

from ratrain.config import Plan
from ratrain.cost.model import CostModel
from ratrain.models.spec import ModelSpec
from ratrain.platforms import Platform, load
from ratrain.schedule.ir import Schedule
from ratrain.sim.engine import Timing, replay
from ratrain.sim.result import SimEvent, SimResult, stage_metrics

__all__ = ["simulate", "simulate_schedule"]


def _events(timings: list[list[Timing]], cost: CostModel) -> list[SimEvent]:
    out = []
    for stage in timings:
        for t in stage:
            c = cost.action(t.action)
            out.append(
                SimEvent(
                    stage=t.action.stage,
                    name=str(t.action),
                    op=t.action.op.value,
                    resource=t.action.resource.value,
                    start_s=t.start_s,
                    end_s=t.end_s,
                    issue_s=t.issue_s,
                    bound=c.bound,
                    algorithm=c.algorithm,
                )
            )
    return out


def _memory(ledger, timings: list[list[Timing]]):
    """The ledger's per-action bytes, placed at each action's simulated start."""
    timeline, peaks, breakdowns = [], [], []
    for s, led in enumerate(ledger.stages):
        stage = timings[s]
        points = []
        for index, by_class in led.trace:
            t = stage[index].start_s if 0 <= index < len(stage) else 0.0
            points.append((t, dict(by_class)))
        timeline.append(points)
        peaks.append(int(led.peak_bytes))
        breakdowns.append(dict(led.breakdown_at_peak))
    return timeline, peaks, breakdowns


def simulate_schedule(schedule: Schedule, cost: CostModel, *, ledger=None) -> SimResult:
    """Time a given schedule with a given cost model; `ledger` (from `ratrain.memory.replay`)
    adds memory over time, or None to leave memory out."""
    timings = replay(schedule, cost.time_s)
    events = _events(timings, cost)
    step_s = max((e.end_s for e in events), default=0.0)
    bubble, util, exposed = stage_metrics(events, schedule.pp, step_s)
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
        schedule=schedule.kind or plan.schedule,
        platform=cost.platform.name,
        model=cost.spec.name,
        plan=plan.to_dict(),
    )
    if ledger is not None:
        result.memory_timeline, result.peak_memory_bytes, result.memory_breakdown = _memory(
            ledger, timings
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
    rank_layout: str = "pp-inner",
) -> SimResult:
    """Simulate one step of `plan` for `spec` on `platform` (a `Platform`, preset name or path).

    `schedule` defaults to `build_schedule(spec, plan)`; `check` validates it first;
    `cost_scale` scales cost categories (see `ratrain.cost.model.COST_CATEGORIES`);
    `rank_layout` places ranks on nodes (see `ratrain.cost.comm.RANK_LAYOUTS`).
    """
    from ratrain.memory import replay as ledger_replay
    from ratrain.schedule import build_schedule, check_schedule

    platform = load(platform)
    plan.check_for(spec)
    if schedule is None:
        schedule = build_schedule(spec, plan)
    if check:
        check_schedule(schedule)
    cost = CostModel(spec, plan, platform, scale=cost_scale, rank_layout=rank_layout)
    return simulate_schedule(schedule, cost, ledger=ledger_replay(schedule, spec, plan))
