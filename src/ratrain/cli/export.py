"""`ratrain export CKPT_DIR --hf OUT_DIR`: a checkpoint's weights as a Hugging Face model
directory (config.json + safetensors) that `transformers.AutoModelForCausalLM` loads; a
checkpoint trained with a tokenizer also gives its tokenizer files and generation_config.json
(bos/eos token ids), which `AutoTokenizer` and `generate` read."""

from __future__ import annotations

import argparse

from ratrain.cli.common import nonempty, positive_float
from ratrain.errors import RatrainError

__all__ = ["add_arguments", "run"]

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        type=nonempty,
        metavar="CKPT_DIR",
        help="a step-* checkpoint, or a --save directory",
    )
    p.add_argument(
        "--hf", type=nonempty, required=True, metavar="OUT_DIR", help="write the HF model here"
    )
    p.add_argument(
        "--dtype", choices=tuple(_DTYPES), default="fp32", help="weights' dtype (default fp32)"
    )
    p.add_argument(
        "--max-shard-gb",
        type=positive_float,
        default=5.0,
        help="split the safetensors into shards of at most this size (default 5)",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from ratrain.checkpoint import read_meta, resolve_resume
    from ratrain.checkpoint.hf import write_hf
    from ratrain.checkpoint.read import read_model_weights
    from ratrain.cli.outputs import check_output_dir, prepare_output_dir
    from ratrain.models.spec import ModelSpec

    if not args.max_shard_gb > 0:
        raise RatrainError(f"--max-shard-gb must be positive, got {args.max_shard_gb}")
    check_output_dir(args.hf, "--hf")  # before the checkpoint is read; nothing created
    try:
        ckpt = resolve_resume(args.checkpoint, None)
    except RatrainError as e:  # worded for train's --resume: name CKPT_DIR instead
        raise RatrainError(str(e).replace("--resume ", "CKPT_DIR ", 1)) from None
    meta = read_meta(ckpt)
    spec = ModelSpec.from_dict(meta["model"])
    prepare_output_dir(args.hf, "--hf")
    sd = read_model_weights(ckpt)
    if spec.tied_embeddings:
        sd[f"units.{spec.n_layers + 1}.weight"] = sd["units.0.weight"]
    files = write_hf(
        sd,
        spec,
        args.hf,
        dtype=getattr(torch, _DTYPES[args.dtype]),
        max_shard_bytes=int(args.max_shard_gb * 2**30),
        tokenizer=ckpt if (ckpt / "tokenizer.json").is_file() else None,
    )
    print(f"exported {spec.name} at step {meta['step']} from {ckpt} to {args.hf}:")
    for f in files:
        print(f"  {f.name}")
    return 0
