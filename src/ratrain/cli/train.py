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

from ratrain.cli.common import add_model_arg, add_plan_args, plan_from_args, positive_int
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.launch.host_memory import check_mmap_threshold
from ratrain.models.counts import total_params
from ratrain.models.spec import ModelSpec
from ratrain.train.request import TrainRequest
from ratrain.train.summary import summary_line

__all__ = [
    "add_arguments",
    "run",
    "run_reference",
    "train_config_from_args",
    "train_request_from_args",
    "data_source",
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
    add_model_arg(p)  # default: the plan file's model, else tiny
    add_plan_args(p, defaults=PLAN_DEFAULTS)
    g = p.add_argument_group("training")
    _add_optimizer_args(g)
    _add_runtime_args(g)
    _add_data_args(p.add_argument_group("data"))
    _add_output_args(p.add_argument_group("output"))
    _add_checkpoint_args(p.add_argument_group("checkpoints (see docs/checkpoints.md)"))


def _add_optimizer_args(g) -> None:
    """Steps, learning-rate schedule, weight decay, seed."""
    g.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"optimizer steps (default {DEFAULT_STEPS})",
    )
    g.add_argument(
        "--lr",
        type=float,
        default=DEFAULT_LR,
        help=f"peak learning rate (default {DEFAULT_LR:g}; lower it for larger models)",
    )
    g.add_argument(
        "--min-lr", type=float, help="final learning rate of the cosine (default lr / 10)"
    )
    g.add_argument("--warmup", type=int, help="linear warmup steps (default steps / 15)")
    g.add_argument(
        "--weight-decay",
        type=float,
        default=0.1,
        help="AdamW decoupled weight decay on matrices (default 0.1)",
    )
    g.add_argument(
        "--seed", type=int, default=0, help="seed of the weights and of the data (default 0)"
    )


def _add_runtime_args(g) -> None:
    """Kernels, compilation, placement, host memory, threads, processes, timeout."""
    g.add_argument("--backend", default="torch", help="kernel backend (default torch)")
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
        "--cpu-caching-allocator",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="distributed runtime, CPU: serve tensors from a caching allocator that reuses "
        "freed blocks by size instead of fragmenting malloc's heap (built once with the C++ "
        "compiler; default off: it aborts bf16 runs on CPUs with native bf16 units; see "
        "docs/runtime.md)",
    )
    g.add_argument(
        "--malloc-mmap-threshold",
        type=int,
        default=0,
        metavar="BYTES",
        help="distributed runtime, CPU: each rank fixes glibc's mmap threshold to this, so "
        "freed tensors of at least this size go back to the OS and resident memory follows "
        "live tensors, at the price of a page fault per fresh allocation; it matters with "
        "--no-cpu-caching-allocator (131072 then cut rank 0's peak RSS by 15%% and cost "
        "tokens/s on the issue-12 job; default 0: glibc's own dynamic threshold; see "
        "docs/runtime.md)",
    )
    g.add_argument(
        "--threads",
        type=int,
        help="CPU threads per process (default: one process: 1 for models under 50M "
        "parameters, whose small GEMMs gain nothing from more and lose much when cores are "
        "shared, else torch's; several ranks: the CPUs this process may use, shared by them)",
    )
    g.add_argument("--nproc", type=int, help="processes to launch; must equal pp x dp")
    g.add_argument(
        "--timeout",
        type=float,
        help="rendezvous/collective timeout in s: a stuck or lost rank fails the job after it "
        "(default 300)",
    )


def _add_data_args(d) -> None:
    d.add_argument(
        "--data",
        default="synthetic",
        help="synthetic, or a .txt/.jsonl file, or a token file (.bin/.u16/.u32)",
    )
    d.add_argument(
        "--tokenizer",
        help="a Hugging Face tokenizer.json (or its directory) for text data; default: bytes",
    )
    d.add_argument(
        "--data-dtype", choices=("uint16", "uint32"), help="token dtype of a binary token file"
    )


def _add_output_args(o) -> None:
    o.add_argument("--metrics", help="write per-step metrics as JSON lines to this file")
    o.add_argument("--tensorboard", metavar="DIR", help="also log to TensorBoard (if installed)")
    o.add_argument("--quiet", action="store_true", help="no progress bar")


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
        metavar="DIR|auto",
        help="continue from a checkpoint (a step-* directory, or a --save directory's newest); "
        "auto: the newest complete one under --save, or a fresh start if there is none. Under "
        "torchrun a restarted job resumes from --save by itself",
    )
    c.add_argument(
        "--init-from",
        metavar="HF_DIR",
        help="start from Hugging Face weights (config.json + safetensors); the model comes "
        "from HF_DIR",
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
        cpu_caching_allocator=bool(args.cpu_caching_allocator),
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
    )


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
    spec, plan = plan_from_args(args, default_model="tiny")
    _check_processes(args, plan)
    distributed = plan.pp * plan.dp > 1 or args.nproc is not None
    if distributed or args.save or args.resume or args.init_from:
        # Checkpoints and HF weights live in the distributed runtime (also on one process).
        from ratrain.train.command import run_distributed

        request, source = train_request_from_args(args), data_source(args, spec, plan)
        with _omp_threads(args.threads):  # each rank's threads (the launcher reads it)
            return run_distributed(request, spec, plan, cfg, source)
    _note_ignored_flags(args, plan)
    return run_reference(args, spec, plan)


def _check_flags(args: argparse.Namespace) -> TrainConfig:
    """The flags' errors (one line each) before anything is built; the training config.
    With --init-from, --model becomes its config.json."""
    from ratrain.cli.outputs import prepare_output_dir, prepare_output_file

    prepare_output_file(args.metrics, "--metrics")
    prepare_output_dir(args.tensorboard, "--tensorboard")
    cfg = train_config_from_args(args)
    check_mmap_threshold(args.malloc_mmap_threshold)
    _check_checkpoint_flags(args)
    if args.init_from:
        from ratrain.models.hf_config import from_hf_config

        if args.model is not None:
            raise RatrainError("--init-from takes the model from its config.json; drop --model")
        if args.resume:
            raise RatrainError(
                "--init-from and --resume exclude each other (a checkpoint "
                "already holds the weights)"
            )
        from_hf_config(args.init_from)  # a config error is reported as such, first
        args.model = _config_path(args.init_from)
    return cfg


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


def _note_ignored_flags(args: argparse.Namespace, plan: Plan) -> None:
    """Say which flags the single-process reference trainer does not apply."""
    if args.compile or plan.loss_chunk_tokens:
        print(
            "ratrain train: --compile and --loss-chunk-tokens apply to the pipeline runtime "
            "(pp x dp > 1, or --nproc 1); the single-process reference trainer runs eagerly "
            "with the plain loss",
            file=sys.stderr,
        )
    if args.malloc_mmap_threshold:
        print(
            "ratrain train: --malloc-mmap-threshold applies to the pipeline runtime's ranks "
            "(pp x dp > 1, or --nproc 1); the single-process reference trainer ignores it",
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

    from ratrain.observe.metrics import JsonlWriter, Progress, TensorBoardWriter
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

    def on_step(s) -> None:
        tb.write(s.step, s.record())
        bar.update(**{"loss": s.loss, "lr": s.lr, "tok/s": f"{s.tokens_per_s:,.0f}"})

    t0 = time.perf_counter()
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        losses = trainer.train(on_step)
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
