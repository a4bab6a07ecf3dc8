"""The guide's "Train on your own text" section (docs/guide/finetune.md; it was the README's),
run command by command on a tiny corpus and tokenizer made here (fewer steps and smaller
batches than the guide, nothing else changed):
prepare -> train on the prepared directory -> generate -> export, and the export loads in
transformers with its tokenizer, continuing a prompt as `ratrain generate` does."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from _text import make_docs, make_tokenizer, write_jsonl
from ratrain.cli import main

transformers = pytest.importorskip("transformers")

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "finetune.md"
SMALL = ["--seq", "16", "--micro-batch", "1", "--global-batch", "2", "--quiet", "--threads", "1"]


def section_commands() -> list[list[str]]:
    """The `ratrain ...` lines of the section's bash block, as argv lists."""
    text = GUIDE.read_text()
    m = re.search(r"## Train on your own text\n(.*?)\n```bash\n(.*?)```", text, re.S)
    assert m, "docs/guide/finetune.md lost its 'Train on your own text' section"
    lines = [x.strip() for x in m.group(2).splitlines()]
    return [shlex.split(x)[1:] for x in lines if x.startswith("ratrain ")]


def _small(argv: list[str]) -> list[str]:
    if argv[0] != "train":
        return argv
    i = argv.index("--steps")
    return [*argv[: i + 1], "2", *argv[i + 2 :], *SMALL]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_readme_own_text_section_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(300)
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    make_tokenizer(tmp_path / "tokenizer", docs)
    commands = section_commands()
    assert [c[0] for c in commands] == ["prepare", "train", "generate", "export"]
    outputs = {}
    for argv in commands:
        assert main(_small(argv)) == 0, argv
        outputs[argv[0]] = capsys.readouterr().out
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["splits"]["val"]["documents"] >= 1
    assert "train.u16" in outputs["train"]  # it trained on the prepared train split
    ckpt = tmp_path / "ckpt" / "step-00000002"
    assert (ckpt / "tokenizer.json").read_bytes() == (
        tmp_path / "tokenizer" / "tokenizer.json"
    ).read_bytes()
    assert outputs["generate"].strip()  # some text
    # The export: model, tokenizer and generation config load in transformers, and greedy
    # decoding there equals `ratrain generate --temperature 0` on the checkpoint.
    hf_dir = tmp_path / "out" / "my-model"
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert model.generation_config.eos_token_id == tok.eos_token_id == 0
    ids = tok("the cat", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12
        )
    expect = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    for source in (str(ckpt), str(hf_dir)):
        argv = [
            "generate",
            source,
            "--prompt",
            "the cat",
            "--max-new-tokens",
            "12",
            "--temperature",
            "0",
        ]
        assert main(argv) == 0
        assert capsys.readouterr().out == expect + "\n"


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_train_tokenizer_flag_keeps_the_tokenizer_in_the_checkpoint(tmp_path, capsys):
    docs = make_docs(100)
    corpus = write_jsonl(tmp_path / "c.jsonl", docs)
    tok = make_tokenizer(tmp_path / "tok", docs)
    (tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    save = tmp_path / "ck"
    argv = ["train", "--data", str(corpus), "--tokenizer", str(tok), "--model", "tiny", "--pp", "1"]
    assert main([*argv, "--steps", "1", "--save", str(save), *SMALL]) == 0
    ckpt = save / "step-00000001"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (ckpt / name).read_bytes() == (tok / name).read_bytes()
    assert main(["export", str(save), "--hf", str(tmp_path / "hf")]) == 0
    assert "generation_config.json" in capsys.readouterr().out
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 0, "eos_token_id": 0}
