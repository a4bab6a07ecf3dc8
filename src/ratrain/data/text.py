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
    "parse_jsonl_line",
    "chunk_text",
    "tokenizer_json",
    "copy_tokenizer",
    "TOKENIZER_FILES",
]

_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
_BOS_NAMES = ("<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "[CLS]")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""The files of a Hugging Face tokenizer that travel with a model (prepared data, checkpoints,
exports); only tokenizer.json is required."""
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
        path = tokenizer_json(path)
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
        self.path = path

    def special_ids(self) -> dict[str, int | None]:
        """bos/eos token ids as a model config states them: the tokens tokenizer_config.json
        (beside tokenizer.json) names, else the usual names; no BOS token: BOS = EOS (GPT-2)."""
        named = _config_tokens(self.path.parent) if self.path.name == "tokenizer.json" else {}
        ids = {}
        for key, names in (("eos", _EOS_NAMES), ("bos", _BOS_NAMES)):
            cands = [named[key]] if key in named else []
            ids[key] = next(
                (i for n in (*cands, *names) if (i := self._tok.token_to_id(n)) is not None), None
            )
        return {"bos_token_id": ids["bos"] if ids["bos"] is not None else ids["eos"],
                "eos_token_id": ids["eos"]}  # fmt: skip

    def encode_one(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def separator(self) -> list[int]:
        return [self.eos_id] if self.eos_id is not None else []


def tokenizer_json(path: str | Path) -> Path:
    """The tokenizer.json that `path` (the file, or its directory) names; one line if none."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.is_dir():
        raise RatrainError(f"data: {str(path)!r} is a folder, not a tokenizer file")
    if not path.is_file():
        raise RatrainError(f"data: tokenizer file {str(path)!r} not found")
    return path


def _config_tokens(d: Path) -> dict[str, str]:
    """The bos/eos tokens tokenizer_config.json in `d` names (a string or {"content": ...})."""
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for key in ("bos", "eos"):
        v = cfg.get(f"{key}_token") if isinstance(cfg, dict) else None
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[key] = v
    return out


def copy_tokenizer(src: str | Path, dst_dir: str | Path) -> list[Path]:
    """Copy a tokenizer (tokenizer.json, and tokenizer_config.json / special_tokens_map.json
    when they lie beside it) into `dst_dir` as TOKENIZER_FILES; the files written."""
    import shutil

    tj = tokenizer_json(src)
    dst = Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TOKENIZER_FILES:
        f = tj if name == "tokenizer.json" else tj.parent / name
        if f.is_file() and (name == "tokenizer.json" or tj.name == "tokenizer.json"):
            shutil.copyfile(f, dst / name)
            written.append(dst / name)
    return written


def load_tokenizer(path: str | Path | None, model_vocab: int):
    """The tokenizer at `path` (tokenizer.json or its directory), or the byte-level one."""
    tok = ByteTokenizer(model_vocab) if path is None else HFTokenizer(Path(path))
    if tok.vocab_size > model_vocab:
        raise RatrainError(
            f"data: tokenizer {tok.name!r} has {tok.vocab_size} ids but the model's vocabulary is "
            f"{model_vocab}; use a model whose vocab covers the tokenizer"
        )
    return tok


def read_documents(path: Path, field: str = "text") -> list[str]:
    """The documents of a .txt (the whole file) or .jsonl (the `field` fields) file."""
    if not path.is_file():
        raise RatrainError(f"data: text file {str(path)!r} not found")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise RatrainError(f"data: text file {str(path)!r} is empty")
    if path.suffix.lower() != ".jsonl":
        return [text]
    # Split at "\n" only: JSON strings may hold raw U+2028 and other line breaks.
    docs = [
        parse_jsonl_line(path, lineno, line, field)
        for lineno, line in enumerate(text.split("\n"), 1)
        if line.strip()
    ]
    if not any(d.strip() for d in docs):
        raise RatrainError(f"data: {str(path)!r} holds no text")
    return docs


def parse_jsonl_line(path, lineno: int, line: str, field: str = "text") -> str:
    """The string `field` of one JSON line; one-line errors naming file and line."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise RatrainError(f"data: {path}:{lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
        raise RatrainError(
            f'data: {path}:{lineno}: expected an object with a string "{field}" field'
        )
    return obj[field]


def encode_documents(tok, docs: list[str]) -> np.ndarray:
    """All documents' ids, each followed by the tokenizer's separator, as one int64 array."""
    pieces, owner = [], []
    for d, doc in enumerate(docs):
        for piece in chunk_text(doc):
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


def chunk_text(text: str) -> list[str]:
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

    tokenizer_path: Path | None = None
    """The tokenizer.json the tokens come from (None: bytes); checkpoints copy it."""

    def __init__(self, path: str | Path, vocab: int, seq: int, seed: int = 0, tokenizer=None):
        path = Path(path)
        tok = load_tokenizer(tokenizer, vocab)
        tokens = encode_documents(tok, read_documents(path))
        if tokens.size and tokens.max() >= vocab:  # added tokens beyond the declared size, say
            raise RatrainError(
                f"data: tokenizer produced id {tokens.max()} >= the model's vocabulary {vocab}"
            )
        self.tokenizer_name = tok.name
        self.tokenizer_path = getattr(tok, "path", None)  # a checkpoint keeps a copy
        super().__init__(tokens, vocab, seq, seed, name=f"{path.name} ({tok.name})")
