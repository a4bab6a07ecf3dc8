"""Token sources: deterministic, random-access, shardable by data-parallel replica.

    source = make_source("synthetic", spec, seq=64, seed=0)   # or a .txt/.jsonl/.bin path
    batches = Batches.from_plan(source, plan)
    inputs, targets = batches.batch(step, micro, dp_rank)      # (micro_batch, seq) int64 each

See `ratrain.data.base` for the map from (step, microbatch, replica) to sequences.
"""

from __future__ import annotations

from pathlib import Path

from ratrain.data.base import Batches, TokenSource, WindowSource
from ratrain.data.binfile import BIN_SUFFIXES, BinSource
from ratrain.data.synthetic import SyntheticSource
from ratrain.data.text import TextSource, load_tokenizer
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec

__all__ = [
    "Batches",
    "TokenSource",
    "WindowSource",
    "SyntheticSource",
    "TextSource",
    "BinSource",
    "make_source",
]

TEXT_SUFFIXES = (".txt", ".jsonl", ".text", ".md")


def make_source(
    kind_or_path: str | Path,
    spec: ModelSpec,
    seq: int,
    seed: int = 0,
    *,
    tokenizer: str | Path | None = None,
    dtype: str | None = None,
    branching: int = 4,
) -> TokenSource:
    """The source named by `kind_or_path`.

    "synthetic": the Markov-chain source; a .txt/.jsonl path: text tokenized with `tokenizer`
    (else bytes); a .bin/.u16/.u32 path (or any path with `dtype`): a token file; a directory
    `ratrain prepare` wrote: its train split. A source knows its tokenizer.json
    (`tokenizer_path`) when one is given or the directory names one: checkpoints copy it.
    """
    if str(kind_or_path) == "synthetic":
        return SyntheticSource(spec.vocab, seq, seed, branching=branching)
    path = Path(kind_or_path)
    if not path.exists():
        raise RatrainError(
            f"data: {str(path)!r} not found; pass --data synthetic, an existing .txt, .jsonl "
            "or token (.bin/.u16/.u32) file, or a directory `ratrain prepare` wrote"
        )
    if path.is_dir():
        from ratrain.data.prepare import prepared_source

        return prepared_source(path, spec.vocab, seq, seed, tokenizer=tokenizer, dtype=dtype)
    if path.suffix.lower() in TEXT_SUFFIXES:
        return TextSource(path, spec.vocab, seq, seed, tokenizer=tokenizer)
    if dtype is not None or path.suffix.lower() in BIN_SUFFIXES:
        src = BinSource(path, spec.vocab, seq, seed, dtype=dtype)
        if tokenizer is not None:  # the ids' tokenizer: checked, and kept by checkpoints
            src.tokenizer_path = load_tokenizer(tokenizer, spec.vocab).path
        return src
    raise RatrainError(
        f"data: cannot tell what {str(path)!r} holds; name it *.txt or *.jsonl (text) or "
        "*.bin/*.u16/*.u32 (token ids), or pass --data-dtype for a token file"
    )
