"""Plain-text and JSON-lines corpora, tokenized on load.

`.txt`: the whole file is one document. `.jsonl`: one JSON object per line, its "text"
field a document. Documents are joined with the tokenizer's end-of-text token, then cut
into random windows like a binary token file.

Tokenizers: a Hugging Face `tokenizer.json` (needs the optional `tokenizers` package), or
the built-in byte-level tokenizer: ids 0..255 are the UTF-8 bytes, and id 256 is <eos>
when the model's vocabulary has room for it (vocab >= 257); with exactly 256 ids the
documents are joined by a newline byte instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ratrain.data.base import WindowSource
from ratrain.errors import RatrainError

__all__ = [
    "TextSource",
    "ByteTokenizer",
    "HFTokenizer",
    "load_tokenizer",
    "read_documents",
    "encode_documents",
]

_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
_ENCODE_CHUNK_CHARS = 1 << 20  # a .txt file is encoded in newline-aligned chunks of about this size


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, plus <eos> = 256 when the model has a 257th id."""

    def __init__(self, model_vocab: int):
        if model_vocab < 256:
            raise RatrainError(
                f"data: the byte-level tokenizer needs a vocabulary of at least 256, the model has "
                f"{model_vocab}; pass --tokenizer tokenizer.json or pick a larger model"
            )
        self.eos_id = 256 if model_vocab > 256 else None
        self.vocab_size = 257 if self.eos_id is not None else 256
        self.name = "bytes"

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]

    def separator(self) -> list[int]:
        return [self.eos_id] if self.eos_id is not None else [ord("\n")]


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json; documents are joined by its end-of-text token."""

    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise RatrainError(
                "data: --tokenizer needs the `tokenizers` package: pip install 'ratrain[hf]'"
            ) from None
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise RatrainError(f"data: tokenizer file {str(path)!r} not found")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises a bare Exception for a malformed file
            raise RatrainError(
                f"data: cannot read tokenizer {str(path)!r}: {str(e).splitlines()[0]}"
            ) from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = next(
            (i for n in _EOS_NAMES if (i := self._tok.token_to_id(n)) is not None), None
        )
        self.name = path.name

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def separator(self) -> list[int]:
        return [self.eos_id] if self.eos_id is not None else []


def load_tokenizer(path: str | Path | None, model_vocab: int):
    """The tokenizer at `path` (tokenizer.json or its directory), or the byte-level one."""
    tok = ByteTokenizer(model_vocab) if path is None else HFTokenizer(Path(path))
    if tok.vocab_size > model_vocab:
        raise RatrainError(
            f"data: tokenizer {tok.name!r} has {tok.vocab_size} ids but the model's vocabulary is "
            f"{model_vocab}; use a model whose vocab covers the tokenizer"
        )
    return tok


def read_documents(path: Path) -> list[str]:
    """The documents of a .txt (the whole file) or .jsonl (the "text" fields) file."""
    if not path.is_file():
        raise RatrainError(f"data: text file {str(path)!r} not found")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise RatrainError(f"data: text file {str(path)!r} is empty")
    if path.suffix.lower() != ".jsonl":
        return [text]
    docs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RatrainError(f"data: {path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise RatrainError(
                f'data: {path}:{lineno}: expected an object with a string "text" field'
            )
        docs.append(obj["text"])
    if not any(d.strip() for d in docs):
        raise RatrainError(f"data: {str(path)!r} holds no text")
    return docs


def encode_documents(tok, docs: list[str]) -> np.ndarray:
    """All documents' ids, each followed by the tokenizer's separator, as one int64 array."""
    pieces, owner = [], []
    for d, doc in enumerate(docs):
        for piece in _chunks(doc):
            pieces.append(piece)
            owner.append(d)
    sep = np.asarray(tok.separator(), dtype=np.int64)
    parts: list[np.ndarray] = []
    # One batch call: the HF tokenizer encodes the pieces in parallel.
    for i, ids in enumerate(tok.encode(pieces)):
        parts.append(ids)
        if i + 1 == len(owner) or owner[i + 1] != owner[i]:
            parts.append(sep)
    return np.concatenate(parts)


def _chunks(text: str) -> list[str]:
    """Split at newlines into pieces of about _ENCODE_CHUNK_CHARS (batch encoding, bounded memory)."""
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + _ENCODE_CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


class TextSource(WindowSource):
    """A .txt or .jsonl file, tokenized on load; random windows by seed."""

    def __init__(self, path: str | Path, vocab: int, seq: int, seed: int = 0, tokenizer=None):
        path = Path(path)
        tok = load_tokenizer(tokenizer, vocab)
        tokens = encode_documents(tok, read_documents(path))
        if tokens.size and tokens.max() >= vocab:  # added tokens beyond the declared size, say
            raise RatrainError(
                f"data: tokenizer produced id {tokens.max()} >= the model's vocabulary {vocab}"
            )
        self.tokenizer_name = tok.name
        super().__init__(tokens, vocab, seq, seed, name=f"{path.name} ({tok.name})")
