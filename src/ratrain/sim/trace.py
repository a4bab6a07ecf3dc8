"""Chrome / Perfetto trace-event JSON for timelines, simulated or measured.

One format for both: `trace_events` takes plain records, so the runtime writes measured
timelines the way the simulator writes predicted ones, and the two open side by side in
Perfetto (ui.perfetto.dev) or chrome://tracing. The layout:

- one process per pipeline stage: ``pid = stage`` (named ``stage {s}``);
- one thread per resource: ``tid`` = `RESOURCE_TIDS` [resource] (named after it:
  compute, copy, dp_net, p2p, none);
- each action is a complete event (``"ph": "X"``) named in the IR's text form
  (``1F3@5``), ``cat`` its op (``F``), ``ts``/``dur`` in microseconds, and in ``args`` what
  else the record carries (bound, algorithm, ...);
- memory is a counter event (``"ph": "C"``) named ``memory`` per stage, its args the bytes
  per class of training state.

Format reference: "Trace Event Format" (Google, the document chrome://tracing and Perfetto
import). Pure Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["RESOURCE_TIDS", "trace_events", "write_trace"]

RESOURCE_TIDS = {"compute": 0, "copy": 1, "dp_net": 2, "p2p": 3, "none": 4}
_CORE = ("stage", "name", "resource", "start_s", "end_s")
_EXTRA = ("op", "bound", "algorithm", "issue_s", "args")


def _field(rec, key: str, default=None):
    if isinstance(rec, Mapping):
        return rec.get(key, default)
    return getattr(rec, key, default)


def _us(t_s: float) -> float:
    return round(t_s * 1e6, 3)


def trace_events(
    events: Iterable,
    memory: Iterable[tuple[int, float, Mapping[str, int]]] | None = None,
) -> list[dict]:
    """Trace events from plain records.

    `events`: records (mappings or objects) with stage, name, resource, start_s, end_s, and
    optionally op, bound, algorithm, issue_s, args (a dict). `memory`: (stage, time_s,
    {class: bytes}) samples.
    """
    out: list[dict] = []
    seen: set[tuple[int, str]] = set()
    for rec in events:
        stage, name, resource, start_s, end_s = (_field(rec, k) for k in _CORE)
        if resource not in RESOURCE_TIDS:
            raise ValueError(f"trace record {name!r}: unknown resource {resource!r}")
        seen.add((int(stage), resource))
        args = {k: _field(rec, k) for k in ("bound", "algorithm") if _field(rec, k) is not None}
        if _field(rec, "issue_s") is not None:
            args["issue_us"] = _us(_field(rec, "issue_s"))
        args.update(_field(rec, "args") or {})
        out.append(
            {
                "name": str(name),
                "cat": str(_field(rec, "op") or resource),
                "ph": "X",
                "pid": int(stage),
                "tid": RESOURCE_TIDS[resource],
                "ts": _us(start_s),
                "dur": _us(max(0.0, end_s - start_s)),
                "args": args,
            }
        )
    stages = {s for s, _ in seen}
    for stage, t_s, by_class in memory or ():
        stages.add(int(stage))
        out.append(
            {
                "name": "memory",
                "ph": "C",
                "pid": int(stage),
                "ts": _us(t_s),
                "args": {k: int(v) for k, v in by_class.items()},
            }
        )
    meta = []
    for s in sorted(stages):
        meta.append({"name": "process_name", "ph": "M", "pid": s, "args": {"name": f"stage {s}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": s, "args": {"sort_index": s}})
    for s, r in sorted(seen):
        tid = RESOURCE_TIDS[r]
        meta.append({"name": "thread_name", "ph": "M", "pid": s, "tid": tid, "args": {"name": r}})
    return meta + out


def write_trace(result, path: str | Path, *, memory: bool = True) -> Path:
    """Write a `SimResult` (or anything with `.events` and `.memory_timeline`) as a trace
    JSON file."""
    samples = []
    if memory:
        for s, points in enumerate(getattr(result, "memory_timeline", None) or []):
            samples.extend((s, t, b) for t, b in points)
    doc = {
        "traceEvents": trace_events(result.events, samples),
        "displayTimeUnit": "ms",
        "otherData": {
            k: getattr(result, k) for k in ("model", "platform", "schedule") if hasattr(result, k)
        },
    }
    p = Path(path)
    p.write_text(json.dumps(doc))
    return p
