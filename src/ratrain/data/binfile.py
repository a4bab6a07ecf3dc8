"""Pre-tokenized binary token files: a flat array of uint16 or uint32 ids, memory-mapped.

The dtype comes from the `dtype` argument, else from the file's extension: `.u32` /
`.uint32` mean uint32; `.u16` / `.uint16` / `.bin` mean uint16 (nanoGPT's convention for
`.bin`). Windows of `seq + 1` tokens are drawn at random offsets, one per sequence index
and seed (see `WindowSource`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ratrain.data.base import WindowSource
from ratrain.errors import RatrainError

__all__ = ["BinSource", "BIN_SUFFIXES", "bin_dtype"]

BIN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
BIN_SUFFIXES = {
    ".bin": "uint16",
    ".u16": "uint16",
    ".uint16": "uint16",
    ".u32": "uint32",
    ".uint32": "uint32",
}
_SCAN_TOKENS = 1 << 24  # max() in chunks, so a file larger than memory is scanned in passes


def bin_dtype(path: Path, dtype: str | None) -> np.dtype:
    name = dtype or BIN_SUFFIXES.get(path.suffix.lower())
    if name is None:
        raise RatrainError(
            f"data: cannot tell the token dtype of {str(path)!r} from its extension; "
            f"pass --data-dtype uint16|uint32 or name it *{'|*'.join(BIN_SUFFIXES)}"
        )
    if name not in BIN_DTYPES:
        raise RatrainError(f"data: token dtype must be uint16 or uint32, got {name!r}")
    return np.dtype(BIN_DTYPES[name])


def _max_token(tokens: np.ndarray) -> int:
    return max(int(tokens[i : i + _SCAN_TOKENS].max()) for i in range(0, len(tokens), _SCAN_TOKENS))


class BinSource(WindowSource):
    """Random windows of a memory-mapped token file; every id is checked against `vocab` on load."""

    tokenizer_path: Path | None = None
    """The tokenizer.json the ids come from, when known (--tokenizer, a prepared directory)."""

    def __init__(
        self, path: str | Path, vocab: int, seq: int, seed: int = 0, dtype: str | None = None
    ):
        path = Path(path)
        if not path.is_file():
            raise RatrainError(f"data: token file {str(path)!r} not found")
        dt = bin_dtype(path, dtype)
        size_bytes = path.stat().st_size
        if size_bytes == 0:
            raise RatrainError(f"data: token file {str(path)!r} is empty")
        if size_bytes % dt.itemsize:
            raise RatrainError(
                f"data: {str(path)!r} is {size_bytes} bytes, not a whole number of {dt.name} tokens; "
                "wrong --data-dtype?"
            )
        tokens = np.memmap(path, dtype=dt, mode="r")
        top = _max_token(tokens)
        if top >= vocab:
            raise RatrainError(
                f"data: {str(path)!r} holds token id {top}, but the model's vocabulary is {vocab}; "
                "use a model with a larger vocab or re-tokenize (wrong --data-dtype?)"
            )
        super().__init__(tokens, vocab, seq, seed, name=f"{path.name} ({dt.name})")
