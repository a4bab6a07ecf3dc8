"""Measured timelines in the simulator's format.

The executor records each action it runs in the IR's vocabulary (`format_action` names,
the IR's resources) and `write_measured_trace` writes them with the simulator's own
`ratrain.sim.trace.trace_events`, so a predicted and a measured step open side by side in
Perfetto (ui.perfetto.dev) or chrome://tracing.

Times: seconds since a reference instant taken right after a barrier, so the ranks of one
machine share a clock (perf_counter is CLOCK_MONOTONIC). A compute action's start and end
are measured; an asynchronous one starts when issued and ends when the walk observes it
complete (at the wait that needed it, or at the next poll after a compute action), so its
end is an upper bound.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ratrain.schedule.ir import Action, format_action
from ratrain.sim.trace import trace_events

__all__ = ["TraceEvent", "Recorder", "write_measured_trace"]


@dataclass
class TraceEvent:
    stage: int
    name: str
    resource: str
    op: str
    start_s: float
    end_s: float
    issue_s: float | None = None
    args: dict = field(default_factory=dict)


class Recorder:
    """Collects the events of the steps asked for (all steps when `steps` is None)."""

    def __init__(self, stage: int, replica: int, t0: float, steps: set[int] | None = None):
        self.stage, self.replica, self.t0 = stage, replica, t0
        self.steps = steps
        self.events: list[TraceEvent] = []
        self._open: dict[Action, TraceEvent] = {}
        self.step = 0
        self.active = steps is None or 0 in steps

    def begin_step(self, step: int) -> None:
        self.step = step
        self.active = self.steps is None or step in self.steps

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def compute(self, a: Action, start_s: float, end_s: float) -> None:
        if self.active:
            self.events.append(self._event(a, start_s, end_s, None))

    def issued(self, a: Action, t_s: float) -> None:
        if self.active:
            ev = self._event(a, t_s, t_s, t_s)
            self._open[a] = ev
            self.events.append(ev)

    def completed(self, a: Action, t_s: float) -> None:
        ev = self._open.pop(a, None)
        if ev is not None:
            ev.end_s = t_s

    def _event(self, a: Action, start_s: float, end_s: float, issue_s: float | None) -> TraceEvent:
        return TraceEvent(
            self.stage,
            format_action(a),
            a.resource.value,
            a.op.value,
            start_s,
            end_s,
            issue_s,
            {"step": self.step, "replica": self.replica},
        )

    def records(self) -> list[dict]:
        return [asdict(e) for e in self.events]


def write_measured_trace(
    records: list[dict],
    path: str | Path,
    *,
    memory: list[tuple[int, float, dict]] | None = None,
    meta: dict | None = None,
) -> Path:
    """Write event records (from one or more ranks' `Recorder.records()`) as trace JSON."""
    doc = {
        "traceEvents": trace_events(records, memory),
        "displayTimeUnit": "ms",
        "otherData": {"measured": True, **(meta or {})},
    }
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))
    return p
