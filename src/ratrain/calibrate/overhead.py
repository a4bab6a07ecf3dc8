"""The runtime's fixed cost per action, measured on a model too small to compute anything.

Runs a real training job (`ratrain.train.job.run_job`, the code
`ratrain train` runs) of a tiny model — hidden 32, 2 blocks, 16 tokens per microbatch —
on one rank with transient views (so the walk fetches views), traces a few steps after
warm-up, and takes the median measured duration of each compute-like op on the walk
(F, B, UPD, VF). At that size the kernels take microseconds, so what is measured is the
executor's and the modules' Python and dispatch cost per action: the cost that dominates
when units are small. RECOMPUTE re-runs a forward: it is given F's figure. The same job
under `pipeline: zb-h1` gives a split backward's two halves (BI, BW): each is an action
of its own on the walk, with its own fixed cost, which the unsplit B's does not stand for.
"""

from __future__ import annotations

import functools
import statistics

from ratrain.calibrate.shapes import TINY_SPEC
from ratrain.config import Plan, TrainConfig
from ratrain.data import make_source
from ratrain.train.job import Job, Launch, Outputs, run_job

__all__ = ["measure_action_overhead"]


def measure_action_overhead(quick: bool, device: str | None = None) -> dict[str, float]:
    """Median seconds per action of each compute op on the walk: {"F", "B", "UPD", "VF",
    "RC", "BI", "BW"}."""
    out = _medians(quick, device, "1f1b")
    if "F" in out:
        out.setdefault("RC", out["F"])
    split = _medians(quick, device, "zb-h1")
    out.update({op: split[op] for op in ("BI", "BW") if op in split})
    return out


def _medians(quick: bool, device: str | None, pipeline: str) -> dict[str, float]:
    steps = 6 if quick else 12
    seq = 16
    plan = Plan(
        micro_batch=1,
        global_batch=8,
        seq=seq,
        compute_dtype="fp32",
        view_policy="transient",
        schedule="ratrain",
        pipeline=pipeline,
    )
    cfg = TrainConfig(steps=steps, warmup_steps=1)
    job = Job(
        TINY_SPEC,
        plan,
        cfg,
        functools.partial(make_source, "synthetic", TINY_SPEC, seq),
        launch=Launch(device=device, deadline_s=300),
        outputs=Outputs(progress=False, trace_steps=tuple(range(2, steps))),
    )
    run = run_job(job)[0].runs[plan.schedule]
    by_op: dict[str, list[float]] = {}
    for r in run.trace:
        if r.get("issue_s") is None:  # measured on the walk
            by_op.setdefault(r["op"], []).append(r["end_s"] - r["start_s"])
    return {op: statistics.median(ts) for op, ts in by_op.items() if ts}
