"""The steady-state extrapolation with links between nodes held (`ratrain.cost.links`): a
pipeline and its DP groups crossing nodes, the transfers and syncs sharing the links,
still repeat within one short run and give the full simulation's result."""

from __future__ import annotations

import dataclasses

import pytest

from _steady import assert_same_result
from ratrain.config import Plan
from ratrain.cost.links import crosses_nodes
from ratrain.cost.model import CostModel
from ratrain.models.presets import get_preset
from ratrain.platforms import Link
from ratrain.platforms.load import load
from ratrain.sim import simulate, steady
from ratrain.sim.steady import MIN_MICROBATCHES, extrapolate

TINY = get_preset("tiny")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("schedule", ["gpu-style", "ratrain"])
@pytest.mark.parametrize("layout", ["pp-inner", "dp-inner"])
def test_links_keep_the_steady_state(schedule, layout, monkeypatch):
    """a100-80g with 2 ranks per node and a slow link between nodes, pp=4 x dp=2: every
    layout crosses nodes with the pipeline or the DP groups or both."""
    monkeypatch.setattr(steady, "MIN_SAVING", 1)  # extrapolate even where it saves little
    pl = dataclasses.replace(load("a100-80g"), units_per_node=2, inter_node=Link(2e8, 1e-5, 0.8))
    plan = Plan(
        pp=4,
        dp=2,
        global_batch=2 * (MIN_MICROBATCHES + 7),
        seq=128,
        schedule=schedule,
        rank_layout=layout,
        compute_dtype="fp16",
        grad_dtype="fp16",
    )
    assert crosses_nodes(CostModel(TINY, plan, pl))

    def short(p):
        return simulate(TINY, p, pl, memory_timeline=False)

    got = extrapolate(plan, short)
    assert got is not None, "fell back to the full simulation"
    assert_same_result(got, simulate(TINY, plan, pl, memory_timeline=False))
