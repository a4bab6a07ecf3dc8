"""What a validation found, plan by plan and in summary: each plan's prediction beside its
measurement (`PlanResult`), the statistics over them (`ratrain.validate.stats`), and per
model the planner's check: `ratrain plan`'s search (`ratrain.planner.search`, all
families, the grid's compute dtype pinned, each unit count up to the grid's largest) picks
the plan it predicts fastest for that job on the platform, and its measured step is
compared with the measured fastest of the grid's plans of that job: the same model at the
compute dtype the search was pinned to (within 5%?; a plan of another dtype measured
faster is named beside it, as a numerics choice the planner does not make). The plan the
simulator ranks fastest among the grid's own plans is reported beside it.

Shared by a run of the grid (`ratrain.validate.run`) and a re-scoring of an earlier one
(`ratrain.validate.rescore`); no runtime here, so that re-scoring runs without torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ratrain.errors import RatrainError
from ratrain.platforms import Platform
from ratrain.validate import stats
from ratrain.validate.grid import GridPlan

__all__ = ["BEST_WITHIN", "PlanResult", "planner_pick", "summarize", "result_dict"]

BEST_WITHIN = 0.05


@dataclass
class PlanResult:
    name: str
    model: str
    plan: dict
    predicted_step_s: float
    measured_step_s: float
    ledger_peak_bytes: list[int]
    """Per stage."""
    measured_peak_bytes: list[list[int]]
    """Per stage, per replica."""
    step_times_s: list[float] = field(default_factory=list)
    measured_trace: list[dict] = field(default_factory=list)
    grid: GridPlan | None = field(default=None, repr=False)
    """The grid entry (model and plan) this result is of."""

    @property
    def error(self) -> float:
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    def memory_errors(self) -> list[float]:
        """(ledger - measured) / measured for every rank."""
        return [
            (self.ledger_peak_bytes[s] - m) / m
            for s, reps in enumerate(self.measured_peak_bytes)
            for m in reps
            if m
        ]


def planner_pick(grid: list[GridPlan], model: str, platform: Platform) -> GridPlan | None:
    """The plan `ratrain plan` picks for the job of `model`'s grid plans, as a grid entry
    (the grid's own entry when it holds the same plan), or None when nothing fits."""
    from collections import Counter
    from dataclasses import replace

    from ratrain.planner.search import search
    from ratrain.planner.space import Request

    group = [g for g in grid if g.model == model]
    spec, ref = group[0].spec, group[0].plan
    dtype = Counter(g.plan.compute_dtype for g in group).most_common(1)[0][0]
    most = max(g.plan.pp * g.plan.dp for g in group)
    best = None
    for clusters in range(1, most + 1):
        req = Request(
            spec, platform, clusters, ref.global_batch, ref.seq, pins={"compute_dtype": dtype}
        )
        try:
            cand = search(req, top=1).best
        except RatrainError:
            cand = None
        if cand is not None and (best is None or cand.step_time_s < best.step_time_s):
            best = cand
    if best is None:
        return None
    plan = replace(best.plan, model=None)
    for g in group:
        if replace(g.plan, model=None) == plan:
            return g
    return GridPlan(f"plan-pick:{model}", model, spec, plan)


def summarize(results: list[PlanResult], picks: dict[str, str] | None = None) -> dict:
    pred = [r.predicted_step_s for r in results]
    meas = [r.measured_step_s for r in results]
    out: dict = {
        "plans": len(results),
        "mape": stats.mape(pred, meas),
        "max_error": stats.max_error(pred, meas),
        "kendall_tau": stats.kendall_tau(pred, meas) if len(results) > 1 else None,
    }
    mem = [e for r in results for e in r.memory_errors()]
    out["memory_min_error"] = min(mem) if mem else None
    out["memory_max_error"] = max(mem) if mem else None
    out["memory_within"] = bool(mem) and min(mem) >= 0 and max(mem) <= 0.10
    out["planner_pick"] = {}
    for model in dict.fromkeys(r.model for r in results):
        group = [r for r in results if r.model == model]
        fastest = min(group, key=lambda r: r.measured_step_s)
        i, slower = stats.best_within(
            [r.predicted_step_s for r in group], [r.measured_step_s for r in group]
        )
        row = {"sim_pick": group[i].name, "sim_pick_slower": slower}
        pick = (picks or {}).get(model)
        chosen = next((r for r in group if r.name == pick), None)
        if chosen is None:  # no planner pick: judge the simulator's ranking of the grid
            chosen = group[i]
        else:  # the planner's job: its pinned compute dtype (`planner_pick`), not another
            dtype = chosen.plan.get("compute_dtype")
            job = [r for r in group if r.plan.get("compute_dtype") == dtype]
            other = fastest
            fastest = min(job, key=lambda r: r.measured_step_s)
            if other is not fastest:
                row["measured_fastest_other_dtype"] = other.name
        slower = chosen.measured_step_s / fastest.measured_step_s - 1
        row.update(
            pick=chosen.name,
            measured_fastest=fastest.name,
            slower_than_fastest=slower,
            within_5pct=slower <= BEST_WITHIN,
        )
        out["planner_pick"][model] = row
    worst = max(results, key=lambda r: abs(r.error))
    out["worst_plan"] = worst.name
    return out


def result_dict(r: PlanResult) -> dict:
    d = asdict(r)
    d.pop("measured_trace")
    d.pop("grid")
    d["error"] = r.error
    d["memory_errors"] = r.memory_errors()
    return d
