"""How a job ends, in one line: a failed rank, a stop on a signal, an interrupted stop; and
`run_job_one_line`, which every command that runs a job (train, verify, validate, eval) uses
so that a rank's failure reads the same everywhere."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

from ratrain.checkpoint import complete_checkpoints
from ratrain.checkpoint.layout import step_dir_name
from ratrain.errors import RatrainError
from ratrain.launch.faults import (
    Interrupted,
    JobFailed,
    PeerLost,
    current_step,
    read_steps,
    signal_name,
)
from ratrain.launch.spawn import RankFailure, RanksInterrupted
from ratrain.train.job import CheckedJob, Job, RankResult, check_job, run_job

NO_CHECKPOINTS = "no checkpoints (run with --save DIR to keep progress)"

__all__ = [
    "NO_CHECKPOINTS",
    "run_job_one_line",
    "failure_message",
    "last_checkpoint_note",
    "stopped_run",
    "stop_line",
]


def run_job_one_line(
    job: Job | CheckedJob, what: str = "", *, checkpoints: bool = False
) -> list[RankResult]:
    """`run_job`, with a rank's failure as one line (`JobFailed`, exit code 1): which rank,
    what happened, at which step, and with `checkpoints` where to resume from; `what` goes
    first (e.g. "plan pp2-dp1: "). A `Job` is checked first (`check_job`), a `CheckedJob`
    is not again. A user mistake the checks or the ranks found stays the `RatrainError` it
    is; ranks stopped by a signal that did not end cleanly are `Interrupted`."""
    checked = job if isinstance(job, CheckedJob) else check_job(job)
    launched = checked.rdzv is not None
    status = None
    if checked.job.hooks.status_dir is None and not launched:
        status = tempfile.TemporaryDirectory(prefix="ratrain-status-")
        checked = _with_status_dir(checked, status.name)
    status_dir, save_dir = checked.job.hooks.status_dir, checked.job.checkpoints.save_dir
    try:
        return run_job(checked)
    except RatrainError:
        raise
    except RankFailure as e:
        steps = read_steps(status_dir) if status_dir else {}
        step = steps.get(e.rank) if e.rank is not None else None
        if step is None and steps:
            step = max(steps.values())
        line = failure_message(e.rank, e.cause, step, save_dir, checkpoints)
        raise JobFailed(what + line) from None
    except RanksInterrupted as e:
        steps = read_steps(status_dir) if status_dir else {}
        raise Interrupted(e.signum, what + _interrupt_line(e, steps, save_dir)) from None
    except Exception as e:  # launched by torchrun/Slurm: this rank saw the failure
        if not launched:
            raise
        rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
        first = (str(e).strip().splitlines() or [""])[0][:200]
        cause = f"stopped ({type(e).__name__}: {first}; a peer rank may have died)"
        if isinstance(e, PeerLost):  # the heartbeat named the peers lost
            cause = e.cause
        line = failure_message(rank, cause, current_step(), save_dir, checkpoints)
        raise JobFailed(what + line) from None
    finally:
        if status is not None:
            status.cleanup()


def _with_status_dir(checked: CheckedJob, status_dir: str) -> CheckedJob:
    """`checked` with its ranks reporting their steps in `status_dir`."""
    job = checked.job
    hooks = dataclasses.replace(job.hooks, status_dir=status_dir)
    return dataclasses.replace(checked, job=dataclasses.replace(job, hooks=hooks))


def failure_message(
    rank: int | None, cause: str, step: int | None, save_dir: str | None, checkpoints: bool = True
) -> str:
    """The one line a failed job ends with: who, what, when, and (for a job that can save:
    `checkpoints`) where to resume from."""
    who = f"rank {rank}" if rank is not None else "a rank"
    where = f" at step {step}" if step is not None else ""
    said = f"{who} {cause}{where}"
    return f"{said}; {last_checkpoint_note(save_dir)}" if checkpoints else said


def last_checkpoint_note(save_dir: str | None) -> str:
    if not save_dir:
        return NO_CHECKPOINTS
    done = complete_checkpoints(save_dir)
    if done:
        return f"last complete checkpoint {done[-1]} (continue with --resume auto)"
    return f"no complete checkpoint in {save_dir} yet"


def stopped_run(results: list[RankResult]) -> tuple[int, int] | None:
    """(signal, next step) of a run the ranks stopped on request (the same on every rank)."""
    for r in results:
        for run in r.runs.values():
            if run.stopped_by:
                return run.stopped_by, run.stopped_at
    return None


def stop_line(signum: int, step: int, save_dir: str | None) -> str:
    """The line a job stopped by a signal ends with: where, and how to go on."""
    said = f"stopped by {signal_name(signum)} at step {step}"
    if not save_dir:
        return f"{said}; no checkpoint (run with --save DIR to keep progress)"
    return f"{said}; checkpoint {Path(save_dir) / step_dir_name(step)}; continue with --resume auto"


def _interrupt_line(e: RanksInterrupted, steps: dict[int, int], save_dir: str | None) -> str:
    """The line of a stop that did not end cleanly: a second signal, or a rank that died."""
    at = f" at step {max(steps.values())}" if steps else ""
    if e.aborted:
        said = f"aborted by a second signal after {signal_name(e.signum)}{at}: ranks killed"
    else:
        said = f"interrupted by {signal_name(e.signum)}{at} (a rank ended before the stop)"
    return f"{said}; {last_checkpoint_note(save_dir)}"
