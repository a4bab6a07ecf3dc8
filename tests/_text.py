"""Small text corpora and tokenizers made in-process, for the tests of `prepare`, eval,
generation and the fine-tuning guide's own-text walk-through (no download)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = "the cat sat on a mat dog ran far away big small red blue house tree bird sang".split()


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) + "." for _ in range(n)]


def make_tokenizer(d: Path, docs: list[str], vocab: int = 120) -> Path:
    """A small BPE (Metaspace pre-tokenizer, so decoding restores spaces) with an
    <|endoftext|> token, trained in-process on `docs`; its directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        docs, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"])
    )
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    return d


def word_tokenizer(d: Path, n_words: int) -> Path:
    """A word-level tokenizer of [UNK], </s> and WORDS + w0, w1, ... (n_words in all)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    names = (WORDS + [f"w{i}" for i in range(n_words)])[:n_words]
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *names])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    return d


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path
