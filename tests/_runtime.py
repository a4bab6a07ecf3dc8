"""The harness the runtime tests share: run a job on local gloo ranks, read its losses."""

from __future__ import annotations

import functools

from ratrain.config import Plan, TrainConfig
from ratrain.data import make_source
from ratrain.models.spec import ModelSpec
from ratrain.train.job import Job, RankResult, run_job


def source(spec: ModelSpec, plan: Plan, cfg: TrainConfig):
    """The synthetic token source every rank and the reference trainer read."""
    return functools.partial(make_source, "synthetic", spec, plan.seq, cfg.seed)


def job(
    spec: ModelSpec, plan: Plan, cfg: TrainConfig, variants, *, timeout_s=120, deadline_s=400, **kw
) -> Job:
    return Job(
        spec,
        plan,
        cfg,
        source(spec, plan, cfg),
        variants=tuple(variants),
        device="cpu",
        progress=False,
        timeout_s=timeout_s,
        deadline_s=deadline_s,
        **kw,
    )


def run(spec: ModelSpec, plan: Plan, cfg: TrainConfig, variants, **kw) -> list[RankResult]:
    return run_job(job(spec, plan, cfg, variants, **kw))


def losses(results: list[RankResult], name: str) -> list[float]:
    """The losses of run `name`, from the one rank that reports them."""
    (out,) = [r.runs[name].losses for r in results if r.runs[name].losses]
    return out


def max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))
