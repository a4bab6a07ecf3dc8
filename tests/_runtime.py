"""The harness the runtime tests share: run a job on local gloo ranks, read its losses."""

from __future__ import annotations

import dataclasses
import functools

from ratrain.config import Plan, TrainConfig
from ratrain.data import make_source
from ratrain.models.spec import ModelSpec
from ratrain.train.job import Job, Launch, Outputs, RankResult, run_job


def source(spec: ModelSpec, plan: Plan, cfg: TrainConfig):
    """The synthetic token source every rank and the reference trainer read."""
    return functools.partial(make_source, "synthetic", spec, plan.seq, cfg.seed)


def job(
    spec: ModelSpec,
    plan: Plan,
    cfg: TrainConfig,
    variants,
    *,
    timeout_s=120,
    deadline_s=400,
    launch: Launch | None = None,
    outputs: Outputs | None = None,
    **parts,
) -> Job:
    """A job of `variants` on the CPU, quiet, under `timeout_s` and `deadline_s`; `launch`
    and `outputs` give the rest of their records, `parts` the job's other records."""
    launch = dataclasses.replace(
        launch or Launch(), device="cpu", timeout_s=timeout_s, deadline_s=deadline_s
    )
    return Job(
        spec,
        plan,
        cfg,
        source(spec, plan, cfg),
        variants=tuple(variants),
        launch=launch,
        outputs=dataclasses.replace(outputs or Outputs(), progress=False),
        **parts,
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


def losses_and_reference(spec: ModelSpec, plan: Plan, variants, steps: int = 5, **cfg_kw):
    """Run `variants` of `plan` for `steps` steps: each run's losses by name, the reference
    trainer's (fp32 plans only, else None) and the ranks' results."""
    from ratrain.train.reference import ReferenceTrainer

    cfg = TrainConfig(steps=steps, warmup_steps=1, **cfg_kw)
    res = run(spec, plan, cfg, variants, timeout_s=60, deadline_s=240)
    out = {name: losses(res, name) for name, _ in variants}
    ref = None
    if plan.compute_dtype == "fp32":
        ref = ReferenceTrainer(spec, plan, cfg, source(spec, plan, cfg)()).train()
    return out, ref, res
