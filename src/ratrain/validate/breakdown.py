"""Where a prediction goes wrong: measured vs simulated time per kind of action.

For one plan, the measured trace of one step (the runtime's `Recorder` records, every
rank) and the simulated step are summed per *kind*: the op (F, B, RC, UPD, SYNC, NORM, ...)
and, for F/B/RC, the unit's kind (emb, block, head), on replica 0 of every stage. Compute
actions are summed by duration; an asynchronous action by its span from issue to the point
the walk saw it complete (the simulator's: issue to landing), which says how long the walk
had it in flight, not what it cost. `idle` is the step minus the stage's compute time (the
walk waiting, or dispatching between actions). Over a grid, the ratio measured/simulated
per kind says which term of the cost model is off, and by how much.

Pure Python.
"""

from __future__ import annotations

from collections import defaultdict

from ratrain.schedule.ir import parse_action

__all__ = ["kind_of", "step_breakdown", "merge", "COMPUTE_KINDS"]

COMPUTE_KINDS = ("F", "B", "RC", "UPD")


def kind_of(op: str, units: tuple[int, ...], n_layers: int) -> str:
    if op not in ("F", "B", "RC") or not units:
        return op
    u = units[0]
    part = "emb" if u == 0 else "head" if u == n_layers + 1 else "block"
    return f"{op}.{part}"


def step_breakdown(records: list[dict], sim_result, n_layers: int) -> dict[str, list[float]]:
    """{kind: [measured_s, simulated_s]} over replica 0 of every stage, plus "step" (the
    slowest stage's span) and "idle" (summed over stages: step minus compute time)."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    recs = [r for r in records if r.get("args", {}).get("replica", 0) == 0]
    if recs:
        t0 = min(r["start_s"] for r in recs)
        step = max(r["end_s"] for r in recs) - t0
        busy = 0.0
        for r in recs:
            a = parse_action(r["name"])
            k = kind_of(r["op"], a.units, n_layers)
            out[k][0] += r["end_s"] - r["start_s"]
            if r["resource"] == "compute":
                busy += r["end_s"] - r["start_s"]
        out["step"][0] = step
        out["idle"][0] = step * len({r["stage"] for r in recs}) - busy
    busy = 0.0
    for e in sim_result.events:
        k = kind_of(e.action.op.value, e.action.units, n_layers)
        out[k][1] += e.end_s - e.start_s
        if e.resource == "compute":
            busy += e.end_s - e.start_s
    out["step"][1] = sim_result.step_time_s
    out["idle"][1] = sim_result.step_time_s * sim_result.pp - busy
    return dict(out)


def merge(parts: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Sum several plans' breakdowns kind by kind."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for p in parts:
        for k, (m, s) in p.items():
            out[k][0] += m
            out[k][1] += s
    return dict(out)
