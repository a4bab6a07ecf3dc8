"""Headroom: the part of the usable memory (less the workspace) a plan keeps free for the
allocator's fragmentation, per platform (`headroom_fraction`, each preset's sourced or
assumed) and per command (`--headroom`)."""

from __future__ import annotations

import json

import pytest

from _planner import TINY, small_cap
from ratrain.cli import main
from ratrain.errors import RatrainError
from ratrain.planner import Request, search
from ratrain.planner.evaluate import usable_bytes
from ratrain.platforms.load import PRESETS_DIR, load


@pytest.mark.parametrize(
    "name, fraction, kind",
    [("a100-80g", 0.15, "assumed"), ("h100-80g", 0.15, "assumed"), ("mt3000", 0.0, "assumed"),
     ("cpu-local", 0.0, "measured")],
)  # fmt: skip
def test_each_preset_says_where_its_headroom_comes_from(name, fraction, kind):
    p = load(name)
    assert p.headroom_fraction == fraction
    assert p.notes["headroom_fraction"].startswith(kind)
    room = p.usable_memory_bytes - p.workspace_bytes
    assert p.headroom_bytes == int(fraction * room)
    assert p.plan_limit_bytes == room - p.headroom_bytes


def test_the_search_keeps_the_headroom_free():
    plat = small_cap()  # the tiny model's plans straddle its cap
    free = Request(TINY, plat, 4, 8, 128)
    kept = Request(TINY, plat.__class__(**{**plat.__dict__, "headroom_fraction": 0.2}), 4, 8, 128)
    assert usable_bytes(kept) == usable_bytes(free) - int(0.2 * usable_bytes(free))
    best_free, best_kept = search(free).ranked[0], search(kept).ranked[0]
    assert max(best_kept.peak_memory_bytes) <= usable_bytes(kept)
    # The headroom takes memory a plan without it used: that plan no longer fits.
    assert max(best_free.peak_memory_bytes) > usable_bytes(kept)
    assert best_kept.step_time_s >= best_free.step_time_s


def _platform_file(tmp_path, line: str) -> str:
    text = (PRESETS_DIR / "mt3000.yaml").read_text()
    text = text.replace("headroom_fraction:\n  value: 0.0\n", f"headroom_fraction:\n  {line}\n")
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("line", ["value: 1.5", "value: -0.1", "value: lots"])
def test_a_platform_file_with_a_bad_headroom_is_refused(tmp_path, line):
    with pytest.raises(RatrainError, match="headroom_fraction"):
        load(_platform_file(tmp_path, line))


_PLAN = ["plan", "--model", "llama2-7b", "--platform", "a100-80g", "--clusters", "8"]
_PLAN += ["--global-batch", "64", "--seq", "4096", "--json", "--quiet"]


def test_plan_json_carries_the_headroom_and_the_flag_overrides_it(capsys):
    assert main([*_PLAN, "--time-budget", "0.5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plat = load("a100-80g")
    assert doc["headroom_bytes"] == plat.headroom_bytes > 0
    assert doc["limit_bytes"] == plat.plan_limit_bytes
    assert max(doc["predicted"]["peak_memory_bytes"]) <= doc["limit_bytes"]
    assert main([*_PLAN, "--time-budget", "0.5", "--headroom", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["headroom_bytes"] == 0
    assert doc["limit_bytes"] == plat.usable_memory_bytes - plat.workspace_bytes


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan", "ten"])
def test_a_bad_headroom_flag_is_one_line_and_exit_2(capsys, value):
    assert main([*_PLAN, "--headroom", value]) == 2
    err = capsys.readouterr().err
    assert "--headroom" in err and "fraction from 0 to 0.9" in err and "Traceback" not in err


def test_an_infeasible_answer_names_the_headroom(capsys, tmp_path):
    args = ["plan", "--model", "llama2-70b", "--platform", "a100-80g", "--clusters", "8"]
    args += ["--global-batch", "64", "--seq", "4096", "--time-budget", "0.5"]
    assert main(args) == 2
    assert "headroom kept free (--headroom)" in capsys.readouterr().out
