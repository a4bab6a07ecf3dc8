"""What a distributed training run is asked for besides the model, the plan, the training
config and the data: devices, launch, outputs and checkpoints, as typed values.

`ratrain.cli.train` builds a `TrainRequest` from its flags and hands it to
`ratrain.train.command.run_distributed`; nothing below the CLI reads argparse. Pure Python
(no torch), so the CLI can import it before it knows whether it will train."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrainRequest"]


@dataclass(frozen=True)
class TrainRequest:
    """How to run one distributed training job and what it writes."""

    device: str | None = None
    """cpu | cuda; None: cuda when available."""
    backend: str = "torch"
    """Kernel backend (`ratrain.kernels`)."""
    compile_units: bool = False
    """Run each transformer block through torch.compile (`--compile`)."""
    pin_cores: bool = False
    """Pin each locally spawned rank to its cores (`--pin-cores`)."""
    host_allocator: str = "auto"
    """The ranks' malloc: auto | tcmalloc | jemalloc | malloc (`--host-allocator`)."""
    malloc_mmap_threshold_bytes: int = 0
    """> 0: each rank fixes glibc's mmap threshold to this; 0 leaves glibc's own dynamic
    threshold (`--malloc-mmap-threshold`)."""
    timeout_s: float | None = None
    """Rendezvous/collective timeout; None or 0: the launcher's default, 300 s
    (`--timeout`)."""
    metrics_path: str | None = None
    """Write per-step metrics as JSON lines here (`--metrics`)."""
    tensorboard_dir: str | None = None
    """Also log to TensorBoard here (`--tensorboard`)."""
    trace_path: str | None = None
    """Write the measured timeline of the last step here."""
    measure_memory: bool = False
    """CPU: count live tensor bytes (slower); CUDA always reports the allocator's peak."""
    progress: bool = True
    """Show the progress bar (`--quiet` turns it off)."""
    memory_cap_bytes: int | None = None
    """Usable memory per rank: a plan whose ledger peak exceeds it is refused."""
    memory_cap_label: str = "--memory-cap"
    """Where the cap came from, as the refusal names it (a flag, or the plan file's)."""
    save_dir: str | None = None
    """Write checkpoints here (`--save`)."""
    save_every: int | None = None
    """Steps between checkpoints; None: only at the end (`--save-every`)."""
    keep: int | None = None
    """Keep only the newest `keep` checkpoints; None: all (`--keep`)."""
    resume: str | None = None
    """A step-* checkpoint, a `--save` directory, or "auto" (`--resume`); None: a fresh
    start, unless torchrun restarted the job (`ratrain.checkpoint.hooks.resume_dir`)."""
    init_from: str | None = None
    """A Hugging Face directory (config.json + safetensors) to take the weights from."""
    run_steps: int | None = None
    """Steps to run now; None: all of the config's steps; 0 (with `save_dir`) writes the
    starting state as a checkpoint and stops (`--steps 0`)."""
    eval_every: int | None = None
    """Evaluate on the held-out set every N steps and after the last (`--eval-every`); the
    held-out source comes beside the training source (`run_distributed`'s `eval_source`)."""
    eval_tokens: int | None = None
    """The held-out set's size in tokens (`--eval-tokens`); None: 32 sequences."""
