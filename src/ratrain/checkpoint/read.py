"""Read a whole checkpoint in one process (export, inspection, tests): full fp32 tensors by
global name, whatever plan wrote it."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ratrain.checkpoint.layout import read_meta
from ratrain.errors import RatrainError

__all__ = ["read_tensors", "read_model_weights"]


def read_tensors(ckpt: str | Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor under `prefix` (e.g. 'model/'), keys without the prefix."""
    ckpt = Path(ckpt)
    read_meta(ckpt)
    try:
        md = dcp.FileSystemReader(str(ckpt)).read_metadata()
        state = {
            k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
            for k, m in md.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata) and k.startswith(prefix)
        }
        with warnings.catch_warnings():  # "assuming the intent is to load in one process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(ckpt), no_dist=True)
    except RatrainError:
        raise
    except (Exception, CheckpointException) as e:  # the latter is a BaseException
        from ratrain.checkpoint.io import dcp_error_line

        first = dcp_error_line(e)
        raise RatrainError(
            f"checkpoint {str(ckpt)!r} is corrupt or incomplete ({first[:200]})"
        ) from None
    return {k[len(prefix) :]: v for k, v in state.items()}


def read_model_weights(ckpt: str | Path) -> dict[str, torch.Tensor]:
    """The fp32 master weights as a `LlamaModel` state dict (`units.{u}.{name}`)."""
    return read_tensors(ckpt, "model/")
