"""`ratrain train`: train a model. With no arguments, the built-in demo: the tiny model on
the synthetic Markov-chain source, on the CPU, in about a minute, ending with the final loss
against the source's entropy floor (the best loss any model can reach).

The flags are `ratrain.cli.train_flags`; this module checks them, turns them into typed
values and hands those to the distributed runtime (`ratrain.train.command`) or to the
single-process reference trainer (`ratrain.train.reference_run`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ratrain.cli.common import plan_from_args
from ratrain.cli.jobfile import (
    absolute_paths,
    apply_job,
    dump_job,
    explicit_dests,
    job_of_args,
    job_sections,
    read_job_file,
)
from ratrain.cli.plan import AUTO as AUTO_PLAN
from ratrain.cli.train_flags import DEFAULT_LR, DEFAULT_STEPS, PLAN_DEFAULTS, add_arguments
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.launch.host_memory import check_mmap_threshold, resolve_host_allocator
from ratrain.models.spec import ModelSpec
from ratrain.schedule.zerobubble import refuse_unsupported
from ratrain.train.parts import CheckpointOpts, EvalOpts, Launch, MemoryCap, Outputs
from ratrain.train.request import TrainRequest

if TYPE_CHECKING:
    from ratrain.data.base import TokenSource

__all__ = [
    "add_arguments",
    "PLAN_DEFAULTS",
    "DEFAULT_STEPS",
    "DEFAULT_LR",
    "run",
    "train_config_from_args",
    "train_request_from_args",
    "data_source",
    "eval_data_source",
    "cpu_threads",
    "omp_threads",
]


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
    # A resume keeps the saved options no flag sets (betas, eps, loss scaling)
    saved = getattr(args, "_saved_train_config", None) or {}
    names = {f.name for f in dataclasses.fields(TrainConfig)} - set(_TRAIN_FLAG_FIELDS)
    return TrainConfig(
        steps=max(args.steps, 1),  # --steps 0: the schedule of a 1-step run, never stepped
        lr=args.lr,
        min_lr=min_lr,
        warmup_steps=warmup,
        weight_decay=args.weight_decay,
        seed=args.seed,
        **{k: v for k, v in saved.items() if k in names},
    )


def train_request_from_args(
    args: argparse.Namespace, held_out: Callable[[], TokenSource] | None = None
) -> TrainRequest:
    """What the distributed runtime is asked for besides model, plan, config and data;
    `held_out` builds the held-out source of --eval-every (`eval_data_source`)."""
    return TrainRequest(
        launch=_launch_of(args),
        outputs=_outputs_of(args),
        checkpoints=CheckpointOpts(
            save_dir=args.save, save_every=args.save_every, keep=args.keep, init_from=args.init_from
        ),
        evaluation=EvalOpts(every=args.eval_every, source=held_out, tokens=args.eval_tokens),
        memory_cap=_memory_cap_of(args),
        resume=args.resume,
    )


def _launch_of(args: argparse.Namespace) -> Launch:
    return Launch(
        device=getattr(args, "device", None),
        backend=args.backend,
        compile_units=bool(args.compile),
        timeout_s=args.timeout,
        peer_timeout_s=args.peer_timeout,
        pin_cores=bool(args.pin_cores),
        host_allocator=args.host_allocator,
        malloc_mmap_threshold_bytes=args.malloc_mmap_threshold,
        run_steps=0 if args.steps == 0 else None,  # --steps 0: save the starting state
    )


def _outputs_of(args: argparse.Namespace) -> Outputs:
    return Outputs(
        metrics_path=args.metrics,
        tensorboard_dir=args.tensorboard,
        wandb_project=args.wandb,
        progress=not args.quiet,
        trace_path=getattr(args, "trace", None),
        measure_memory=bool(getattr(args, "measure_memory", False)),
    )


def _memory_cap_of(args: argparse.Namespace) -> MemoryCap | None:
    """--memory-cap, else the cap the plan file was planned for (`memory_cap`)."""
    from ratrain.cli.common import memory_cap

    cap, label = memory_cap(args)
    return MemoryCap(int(cap * 2**30), label) if cap else None


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
    parser = job_parser()
    given = _apply_config(parser, args)
    saved = _restore_job(parser, args, given)
    given_model = args.model
    if args.print_config is not None:
        return _print_config(parser, args)
    cfg = _check_flags(args)
    if args.plan == AUTO_PLAN:  # plan, measure the best few, train the fastest measured
        from ratrain.cli.plan import auto_plan

        auto_plan(args, PLAN_DEFAULTS, _default_model(args))
    spec, plan = plan_from_args(args, default_model=_default_model(args))
    if getattr(args, "_auto_resumed", False):
        _auto_resumed(args, plan)
    refuse_unsupported(plan)  # before any rank starts (building the schedule refuses it too)
    _check_processes(args, plan)
    job = _effective_job(parser, args, given_model, plan, cfg)
    if saved is not None:
        from ratrain.checkpoint import read_meta
        from ratrain.checkpoint.io import check_compatible

        ckpt, saved_job = saved
        check_compatible(read_meta(ckpt), ckpt, spec, plan)  # another model: that line only
        _say_changes(saved_job, job)
    distributed = plan.pp * plan.dp > 1 or args.nproc is not None
    distributed = distributed or getattr(args, "device", None) == "cuda"  # reference: CPU only
    source = data_source(args, spec, plan)
    if distributed or args.save or args.resume or args.init_from or args.eval_every:
        # Checkpoints, HF weights and evaluation live in the distributed runtime (also on
        # one process).
        from ratrain.train.command import run_distributed

        request = train_request_from_args(args, eval_data_source(args, spec, plan))
        if args.steps > 0:  # a conversion (--steps 0) keeps no job: it trained none
            stored = absolute_paths(job, parser, RESTORED_SECTIONS)
            request = dataclasses.replace(request, job=stored)
        with omp_threads(args.threads):  # each rank's threads (the launcher reads it)
            return run_distributed(request, spec, plan, cfg, source)
    _note_ignored_flags(args, plan)
    from ratrain.train.reference_run import run_reference

    launch, outputs = _launch_of(args), _outputs_of(args)
    return run_reference(spec, plan, cfg, source, launch, outputs, _threads(args))


# --- the job: a job file (--config, --print-config), and what a resume keeps ----------

RESTORED_SECTIONS = ("plan", "training", "data", "evaluation")
"""The sections of the job a resume restores from its checkpoint, but for the options
given explicitly (on the command line or in --config): what is trained and on what. The
runtime, the outputs and the checkpoint options are this run's own."""
NOT_RESTORED = ("model", "plan")
"""The model is the checkpoint's (its spec; another one is refused by `check_compatible`);
the plan file is stood for by the effective values of the plan's options."""
FROZEN_ON_RESUME = ("seed", "data", "tokenizer", "data_dtype", "global_batch", "seq")
"""Options a resume refuses to change: they would break the order of the data (which
sequences come next), so the run would no longer continue the saved one."""
_TRAIN_FLAG_FIELDS = ("steps", "lr", "min_lr", "warmup_steps", "weight_decay", "seed", "extra")


@functools.cache
def job_parser() -> argparse.ArgumentParser:
    """A parser of `ratrain train`'s options: the job file's sections and keys
    (`ratrain.cli.jobfile.job_sections`) and the values' checks."""
    p = argparse.ArgumentParser(prog="ratrain train", add_help=False)
    add_arguments(p)
    return p


def _flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}


def _apply_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> set[str]:
    """Set the options --config gives (flags given on the command line win); the options
    given explicitly, on the command line or in the file."""
    given = explicit_dests(args)
    if args.config:
        data = read_job_file(args.config)
        given |= set(apply_job(parser, args, data, f"--config {args.config}", keep=given))
    args._explicit_dests = given
    return given


def _restore_job(
    parser: argparse.ArgumentParser, args: argparse.Namespace, given: set[str]
) -> tuple[Path, dict] | None:
    """On a resume from a checkpoint that stored its job: restore the options of its
    `RESTORED_SECTIONS` not given explicitly, refuse (one line) an explicit change of one of
    `FROZEN_ON_RESUME`; the checkpoint and its saved job (None: a fresh start, or an older checkpoint without
    one, which resumes with the flags as they are)."""
    from ratrain.checkpoint import read_meta, resolve_resume
    from ratrain.checkpoint.hooks import resume_arg

    resume = resume_arg(args.resume, args.save)
    ckpt = resolve_resume(resume, args.save) if resume is not None else None
    if ckpt is None:
        return None
    meta = read_meta(ckpt)
    job = meta.get("job")
    if not isinstance(job, dict):
        return None
    job = {s: job[s] for s in RESTORED_SECTIONS if isinstance(job.get(s), dict)}
    saved = apply_job(parser, argparse.Namespace(), job, f"checkpoint {ckpt}", strict=False)
    present = {str(k).replace("-", "_") for keys in job.values() for k in keys}
    plan_dests = {a.dest for a in job_sections(parser)["plan"]}
    # a plan file given now: its values, not the saved ones; --plan auto: the saved ones,
    # which its trial chose at the start
    auto = args.plan == AUTO_PLAN and isinstance(job.get("plan"), dict)
    plan_file = "plan" in given and not auto
    for dest in present - set(NOT_RESTORED) - given:
        if plan_file and dest in plan_dests:
            continue
        setattr(args, dest, saved.get(dest))
    flags = _flags(parser)
    refused = [
        f"{flags[d]} {getattr(args, d)} (saved {saved.get(d)})"
        for d in FROZEN_ON_RESUME
        if d in given and d in present and not _same(getattr(args, d), saved.get(d))
    ]
    if refused:
        raise RatrainError(
            f"checkpoint {ckpt} cannot continue with another {', '.join(refused)}: a resume "
            "keeps the data order; drop those flags, or start afresh (no --resume, another "
            "--save)"
        )
    if auto:
        args.plan, args._auto_resumed = None, True
    args._saved_train_config = meta.get("lr_schedule")
    args._saved_model = job.get("plan", {}).get("model")
    return ckpt, job


def _same(a, b) -> bool:
    """Equal values, or the same file or folder named two ways."""
    if isinstance(a, tuple):
        a = list(a)
    if isinstance(b, tuple):
        b = list(b)
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str) and os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return False


def _effective_job(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    given_model: str | None,
    plan: Plan,
    cfg: TrainConfig,
) -> dict:
    """The job these options run, as a job file holds it: the plan's options as the plan
    says them (a plan file's and the defaults' merged, the file itself no longer needed),
    the learning rate's derived defaults (min_lr, warmup) as the numbers they are."""
    from ratrain.cli.common import memory_cap, plan_file
    from ratrain.schema import cli_fields, knob_of

    job = job_of_args(parser, args)
    if args.init_from:
        model = None  # the model is HF_DIR's (--init-from refuses --model)
    elif given_model or not args.plan:
        dm = _default_model(args) if not given_model else given_model
        # the resumed checkpoint's: as its job names it
        model = dm if isinstance(dm, str) else getattr(args, "_saved_model", None)
    else:
        file_plan, extras = plan_file(args)
        model = extras.get("model_path") or file_plan.model
    job["plan"]["model"] = model
    job["plan"]["plan"] = None
    for f in cli_fields(Plan):
        v, pin = getattr(plan, f.name), knob_of(f).pin
        if pin == "optional_float":
            v = 0.0 if v is None else v  # --clip-grad 0: none
        elif pin == "policy_list" and not isinstance(v, str):
            v = ",".join(v)
        job["plan"][f.name] = list(v) if isinstance(v, tuple) else v
    job["training"].update(min_lr=cfg.min_lr, warmup=cfg.warmup_steps)
    if args.plan and args.memory_cap is None:
        job["output"]["memory_cap"] = memory_cap(args)[0]  # the plan file's cap
    return job


def _say_changes(saved: dict, job: dict) -> None:
    """One line on stderr (rank 0) listing each option of the saved job this run changes."""
    from ratrain.checkpoint.hooks import is_rank0

    changes = []
    for sec, keys in saved.items():
        for k, old in keys.items():
            k = str(k).replace("-", "_")
            if k in NOT_RESTORED or k not in job.get(sec, {}):
                continue
            new = job[sec][k]
            if not _same(old, new):
                changes.append(f"{k} {_show(old)} -> {_show(new)}")
    if changes and is_rank0():
        print(f"ratrain: changed on resume: {', '.join(changes)}", file=sys.stderr, flush=True)


def _auto_resumed(args: argparse.Namespace, plan: Plan) -> None:
    """A resume of `--plan auto`: its plan is the checkpoint's (said in one line); --nproc
    was the ranks to plan for, as at the start."""
    from ratrain.checkpoint.hooks import is_rank0
    from ratrain.planner.report import describe

    if args.nproc is not None and args.nproc != plan.pp * plan.dp:
        args.nproc = None
    if is_rank0():
        print(
            f"ratrain train: --plan auto: the checkpoint's plan, chosen by its trial: "
            f"{describe(plan)}",
            file=sys.stderr,
            flush=True,
        )


def _show(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, list):
        return ",".join(map(str, v))
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _print_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--print-config: the effective job as a job file, on stdout or in PATH."""
    cfg = train_config_from_args(args)
    default = _config_path(args.init_from) if args.init_from else _default_model(args)
    model = None if args.init_from else args.model
    _, plan = plan_from_args(args, default_model=default)
    job = _effective_job(parser, args, model, plan, cfg)
    text = dump_job(
        job,
        "ratrain train job: `ratrain train --config FILE` runs it (flags override it);\n"
        "null: not given (the option's default)",
    )
    if args.print_config == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    from ratrain.cli.outputs import prepare_output_file

    prepare_output_file(args.print_config, "--print-config")
    try:
        with open(args.print_config, "w") as f:
            f.write(text)
    except OSError as e:
        raise RatrainError(f"--print-config {args.print_config}: cannot write it ({e})") from None
    return 0


def _check_flags(args: argparse.Namespace) -> TrainConfig:
    """The flags' errors (one line each) before anything is built; the training config.
    With --init-from, --model becomes its config.json."""
    from ratrain.cli.outputs import check_output_dir, prepare_output_dir, prepare_output_file
    from ratrain.observe.metrics import require_tensorboard, require_wandb

    if args.tensorboard is not None:  # a bad folder says so; then a missing package does
        check_output_dir(args.tensorboard, "--tensorboard")
        require_tensorboard()
    if args.wandb is not None:  # a missing package says so before any work
        require_wandb()
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
        from ratrain.checkpoint.hf import hf_model_dir

        args.init_from = str(hf_model_dir(args.init_from))  # its config.json -> the directory
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
def omp_threads(threads: int | None):
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


def _threads(args: argparse.Namespace) -> int | None:
    """--threads, checked (None: the reference trainer's default)."""
    if args.threads is not None and args.threads <= 0:
        raise RatrainError(f"--threads must be a positive integer, got {args.threads}")
    return args.threads


def cpu_threads(args: argparse.Namespace, spec: ModelSpec) -> int:
    """The CPU threads the reference trainer runs on for these flags
    (`ratrain.train.reference_run.reference_threads`)."""
    from ratrain.train.reference_run import reference_threads

    return reference_threads(_threads(args), spec)
