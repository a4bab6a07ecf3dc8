"""`ratrain emulate` and its old name `ratrain cluster` (an alias), and `ratrain link-probe`'s
one-line refusals outside a torchrun job of an even number of nodes. Needs no root: nothing
here brings up a network namespace (`tests/launch/test_emulate.py` does)."""

from __future__ import annotations

import pytest

from _cli import one_line_error
from ratrain.cli import main


def test_emulate_help_and_its_alias_cluster(capsys):
    assert main(["emulate", "--help"]) == 0
    emulate = capsys.readouterr().out
    assert "--link-mbit" in emulate and "--ranks-per-node" in emulate
    assert main(["cluster", "--help"]) == 0
    cluster = capsys.readouterr().out
    assert "`ratrain cluster` is an alias of `ratrain emulate`" in cluster
    assert cluster == emulate  # one command under two names
    assert main(["--help"]) == 0
    assert "emulate (cluster)" in capsys.readouterr().out


def test_the_alias_takes_the_same_flags(capsys):
    one_line_error(capsys, ["cluster", "--nodes", "0"], "--nodes", "positive integer")


@pytest.fixture
def no_launcher(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)


def test_link_probe_outside_torchrun_is_one_line(tmp_path, capsys, no_launcher):
    out = tmp_path / "links.json"
    line = one_line_error(capsys, ["link-probe", str(out), "--ranks-per-node", "2"], "torchrun")
    assert line.startswith("ratrain link-probe: error: ")
    assert not out.exists()


@pytest.mark.parametrize("world,per_node", [(2, 2), (6, 2), (3, 2), (4, 4)])
def test_link_probe_needs_an_even_number_of_nodes(
    tmp_path, capsys, monkeypatch, no_launcher, world, per_node
):
    """Refused before any process group is made: every rank says the same line."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    out = tmp_path / "links.json"
    argv = ["link-probe", str(out), "--ranks-per-node", str(per_node)]
    one_line_error(capsys, argv, "even number of nodes", f"got {world} ranks")
    assert not out.exists()
