"""Every command's --help renders (argparse formats each help string with %: a stray
percent sign in one raises only when help is asked for)."""

from __future__ import annotations

import pytest

from ratrain.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_renders(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ratrain") and command in out
