"""Core lending measured per burst and rank speed per microbatch size: a rank's speed while
others wait depends on how long each computes between waits (`compute.shared_rank_speed`
rows with a burst column), and a rank of several threads splits a kernel over more tokens
better (`compute.rank_speed_tokens`). The tables load (old 3-column rows too), the cost
model and the simulator follow them, and the planner's peak speed still bounds them."""

import dataclasses
import math

import pytest
import yaml

from ratrain.config import Plan
from ratrain.cost import CostModel
from ratrain.cost.measured import compute_speed
from ratrain.cost.sharing import bursts, peak_speed, shared_speed
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.platforms.load import PRESETS_DIR, load
from ratrain.schedule.ir import Action, Op, Resource, Schedule
from ratrain.sim.sharing import node_sharing, run_shared

BASE = dataclasses.replace(
    load("cpu-local"),
    waiting_ranks_lend_cores=True,
    rank_speed=((1, 1.5), (2, 0.9), (4, 0.45)),
    rank_speed_tokens=(),
    shared_rank_speed=(),
)
# 2 ranks: one of them busy runs at 0.95 when each computes 10 ms between waits, 1.2 at
# 100 ms (both above the all-busy speed 0.9, so no floor applies).
ROWS = ((2, 1, 0.95, 0.01), (2, 1, 1.2, 0.1))
BURSTY = dataclasses.replace(BASE, shared_rank_speed=ROWS)
TOKENS = ((1, 128, 1.4), (1, 512, 1.7))
THREADED = dataclasses.replace(BASE, rank_speed_tokens=TOKENS)
TINY = get_preset("tiny")


def _write(tmp_path, key, rows):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["compute"][key] = {"value": rows, "note": "measured: test rows"}
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_burst_rows_load_sorted(tmp_path):
    p = load(str(_write(tmp_path, "shared_rank_speed", [list(r) for r in reversed(ROWS)])))
    assert p.shared_rank_speed == ROWS
    old = load(str(_write(tmp_path, "shared_rank_speed", [[2, 1, 0.9]])))
    assert old.shared_rank_speed == ((2, 1, 0.9),)


@pytest.mark.parametrize(
    "key,rows",
    [
        ("shared_rank_speed", [[2, 1, 0.9, 0.0]]),
        ("shared_rank_speed", [[2, 1, 0.9, 0.01], [2, 1, 0.9]]),
        ("rank_speed_tokens", [[1, 0.5, 1.4]]),
        ("rank_speed_tokens", [[1, 128]]),
    ],
)
def test_bad_rows_are_one_line_errors(tmp_path, key, rows):
    with pytest.raises(RatrainError, match=key) as e:
        load(str(_write(tmp_path, key, rows)))
    assert "\n" not in str(e.value)


def test_tokens_rows_load(tmp_path):
    p = load(str(_write(tmp_path, "rank_speed_tokens", [[1, 512, 1.7], [1, 128, 1.4]])))
    assert p.rank_speed_tokens == TOKENS
    assert p.notes["compute.rank_speed_tokens"].startswith("measured")


def test_shared_speed_interpolates_in_log_burst():
    assert bursts(BURSTY, 2) == (0.01, 0.1) and bursts(BURSTY, 4) == ()
    assert shared_speed(BURSTY, 2, 1, 0.01) == pytest.approx(0.95)
    assert shared_speed(BURSTY, 2, 1, 0.001) == pytest.approx(0.95)  # held at the ends
    assert shared_speed(BURSTY, 2, 1, 1.0) == pytest.approx(1.2)
    mid = math.sqrt(0.01 * 0.1)
    assert shared_speed(BURSTY, 2, 1, mid) == pytest.approx((0.95 + 1.2) / 2)
    assert shared_speed(BURSTY, 2, 1) == pytest.approx(1.2)  # no burst: the slowest change
    assert peak_speed(BURSTY, 2) == pytest.approx(1.2)
    assert shared_speed(BURSTY, 2, 2, 0.01) == compute_speed(BURSTY, 2)  # all busy


def test_the_simulator_rates_each_action_at_its_own_burst():
    plan = Plan(pp=2, dp=1, global_batch=2, seq=128)
    cost = CostModel(TINY, plan, BURSTY)
    sh = node_sharing(cost)
    assert sh.bursts == (0.01, 0.1) and sh.speed == cost.speed
    f0, f1 = Action(Op.F, 0, (1,), 0), Action(Op.F, 1, (2,), 0)
    sch = Schedule([[f0], [f1]])
    sch.add_dep(f1, f0)  # one after the other: each alone on the node
    res = [Resource.COMPUTE] * 2
    full = cost.speed
    for one_thread, speed in ((0.01, 0.95), (0.2, 1.2), (math.sqrt(0.001), (0.95 + 1.2) / 2)):
        d = one_thread / full  # its time at the all-busy speed
        _, _, end = run_shared(sch, [d, d], res, [0.0, 0.0], sh)
        assert end[0] == pytest.approx(one_thread / speed, rel=1e-12)
        assert end[1] == pytest.approx(2 * one_thread / speed, rel=1e-12)


def test_rank_speed_follows_the_microbatch_tokens():
    assert compute_speed(THREADED, 1, 128) == pytest.approx(1.4)
    assert compute_speed(THREADED, 1, 64) == pytest.approx(1.4)
    assert compute_speed(THREADED, 1, 256) == pytest.approx(1.55)
    assert compute_speed(THREADED, 1, 4096) == pytest.approx(1.7)
    assert compute_speed(THREADED, 1) == compute_speed(BASE, 1)  # no tokens: rank_speed
    assert compute_speed(THREADED, 2, 512) == compute_speed(BASE, 2)  # no rows for k = 2
    small = CostModel(TINY, Plan(micro_batch=1, global_batch=1, seq=128), THREADED)
    large = CostModel(TINY, Plan(micro_batch=4, global_batch=4, seq=128), THREADED)
    assert (small.speed, large.speed) == pytest.approx((1.4, 1.7))
    a = Action(Op.F, 0, (1,), 0)

    def kernels_s(platform, mb):  # the part of F's time that follows the speed
        c = CostModel(TINY, Plan(micro_batch=mb, global_batch=mb, seq=128), platform).action(a)
        return c.time_s - c.fixed_s

    ratio = kernels_s(THREADED, 4) / kernels_s(THREADED, 1)
    plain = kernels_s(BASE, 4) / kernels_s(BASE, 1)
    assert ratio == pytest.approx(plain * 1.4 / 1.7, rel=1e-9)
    assert peak_speed(THREADED, 1, 512) >= 1.7
