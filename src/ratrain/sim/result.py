"""What a simulated step produced: the timeline, its summary figures, and memory over time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ratrain.schedule.ir import Action, Op, Resource, format_action

__all__ = ["SimEvent", "SimResult", "busy_s", "stage_metrics", "stage_metrics_flat", "RESOURCES"]

RESOURCES = tuple(r.value for r in Resource if r is not Resource.NONE)
_CHECKS = (Op.GRAD_NORM, Op.OVERFLOW)
_BACKWARD = (Op.B, Op.B_IN, Op.B_W)  # what ends before the tail


class SimEvent(NamedTuple):
    """One action on the timeline; `name` is its IR text form (e.g. ``1F3@5``)."""

    stage: int
    action: Action
    resource: str
    start_s: float
    end_s: float
    issue_s: float
    bound: str | None = None
    """Kernels: what limits them (flat | compute | dma | memory)."""
    algorithm: str | None = None
    """Transfers and collectives: the algorithm and link they were costed on."""

    @property
    def name(self) -> str:
        return format_action(self.action)

    @property
    def op(self) -> str:
        return self.action.op.value

    @property
    def dur_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict:
        d = self._asdict()
        d["action"] = self.name
        return d


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def busy_s(
    intervals: list[tuple[float, float]], lo: float = 0.0, hi: float = float("inf")
) -> float:
    """Length of the union of intervals, clipped to [lo, hi]."""
    merged = _union(intervals)
    if hi == float("inf") and (not merged or merged[0][0] >= lo):
        # Nothing to clip (min(b, inf) is b, max(a, lo) is a, and b > a): the same terms.
        return sum([b - a for a, b in merged])
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in merged)


def _clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _minus(
    a: list[tuple[float, float]], b: list[tuple[float, float]], lo: float, hi: float
) -> float:
    """Length of (∪a minus ∪b) within [lo, hi]."""
    a, b = _union(_clip(a, lo, hi)), _union(_clip(b, lo, hi))
    both = [(max(x0, y0), min(x1, y1)) for x0, x1 in a for y0, y1 in b]
    return busy_s(a) - busy_s(both)


@dataclass
class SimResult:
    step_time_s: float
    tokens_per_s: float
    bubble_fraction: float
    """Mean over stages of the compute resource's idle time over the step time."""
    stage_bubble: list[float]
    utilization: list[dict[str, float]]
    """Per stage, per resource: busy time / step time."""
    exposed: list[dict[str, float]]
    """Per stage, the tail after its last backward (tail_s) and what fills it: update_s
    (optimizer steps on the compute resource), sync_s (gradient syncs running while compute
    idles), global_s (waiting for the global norm / overflow checks, which need every stage,
    while compute idles and no sync runs), other_s (the rest: view fetches, ...)."""
    events: list[SimEvent]
    memory_timeline: list[list[tuple[float, dict[str, int]]]] = field(default_factory=list)
    """Per stage: (time_s, bytes per class while the action runs), one entry per action in
    list order, at the time a compute action starts or another action is issued."""
    peak_memory_bytes: list[int] = field(default_factory=list)
    memory_breakdown: list[dict[str, int]] = field(default_factory=list)
    """Per stage: bytes per class at the stage's peak."""
    memory_cap_bytes: int = 0
    workspace_bytes: int = 0
    headroom_bytes: int = 0
    """Kept free by the planner besides the workspace (`Platform.headroom_bytes`)."""
    schedule: str = ""
    platform: str = ""
    model: str = ""
    plan: dict = field(default_factory=dict)

    @property
    def pp(self) -> int:
        return len(self.stage_bubble)

    def over_cap(self) -> list[int]:
        """Stages whose peak plus the platform's workspace and headroom exceeds the usable
        memory."""
        if not self.memory_cap_bytes:
            return []
        return [
            s
            for s, b in enumerate(self.peak_memory_bytes)
            if b + self.workspace_bytes + self.headroom_bytes > self.memory_cap_bytes
        ]

    def to_json(self, *, detail: bool = False) -> dict:
        """A JSON-ready dict; `detail` adds the events and the memory timeline."""
        d = {
            "model": self.model,
            "platform": self.platform,
            "schedule": self.schedule,
            "plan": self.plan,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "bubble_fraction": self.bubble_fraction,
            "stage_bubble": self.stage_bubble,
            "utilization": self.utilization,
            "exposed": self.exposed,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_breakdown": self.memory_breakdown,
            "memory_cap_bytes": self.memory_cap_bytes,
            "workspace_bytes": self.workspace_bytes,
            "headroom_bytes": self.headroom_bytes,
            "over_cap_stages": self.over_cap(),
        }
        if detail:
            d["events"] = [e.to_dict() for e in self.events]
            d["memory_timeline"] = [
                [{"t_s": t, "bytes": b} for t, b in stage] for stage in self.memory_timeline
            ]
        return d


def stage_metrics(events: list[SimEvent], pp: int, step_s: float):
    """Bubble, utilization and exposed tail per stage, from the events."""
    per_stage: list[list[SimEvent]] = [[] for _ in range(pp)]
    for e in events:
        per_stage[e.stage].append(e)
    cols = [list(zip(*mine, strict=True)) if mine else [()] * 6 for mine in per_stage]
    return stage_metrics_flat(
        [(c[1], c[2], c[3], c[4], c[5]) for c in cols],
        step_s,
        ops=[[a.op for a in c[1]] for c in cols],
    )


def stage_metrics_flat(stages, step_s: float, *, ops=None):
    """`stage_metrics` on columns: per stage (actions, resource values, start_s, end_s,
    issue_s), each in the stage's event order; `ops` (per stage, each action's op) may be
    given where the caller has it. The same sums in the same order as over the events."""
    bubble, util, exposed = [], [], []
    for s, (acts, res, start, end, issue) in enumerate(stages):
        ivs = list(zip(start, end, strict=True))
        # Each resource's intervals in event order (one filtering pass per resource present).
        by = {
            r: [iv for rr, iv in zip(res, ivs, strict=True) if rr == r] for r in dict.fromkeys(res)
        }
        u = {r: busy_s(by.get(r, [])) / step_s if step_s > 0 else 0.0 for r in RESOURCES}
        util.append(u)
        bubble.append(1.0 - u["compute"])
        op_of = ops[s] if ops is not None else [a.op for a in acts]
        exposed.append(_exposed(op_of, start, end, issue, by.get("compute", [])))
    return bubble, util, exposed


def _exposed(ops, start, end, issue, compute) -> dict[str, float]:
    """Split the tail after the stage's last backward by what the compute resource waits on."""
    sync_op, upd = Op.GRAD_SYNC, Op.UPDATE
    backs = [e for op, e in zip(ops, end, strict=True) if op in _BACKWARD]
    last = max(end, default=0.0)
    lo = max(backs, default=last)
    syncs = [(t0, t1) for op, t0, t1 in zip(ops, start, end, strict=True) if op is sync_op]
    checks = [(t0, t1) for op, t0, t1 in zip(ops, issue, end, strict=True) if op in _CHECKS]
    update = busy_s(
        [(t0, t1) for op, t0, t1 in zip(ops, start, end, strict=True) if op is upd], lo, last
    )
    sync = _minus(syncs, compute, lo, last)
    checks_s = _minus(checks, compute + syncs, lo, last)
    tail = last - lo
    return {
        "tail_s": tail,
        "update_s": update,
        "sync_s": sync,
        "global_s": checks_s,
        "other_s": max(0.0, tail - update - sync - checks_s),
    }
