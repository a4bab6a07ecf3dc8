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
@pytest.mark.parametrize(
    "pp,dp,layout", [(4, 2, "pp-inner"), (2, 4, "pp-inner"), (2, 4, "dp-inner")]
)
def test_links_keep_the_steady_state(schedule, pp, dp, layout, monkeypatch):
    """a100-80g with 2 ranks per node and a slow link between nodes: every plan crosses
    nodes with the pipeline or the DP groups or both (pp=2 x dp=4 dp-inner with both).

    Not here: pp=4 x dp=2 dp-inner, where every hop of the pipeline crosses nodes and each
    stage's egress carries its sends both ways at a fair share. With receives posted one
    ahead (`ratrain.schedule.rendezvous.post_receives_ahead`) the two directions' sends
    overlap by amounts that drift from one microbatch to the next (the tiny model at this
    rate: no repeat of any length up to 12 microbatches between 30 and 80), so no short
    step repeats and the evaluator simulates it in full."""
    monkeypatch.setattr(steady, "MIN_SAVING", 1)  # extrapolate even where it saves little
    pl = dataclasses.replace(load("a100-80g"), units_per_node=2, inter_node=Link(2e8, 1e-5, 0.8))
    plan = Plan(
        pp=pp,
        dp=dp,
        global_batch=dp * (MIN_MICROBATCHES + 7),
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


@pytest.mark.timeout(240)
def test_a_step_that_never_repeats_is_not_extrapolated(monkeypatch):
    """pp=4 x dp=2 dp-inner on the same links (the case the test above leaves out): its
    steps grow by different amounts per 4 microbatches, so the extrapolation must refuse
    it rather than claim a period."""
    monkeypatch.setattr(steady, "MIN_SAVING", 1)
    pl = dataclasses.replace(load("a100-80g"), units_per_node=2, inter_node=Link(2e8, 1e-5, 0.8))
    plan = Plan(
        pp=4,
        dp=2,
        global_batch=2 * (MIN_MICROBATCHES + 7),
        seq=128,
        rank_layout="dp-inner",
        compute_dtype="fp16",
        grad_dtype="fp16",
    )

    def step_s(m):
        return simulate(TINY, plan.replace(global_batch=2 * m), pl, memory_timeline=False)

    grows = {round(step_s(m + 4).step_time_s - step_s(m).step_time_s, 12) for m in (32, 40, 48)}
    assert len(grows) > 1  # no period of 4 microbatches
    assert extrapolate(plan, lambda p: simulate(TINY, p, pl, memory_timeline=False)) is None
