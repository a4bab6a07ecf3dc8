"""`ratrain prepare`: text corpora tokenized once into memory-mapped token files.

Inputs: `.jsonl` (one JSON object per line, its `field` a document), `.txt`/`.text`/`.md`
(the whole file one document, or with `txt_docs` each paragraph or each line), `.parquet`
(the string column `field`; needs pyarrow). Each document is encoded with a Hugging Face
tokenizer.json and followed by the tokenizer's end-of-text token, as `TextSource` does.

The work is cut into chunks of about `chunk_bytes` of input (cut at line, or paragraph,
boundaries) that worker processes parse and encode; the main process writes their tokens in
input order, so the output does not depend on the number of workers. Then documents are
drawn for the held-out split by a seeded permutation until it holds `val_fraction` of the
tokens (or `val_tokens`), and the two splits are written in input order:

    OUT/train.u16      (train.u32 when the tokenizer has more than 65536 ids)
    OUT/val.u16        absent when the held-out split is empty
    OUT/tokenizer/     a copy of the tokenizer (tokenizer.json, tokenizer_config.json, ...)
    OUT/manifest.json  written last: what was read, with what, and what came out

Everything is written under `OUT/.tmp-prepare-*` and moved into place at the end, manifest
last; a run that finds a manifest with the same inputs (paths, sizes, mtimes), tokenizer
(its sha256) and options does nothing. `prepared_source` opens the result for training.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ratrain.data.binfile import BinSource
from ratrain.data.text import (
    HFTokenizer,
    chunk_text,
    copy_tokenizer,
    parse_jsonl_line,
    tokenizer_json,
)
from ratrain.errors import RatrainError

__all__ = [
    "PrepareRequest",
    "PrepareResult",
    "prepare",
    "prepared_source",
    "check_request",
    "read_manifest",
    "MANIFEST",
    "TEXT_DOCS",
]

MANIFEST = "manifest.json"
FORMAT = "ratrain-prepared-1"
TEXT_DOCS = ("file", "paragraph", "line")
_TEXT_SUFFIXES = (".txt", ".text", ".md")
_SUFFIXES = (".jsonl", ".parquet", *_TEXT_SUFFIXES)
_COPY_TOKENS = 1 << 24  # tokens copied per slice when the splits are written


@dataclass(frozen=True)
class PrepareRequest:
    inputs: tuple[Path, ...]
    tokenizer: Path
    out: Path
    field: str = "text"
    txt_docs: str = "file"
    val_fraction: float = 0.005
    val_tokens: int | None = None
    """When set, the held-out split holds at least this many tokens (val_fraction unused)."""
    seed: int = 0
    workers: int = 1
    chunk_bytes: int = 4 << 20


@dataclass(frozen=True)
class PrepareResult:
    manifest: dict
    up_to_date: bool
    """True when an existing manifest matched and nothing was written."""


Progress = Callable[[int, int, int, int], None]
"""progress(input bytes done, input bytes in all, tokens so far, documents so far)"""


# --- checks and the fingerprint -------------------------------------------------------


def check_request(req: PrepareRequest) -> None:
    if not req.inputs:
        raise RatrainError("data: no input files")
    for p in req.inputs:
        if p.is_dir():
            raise RatrainError(f"data: input {str(p)!r} is a folder; give its files")
        if not p.is_file():
            raise RatrainError(f"data: input {str(p)!r} not found")
        if p.suffix.lower() not in _SUFFIXES:
            raise RatrainError(
                f"data: cannot tell what {str(p)!r} holds; name it *.jsonl, *.parquet or "
                "*.txt (also .text, .md)"
            )
        if p.suffix.lower() == ".parquet" and req.field:
            _parquet_file(p, req.field)
    HFTokenizer(req.tokenizer)  # one line if it is missing or unreadable
    if not req.field:
        raise RatrainError("data: --field must not be empty")
    if req.txt_docs not in TEXT_DOCS:
        raise RatrainError(f"data: --txt-docs must be one of {', '.join(TEXT_DOCS)}")
    if req.val_tokens is not None and req.val_tokens < 0:
        raise RatrainError(f"data: --val-tokens must be >= 0, got {req.val_tokens}")
    if not 0 <= req.val_fraction < 1:
        raise RatrainError(f"data: --val-fraction must be in [0, 1), got {req.val_fraction}")
    if req.workers < 1:
        raise RatrainError(f"data: --workers must be a positive integer, got {req.workers}")
    if req.out.exists() and not req.out.is_dir():
        raise RatrainError(f"data: -o {str(req.out)!r} exists and is not a directory")


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RatrainError(
            "data: reading .parquet files needs pyarrow: pip install pyarrow"
        ) from None
    return pq


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fingerprint(req: PrepareRequest, tok: HFTokenizer) -> dict:
    """What the output depends on: a manifest with the same fingerprint is up to date."""
    inputs = []
    for p in req.inputs:
        st = p.stat()
        inputs.append({"path": str(p.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})
    rule = {"by": "document", "seed": req.seed, "field": req.field, "txt_docs": req.txt_docs}
    if req.val_tokens is not None:
        rule["val_tokens"] = req.val_tokens
    else:
        rule["val_fraction"] = req.val_fraction
    return {"inputs": inputs, "tokenizer_sha256": _sha256(tok.path), "split_rule": rule}


def _token_dtype(vocab: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)


def _suffix(dtype: np.dtype) -> str:
    return ".u16" if dtype == np.uint16 else ".u32"


# --- reading: chunks of input for the workers -----------------------------------------


@dataclass(frozen=True)
class _Task:
    kind: str  # jsonl | lines | paragraphs | piece (a part of one document) | docs
    path: str
    line0: int  # the line number of the chunk's first line
    payload: bytes | list
    nbytes: int  # input bytes it stands for (progress)
    first: bool = True  # piece: the document's first part
    last: bool = True  # piece: the document's last part


def _byte_chunks(path: Path, kind: str, size: int) -> Iterator[_Task]:
    """Chunks of about `size` bytes, cut after a line (or, for paragraphs, a blank line)."""
    with path.open("rb") as f:
        line0 = 1
        while data := f.read(size):
            if not data.endswith(b"\n"):
                data += f.readline()
            if kind == "paragraphs":  # on to the end of the paragraph
                while (line := f.readline()) and line.strip():
                    data += line
                data += line
            yield _Task(kind, str(path), line0, data, len(data))
            line0 += data.count(b"\n")


def _piece_chunks(path: Path, size: int) -> Iterator[_Task]:
    """One document in parts cut after a line; the last one says so (one chunk's lookahead)."""
    prev = None
    for t in _byte_chunks(path, "piece", size):
        if prev is not None:
            yield _Task(
                "piece", prev.path, prev.line0, prev.payload, prev.nbytes, prev.first, False
            )
        prev = _Task("piece", t.path, t.line0, t.payload, t.nbytes, first=prev is None)
    if prev is not None:
        yield prev


def _parquet_file(path: Path, field: str):
    """The opened parquet file, its `field` a text column; one line otherwise."""
    pq = _pyarrow()
    try:
        pf = pq.ParquetFile(str(path))
    except Exception as e:  # pyarrow raises its own error types for a damaged file
        raise RatrainError(f"data: {path}: not a readable parquet file ({e})") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise RatrainError(
            f"data: {path} has no column {field!r} (columns: {', '.join(names)}); pass --field"
        )
    ftype = str(pf.schema_arrow.field(field).type)
    if ftype not in ("string", "large_string"):
        raise RatrainError(f"data: {path}: column {field!r} holds {ftype}, not text")
    return pf


def _parquet_chunks(path: Path, field: str, size: int) -> Iterator[_Task]:
    pf = _parquet_file(path, field)
    rows = max(pf.metadata.num_rows, 1)
    per_row = path.stat().st_size / rows
    batch = max(1, int(size / max(per_row, 1.0)))
    for rb in pf.iter_batches(batch_size=batch, columns=[field]):
        docs = rb.column(0).to_pylist()
        yield _Task("docs", str(path), 0, docs, int(len(docs) * per_row))


def _tasks(req: PrepareRequest) -> Iterator[_Task]:
    for p in req.inputs:
        suffix = p.suffix.lower()
        if suffix == ".jsonl":
            yield from _byte_chunks(p, "jsonl", req.chunk_bytes)
        elif suffix == ".parquet":
            yield from _parquet_chunks(p, req.field, req.chunk_bytes)
        elif req.txt_docs == "file":
            yield from _piece_chunks(p, req.chunk_bytes)
        else:
            yield from _byte_chunks(p, req.txt_docs + "s", req.chunk_bytes)


# --- encoding (in the workers) --------------------------------------------------------

_WORKER: dict = {}  # the worker's tokenizer, token dtype and JSON field


def _init_worker(tokenizer: str, dtype: str, field: str, parallel: bool) -> None:
    if not parallel:  # one process per core already: no thread pool inside each
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER.update(tok=HFTokenizer(Path(tokenizer)), dtype=np.dtype(dtype), field=field)


def _documents(task: _Task, field: str) -> list[str]:
    if task.kind == "docs":
        return [d for d in task.payload if d]
    text = task.payload.decode("utf-8", errors="replace")
    if task.kind == "piece":
        return [text]
    if task.kind == "lines":
        return [x for x in text.split("\n") if x.strip()]
    if task.kind == "paragraphs":
        return [x for x in re.split(r"\n[ \t\r\f\v]*\n", text) if x.strip()]
    # jsonl: split at "\n" only (JSON strings may hold raw U+2028)
    docs = (
        parse_jsonl_line(task.path, task.line0 + i, line, field)
        for i, line in enumerate(text.split("\n"))
        if line.strip()
    )
    return [d for d in docs if d]


@dataclass(frozen=True)
class _Encoded:
    tokens: np.ndarray
    lengths: np.ndarray  # tokens of each document (or part of one) in the chunk
    continues: bool  # the first entry continues the previous chunk's last document
    nbytes: int


def _encode(task: _Task) -> _Encoded | str:
    """A chunk's tokens, or the one-line error (RatrainError does not travel through pickle)."""
    tok, dtype = _WORKER["tok"], _WORKER["dtype"]
    try:
        docs = _documents(task, _WORKER["field"])
    except RatrainError as e:
        return str(e)
    pieces, owner = [], []
    for d, doc in enumerate(docs):
        for piece in chunk_text(doc):
            pieces.append(piece)
            owner.append(d)
    sep = np.asarray(tok.separator() if task.last else [], dtype=dtype)
    parts, lengths = [], np.zeros(len(docs), dtype=np.int64)
    for i, ids in enumerate(tok.encode(pieces)):
        parts.append(ids.astype(dtype))
        lengths[owner[i]] += len(ids)
        if i + 1 == len(owner) or owner[i + 1] != owner[i]:
            parts.append(sep)
            lengths[owner[i]] += len(sep)
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return _Encoded(tokens, lengths, task.kind == "piece" and not task.first, task.nbytes)


class _Pool:
    """Tasks encoded in order by `workers` processes, at most 2 x workers in flight (so
    reading never runs ahead of encoding by more than that); in this process for one."""

    def __init__(self, req: PrepareRequest, dtype: np.dtype):
        init = (str(req.tokenizer), dtype.name, req.field, req.workers == 1)
        self.workers, self.pool = req.workers, None
        if req.workers == 1:
            _init_worker(*init)
            return
        import multiprocessing as mp

        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork" if "fork" in methods else "spawn")
        self.pool = ctx.Pool(req.workers, initializer=_init_worker, initargs=init)

    def map(self, tasks: Iterator[_Task]) -> Iterator[_Encoded | str]:
        if self.pool is None:
            yield from map(_encode, tasks)
            return
        pending: deque = deque()
        for t in tasks:
            pending.append(self.pool.apply_async(_encode, (t,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def _encode_all(
    req: PrepareRequest, dtype: np.dtype, all_path: Path, progress: Progress | None
) -> np.ndarray:
    """Every document's tokens into `all_path`, in input order; each document's length."""
    total = sum(p.stat().st_size for p in req.inputs)
    lengths: list[np.ndarray] = []
    done = n_tokens = n_docs = 0
    pool = _Pool(req, dtype)
    try:
        with all_path.open("wb") as f:
            for res in pool.map(_tasks(req)):
                if isinstance(res, str):
                    raise RatrainError(res)
                res.tokens.tofile(f)
                ln = res.lengths
                if res.continues and lengths and len(ln):
                    lengths[-1] = lengths[-1].copy()
                    lengths[-1][-1] += ln[0]
                    ln = ln[1:]
                if len(ln):
                    lengths.append(ln)
                done, n_tokens, n_docs = (
                    done + res.nbytes,
                    n_tokens + len(res.tokens),
                    n_docs + len(ln),
                )
                if progress is not None:
                    progress(min(done, total), total, n_tokens, n_docs)
    finally:
        pool.close()
    out = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    out = out[out > 0]  # a document of no tokens (no text, no separator) is none
    if not out.size:
        raise RatrainError("data: the inputs hold no text")
    return out


# --- the split and the files ----------------------------------------------------------


def _val_documents(lengths: np.ndarray, req: PrepareRequest) -> np.ndarray:
    """Which documents are held out: a seeded permutation's first documents, until they hold
    the target number of tokens. A boolean mask over the documents."""
    total = int(lengths.sum())
    target = req.val_tokens if req.val_tokens is not None else math.ceil(req.val_fraction * total)
    val = np.zeros(len(lengths), dtype=bool)
    if target <= 0:
        return val
    order = np.random.default_rng(req.seed).permutation(len(lengths))
    k = int(np.searchsorted(np.cumsum(lengths[order]), target)) + 1
    if k >= len(lengths):
        raise RatrainError(
            f"data: the held-out split ({target:,} tokens) would take every one of the "
            f"{len(lengths):,} documents; the split is by documents: lower --val-fraction / "
            "--val-tokens (0: none), or give more documents (e.g. --txt-docs paragraph)"
        )
    val[order[:k]] = True
    return val


def _write_splits(all_path: Path, lengths: np.ndarray, val: np.ndarray, dtype, tmp: Path) -> dict:
    """train/val files from the documents in input order; {split: (file, tokens, documents)}."""
    files = {"train": tmp / f"train{_suffix(dtype)}", "val": tmp / f"val{_suffix(dtype)}"}
    counts = {s: [0, 0] for s in files}
    ends = np.cumsum(lengths)
    if not val.any():
        os.replace(all_path, files["train"])
        counts["train"] = [int(ends[-1]), len(lengths)]
        return {s: (files[s].name, *counts[s]) for s in files if counts[s][1]}
    tokens = np.memmap(all_path, dtype=dtype, mode="r")
    change = np.flatnonzero(np.diff(val.astype(np.int8))) + 1  # runs of one split
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [len(lengths)]])
    outs = {s: files[s].open("wb") for s in files}
    try:
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            split = "val" if val[a] else "train"
            lo, hi = int(ends[a - 1]) if a else 0, int(ends[b - 1])
            for i in range(lo, hi, _COPY_TOKENS):
                tokens[i : min(hi, i + _COPY_TOKENS)].tofile(outs[split])
            counts[split][0] += hi - lo
            counts[split][1] += b - a
    finally:
        for f in outs.values():
            f.close()
        del tokens
    all_path.unlink()
    return {s: (files[s].name, *counts[s]) for s in files}


def _publish(tmp: Path, out: Path, names: list[str]) -> None:
    """Move the files into `out`: the old manifest first (a run killed here leaves none, so
    the next run redoes the work), the new one last."""
    (out / MANIFEST).unlink(missing_ok=True)
    for old in out.glob("*.u16"):
        old.unlink()
    for old in out.glob("*.u32"):
        old.unlink()
    if (out / "tokenizer").exists():
        shutil.rmtree(out / "tokenizer")
    for name in names:
        os.replace(tmp / name, out / name)
    os.replace(tmp / MANIFEST, out / MANIFEST)
    shutil.rmtree(tmp, ignore_errors=True)


def read_manifest(d: str | Path) -> dict:
    """A prepared directory's manifest, or one line saying what is wrong."""
    p = Path(d) / MANIFEST
    if not p.is_file():
        raise RatrainError(
            f"data: {str(d)!r} is a directory without {MANIFEST}; pass a directory that "
            "`ratrain prepare` wrote, or a file"
        )
    try:
        m = json.loads(p.read_text())
        if not isinstance(m, dict):
            raise ValueError(f"a JSON {type(m).__name__}, not an object")
        if m.get("format") != FORMAT:
            raise ValueError(f"format {m.get('format')!r}, expected {FORMAT!r}")
        if "train" not in m["splits"]:
            raise KeyError("splits.train")
        for name, split in m["splits"].items():
            _check_split(str(name), split)
        if not isinstance(m["tokenizer"]["vocab_size"], int) or m["dtype"] not in (
            "uint16",
            "uint32",
        ):
            raise ValueError("tokenizer.vocab_size or dtype")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RatrainError(
            f"data: {p}: not a ratrain prepare manifest ({e}); run `ratrain prepare` again"
        ) from None
    return m


def _check_split(name: str, split) -> None:
    """A split's entry: a file named in the folder itself (never a path out of it) and a
    whole number of tokens >= 0."""
    for key in ("file", "tokens"):
        if key not in split:
            raise KeyError(f"splits.{name}.{key}")
    f = split["file"]
    if not isinstance(f, str) or not f or Path(f).name != f or f in (".", ".."):
        raise ValueError(f"splits.{name}.file must be a file name in the folder, got {f!r}")
    n = split["tokens"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"splits.{name}.tokens must be a whole number >= 0, got {n!r}")


def _up_to_date(out: Path, fingerprint: dict) -> dict | None:
    try:
        m = read_manifest(out)
    except RatrainError:
        return None
    if {k: m.get(k) for k in fingerprint} != fingerprint:
        return None
    itemsize = np.dtype(m["dtype"]).itemsize
    for s in m["splits"].values():
        f = out / s["file"]
        if not f.is_file() or f.stat().st_size != s["tokens"] * itemsize:
            return None
    return m


def prepare(req: PrepareRequest, progress: Progress | None = None) -> PrepareResult:
    """Tokenize `req.inputs` into `req.out` (see the module docstring)."""
    check_request(req)
    tok = HFTokenizer(req.tokenizer)
    fp = _fingerprint(req, tok)
    found = _up_to_date(req.out, fp)
    if found is not None:
        return PrepareResult(found, up_to_date=True)
    t0 = time.perf_counter()
    dtype = _token_dtype(tok.vocab_size)
    req.out.mkdir(parents=True, exist_ok=True)
    for stale in req.out.glob(".tmp-prepare-*"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    tmp = req.out / f".tmp-prepare-{os.getpid()}"
    tmp.mkdir()
    try:
        lengths = _encode_all(req, dtype, tmp / "all.tokens", progress)
        splits = _write_splits(
            tmp / "all.tokens", lengths, _val_documents(lengths, req), dtype, tmp
        )
        copy_tokenizer(tok.path, tmp / "tokenizer")
        seconds = time.perf_counter() - t0
        manifest = _manifest(fp, tok, dtype, splits, lengths, seconds)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        _publish(tmp, req.out, [s[0] for s in splits.values()] + ["tokenizer"])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PrepareResult(manifest, up_to_date=False)


def _manifest(fp: dict, tok: HFTokenizer, dtype, splits: dict, lengths, seconds: float) -> dict:
    tokens = int(lengths.sum())
    return {
        "format": FORMAT,
        **fp,
        "tokenizer": {
            "source": str(tok.path.resolve()),
            "dir": "tokenizer",
            "vocab_size": tok.vocab_size,
            "eos_token_id": tok.eos_id,
        },
        "dtype": dtype.name,
        "tokens": tokens,
        "documents": len(lengths),
        "splits": {s: {"file": f, "tokens": n, "documents": d} for s, (f, n, d) in splits.items()},
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds) if seconds > 0 else None,
    }


def prepared_source(
    d: str | Path,
    vocab: int,
    seq: int,
    seed: int = 0,
    *,
    split: str = "train",
    tokenizer: str | Path | None = None,
    dtype: str | None = None,
) -> BinSource:
    """The `split` of a prepared directory as a token source; one-line errors for a model
    whose vocabulary the tokenizer does not fit, or another --tokenizer / --data-dtype."""
    d = Path(d)
    m = read_manifest(d)
    tv = m["tokenizer"]["vocab_size"]
    if tv > vocab:
        raise RatrainError(
            f"data: {str(d)!r} was tokenized with {tv} ids but the model's vocabulary is "
            f"{vocab}; use a model whose vocab covers the tokenizer"
        )
    if dtype is not None and dtype != m["dtype"]:
        raise RatrainError(f"data: {str(d)!r} holds {m['dtype']} tokens; drop --data-dtype {dtype}")
    tok_dir = d / m["tokenizer"].get("dir", "tokenizer")
    if tokenizer is not None:
        if _sha256(tokenizer_json(tokenizer)) != m.get("tokenizer_sha256"):
            raise RatrainError(
                f"data: --tokenizer {tokenizer} is not the tokenizer {str(d)!r} was prepared "
                "with; drop --tokenizer (the directory names its own)"
            )
    if split not in m["splits"]:
        raise RatrainError(
            f"data: {str(d)!r} has no {split!r} split (it has {', '.join(m['splits'])})"
        )
    _check_size(d, m, split)
    src = BinSource(d / m["splits"][split]["file"], vocab, seq, seed, dtype=m["dtype"])
    src.name = f"{d.name}/{src.name}"
    if (tok_dir / "tokenizer.json").is_file():
        src.tokenizer_path = tok_dir / "tokenizer.json"
    return src


def _check_size(d: Path, m: dict, split: str) -> None:
    """The split's token file holds the manifest's count of tokens: a file cut short (a full
    disk, a copy stopped part way) or grown (another file copied over it) is not the data
    the manifest describes."""
    entry = m["splits"][split]
    f = d / entry["file"]
    if not f.is_file():
        return  # BinSource says it is not found
    itemsize = np.dtype(m["dtype"]).itemsize
    size_bytes, want_bytes = f.stat().st_size, entry["tokens"] * itemsize
    if size_bytes == want_bytes:
        return
    if size_bytes % itemsize:
        what = f"{size_bytes} bytes, not a whole number of {m['dtype']} tokens"
    else:
        what = f"{size_bytes // itemsize:,} tokens"
    shape = "shorter" if size_bytes < want_bytes else "longer"
    raise RatrainError(
        f"data: {str(f)!r} holds {what}, {shape} than the {entry['tokens']:,} its "
        f"manifest.json says; it was damaged or replaced: run `ratrain prepare` again"
    )
