"""Every case of benchmarks/bad_input_audit.py (the commands, flags and files added since the
last audit: prepare, eval, generate, emulate/cluster, bench cluster, link-probe, plot, job
files, the new train flags, plan and platform files, prepared data that does not match its
manifest, tokenizers, numeric ranges, abbreviated flags): one line that names what is
wrong, exit code 2, no traceback, no work started and no file that existed changed.

The cases run in-process against fixtures made once per module; those that need a
checkpoint (about 15 s to train one) are marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from _audit import AUDIT_PATH, load_audit  # noqa: E402

audit = load_audit()
FAST = [c for c in audit.CASES if not c.needs]
WITH_CKPT = [c for c in audit.CASES if c.needs]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    return str(root), audit.make_fixtures(root, checkpoint=False)


@pytest.fixture(scope="module")
def fixtures_with_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input-ckpt")
    return str(root), audit.make_fixtures(root, checkpoint=True)


def _check(case, root: str, paths: dict) -> None:
    r = audit.run_case(case, paths, root)
    assert r.problems() == [], (r.argv, r.err)


@pytest.mark.parametrize("case", FAST, ids=[c.name[:70] for c in FAST])
def test_bad_input_is_one_line_exit_2_nothing_touched(case, fixtures):
    _check(case, *fixtures)


@pytest.mark.slow
@pytest.mark.parametrize("case", WITH_CKPT, ids=[c.name[:70] for c in WITH_CKPT])
def test_bad_input_with_a_checkpoint(case, fixtures_with_checkpoint):
    _check(case, *fixtures_with_checkpoint)


def test_the_audit_sees_a_traceback_work_and_a_changed_file(fixtures, monkeypatch):
    """The checks can fail: a command that crashes, one that reaches work, and one that
    changes a file are each reported."""
    from ratrain.cli import plot

    root, paths = fixtures
    case = audit.Case(("plot", "{metrics}", "-o", "{out_png}"), "never printed")

    def crash(args):
        raise KeyError("x")

    monkeypatch.setattr(plot, "run", crash)
    assert "traceback" in audit.run_case(case, paths, root).problems()

    def work(args):
        from ratrain.observe.curves import plot_curves

        plot_curves([], args.output)

    monkeypatch.setattr(plot, "run", work)
    assert "traceback" in audit.run_case(case, paths, root).problems()

    def overwrite(args):
        Path(args.output).write_bytes(b"lost")
        return 2

    monkeypatch.setattr(plot, "run", overwrite)
    probs = audit.run_case(case, paths, root).problems()
    assert any(p.startswith("changed or created out/keep.png") for p in probs), probs
    Path(paths["out_png"]).write_bytes(b"\x89PNG kept\n")


def test_a_refused_run_keeps_an_existing_output(fixtures):
    """--print-config PATH, --json and -o name files that exist; a bad value elsewhere on
    the line leaves each byte for byte."""
    from ratrain.cli import main

    root, paths = fixtures
    yaml_before = Path(paths["out_yaml"]).read_bytes()
    png_before = Path(paths["out_png"]).read_bytes()
    assert main(["train", "--print-config", paths["out_yaml"], "--seed", "-1"]) == 2
    assert main(["plot", paths["metrics"], "-o", paths["out_png"], "--dpi", "0"]) == 2
    assert main(["bench", "cluster", "--json", paths["out_yaml"], "--caps", "inf"]) == 2
    assert Path(paths["out_yaml"]).read_bytes() == yaml_before
    assert Path(paths["out_png"]).read_bytes() == png_before


def test_flags_are_not_abbreviated_and_the_error_names_the_flag(capsys):
    from ratrain.cli import main

    assert main(["simulate", "--model", "tiny", "--glob", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ratrain simulate: error: unrecognized arguments: --glob 8")
    assert "did you mean --global-batch" in err and err.count("\n") == 1
    assert main(["simulate", "--model", "tiny", "--globl-batch", "8"]) == 2
    assert "did you mean --global-batch" in capsys.readouterr().err


def test_no_command_doc_or_test_uses_an_abbreviated_flag():
    """Every --flag written in the repository's code, docs and scripts is a whole flag of
    some ratrain command, or no prefix of one (another program's flag)."""
    import argparse
    import re
    import subprocess

    from ratrain.cli import COMMANDS, _build_parser

    flags: set[str] = set()

    def collect(p: argparse.ArgumentParser) -> None:
        for a in p._actions:
            flags.update(o for o in a.option_strings if o.startswith("--"))
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    collect(sub)

    for c in COMMANDS:
        collect(_build_parser([c])[0])
    repo = AUDIT_PATH.parents[1]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        text=True,
    ).stdout.split()
    if not listed:
        pytest.skip("not a git checkout")
    bad = []
    for f in listed:
        if not f.endswith((".py", ".md", ".sh", ".yaml", ".toml")) and not f.startswith(".ci"):
            continue
        if f in ("benchmarks/bad_input_audit.py", "tests/cli/test_bad_input_audit.py"):
            continue  # their abbreviations are the cases
        try:
            text = (repo / f).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        for m in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
            word = m.group(0)
            if word not in flags and any(o.startswith(word) for o in flags):
                bad.append(f"{f}: {word}")
    known_other = {"--repeat"}  # benchmarks' own flag (sim_speed.py, tiling_speed.py)
    assert [b for b in bad if b.split(": ")[1] not in known_other] == []
