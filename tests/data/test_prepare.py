"""`ratrain prepare`: the same tokens as tokenizing on load, whatever the number of workers
or chunk size; a held-out split of whole documents by seed; idempotent; `train --data DIR`
reads the train split and checks the vocab; bad input is one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _cli import one_line_error
from _text import WORDS, make_docs, make_tokenizer, word_tokenizer, write_jsonl
from ratrain.cli import main
from ratrain.data import make_source
from ratrain.data.binfile import BinSource
from ratrain.data.prepare import PrepareRequest, prepare, read_manifest
from ratrain.data.text import HFTokenizer, TextSource
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset

tokenizers = pytest.importorskip("tokenizers")

TINY = get_preset("tiny")  # vocab 256


@pytest.fixture
def corpus(tmp_path):
    docs = make_docs(200)
    return write_jsonl(tmp_path / "c.jsonl", docs), make_tokenizer(tmp_path / "tok", docs), docs


def _req(tmp_path, inputs, tok, out="out", **kw) -> PrepareRequest:
    return PrepareRequest(tuple(inputs), tok, tmp_path / out, **kw)


def _tokens(out: Path, split: str = "train") -> np.ndarray:
    m = read_manifest(out)
    return np.fromfile(out / m["splits"][split]["file"], dtype=m["dtype"])


def test_same_tokens_as_text_source_for_any_workers_and_chunks(tmp_path, corpus):
    path, tok, docs = corpus
    expect = TextSource(path, TINY.vocab, seq=4, tokenizer=tok).tokens
    for workers, chunk in ((1, 4 << 20), (2, 500)):
        out = f"out{workers}"
        r = prepare(
            _req(tmp_path, [path], tok, out, val_fraction=0, workers=workers, chunk_bytes=chunk)
        )
        assert not r.up_to_date
        assert _tokens(tmp_path / out).tolist() == expect.tolist()
        m = r.manifest
        assert m["documents"] == len(docs) and m["tokens"] == len(expect)
        assert m["dtype"] == "uint16" and "val" not in m["splits"]
        assert m["tokenizer"]["vocab_size"] == HFTokenizer(tok).vocab_size
        assert m["tokenizer"]["eos_token_id"] == 0
        assert (tmp_path / out / "tokenizer" / "tokenizer.json").is_file()
        assert not list((tmp_path / out).glob(".tmp-*"))


def _doc_token_lists(tok_dir: Path, docs: list[str]) -> list[list[int]]:
    tok = HFTokenizer(tok_dir)
    return [ids.tolist() + tok.separator() for ids in tok.encode(docs)]


def test_held_out_split_is_whole_documents_by_seed(tmp_path, corpus):
    path, tok, docs = corpus
    per_doc = _doc_token_lists(tok, docs)
    lengths = np.array([len(d) for d in per_doc])
    target = int(np.ceil(0.1 * lengths.sum()))
    # The documented rule: a seeded permutation's first documents, until they hold the target.
    order = np.random.default_rng(3).permutation(len(docs))
    k = int(np.searchsorted(np.cumsum(lengths[order]), target)) + 1
    held = set(order[:k].tolist())
    expect = {
        "train": [t for i, d in enumerate(per_doc) if i not in held for t in d],
        "val": [t for i, d in enumerate(per_doc) if i in held for t in d],
    }
    r = prepare(_req(tmp_path, [path], tok, val_fraction=0.1, seed=3, workers=2, chunk_bytes=700))
    for split in ("train", "val"):
        assert _tokens(tmp_path / "out", split).tolist() == expect[split]
    assert r.manifest["splits"]["val"] == {
        "file": "val.u16",
        "tokens": len(expect["val"]),
        "documents": k,
    }
    assert len(expect["val"]) >= target > len(expect["val"]) - lengths[order[k - 1]]
    prepare(_req(tmp_path, [path], tok, "other", val_fraction=0.1, seed=4))
    assert _tokens(tmp_path / "other", "val").tolist() != expect["val"]
    by_tokens = prepare(_req(tmp_path, [path], tok, "vt", val_tokens=50))
    assert 50 <= by_tokens.manifest["splits"]["val"]["tokens"] < 50 + lengths.max()
    assert r.manifest["split_rule"] == {
        "by": "document", "seed": 3, "field": "text", "txt_docs": "file", "val_fraction": 0.1
    }  # fmt: skip
    assert by_tokens.manifest["split_rule"]["val_tokens"] == 50


def test_rerun_is_a_no_op_until_an_input_changes(tmp_path, corpus):
    path, tok, _ = corpus
    req = _req(tmp_path, [path], tok)
    first = prepare(req)
    stamp = (tmp_path / "out" / "train.u16").stat().st_mtime_ns
    second = prepare(req)
    assert second.up_to_date and second.manifest == first.manifest
    assert (tmp_path / "out" / "train.u16").stat().st_mtime_ns == stamp
    write_jsonl(path, make_docs(150, seed=1))  # new content: prepared again
    third = prepare(req)
    assert not third.up_to_date and third.manifest["documents"] == 150
    other = word_tokenizer(tmp_path / "tok2", 200)
    fourth = prepare(_req(tmp_path, [path], other))
    assert not fourth.up_to_date and fourth.manifest["tokenizer"]["vocab_size"] == 202


def test_text_documents_file_paragraph_line(tmp_path, corpus):
    _, tok, docs = corpus
    txt = tmp_path / "book.txt"
    txt.write_text("\n".join(docs[:5]) + "\n\n" + "\n".join(docs[5:9]) + "\n \n" + docs[9] + "\n")
    whole = TextSource(txt, TINY.vocab, seq=4, tokenizer=tok).tokens.tolist()
    counts = {}
    for mode in ("file", "paragraph", "line"):
        r = prepare(_req(tmp_path, [txt], tok, mode, txt_docs=mode, val_fraction=0, chunk_bytes=64))
        counts[mode] = r.manifest["documents"]
    assert counts == {"file": 1, "paragraph": 3, "line": 10}  # file: 64-byte chunks, one document
    prepare(_req(tmp_path, [txt], tok, "whole", val_fraction=0))
    assert _tokens(tmp_path / "whole").tolist() == whole
    with pytest.raises(RatrainError, match="would take every one of the 1 documents"):
        prepare(_req(tmp_path, [txt], tok, "one", txt_docs="file"))


def test_train_reads_the_prepared_directory(tmp_path, corpus):
    path, tok, _ = corpus
    prepare(_req(tmp_path, [path], tok))
    src = make_source(tmp_path / "out", TINY, seq=8, seed=0)
    assert isinstance(src, BinSource)
    assert src.tokens.tolist() == _tokens(tmp_path / "out").tolist()
    assert src.tokenizer_path == tmp_path / "out" / "tokenizer" / "tokenizer.json"
    assert make_source(tmp_path / "out", TINY, seq=8, tokenizer=tok).vocab == TINY.vocab
    big = word_tokenizer(tmp_path / "big", 298)
    with pytest.raises(RatrainError, match="is not the tokenizer"):
        make_source(tmp_path / "out", TINY, seq=8, tokenizer=big)
    prepare(_req(tmp_path, [path], big, "big_out"))
    with pytest.raises(
        RatrainError, match="tokenized with 300 ids but the model's vocabulary is 256"
    ):
        make_source(tmp_path / "big_out", TINY, seq=8)
    with pytest.raises(RatrainError, match="without manifest.json"):
        make_source(tmp_path / "tok", TINY, seq=8)


def test_uint32_for_a_large_vocabulary(tmp_path):
    word_tokenizer(tmp_path / "tok", 70_000)
    write_jsonl(tmp_path / "c.jsonl", ["w1 w69000", "w5"])
    m = prepare(_req(tmp_path, [tmp_path / "c.jsonl"], tmp_path / "tok", val_fraction=0)).manifest
    assert m["dtype"] == "uint32" and m["splits"]["train"]["file"] == "train.u32"
    off = 2 + len(WORDS)
    assert _tokens(tmp_path / "out").tolist() == [off + 1, off + 69000, 1, off + 5, 1]


def test_cli_prepare_and_its_errors(tmp_path, corpus, capsys):
    path, tok, _ = corpus
    out = str(tmp_path / "o")
    assert main(["prepare", str(path), "--tokenizer", str(tok), "-o", out, "--workers", "2"]) == 0
    text = capsys.readouterr()
    assert "train:" in text.out and "val:" in text.out and "tokens/s" in text.out
    assert "prepare 100%" in text.err  # the progress line
    assert main(["prepare", str(path), "--tokenizer", str(tok), "-o", out]) == 0
    assert "is up to date" in capsys.readouterr().out
    base = ["prepare", str(path), "--tokenizer", str(tok), "-o", str(tmp_path / "e")]
    one_line_error(capsys, ["prepare", "nope.jsonl", *base[2:]], "input 'nope.jsonl' not found")
    one_line_error(capsys, [*base[:2], "--tokenizer", "nope", *base[4:]], "'nope' not found")
    one_line_error(capsys, [*base, "--field", "body"], 'string "body" field')
    one_line_error(capsys, [*base, "--val-fraction", "1.5"], "--val-fraction must be in [0, 1)")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{oops\n')
    one_line_error(
        capsys, ["prepare", str(tmp_path / "bad.jsonl"), *base[2:]], "bad.jsonl:2: not valid JSON"
    )
    (tmp_path / "c.csv").write_text("a,b\n")
    one_line_error(capsys, ["prepare", str(tmp_path / "c.csv"), *base[2:]], "cannot tell what")
    assert not list((tmp_path / "e").iterdir())  # nothing left behind by bad input


def test_parquet(tmp_path, corpus, capsys):
    _, tok, docs = corpus
    base = ["--tokenizer", str(tok), "-o", str(tmp_path / "p"), "--val-fraction", "0"]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        (tmp_path / "c.parquet").write_bytes(b"PAR1")
        one_line_error(
            capsys, ["prepare", str(tmp_path / "c.parquet"), *base], "pip install pyarrow"
        )
        return
    pq.write_table(pa.table({"body": docs, "n": list(range(len(docs)))}), tmp_path / "c.parquet")
    assert main(["prepare", str(tmp_path / "c.parquet"), *base, "--field", "body"]) == 0
    capsys.readouterr()
    expect = [t for d in _doc_token_lists(tok, docs) for t in d]
    assert _tokens(tmp_path / "p").tolist() == expect
    one_line_error(
        capsys,
        ["prepare", str(tmp_path / "c.parquet"), *base[:2], "-o", str(tmp_path / "q")],
        "no column 'text'",
    )
