"""`ratrain train` on one process with the reference trainer (`ReferenceTrainer`): its
header, progress bar, metrics (JSONL, TensorBoard), the one line a signal ends it with, and
the summary line."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import torch

from ratrain.config import Plan, TrainConfig
from ratrain.data.base import TokenSource
from ratrain.launch.faults import Interrupted, signal_name, signals_interrupt
from ratrain.models.counts import total_params
from ratrain.models.spec import ModelSpec
from ratrain.observe.metrics import (
    JsonlWriter,
    Progress,
    TensorBoardWriter,
    WandbWriter,
    wandb_dir,
)
from ratrain.train.failures import NO_CHECKPOINTS
from ratrain.train.parts import Launch, Outputs
from ratrain.train.reference import ReferenceTrainer
from ratrain.train.summary import summary_line

__all__ = ["run_reference", "reference_threads", "SMALL_MODEL_PARAMS"]

SMALL_MODEL_PARAMS = 50_000_000
"""Below this many parameters, one CPU thread by default (`reference_threads`)."""


def reference_threads(threads: int | None, spec: ModelSpec) -> int:
    """The CPU threads the reference trainer runs on: `threads` (`--threads`) if given;
    else 1 for models under `SMALL_MODEL_PARAMS` when OMP_NUM_THREADS is not set (their
    small GEMMs gain nothing from more, and lose much when cores are shared); else
    torch's."""
    if threads is not None:
        return threads
    if "OMP_NUM_THREADS" not in os.environ and total_params(spec) < SMALL_MODEL_PARAMS:
        return 1
    return torch.get_num_threads()


def run_reference(
    spec: ModelSpec,
    plan: Plan,
    cfg: TrainConfig,
    source: Callable[[], TokenSource],
    launch: Launch | None = None,
    outputs: Outputs | None = None,
    threads: int | None = None,
) -> int:
    """Single-process training with `ReferenceTrainer` on `reference_threads(threads)`
    threads, with `launch.backend`: the metrics file, TensorBoard folder and progress bar
    of `outputs` (None: the defaults; the rest of `launch` and `outputs` is the pipeline runtime's; this
    trainer keeps no checkpoints); a summary line at the end. Interrupted by a signal, it
    raises `Interrupted` with one line: the step reached, and that nothing was saved."""
    launch, outputs = launch or Launch(), outputs or Outputs()
    n_threads = reference_threads(threads, spec)
    src = source()
    metrics = JsonlWriter(outputs.metrics_path) if outputs.metrics_path else None
    tb = TensorBoardWriter(outputs.tensorboard_dir)
    wb = WandbWriter(outputs.wandb_project, wandb_dir(outputs.metrics_path))
    trainer = ReferenceTrainer(spec, plan, cfg, src, backend=launch.backend, metrics=metrics)
    _print_header(spec, plan, cfg, src, n_threads)
    bar = Progress(cfg.steps, "train", quiet=not outputs.progress)
    done = [0]  # steps finished, for the line a signal ends the run with

    def on_step(s) -> None:
        tb.write(s.step, s.record())
        wb.write(s.step, s.record())
        bar.update(**{"loss": s.loss, "lr": s.lr, "tok/s": f"{s.tokens_per_s:,.0f}"})
        done[0] += 1

    t0 = time.perf_counter()
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        with signals_interrupt():
            losses = trainer.train(on_step)
    except Interrupted as e:  # one line, 128 + the signal; this trainer keeps no checkpoints
        line = f"interrupted by {signal_name(e.signum)} at step {done[0]}; " + NO_CHECKPOINTS
        raise Interrupted(e.signum, line) from None
    finally:
        torch.set_num_threads(saved_threads)
        bar.close()
        tb.close()
        wb.close()
        if metrics is not None:
            metrics.close()
    elapsed_s = time.perf_counter() - t0
    print(summary_line(losses, src, elapsed_s, cfg.steps * plan.tokens_per_step))
    return 0


def _print_header(
    spec: ModelSpec, plan: Plan, cfg: TrainConfig, src: TokenSource, threads: int
) -> None:
    print(
        f"training {spec.name} ({total_params(spec) / 1e6:.2f}M params) on {src.describe()}\n"
        f"  {cfg.steps} steps x {plan.global_batch} seqs x {plan.seq} tokens "
        f"(micro-batch {plan.micro_batch}, {plan.microbatches * plan.dp} microbatches), "
        f"{plan.compute_dtype}, lr {cfg.lr:g} -> {cfg.min_lr:g}, reference trainer, "
        f"{threads} CPU thread{'s' if threads > 1 else ''}"
    )
    sys.stdout.flush()
