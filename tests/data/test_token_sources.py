import json

import numpy as np
import pytest
import torch

from ratrain.config import Plan
from ratrain.data import Batches, BinSource, SyntheticSource, TextSource, make_source
from ratrain.data.synthetic import markov_chain, stationary
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset

TINY = get_preset("tiny")  # vocab 256


# -- synthetic source ---------------------------------------------------------------------


def test_synthetic_is_deterministic_and_seeded():
    a, b = SyntheticSource(256, 32, seed=3), SyntheticSource(256, 32, seed=3)
    np.testing.assert_array_equal(a.sequences([0, 7, 1000]), b.sequences([0, 7, 1000]))
    assert a.entropy_floor_nats == b.entropy_floor_nats
    c = SyntheticSource(256, 32, seed=4)
    assert not np.array_equal(a.sequences(range(4)), c.sequences(range(4)))
    # random access: a sequence does not depend on which others are asked for with it
    np.testing.assert_array_equal(a.sequences([7]), a.sequences([0, 7])[1:])


def test_synthetic_chain_and_entropy_floor():
    src = SyntheticSource(64, 64, seed=1, branching=3)
    succ, probs = src.succ, src.probs
    assert all(len(set(row)) == 3 for row in succ.tolist())  # distinct successors
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    trans = np.zeros((64, 64))
    np.put_along_axis(trans, succ, probs, axis=1)
    np.testing.assert_allclose(src.pi @ trans, src.pi, atol=1e-12)  # stationary
    # The empirical negative log-likelihood of the true chain converges to the floor.
    seqs = src.sequences(range(3000))
    nll = -np.log(trans[seqs[:, :-1], seqs[:, 1:]]).mean()
    assert abs(nll - src.entropy_floor_nats) < 0.01 * src.entropy_floor_nats
    # Every transition in a walk is an edge of the chain.
    assert (trans[seqs[:, :-1], seqs[:, 1:]] > 0).all()


def test_large_vocab_chain_has_distinct_successors():
    succ, probs = markov_chain(40_000, 4, seed=0)
    srt = np.sort(succ, axis=1)
    assert (srt[:, 1:] != srt[:, :-1]).all() and succ.max() < 40_000
    pi = stationary(succ, probs)
    assert abs(pi.sum() - 1) < 1e-12 and (pi > 0).all()


# -- the (step, microbatch, replica) map ---------------------------------------------------


def test_batch_shapes_and_shift():
    batches = Batches(SyntheticSource(256, 16, seed=0), micro_batch=3, microbatches=2, dp=2)
    x, y = batches.batch(5, 1, 1)
    assert x.shape == y.shape == (3, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_global_batch_is_replica_major_concatenation():
    batches = Batches(SyntheticSource(256, 8, seed=0), micro_batch=2, microbatches=3, dp=2)
    gx, gy = batches.global_batch_of(4)
    parts = [batches.batch(4, mb, r) for r in range(2) for mb in range(3)]
    assert torch.equal(gx, torch.cat([p[0] for p in parts]))
    assert torch.equal(gy, torch.cat([p[1] for p in parts]))
    assert list(batches.indices(4, 1, 1)) == [4 * 12 + (1 * 3 + 1) * 2 + i for i in range(2)]


def test_global_batch_does_not_depend_on_the_split():
    src = SyntheticSource(256, 8, seed=2)
    ref = Batches(src, micro_batch=8, microbatches=1, dp=1).global_batch_of(3)
    for mb, m, dp in [(1, 8, 1), (2, 2, 2), (1, 2, 4)]:
        got = Batches(src, micro_batch=mb, microbatches=m, dp=dp).global_batch_of(3)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_resume_is_position_arithmetic():
    plan = Plan(dp=2, micro_batch=2, global_batch=8, seq=16)
    first = Batches.from_plan(SyntheticSource(256, 16, seed=9), plan)
    later = Batches.from_plan(SyntheticSource(256, 16, seed=9), plan)  # a fresh process
    for step in (0, 17):
        for r in range(2):
            for mb in range(2):
                assert torch.equal(first.batch(step, mb, r)[0], later.batch(step, mb, r)[0])
    assert not torch.equal(first.batch(0, 0, 0)[0], first.batch(1, 0, 0)[0])


def test_batch_index_out_of_range():
    batches = Batches(SyntheticSource(256, 8), micro_batch=1, microbatches=2, dp=2)
    with pytest.raises(IndexError):
        batches.batch(0, 2, 0)
    with pytest.raises(IndexError):
        batches.batch(0, 0, 2)


def test_plan_seq_mismatch():
    with pytest.raises(RatrainError, match="seq"):
        Batches.from_plan(SyntheticSource(256, 8), Plan(seq=16))


@pytest.mark.parametrize(
    "make",
    [
        lambda: SyntheticSource(0, 8),
        lambda: SyntheticSource(256, -1),
        lambda: SyntheticSource(256, 8, branching=0),
        lambda: SyntheticSource(8, 8, branching=9),
        lambda: Batches(SyntheticSource(256, 8), micro_batch=0, microbatches=1),
        lambda: Batches(SyntheticSource(256, 8), micro_batch=1, microbatches=1, dp=-2),
    ],
)
def test_bad_sizes(make):
    with pytest.raises(RatrainError, match="must be"):
        make()


# -- binary token files ---------------------------------------------------------------------


def test_bin_windows_are_slices_of_the_file(tmp_path):
    data = np.arange(1000, dtype=np.uint16) % 250
    path = tmp_path / "toks.bin"
    data.tofile(path)
    src = make_source(path, TINY, seq=16, seed=1)
    assert isinstance(src, BinSource)
    seqs = src.sequences(range(20))
    assert seqs.shape == (20, 17) and seqs.dtype == np.int64
    for s in seqs:  # contiguous windows: consecutive values mod 250
        assert ((s[1:] - s[:-1]) % 250 == 1).all()
    again = make_source(path, TINY, seq=16, seed=1).sequences(range(20))
    np.testing.assert_array_equal(seqs, again)


def test_bin_dtype_by_extension_and_flag(tmp_path):
    data = np.array([1, 2, 3, 4, 5, 200], dtype=np.uint32)
    data.tofile(tmp_path / "t.u32")
    src = make_source(tmp_path / "t.u32", TINY, seq=5)
    np.testing.assert_array_equal(src.sequences([0])[0], data)
    data.tofile(tmp_path / "t.dat")
    src = make_source(tmp_path / "t.dat", TINY, seq=5, dtype="uint32")
    np.testing.assert_array_equal(src.sequences([0])[0], data)


@pytest.mark.parametrize(
    "content, name, kw, match",
    [
        (None, "missing.bin", {}, "not found"),
        (b"", "empty.bin", {}, "empty"),
        (b"\x01\x00\x02", "odd.bin", {}, "whole number"),
        (np.array([1, 256, 3], dtype=np.uint16).tobytes(), "big.bin", {}, "token id 256"),
        (np.arange(4, dtype=np.uint16).tobytes(), "short.bin", {}, "fewer than seq"),
        (np.arange(40, dtype=np.uint16).tobytes(), "x.dat", {"dtype": "int8"}, "uint16 or uint32"),
        (np.arange(40, dtype=np.uint16).tobytes(), "x.dat", {}, "cannot tell"),
    ],
)
def test_bin_errors(tmp_path, content, name, kw, match):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(RatrainError, match=match):
        make_source(path, TINY, seq=8, **kw)


# -- text -----------------------------------------------------------------------------------


def test_txt_bytes(tmp_path):
    text = "hello world, a small corpus of text.\n" * 20
    (tmp_path / "c.txt").write_text(text)
    src = make_source(tmp_path / "c.txt", TINY, seq=10, seed=0)
    assert isinstance(src, TextSource)
    raw = np.frombuffer(text.encode() + b"\n", dtype=np.uint8)  # vocab 256: docs end with "\n"
    assert len(src.tokens) == len(raw) and (src.tokens == raw).all()
    seq = bytes(src.sequences([3])[0].astype(np.uint8).tolist()).decode()
    assert seq in text + "\n"


def test_jsonl_bytes_with_eos(tmp_path):
    lines = [json.dumps({"text": "first doc"}), "", json.dumps({"text": "second", "id": 2})]
    (tmp_path / "c.jsonl").write_text("\n".join(lines))
    src = TextSource(tmp_path / "c.jsonl", vocab=300, seq=4)
    expect = list(b"first doc") + [256] + list(b"second") + [256]
    assert src.tokens.tolist() == expect


def _word_tokenizer(path, words):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *words])}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return vocab


def test_hf_tokenizer(tmp_path):
    vocab = _word_tokenizer(tmp_path / "tokenizer.json", ["the", "cat", "sat", "on", "mat"])
    (tmp_path / "c.jsonl").write_text(
        json.dumps({"text": "the cat sat"}) + "\n" + json.dumps({"text": "on the mat"}) + "\n"
    )
    src = make_source(tmp_path / "c.jsonl", TINY, seq=3, tokenizer=tmp_path)
    words = "the cat sat </s> on the mat </s>".split()
    assert src.tokens.tolist() == [vocab[w] for w in words]


def test_hf_tokenizer_larger_than_model(tmp_path):
    _word_tokenizer(tmp_path / "tokenizer.json", [f"w{i}" for i in range(300)])
    (tmp_path / "c.txt").write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9")
    with pytest.raises(RatrainError, match="302 ids but the model's vocabulary is 256"):
        make_source(tmp_path / "c.txt", TINY, seq=3, tokenizer=tmp_path / "tokenizer.json")


@pytest.mark.parametrize(
    "name, content, kw, match",
    [
        ("missing.txt", None, {}, "not found"),
        ("empty.txt", "  \n", {}, "empty"),
        ("bad.jsonl", '{"text": "ok"}\n{not json\n', {}, r"bad.jsonl:2: not valid JSON"),
        ("nofield.jsonl", '{"body": "x"}\n', {}, r'nofield.jsonl:1: expected .* "text"'),
        ("blank.jsonl", '{"text": ""}\n', {}, "holds no text"),
        ("short.txt", "abc", {}, "fewer than seq"),
        ("c.txt", "some text " * 10, {"tokenizer": "nope/tokenizer.json"}, "tokenizer file"),
        ("c.weird", "text", {}, "cannot tell"),
    ],
)
def test_text_errors(tmp_path, name, content, kw, match):
    if content is not None:
        (tmp_path / name).write_text(content)
    kw = {k: (tmp_path / v if k == "tokenizer" else v) for k, v in kw.items()}
    with pytest.raises(RatrainError, match=match):
        make_source(tmp_path / name, TINY, seq=8, **kw)


def test_byte_tokenizer_needs_256_ids(tmp_path):
    (tmp_path / "c.txt").write_text("some text " * 10)
    with pytest.raises(RatrainError, match="at least 256"):
        make_source(tmp_path / "c.txt", get_preset("tiny-tied"), seq=8)
