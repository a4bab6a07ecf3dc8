"""Run a grid of plans through the real runtime and set each beside its prediction.

For each plan of the grid:

- predicted: `ratrain.sim.simulate` on the platform (the step time `ratrain simulate`
  prints) and the memory ledger's peak per stage;
- measured: the same job through `run_job` (the code `ratrain train` runs): the step
  time is the median over the steps after warm-up of the period between step ends, the
  slowest rank's; a second, shorter run with `measure_memory` gives each rank's peak
  tensor bytes (`LiveBytes` slows the step, so it is not timed).

Then the statistics and, per model, the planner's check (`ratrain.validate.results`):
the plan `ratrain plan` picks is run too unless the grid holds it, and its measured step
is compared with the measured fastest of the grid.
"""

from __future__ import annotations

import functools
import os
import statistics
import time

from ratrain.config import TrainConfig
from ratrain.data import make_source
from ratrain.errors import RatrainError
from ratrain.platforms import Platform
from ratrain.sim import simulate
from ratrain.train.failures import run_job_one_line
from ratrain.train.job import FaultHooks, Job, Launch, Outputs
from ratrain.validate.grid import GridPlan
from ratrain.validate.results import PlanResult, planner_pick, summarize
from ratrain.validate.speed import machine_speed

__all__ = ["run_plan", "validate"]


def _job(g: GridPlan, steps: int, outputs: Outputs, deadline_s: float = 1800) -> Job:
    return Job(
        g.spec,
        g.plan,
        TrainConfig(steps=steps, warmup_steps=1),
        functools.partial(make_source, "synthetic", g.spec, g.plan.seq),
        launch=Launch(deadline_s=deadline_s),
        outputs=outputs,
        hooks=FaultHooks(fault=os.environ.get("RATRAIN_FAULT")),
    )


def _timing(
    g: GridPlan, steps: int, warmup: int, deadline_s: float = 1800
) -> tuple[list[list[float]], list[dict]]:
    """One timing run: every rank's step times (warm-up included), rank order, and the
    measured trace of the last step; its ranks are stopped after `deadline_s`."""
    kind = g.plan.schedule
    outputs = Outputs(progress=False, trace_steps=(warmup + steps - 1,))
    job = _job(g, warmup + steps, outputs, deadline_s)
    ranks = run_job_one_line(job, f"plan {g.name}: ")
    times = [list(r.runs[kind].step_times_s) for r in ranks]
    return times, [rec for r in ranks for rec in r.runs[kind].trace]


def _assemble(
    g: GridPlan, platform: Platform, runs: list[tuple[list[list[float]], list[dict]]], warmup: int
) -> PlanResult:
    """The plan's result from its timing runs (passes): per rank, the median of the timed
    steps of every pass; the slowest rank's; the last pass's trace; a memory run."""
    sim = simulate(g.spec, g.plan, platform, memory_timeline=False)
    kind = g.plan.schedule
    n_ranks = len(runs[0][0])
    per_rank = [
        statistics.median([t for times, _ in runs for t in times[r][warmup:]])
        for r in range(n_ranks)
    ]
    mem_ranks = run_job_one_line(
        _job(g, 2, Outputs(progress=False, measure_memory=True)), f"plan {g.name} (memory run): "
    )
    peaks = [[0] * g.plan.dp for _ in range(g.plan.pp)]
    for r in mem_ranks:
        peaks[r.stage][r.replica] = int(r.runs[kind].peak_bytes or 0)
    slowest = max(range(n_ranks), key=per_rank.__getitem__)
    return PlanResult(
        g.name,
        g.model,
        g.plan.to_dict(),
        sim.step_time_s,
        per_rank[slowest],
        list(sim.peak_memory_bytes),
        peaks,
        [t for times, _ in runs for t in times[slowest]],
        runs[-1][1],
        g,
    )


def run_plan(g: GridPlan, platform: Platform, *, steps: int = 5, warmup: int = 1) -> PlanResult:
    return _assemble(g, platform, [_timing(g, steps, warmup)], warmup)


def validate(
    grid: list[GridPlan],
    platform: Platform,
    *,
    steps: int = 5,
    warmup: int = 1,
    progress=None,
    plan_picks: bool = True,
    passes: int = 1,
    probe=None,
) -> tuple[list[PlanResult], dict]:
    """Run every plan of `grid`, and `ratrain plan`'s pick per model when `plan_picks`;
    (per-plan results, summary).

    `passes` > 1 splits the timed steps over that many passes through the grid, in
    alternating order (forward, backward, ...), each plan a fresh job per pass: a machine
    whose speed drifts over the minutes a grid takes (±10-25% on a shared VM) then slows
    every plan's median alike instead of the plans that ran during a slow spell.

    `probe` (a callable returning seconds: `ratrain.calibrate.probe.probe_s`) is timed
    before the first pass and after every pass, against the platform file's
    `measured_on.speed_probe_s`: the summary's `machine_speed` says how fast the machine ran
    relative to calibration (a diagnostic; nothing is scaled by it)."""
    for g in grid:  # one line for a plan too large to run, before any is run
        g.plan.check_size()
    calibrated_probe_s = (platform.measured_on or {}).get("speed_probe_s")
    probe = probe if calibrated_probe_s else None
    probes_s = [probe()] if probe else []
    picks: dict[str, str] = {}
    todo = list(grid)
    if plan_picks:
        for model in dict.fromkeys(g.model for g in grid):
            g = planner_pick(grid, model, platform)
            if g is not None:
                picks[model] = g.name
                if g not in todo:
                    todo.append(g)
    if passes < 1:
        raise RatrainError(f"--passes must be >= 1, got {passes}")
    per_pass = -(-steps // passes)
    runs: dict[str, list] = {g.name: [] for g in todo}
    total, i = len(todo) * (passes + 1), 0
    t0 = time.perf_counter()
    for p in range(passes):
        for g in todo if p % 2 == 0 else todo[::-1]:
            if progress:
                progress(i, total, f"{g.name} (pass {p + 1}/{passes})", time.perf_counter() - t0)
            runs[g.name].append(_timing(g, per_pass, warmup))
            i += 1
        if probe:
            probes_s.append(probe())
    results = []
    for g in todo:
        if progress:
            progress(i, total, f"{g.name} (memory)", time.perf_counter() - t0)
        results.append(_assemble(g, platform, runs[g.name], warmup))
        i += 1
    if progress:
        progress(total, total, "done", time.perf_counter() - t0)
    summary = summarize(results, picks)
    summary["machine_speed"] = machine_speed(calibrated_probe_s, probes_s)
    return results, summary
