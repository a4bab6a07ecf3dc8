"""`ratrain simulate --plot` for every pipeline: the zero-bubble ones split each backward
into B_IN (BI) and B_W (BW) passes, the V ones place two chunks on each stage."""

from __future__ import annotations

import pytest

from ratrain.cli import main
from ratrain.config import PIPELINES, V_PIPELINES
from ratrain.schedule.ir import Op
from ratrain.sim.plot import OP_COLOURS

TINY = ["simulate", "--model", "tiny", "--platform", "cpu-local", "--pp", "2"]
TINY += ["--micro-batch", "1", "--global-batch", "4"]


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h1", "zb-h2", "zb-v", "1f1b-v"])
def test_plot_of_every_pipeline_writes_a_png(tmp_path, capsys, pipeline):
    png = tmp_path / f"{pipeline}.png"
    assert main([*TINY, "--pipeline", pipeline, "--plot", str(png)]) == 0
    assert f"plot written to {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_pipeline_is_covered_and_every_op_has_a_colour():
    assert set(PIPELINES) == {"1f1b", "zb-h1", "zb-h2", "zb-v", "1f1b-v"}
    assert {op.value for op in Op} <= set(OP_COLOURS)
    assert OP_COLOURS["BI"] != OP_COLOURS["BW"] and OP_COLOURS["B"] not in (
        OP_COLOURS["BI"],
        OP_COLOURS["BW"],
    )


@pytest.mark.parametrize("pipeline", V_PIPELINES)
def test_the_second_chunk_of_each_stage_is_told_apart(pipeline):
    from ratrain.config import Plan
    from ratrain.models import get_preset
    from ratrain.platforms import load
    from ratrain.sim import simulate
    from ratrain.sim.plot import second_chunk_units

    spec = get_preset("tiny")
    plan = Plan(pp=2, dp=1, micro_batch=1, global_batch=4, seq=16, pipeline=pipeline)
    r = simulate(spec, plan, load("cpu-local"))
    second = second_chunk_units(r)
    expected = {u for c in (2, 3) for u in plan.chunk_units(spec, c)}
    assert second == expected and second  # chunks 2 and 3 of 4: stage 1's then stage 0's
    plan1 = Plan(pp=2, dp=1, micro_batch=1, global_batch=4, seq=16)
    assert second_chunk_units(simulate(spec, plan1, load("cpu-local"))) == set()
