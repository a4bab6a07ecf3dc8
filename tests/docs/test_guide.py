"""The commands of README.md and docs/guide/*.md, so the guide cannot rot.

Every ```bash block of those pages carries a marker on the line before it:

- `<!-- run: tiny -->`: run here, block after block in the page's order, in one temporary
  directory per page holding `corpus.jsonl` and `tokenizer/` (a tiny corpus and tokenizer
  made here; no network, no GPU, no root). `train` runs are shrunk (`shrink`): at most 4
  steps, checkpoints and evaluations every 2 steps at most, 16-token sequences and small
  batches; nothing else changes.
- `<!-- check: parse -->`: each `ratrain ...` command (also after `torchrun ... -m ratrain`,
  `python -m ratrain` and inside `ratrain emulate ... --`) is parsed by the real argument
  parser, so a renamed subcommand or flag fails; torchrun's own flags by torchrun's parser.

Blocks marked `run: tiny` are parsed too. README's install and test lines must stay those
`.ci/run` runs."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from _text import make_docs, make_tokenizer, write_jsonl
from ratrain.cli import _build_parser, main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
MARKERS = ("run: tiny", "check: parse")
SEPARATORS = {"&&", "||", ";", "|"}


@dataclass
class Block:
    page: Path
    line: int
    marker: str
    text: str


def blocks(page: Path) -> list[Block]:
    """The ```bash blocks of a page with the marker before each ("" when none)."""
    out = []
    for m in re.finditer(r"(?:<!-- ([^>]*?) -->\n)?```bash\n(.*?)```", page.read_text(), re.S):
        line = page.read_text()[: m.start()].count("\n") + 1
        out.append(Block(page, line, (m.group(1) or "").strip(), m.group(2)))
    return out


def commands(text: str) -> list[list[str]]:
    """The shell commands of a block as argv lists: continuation lines joined, comments
    dropped, split at `&&`, `||`, `;` and `|`."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lex.whitespace_split = True
        lex.commenters = "#"
        argv: list[str] = []
        for tok in lex:
            if tok in SEPARATORS:
                out.append(argv)
                argv = []
            else:
                argv.append(tok)
        out.append(argv)
    return [a for a in out if a]


def ratrain_argv(argv: list[str]) -> list[str] | None:
    """The ratrain arguments of a command line, or None when it does not run ratrain.
    torchrun's own flags are checked here by torchrun's parser."""
    if argv[0] == "ratrain":
        return argv[1:]
    for i in range(len(argv) - 2):
        if argv[i : i + 2] == ["-m", "ratrain"]:
            if argv[0] == "torchrun":
                from torch.distributed.run import get_args_parser

                get_args_parser().parse_args([*argv[1:i], "--no-python", "true"])
            return argv[i + 2 :]
    return None


def check_parses(argv: list[str]) -> None:
    """`ratrain ARGV` is accepted by the real parser (recursing into `emulate -- CMD`)."""
    parser, _ = _build_parser(argv)
    # No abbreviations: a flag renamed to a longer name must not pass as its prefix.
    for p in [parser, *parser._subparsers._group_actions[0].choices.values()]:
        p.allow_abbrev = False
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"`ratrain {shlex.join(argv)}`: {err.getvalue().strip()}") from e
    if args.command in ("emulate", "cluster") and not args.raw:
        rest = list(args.node_command)
        rest = rest[1:] if rest[:1] == ["--"] else rest
        if rest:
            check_parses(rest)


def shrink(argv: list[str]) -> list[str]:
    """A `run: tiny` command made quick: `train` takes at most 4 steps, checkpoints and
    evaluations every 2 steps at most, 16-token sequences and 2 microbatches per replica."""
    if argv[0] != "train":
        return argv
    caps = {"--steps": 4, "--save-every": 2, "--eval-every": 2}
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a in caps:
            out[i + 1] = str(min(int(out[i + 1]), caps[a]))
    out += ["--seq", "16", "--quiet", "--threads", "1"]
    if "--plan" not in out:
        dp = int(out[out.index("--dp") + 1]) if "--dp" in out else 1
        out += ["--micro-batch", "1", "--global-batch", str(2 * dp)]
    return out


ALL = [b for page in PAGES for b in blocks(page)]


def _id(b: Block) -> str:
    return f"{b.page.relative_to(ROOT)}:{b.line}"


def test_every_page_has_blocks_and_every_block_a_marker():
    assert len(PAGES) >= 5, PAGES
    for page in PAGES:
        assert blocks(page), f"{page} has no ```bash block"
    bad = [_id(b) for b in ALL if b.marker not in MARKERS]
    assert not bad, f"blocks without <!-- run: tiny --> or <!-- check: parse -->: {bad}"


@pytest.mark.parametrize("block", ALL, ids=_id)
def test_block_parses(block):
    found = 0
    for argv in commands(block.text):
        args = ratrain_argv(argv)
        if args is not None:
            check_parses(args)
            found += 1
    assert found or "pip install" in block.text, f"{_id(block)}: no ratrain command"


def test_readme_install_and_test_lines_are_ci_s():
    """The README's quick start: the pinned install and the default job, and the exact
    install and test commands `.ci/run` runs."""
    ci = [x.strip() for x in (ROOT / ".ci" / "run").read_text().splitlines()]
    install = next(x for x in ci if "pip install" in x).replace(" --quiet", "")
    test = next(x for x in ci if x.startswith("python -m pytest"))
    shell = "\n".join(b.text for b in blocks(ROOT / "README.md"))
    assert "pip install torch==2.13.0 -e . && ratrain train\n" in shell
    assert f"{install} && {test}\n" in shell


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(b.marker == "run: tiny" for b in blocks(p))],
    ids=lambda p: p.name,
)
def test_page_runs(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(120)
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    make_tokenizer(tmp_path / "tokenizer", docs)
    for block in blocks(page):
        if block.marker != "run: tiny":
            continue
        for argv in commands(block.text):
            args = ratrain_argv(argv)
            assert args is not None, f"{_id(block)}: `{shlex.join(argv)}` is not a ratrain command"
            rc = main(shrink(args))
            out = capsys.readouterr()
            assert rc == 0, f"{_id(block)}: `ratrain {shlex.join(args)}` -> {rc}\n{out.err[-2000:]}"
