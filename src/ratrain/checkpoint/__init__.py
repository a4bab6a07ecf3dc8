"""Checkpoints of a training run: `torch.distributed.checkpoint` files keyed by global
parameter names (so any plan can resume them), published atomically. See
docs/checkpoints.md."""

from ratrain.checkpoint.layout import complete_checkpoints, read_meta, resolve_resume

__all__ = ["complete_checkpoints", "read_meta", "resolve_resume"]
