"""Re-score an earlier validation on another platform file, without running anything.

`ratrain validate --json` writes each plan it ran (its model, its `Plan` fields) with the
step time and the peak bytes per rank it measured. `rescore` reads that file back and
predicts every plan again with another platform (the simulator's step time, the ledger's
peak per stage), and computes the same statistics on the same measurements. Two platform
files (say two calibrations of one machine) are then compared without the runtime's
run-to-run noise: whatever moves between their scores is the calibration's doing.

The planner's pick is judged from the measured rows where it can be: `ratrain plan`'s
search runs on the new platform, and when the plan it picks is one of the file's rows its
measured step is compared with the measured fastest. When it picks a plan the file did
not measure, that is said (`pick_measured: false`, the plan in `pick_plan`), and the
simulator's fastest among the measured rows is judged instead.

Runs nothing but the simulator, the ledger and the planner: seconds, no runtime.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.platforms import Platform
from ratrain.sim import simulate
from ratrain.validate.grid import DEFAULT_MODELS, GridPlan, load_grid_models
from ratrain.validate.results import PlanResult, planner_pick, summarize
from ratrain.validate.speed import machine_speed

__all__ = ["load_previous", "rescore"]

_ROW_KEYS = ("name", "model", "plan", "measured_step_s", "measured_peak_bytes")


def _read(path: str | Path) -> dict:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise RatrainError(f"--rescore {p}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise RatrainError(f"--rescore {p}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) or not doc["results"]:
        raise RatrainError(
            f"--rescore {p}: expected the output of `ratrain validate --json` "
            "(a mapping with a non-empty results list)"
        )
    return doc


def _specs(doc: dict, path: str | Path, grid: str | None) -> dict[str, ModelSpec]:
    """Model specs by name: the file's own `models` (written since re-scoring exists), else
    a grid file's, else the default grid's."""
    if isinstance(doc.get("models"), dict):
        try:
            return {m: ModelSpec.from_dict({"name": m, **f}) for m, f in doc["models"].items()}
        except (TypeError, ValueError, KeyError) as e:
            raise RatrainError(f"--rescore {path}: bad models entry ({e})") from None
    if grid and grid != "default":
        return load_grid_models(grid)
    return {m: ModelSpec(name=m, **f) for m, f in DEFAULT_MODELS.items()}


def _row(i: int, r, specs: dict[str, ModelSpec], path) -> tuple[GridPlan, float, list]:
    where = f"--rescore {path}: results[{i}]"
    if not isinstance(r, dict) or any(k not in r for k in _ROW_KEYS):
        raise RatrainError(f"{where}: needs {', '.join(_ROW_KEYS)}")
    if r["model"] not in specs:
        raise RatrainError(
            f"{where} ({r['name']}): model {r['model']!r} is not in the file and not a default "
            "grid model; pass the grid it ran with (--grid FILE)"
        )
    spec = specs[r["model"]]
    try:
        plan = replace(Plan.from_dict(r["plan"]), model=None)
        plan.check_for(spec)
    except (TypeError, ValueError, AttributeError) as e:
        raise RatrainError(f"{where} ({r['name']}): bad plan ({e})") from None
    meas = r["measured_step_s"]
    if not isinstance(meas, (int, float)) or not meas > 0:
        raise RatrainError(f"{where} ({r['name']}): measured_step_s must be a positive number")
    peaks = r["measured_peak_bytes"]
    ok = isinstance(peaks, list) and len(peaks) == plan.pp
    ok = ok and all(isinstance(p, list) and len(p) == plan.dp for p in peaks)
    if not ok:
        raise RatrainError(
            f"{where} ({r['name']}): measured_peak_bytes must be pp x dp = "
            f"{plan.pp} x {plan.dp} numbers, per stage per replica"
        )
    return GridPlan(str(r["name"]), str(r["model"]), spec, plan), float(meas), peaks


def load_previous(path: str | Path, grid: str | None = None) -> tuple[dict, list]:
    """(the file's document, [(grid entry, measured step s, measured peaks)]), checked."""
    doc = _read(path)
    specs = _specs(doc, path, grid)
    rows = [_row(i, r, specs, path) for i, r in enumerate(doc["results"])]
    if len({g.name for g, _, _ in rows}) != len(rows):
        raise RatrainError(f"--rescore {path}: plan names must be unique")
    return doc, rows


def rescore(
    path: str | Path, platform: Platform, *, grid: str | None = None, plan_picks: bool = True
) -> tuple[list[PlanResult], dict, dict]:
    """Re-predict the measured plans of `path` on `platform`: (results, summary, the
    previous file's summary or {})."""
    doc, rows = load_previous(path, grid)
    results = []
    for g, meas, peaks in rows:
        sim = simulate(g.spec, g.plan, platform, memory_timeline=False)
        results.append(
            PlanResult(
                g.name,
                g.model,
                g.plan.to_dict(),
                sim.step_time_s,
                meas,
                list(sim.peak_memory_bytes),
                peaks,
                grid=g,
            )
        )
    picks: dict[str, str] = {}
    unmeasured: dict[str, str] = {}
    if plan_picks:
        grid_rows = [g for g, _, _ in rows]
        for model in dict.fromkeys(g.model for g in grid_rows):
            pick = planner_pick(grid_rows, model, platform)
            if pick is None:
                continue
            if any(pick is g for g in grid_rows):
                picks[model] = pick.name
            else:
                unmeasured[model] = _describe(pick.plan)
    summary = summarize(results, picks)
    for model, row in summary["planner_pick"].items():
        row["pick_measured"] = model in picks
        row["pick_plan"] = unmeasured.get(model)  # None: measured, or no search
    summary["rescored_from"] = str(path)
    # The machine's speed during the measurements, against this file's calibration.
    before = doc.get("summary") or {}
    probes_s = (before.get("machine_speed") or {}).get("probes_s") or []
    summary["machine_speed"] = machine_speed(
        (platform.measured_on or {}).get("speed_probe_s"), probes_s
    )
    return results, summary, before


def _describe(plan: Plan) -> str:
    return (
        f"pp={plan.pp} dp={plan.dp} mb={plan.micro_batch} {plan.schedule} "
        f"recompute={'/'.join(plan.recompute)} {plan.compute_dtype}"
        + (" sharded" if plan.shard_optimizer else "")
        + (f" views={plan.view_policy}" if plan.view_policy != "persistent" else "")
    )
