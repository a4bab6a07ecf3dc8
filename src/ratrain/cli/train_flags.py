"""The flags of `ratrain train` (`add_arguments`) and the built-in demo's defaults."""

from __future__ import annotations

import argparse

from ratrain.cli.common import (
    add_model_arg,
    add_plan_args,
    nonempty,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    seed,
    thread_count,
    timeout_s,
)
from ratrain.cli.jobfile import track_explicit
from ratrain.launch.host_memory import HOST_ALLOCATORS

__all__ = ["add_arguments", "PLAN_DEFAULTS", "DEFAULT_STEPS", "DEFAULT_LR"]

# The demo: 300 steps of 32 x 64 tokens at lr 1e-2 bring the tiny model to within about 3%
# of the synthetic source's entropy floor on held-out data, in about 30 s of one CPU core
# (benchmarks/converge_synthetic.py measures it).
PLAN_DEFAULTS = {
    "pp": 2,  # the built-in job runs the pipeline runtime on 2 local ranks
    "seq": 64,
    "micro_batch": 8,
    "global_batch": 32,
    "compute_dtype": "fp32",
}
DEFAULT_STEPS = 300
DEFAULT_LR = 1e-2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """All of `ratrain train`'s flags, in their groups. Each group is a section of a job
    file (`ratrain.cli.jobfile`: its keys are the dests of the group's actions); the
    "options" group holds what is not part of a job (--config, --print-config)."""
    _add_job_file_args(p)
    plan = p.add_argument_group("plan")
    add_model_arg(plan)  # default: the plan file's, else the resumed checkpoint's, else tiny
    add_plan_args(plan, defaults=PLAN_DEFAULTS)
    _document_auto_plan(plan)
    _add_optimizer_args(p.add_argument_group("training"))
    _add_runtime_args(p.add_argument_group("runtime"))
    _add_data_args(p.add_argument_group("data"))
    _add_eval_args(p.add_argument_group("evaluation (see docs/runtime.md)"))
    _add_output_args(p.add_argument_group("output"))
    _add_checkpoint_args(p.add_argument_group("checkpoints (see docs/checkpoints.md)"))
    track_explicit(p)  # which options were given (a resume keeps the others' saved values)


def _document_auto_plan(group) -> None:
    """--plan also takes "auto" here (`ratrain.cli.plan.auto_plan`)."""
    for a in group._group_actions:
        if a.dest == "plan":
            a.help += (
                "; auto: plan for --nproc ranks (default: this machine's CPUs) on cpu-local, "
                "run the best few plans a few steps each here and train the fastest measured "
                "(the plan flags given are pins; a resume keeps the plan chosen)"
            )


def _add_job_file_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=nonempty,
        metavar="JOB.yaml",
        help="a job file (YAML, or TOML by its suffix): any option below, under its group's "
        "name (plan:, training:, ...; see --print-config); flags override it",
    )
    p.add_argument(
        "--print-config",
        nargs="?",
        const="-",
        metavar="PATH",
        help="write the effective job (defaults, --config, the resumed checkpoint's job and "
        "the flags merged) as a job file to stdout (or PATH) and exit; --config reads it back",
    )


def _add_optimizer_args(g) -> None:
    """Steps, learning-rate schedule, weight decay, seed."""
    g.add_argument(
        "--steps",
        type=nonneg_int,
        default=DEFAULT_STEPS,
        help=f"optimizer steps (default {DEFAULT_STEPS})",
    )
    g.add_argument(
        "--lr",
        type=positive_float,
        default=DEFAULT_LR,
        help=f"peak learning rate (default {DEFAULT_LR:g}; lower it for larger models)",
    )
    g.add_argument(
        "--min-lr", type=nonneg_float, help="final learning rate of the cosine (default lr / 10)"
    )
    g.add_argument("--warmup", type=nonneg_int, help="linear warmup steps (default steps / 15)")
    g.add_argument(
        "--weight-decay",
        type=nonneg_float,
        default=0.1,
        help="AdamW decoupled weight decay on matrices (default 0.1)",
    )
    g.add_argument(
        "--seed", type=seed, default=0, help="seed of the weights and of the data (default 0)"
    )


def _add_runtime_args(g) -> None:
    """Kernels, compilation, placement, host memory, threads, processes, timeout."""
    g.add_argument(
        "--backend", type=nonempty, default="torch", help="kernel backend (default torch)"
    )
    g.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run each transformer block through torch.compile (distributed runtime; "
        "compile time is reported apart; default off, see docs/runtime.md)",
    )
    g.add_argument(
        "--pin-cores",
        action="store_true",
        help="pin each locally spawned rank to one core (ranks outnumbering the cores share "
        "them, stages mixed per core); torchrun and Slurm ranks keep their placement",
    )
    g.add_argument(
        "--host-allocator",
        choices=HOST_ALLOCATORS,
        default="auto",
        help="distributed runtime: the malloc preloaded into the locally spawned ranks "
        "(LD_PRELOAD): tcmalloc (Debian package libtcmalloc-minimal4) or jemalloc "
        "(libjemalloc2) fragment less than glibc's malloc and leave less freed memory "
        "resident (rank 0's peak RSS 11-13%% lower on the rss_breakdown job); default auto: "
        "tcmalloc if installed, else jemalloc, else malloc (glibc's). torchrun/Slurm ranks "
        "keep the LD_PRELOAD they were launched with; see docs/runtime.md",
    )
    g.add_argument(
        "--malloc-mmap-threshold",
        type=int,
        default=0,
        metavar="BYTES",
        help="distributed runtime, CPU: each rank fixes glibc's mmap threshold to this, so "
        "freed tensors of at least this size go back to the OS and resident memory follows "
        "live tensors, at the price of a page fault per fresh allocation; glibc's malloc only "
        "(--host-allocator auto then means malloc; 131072 cut rank 0's peak RSS by 15%% and "
        "cost tokens/s on the rss_breakdown job; default 0: glibc's own dynamic threshold; see "
        "docs/runtime.md)",
    )
    g.add_argument(
        "--threads",
        type=thread_count,
        help="CPU threads per process (default: one process: 1 for models under 50M "
        "parameters, whose small GEMMs gain nothing from more and lose much when cores are "
        "shared, else torch's; several ranks: the CPUs this process may use, shared by them)",
    )
    g.add_argument("--nproc", type=positive_int, help="processes to launch; must equal pp x dp")
    g.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where the distributed runtime's ranks run, one CUDA device per local rank "
        "(default: cuda when available); --device cuda runs even one rank on the distributed "
        "runtime (the single-process reference trainer is CPU only)",
    )
    g.add_argument(
        "--timeout",
        type=timeout_s,
        help="rendezvous/collective timeout in s: a stuck or lost rank fails the job after it "
        "(default 300)",
    )
    g.add_argument(
        "--peer-timeout",
        type=timeout_s,
        help="torchrun/Slurm ranks: end the job this many s after a peer rank's heartbeat "
        "stopped (a node lost, a link down) or node 0's store went out of reach, with one line "
        "naming the node (default 30; --timeout bounds a stuck but living rank)",
    )


def _add_data_args(d) -> None:
    d.add_argument(
        "--data",
        type=nonempty,
        default="synthetic",
        help="synthetic, or a .txt/.jsonl file, or a token file (.bin/.u16/.u32), or a "
        "directory `ratrain prepare` wrote (its train split and its tokenizer)",
    )
    d.add_argument(
        "--tokenizer",
        type=nonempty,
        help="a Hugging Face tokenizer.json (or its directory) for text data; default: bytes. "
        "Checkpoints (--save) keep a copy, which `export` and `generate` use",
    )
    d.add_argument(
        "--data-dtype", choices=("uint16", "uint32"), help="token dtype of a binary token file"
    )


def _add_eval_args(e) -> None:
    e.add_argument(
        "--eval-every",
        type=positive_int,
        metavar="N",
        help="every N steps and after the last, the loss on a held-out set through the "
        "pipeline (forward only), as eval_loss in the metrics: the val split of a --data "
        "directory `ratrain prepare` wrote, or --eval-data",
    )
    e.add_argument(
        "--eval-data",
        type=nonempty,
        metavar="SOURCE",
        help="the held-out data: anything --data takes (a prepared directory: its val "
        "split); --tokenizer and --data-dtype apply to it as to --data",
    )
    e.add_argument(
        "--eval-tokens",
        type=positive_int,
        metavar="T",
        help="the held-out set's size: ceil(T / seq) sequences, rounded up to whole "
        "microbatches of every replica, the same ones at every evaluation (default 32 "
        "sequences)",
    )


def _add_output_args(o) -> None:
    o.add_argument("--metrics", help="write per-step metrics as JSON lines to this file")
    o.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also log to TensorBoard (needs the tensorboard package: "
        "pip install 'ratrain[tensorboard]')",
    )
    o.add_argument(
        "--wandb",
        type=nonempty,
        metavar="PROJECT",
        help="also log to Weights & Biases as PROJECT, offline (files in wandb/ beside "
        "--metrics; wandb sync uploads them); needs the wandb package: pip install wandb",
    )
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    o.add_argument(
        "--memory-cap",
        type=positive_float,
        metavar="GIB",
        help="usable memory per rank in GiB: a plan whose ledger peak exceeds it is refused "
        "before any work; the summary sets the measured peak per rank beside it",
    )
    o.add_argument(
        "--measure-memory",
        action="store_true",
        help="count every rank's live tensor bytes (what the memory ledger and --memory-cap "
        "count) and report their peak per rank in the summary and the metrics; slows each "
        "step on CPU (on CUDA the allocator counts them anyway); without it a CPU run reports "
        "peak RSS",
    )
    o.add_argument(
        "--trace",
        metavar="OUT.json",
        help="write the last step's measured timeline (replica 0 of every stage, every "
        "action in the schedule's names) as a Chrome/Perfetto trace, in the format of "
        "`ratrain simulate --trace`, to open the two side by side",
    )


def _add_checkpoint_args(c) -> None:
    c.add_argument(
        "--save",
        metavar="DIR",
        help="write checkpoints to DIR/step-NNNNNNNN (at the end, and every --save-every steps)",
    )
    c.add_argument("--save-every", type=positive_int, metavar="N", help="checkpoint every N steps")
    c.add_argument(
        "--keep", type=positive_int, metavar="K", help="keep only the newest K checkpoints"
    )
    c.add_argument(
        "--resume",
        type=nonempty,
        metavar="DIR|auto",
        help="continue from a checkpoint (a step-* directory, or a --save directory's newest); "
        "auto: the newest complete one under --save, or a fresh start if there is none. Under "
        "torchrun a restarted job resumes from --save by itself. Without --model the model is "
        "the checkpoint's",
    )
    c.add_argument(
        "--init-from",
        type=nonempty,
        metavar="HF_DIR",
        help="start from Hugging Face weights (config.json + safetensors); the model comes "
        "from HF_DIR. With --resume auto: continue from --save's newest checkpoint if there "
        "is one, else start from HF_DIR (one command line for the first run and its restarts)",
    )
