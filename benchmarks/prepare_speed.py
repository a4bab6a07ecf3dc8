"""`ratrain prepare` throughput on a generated jsonl corpus (random words), in tokens/s.

    python benchmarks/prepare_speed.py [--mb 100] [--workers N] [--dir DIR]

Writes DIR/corpus.jsonl (about --mb MB of documents of 50-2000 words from a 20,000-word
lexicon) and a 32k byte-level BPE trained on a sample of it, then times
`ratrain prepare corpus.jsonl --tokenizer tok -o out` as a user runs it (a fresh process,
imports included), prints wall time, CPU time over wall time (how many cores it kept busy)
and tokens/s from the manifest. Run it on an idle machine: the figure scales with the cores
it gets.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_corpus(d: Path, mb: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    lexicon = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 10)))
        for _ in range(20_000)
    ]
    size, sample = 0, []
    with open(d / "corpus.jsonl", "w") as f:
        while size < mb * 1_000_000:
            text = " ".join(rng.choices(lexicon, k=rng.randint(50, 2000))) + "."
            line = json.dumps({"text": text}) + "\n"
            f.write(line)
            size += len(line)
            if len(sample) < 2000:
                sample.append(text)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(sample, trainer)
    (d / "tok").mkdir(exist_ok=True)
    tok.save(str(d / "tok" / "tokenizer.json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100, help="corpus size in MB (default 100)")
    ap.add_argument("--workers", type=int, help="prepare's --workers (default its own)")
    ap.add_argument("--dir", help="work here and keep the files (default: a temp dir)")
    a = ap.parse_args()
    d = Path(a.dir or tempfile.mkdtemp(prefix="ratrain-prepare-"))
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "corpus.jsonl").exists():
        make_corpus(d, a.mb)
    shutil.rmtree(d / "out", ignore_errors=True)
    cmd = [sys.executable, "-m", "ratrain", "prepare", "corpus.jsonl", "--tokenizer", "tok"]
    cmd += ["-o", "out", "--quiet"] + (["--workers", str(a.workers)] if a.workers else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=d, check=True)
    wall_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    manifest = json.loads((d / "out" / "manifest.json").read_text())
    tokens = sum(s["tokens"] for s in manifest["splits"].values())
    size_mb = (d / "corpus.jsonl").stat().st_size / 1e6
    print(
        f"{size_mb:.0f} MB, {tokens:,} tokens in {wall_s:.1f} s: {tokens / wall_s:,.0f} tokens/s; "
        f"CPU {cpu_s:.1f} s = {cpu_s / wall_s:.2f} cores busy"
    )
    if not a.dir:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
