"""The checkpoint and fault hooks of the distributed training loop
(`ratrain.train.job`): when to save, saving and resuming a stage, which
checkpoint `--resume` means, and keeping the metrics file of a resumed run."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec

__all__ = ["save_due", "save_stage", "resume_stage", "resume_dir", "keep_records_before",
           "is_rank0", "resume_arg", "checkpoint_model"]  # fmt: skip


def save_due(job, k: int) -> bool:
    opts = job.checkpoints
    if not opts.save_dir:
        return False
    last = k + 1 == job.cfg.steps
    return last or (opts.save_every is not None and (k + 1) % opts.save_every == 0)


def save_stage(grid, model, ex, job, plan: Plan, step: int) -> None:
    from ratrain.checkpoint.io import save_checkpoint

    data = {"source": ex.batches.source.describe(), "seed": job.cfg.seed}
    save_checkpoint(
        job.checkpoints.save_dir,
        next_step=step,
        grid=grid,
        model=model,
        executor=ex,
        spec=job.spec,
        plan=plan,
        cfg=job.cfg,
        data=data,
        keep=job.checkpoints.keep,
        fault=job.hooks.fault,
    )


def resume_stage(grid, model, job, plan: Plan) -> dict:
    from ratrain.checkpoint.io import load_checkpoint

    return load_checkpoint(
        job.checkpoints.resume_from, grid=grid, model=model, spec=job.spec, plan=plan
    )


def keep_records_before(path: str, step: int) -> None:
    """Drop the records of steps >= `step` (a killed run may have logged past its last
    checkpoint) so that the resumed run's records follow on without duplicates."""
    p = Path(path)
    if not p.is_file():
        return
    kept = []
    for line in p.read_text().splitlines():
        try:
            if json.loads(line).get("step", step) < step:
                kept.append(line)
        except ValueError:
            continue  # a line cut short by the kill
    p.write_text("".join(x + "\n" for x in kept))


def is_rank0() -> bool:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0


def resume_arg(resume: str | None, save_dir: str | None) -> str | None:
    """`--resume` as the job takes it: "auto" for a job torchrun restarted
    (TORCHELASTIC_RESTART_COUNT > 0) with `save_dir` and no `--resume` of its own."""
    if resume is None and save_dir and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return "auto"
    return resume


def checkpoint_model(resume: str | None, save_dir: str | None) -> ModelSpec | None:
    """The model of the checkpoint `--resume` names (its `ratrain.json` holds the full
    spec), for a run given no `--model`; None when it names none (no `--resume`, or "auto"
    with no checkpoint yet). A bad `--resume` is one line, as `resume_dir` says it."""
    from ratrain.checkpoint import read_meta, resolve_resume

    resume = resume_arg(resume, save_dir)
    ckpt = resolve_resume(resume, save_dir) if resume is not None else None
    if ckpt is None:
        return None
    try:
        return ModelSpec.from_dict(read_meta(ckpt)["model"])
    except (KeyError, TypeError, RatrainError) as e:
        raise RatrainError(f"checkpoint {str(ckpt)!r}: unreadable model spec ({e})") from None


def resume_dir(
    spec: ModelSpec,
    plan: Plan,
    *,
    save_dir: str | None,
    resume: str | None,
    cfg: TrainConfig | None = None,
) -> Path | None:
    """The checkpoint `resume` (`--resume`: a step-* directory, a `--save` directory, or
    "auto") names, checked against `spec` and `plan`; None: a fresh start. A job restarted
    by torchrun (TORCHELASTIC_RESTART_COUNT > 0) with `save_dir` resumes from it as with
    `--resume auto`. With `cfg`, rank 0 notes a changed LR schedule or optimizer."""
    from ratrain.checkpoint import complete_checkpoints, read_meta, resolve_resume
    from ratrain.checkpoint.io import check_compatible

    resume = resume_arg(resume, save_dir)
    if resume is None:
        if save_dir and complete_checkpoints(save_dir):
            newest = complete_checkpoints(save_dir)[-1].name
            raise RatrainError(
                f"--save {save_dir} already holds checkpoints (newest {newest}); pass --resume "
                "auto to continue from it, or another --save directory"
            )
        return None
    ckpt = resolve_resume(resume, save_dir)
    if ckpt is not None:
        meta = read_meta(ckpt)
        check_compatible(meta, ckpt, spec, plan)  # before any rank starts
        # A checkpoint with its job: `ratrain train` said what changed, in one line
        if cfg is not None and is_rank0() and "job" not in meta:
            _note_schedule_change(meta, cfg)
    return ckpt


def _note_schedule_change(meta: dict, cfg: TrainConfig) -> None:
    """Say so when the resumed run's LR schedule or optimizer differs from the saved run's:
    legitimate (e.g. more --steps), but then it is no longer the same training."""
    saved = meta.get("lr_schedule", {})
    now = {k: v for k, v in asdict(cfg).items() if k != "extra"}
    diff = [f"{k} {saved.get(k)} -> {v}" for k, v in now.items() if saved.get(k) != v]
    if diff:
        print(
            f"ratrain: note: resuming with another schedule/optimizer ({', '.join(diff)}); "
            "steps from here differ from the saved run's",
            file=sys.stderr,
            flush=True,
        )
