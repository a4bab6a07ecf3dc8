"""What a distributed training run is asked for besides the model, the plan, the training
config and the data: the records a `Job` is built from (`ratrain.train.parts`), and the
checkpoint to resume, as named on the command line.

`ratrain.cli.train` builds a `TrainRequest` from its flags and hands it to
`ratrain.train.command.run_distributed`, which puts its records into the `Job` as they are;
nothing below the CLI reads argparse. Pure Python (no torch), so the CLI can import it
before it knows whether it will train."""

from __future__ import annotations

from dataclasses import dataclass

from ratrain.train.parts import CheckpointOpts, EvalOpts, Launch, MemoryCap, Outputs

__all__ = ["TrainRequest"]


@dataclass(frozen=True)
class TrainRequest:
    """How to run one distributed training job and what it writes."""

    launch: Launch = Launch()
    outputs: Outputs = Outputs()
    """Its `trace_steps` are the last step's when `trace_path` is set and they are not."""
    checkpoints: CheckpointOpts = CheckpointOpts()
    """Its `resume_from` is resolved from `resume` (`run_distributed`)."""
    evaluation: EvalOpts = EvalOpts()
    memory_cap: MemoryCap | None = None
    resume: str | None = None
    """A step-* checkpoint, a `--save` directory, or "auto" (`--resume`); None: a fresh
    start, unless torchrun restarted the job (`ratrain.checkpoint.hooks.resume_dir`)."""
    job: dict | None = None
    """The effective job as a job file holds it (`ratrain train --print-config`): sections
    of {option: value}. Its checkpoints store it (`ratrain.json`'s "job"), and a resume
    restores it; None: no job is stored."""
