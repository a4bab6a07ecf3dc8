"""`ratrain generate CKPT|HF_DIR --prompt TEXT`: continue a prompt on the CPU with a KV cache
(`ratrain.nn.generate`) and print the completion on stdout. The model is a ratrain checkpoint
(a step-* directory, or a --save directory's newest) or a Hugging Face directory; the
tokenizer is the one beside the weights (tokenizer.json: checkpoints trained with
--tokenizer or on prepared data keep a copy) unless --tokenizer names another."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ratrain.cli.common import (
    nonempty,
    nonneg_float,
    positive_float,
    positive_int,
    seed,
    thread_count,
)
from ratrain.errors import RatrainError

__all__ = ["add_arguments", "run", "load_model"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        type=nonempty,
        metavar="CKPT|HF_DIR",
        help="a checkpoint (step-* or a --save directory) or a Hugging Face model directory",
    )
    p.add_argument("--prompt", required=True, type=nonempty, help="the text to continue")
    p.add_argument(
        "--max-new-tokens", type=positive_int, default=64, help="at most this many (default 64)"
    )
    p.add_argument(
        "--temperature", type=nonneg_float, default=1.0, help="0: greedy; default 1.0 (sampling)"
    )
    p.add_argument("--top-k", type=positive_int, help="sample among the k most likely tokens")
    p.add_argument(
        "--top-p",
        type=positive_float,
        help="sample among the most likely tokens holding probability p",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the sampling (default 0)")
    p.add_argument(
        "--tokenizer",
        type=nonempty,
        metavar="DIR",
        help="a tokenizer.json or its folder (default: the model's)",
    )
    p.add_argument("--threads", type=thread_count, help="CPU threads (default torch's)")


def load_model(path: str | Path):
    """(LlamaModel in eval mode, the directory holding its tokenizer, if any) of a ratrain
    checkpoint or a Hugging Face directory."""
    from ratrain.nn.llama import LlamaModel

    p = Path(path)
    if not p.exists():
        raise RatrainError(f"{str(p)!r} not found; pass a checkpoint or a Hugging Face directory")
    if p.is_dir() and (p / "config.json").is_file() and not (p / "ratrain.json").is_file():
        from ratrain.checkpoint.hf import read_hf_tensors
        from ratrain.models.hf_config import from_hf_config

        spec = from_hf_config(p)
        model = LlamaModel(spec, seed=None)
        sd = read_hf_tensors(p, spec, list(model.state_dict()))
        tok_dir = p
    else:
        from ratrain.checkpoint import read_meta, resolve_resume
        from ratrain.checkpoint.read import read_model_weights
        from ratrain.models.spec import ModelSpec

        try:
            ckpt = resolve_resume(str(p), None)
        except RatrainError as e:  # its messages name --resume
            raise RatrainError(str(e).replace("--resume ", "", 1)) from None
        spec = ModelSpec.from_dict(read_meta(ckpt)["model"])
        model = LlamaModel(spec, seed=None)
        sd = read_model_weights(ckpt)
        if spec.tied_embeddings:
            sd[f"units.{spec.n_layers + 1}.weight"] = sd["units.0.weight"]
        tok_dir = ckpt
    model.load_state_dict(sd, strict=True)
    return model.eval(), (tok_dir if (tok_dir / "tokenizer.json").is_file() else None)


def _sampling(args: argparse.Namespace, stop_ids: tuple[int, ...]):
    from ratrain.nn.generate import Sampling

    if not args.temperature >= 0:
        raise RatrainError(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise RatrainError(f"--top-p must be in (0, 1], got {args.top_p}")
    return Sampling(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_ids=stop_ids,
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from ratrain.data.text import HFTokenizer
    from ratrain.nn.generate import generate

    _sampling(args, ())  # flag errors before the model is read
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok_dir = load_model(args.model)
    if args.tokenizer is None and tok_dir is None:
        raise RatrainError(
            f"{args.model} holds no tokenizer.json (train with --tokenizer, or on data "
            "`ratrain prepare` wrote, to keep one); pass --tokenizer"
        )
    tok = HFTokenizer(Path(args.tokenizer or tok_dir))
    if tok.vocab_size > model.spec.vocab:
        raise RatrainError(
            f"the tokenizer has {tok.vocab_size} ids but the model's vocabulary is "
            f"{model.spec.vocab}; pass the model's own tokenizer"
        )
    eos = tok.special_ids()["eos_token_id"]
    prompt = tok.encode_one(args.prompt)
    if not prompt:
        raise RatrainError("--prompt encodes to no tokens; give some text")
    room = model.spec.max_seq - len(prompt)
    if room <= 0:
        raise RatrainError(
            f"--prompt is {len(prompt)} tokens; the model has {model.spec.max_seq} positions"
        )
    s = _sampling(args, () if eos is None else (eos,))
    if s.max_new_tokens > room:
        print(
            f"ratrain generate: note: {room} new tokens at most (the model has "
            f"{model.spec.max_seq} positions, the prompt takes {len(prompt)})",
            file=sys.stderr,
        )
        s = _sampling(argparse.Namespace(**{**vars(args), "max_new_tokens": room}), s.stop_ids)
    ids = generate(model, prompt, s)
    print(tok.decode([i for i in ids if i != eos]))
    return 0
