"""`ratrain train`: train a model. With no arguments, the built-in demo: the tiny model on
the synthetic Markov-chain source, on the CPU, in about a minute, ending with the final loss
against the source's entropy floor (the best loss any model can reach)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time

from ratrain.cli.common import (
    add_model_arg,
    add_plan_args,
    nonempty,
    nonneg_float,
    nonneg_int,
    plan_from_args,
    positive_float,
    positive_int,
    timeout_s,
)
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.launch.host_memory import (
    HOST_ALLOCATORS,
    check_mmap_threshold,
    resolve_host_allocator,
)
from ratrain.models.counts import total_params
from ratrain.models.spec import ModelSpec
from ratrain.schedule.zerobubble import refuse_unsupported
from ratrain.train.request import TrainRequest
from ratrain.train.summary import summary_line

__all__ = [
    "add_arguments",
    "run",
    "run_reference",
    "train_config_from_args",
    "train_request_from_args",
    "data_source",
    "eval_data_source",
    "cpu_threads",
]

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
SMALL_MODEL_PARAMS = 50_000_000  # below this, one CPU thread by default (see --threads)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)  # default: the plan file's, else the resumed checkpoint's, else tiny
    add_plan_args(p, defaults=PLAN_DEFAULTS)
    g = p.add_argument_group("training")
    _add_optimizer_args(g)
    _add_runtime_args(g)
    _add_data_args(p.add_argument_group("data"))
    _add_eval_args(p.add_argument_group("evaluation (see docs/runtime.md)"))
    _add_output_args(p.add_argument_group("output"))
    _add_checkpoint_args(p.add_argument_group("checkpoints (see docs/checkpoints.md)"))


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
        "--seed", type=nonneg_int, default=0, help="seed of the weights and of the data (default 0)"
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
        "resident (rank 0's peak RSS 11-13%% lower on the issue-12 job); default auto: "
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
        "cost tokens/s on the issue-12 job; default 0: glibc's own dynamic threshold; see "
        "docs/runtime.md)",
    )
    g.add_argument(
        "--threads",
        type=positive_int,
        help="CPU threads per process (default: one process: 1 for models under 50M "
        "parameters, whose small GEMMs gain nothing from more and lose much when cores are "
        "shared, else torch's; several ranks: the CPUs this process may use, shared by them)",
    )
    g.add_argument("--nproc", type=positive_int, help="processes to launch; must equal pp x dp")
    g.add_argument(
        "--timeout",
        type=timeout_s,
        help="rendezvous/collective timeout in s: a stuck or lost rank fails the job after it "
        "(default 300)",
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


def _check_eval_flags(args: argparse.Namespace) -> None:
    """--eval-data and --eval-tokens only with --eval-every, which needs a held-out set."""
    for flag in ("eval_data", "eval_tokens"):
        if getattr(args, flag) is not None and args.eval_every is None:
            raise RatrainError(f"--{flag.replace('_', '-')} needs --eval-every N")
    if args.eval_every is not None and args.eval_data is None and not os.path.isdir(args.data):
        raise RatrainError(
            "--eval-every needs a held-out set: pass --eval-data SOURCE, or --data a "
            "directory `ratrain prepare` wrote (its val split)"
        )


def eval_data_source(args: argparse.Namespace, spec: ModelSpec, plan: Plan):
    """A factory of the held-out source of --eval-every (None without it): --eval-data, else
    the val split of the prepared --data directory (`held_out_source`)."""
    if args.eval_every is None:
        return None
    from ratrain.train.job import held_out_source

    return functools.partial(
        held_out_source,
        args.eval_data or args.data,
        spec,
        plan.seq,
        args.seed,
        tokenizer=args.tokenizer,
        dtype=args.data_dtype,
    )


def _add_output_args(o) -> None:
    o.add_argument("--metrics", help="write per-step metrics as JSON lines to this file")
    o.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also log to TensorBoard (needs the tensorboard package: "
        "pip install 'ratrain[tensorboard]')",
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


def train_config_from_args(args: argparse.Namespace) -> TrainConfig:
    if args.steps < 0 or (args.steps == 0 and not getattr(args, "save", None)):
        raise RatrainError(
            f"--steps must be a positive integer (0 only with --save: write the starting "
            f"state as a checkpoint), got {args.steps}"
        )
    if not args.lr > 0:
        raise RatrainError(f"--lr must be positive, got {args.lr}")
    warmup = args.warmup if args.warmup is not None else args.steps // 15
    if warmup < 0:
        raise RatrainError(f"--warmup must be >= 0, got {warmup}")
    if args.weight_decay < 0:
        raise RatrainError(f"--weight-decay must be >= 0, got {args.weight_decay}")
    min_lr = args.min_lr if args.min_lr is not None else args.lr / 10
    if not 0 <= min_lr <= args.lr:
        raise RatrainError(
            f"--min-lr {min_lr:g} must be between 0 and --lr {args.lr:g} (the cosine decays to it)"
        )
    return TrainConfig(
        steps=max(args.steps, 1),  # --steps 0: the schedule of a 1-step run, never stepped
        lr=args.lr,
        min_lr=min_lr,
        warmup_steps=warmup,
        weight_decay=args.weight_decay,
        seed=args.seed,
    )


def train_request_from_args(args: argparse.Namespace) -> TrainRequest:
    """What the distributed runtime is asked for besides model, plan, config and data."""
    return TrainRequest(
        backend=args.backend,
        compile_units=bool(args.compile),
        pin_cores=bool(args.pin_cores),
        host_allocator=args.host_allocator,
        malloc_mmap_threshold_bytes=args.malloc_mmap_threshold,
        timeout_s=args.timeout,
        metrics_path=args.metrics,
        tensorboard_dir=args.tensorboard,
        progress=not args.quiet,
        save_dir=args.save,
        save_every=args.save_every,
        keep=args.keep,
        resume=args.resume,
        init_from=args.init_from,
        run_steps=0 if args.steps == 0 else None,  # --steps 0: save the starting state
        eval_every=args.eval_every,
        eval_tokens=args.eval_tokens,
        measure_memory=bool(getattr(args, "measure_memory", False)),
        trace_path=getattr(args, "trace", None),
        **_memory_cap_of(args),
    )


def _memory_cap_of(args: argparse.Namespace) -> dict:
    """--memory-cap, else the cap the plan file was planned for (`memory_cap`)."""
    from ratrain.cli.common import memory_cap

    cap, label = memory_cap(args)
    return {"memory_cap_bytes": int(cap * 2**30) if cap else None, "memory_cap_label": label}


def data_source(args: argparse.Namespace, spec: ModelSpec, plan: Plan):
    """A factory of the token source --data, --tokenizer and --data-dtype name."""
    from ratrain.data import make_source

    return functools.partial(
        make_source,
        args.data,
        spec,
        plan.seq,
        args.seed,
        tokenizer=args.tokenizer,
        dtype=args.data_dtype,
    )


def run(args: argparse.Namespace) -> int:
    cfg = _check_flags(args)
    spec, plan = plan_from_args(args, default_model=_default_model(args))
    refuse_unsupported(plan)  # before any rank starts (building the schedule refuses it too)
    _check_processes(args, plan)
    distributed = plan.pp * plan.dp > 1 or args.nproc is not None
    if distributed or args.save or args.resume or args.init_from or args.eval_every:
        # Checkpoints, HF weights and evaluation live in the distributed runtime (also on
        # one process).
        from ratrain.train.command import run_distributed

        request, source = train_request_from_args(args), data_source(args, spec, plan)
        held_out = eval_data_source(args, spec, plan)
        with _omp_threads(args.threads):  # each rank's threads (the launcher reads it)
            return run_distributed(request, spec, plan, cfg, source, held_out)
    _note_ignored_flags(args, plan)
    return run_reference(args, spec, plan)


def _check_flags(args: argparse.Namespace) -> TrainConfig:
    """The flags' errors (one line each) before anything is built; the training config.
    With --init-from, --model becomes its config.json."""
    from ratrain.cli.outputs import check_output_dir, prepare_output_dir, prepare_output_file
    from ratrain.observe.metrics import require_tensorboard

    if args.tensorboard is not None:  # a bad folder says so; then a missing package does
        check_output_dir(args.tensorboard, "--tensorboard")
        require_tensorboard()
    prepare_output_file(args.metrics, "--metrics")
    prepare_output_file(getattr(args, "trace", None), "--trace")
    prepare_output_dir(args.tensorboard, "--tensorboard")
    cfg = train_config_from_args(args)
    check_mmap_threshold(args.malloc_mmap_threshold)
    _check_inputs(args)
    if args.host_allocator != "auto":  # one not installed: one line before any work
        resolve_host_allocator(args.host_allocator, args.malloc_mmap_threshold)
    _check_checkpoint_flags(args)
    _check_eval_flags(args)
    if args.init_from:
        from ratrain.models.hf_config import from_hf_config

        if args.model is not None:
            raise RatrainError("--init-from takes the model from its config.json; drop --model")
        if args.resume not in (None, "auto"):  # auto: --save's newest, else HF_DIR
            raise RatrainError(
                f"--init-from takes --resume auto only (continue from --save's newest "
                f"checkpoint, else start from HF_DIR); --resume {args.resume} already holds "
                "the weights: drop --init-from"
            )
        from_hf_config(args.init_from)  # a config error is reported as such, first
        args.model = _config_path(args.init_from)
    return cfg


def _default_model(args: argparse.Namespace) -> str | ModelSpec:
    """The model when neither --model nor --plan (nor --init-from) names one: that of the
    checkpoint --resume continues (its ratrain.json holds the full spec), else tiny."""
    if args.model is None and not args.plan and (args.resume or args.save):
        from ratrain.checkpoint.hooks import checkpoint_model

        return checkpoint_model(args.resume, args.save) or "tiny"
    return "tiny"


def _check_processes(args: argparse.Namespace, plan: Plan) -> None:
    """--nproc and --threads: positive, and --nproc equal to pp x dp."""
    world = plan.pp * plan.dp
    if args.nproc is not None and args.nproc <= 0:
        raise RatrainError(f"--nproc must be a positive integer, got {args.nproc}")
    if args.threads is not None and args.threads <= 0:
        raise RatrainError(f"--threads must be a positive integer, got {args.threads}")
    if args.nproc is not None and args.nproc != world:
        raise RatrainError(
            f"--nproc {args.nproc} does not match pp x dp = {world}; drop --nproc or fix it"
        )


MAX_THREADS_PER_CPU = 4
"""assumed: --threads above 4 per CPU of the machine only wait for cores (torch's pool of
10**5 threads crashes the process)."""


def _check_inputs(args: argparse.Namespace) -> None:
    """--backend, --tokenizer and --threads, before any file is opened or rank started."""
    from ratrain.kernels.registry import available_backends

    if args.backend not in available_backends():
        raise RatrainError(
            f"--backend {args.backend!r}: unknown; choose one of {', '.join(available_backends())}"
        )
    tok = args.tokenizer
    if tok is not None and not os.path.isfile(os.path.join(tok, "tokenizer.json")):
        if not os.path.isfile(tok):
            raise RatrainError(
                f"--tokenizer {tok!r}: no such file, nor a folder holding tokenizer.json; "
                "give a tokenizer.json or its folder"
            )
    most = MAX_THREADS_PER_CPU * (os.cpu_count() or 1)
    if args.threads is not None and args.threads > most:
        raise RatrainError(
            f"--threads {args.threads}: more than {most} ({MAX_THREADS_PER_CPU} per CPU of "
            "this machine); give at most that"
        )


def _note_ignored_flags(args: argparse.Namespace, plan: Plan) -> None:
    """Say which flags the single-process reference trainer does not apply."""
    if args.compile or plan.loss_chunk_tokens:
        print(
            "ratrain train: --compile and --loss-chunk-tokens apply to the pipeline runtime "
            "(pp x dp > 1, or --nproc 1); the single-process reference trainer runs eagerly "
            "with the plain loss",
            file=sys.stderr,
        )
    for flag, value in (
        ("--malloc-mmap-threshold", args.malloc_mmap_threshold),
        ("--host-allocator", args.host_allocator != "auto"),
        ("--measure-memory", getattr(args, "measure_memory", False)),
        ("--trace", getattr(args, "trace", None)),
    ):
        if value:
            print(
                f"ratrain train: {flag} applies to the pipeline runtime's ranks (pp x dp > 1, "
                "or --nproc 1); the single-process reference trainer ignores it",
                file=sys.stderr,
            )


@contextlib.contextmanager
def _omp_threads(threads: int | None):
    """OMP_NUM_THREADS = threads for the ranks this process launches, restored after."""
    if threads is None:
        yield
        return
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def _config_path(d: str) -> str:
    return os.path.join(d, "config.json") if os.path.isdir(d) else d


def _check_checkpoint_flags(args: argparse.Namespace) -> None:
    from ratrain.cli.outputs import prepare_output_dir

    for flag in ("save_every", "keep"):
        if getattr(args, flag) is not None and not args.save:
            raise RatrainError(f"--{flag.replace('_', '-')} needs --save DIR")
    prepare_output_dir(args.save, "--save")


def run_reference(args: argparse.Namespace, spec: ModelSpec, plan: Plan) -> int:
    """Single-process training with `ReferenceTrainer`: progress, metrics, a summary line."""
    import torch

    from ratrain.launch.faults import Interrupted, signal_name, signals_interrupt
    from ratrain.observe.metrics import JsonlWriter, Progress, TensorBoardWriter
    from ratrain.train.failures import NO_CHECKPOINTS
    from ratrain.train.reference import ReferenceTrainer

    cfg = train_config_from_args(args)
    threads = cpu_threads(args, spec)
    source = data_source(args, spec, plan)()
    metrics = JsonlWriter(args.metrics) if args.metrics else None
    tb = TensorBoardWriter(args.tensorboard)
    trainer = ReferenceTrainer(spec, plan, cfg, source, backend=args.backend, metrics=metrics)
    print(
        f"training {spec.name} ({total_params(spec) / 1e6:.2f}M params) on {source.describe()}\n"
        f"  {cfg.steps} steps x {plan.global_batch} seqs x {plan.seq} tokens "
        f"(micro-batch {plan.micro_batch}, {plan.microbatches * plan.dp} microbatches), "
        f"{plan.compute_dtype}, lr {cfg.lr:g} -> {cfg.min_lr:g}, reference trainer, "
        f"{threads} CPU thread{'s' if threads > 1 else ''}"
    )
    sys.stdout.flush()
    bar = Progress(cfg.steps, "train", quiet=args.quiet)

    done = [0]  # steps finished, for the line a signal ends the run with

    def on_step(s) -> None:
        tb.write(s.step, s.record())
        bar.update(**{"loss": s.loss, "lr": s.lr, "tok/s": f"{s.tokens_per_s:,.0f}"})
        done[0] += 1

    t0 = time.perf_counter()
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
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
        if metrics is not None:
            metrics.close()
    elapsed_s = time.perf_counter() - t0
    print(summary_line(losses, source, elapsed_s, cfg.steps * plan.tokens_per_step))
    return 0


def cpu_threads(args: argparse.Namespace, spec: ModelSpec) -> int:
    import torch

    if args.threads is not None:
        if args.threads <= 0:
            raise RatrainError(f"--threads must be a positive integer, got {args.threads}")
        return args.threads
    if "OMP_NUM_THREADS" not in os.environ and total_params(spec) < SMALL_MODEL_PARAMS:
        return 1
    return torch.get_num_threads()
