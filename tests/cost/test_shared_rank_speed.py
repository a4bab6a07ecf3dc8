"""Measured core lending (`compute.shared_rank_speed`): the table loads, processor sharing
follows it, and the planner's bounds stay bounds (the peak speed covers every row, pruning
keeps the exhaustive best)."""

import itertools
from dataclasses import replace

import pytest
import yaml

from _planner import TINY, exhaustive, small_cap
from ratrain.config import Plan
from ratrain.cost import CostModel
from ratrain.cost.sharing import peak_speed, shared_speed
from ratrain.errors import RatrainError
from ratrain.planner import search
from ratrain.planner.evaluate import usable_bytes
from ratrain.planner.space import Request
from ratrain.planner.time_bound import overheads, step_time_lower_bound_s, unit_times
from ratrain.platforms.load import PRESETS_DIR, load
from ratrain.sim import simulate

# Not monotone in b on purpose (4 ranks: 2 busy measured faster than 1): noise can do that,
# and the bound must still hold. (4, 3) is below the all-busy speed: floored there.
TABLE = ((2, 1, 0.97), (3, 1, 0.83), (3, 2, 0.74), (4, 1, 0.71), (4, 2, 0.78), (4, 3, 0.40))
CPU = replace(load("cpu-local"), waiting_ranks_lend_cores=True)
MEASURED = replace(CPU, shared_rank_speed=TABLE)


def _write(tmp_path, rows):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["compute"]["shared_rank_speed"] = {"value": rows, "note": "measured: test rows"}
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_the_table_loads_with_its_note(tmp_path):
    p = load(str(_write(tmp_path, [list(r) for r in reversed(TABLE)])))
    assert p.shared_rank_speed == TABLE  # sorted, counts as ints
    assert p.notes["compute.shared_rank_speed"].startswith("measured")


@pytest.mark.parametrize("rows", [[[2, 2, 0.9]], [[2, 0, 0.9]], [[3, 1.5, 0.9]], [[2, 1]]])
def test_bad_rows_are_one_line_errors(tmp_path, rows):
    with pytest.raises(RatrainError, match="shared_rank_speed") as e:
        load(str(_write(tmp_path, rows)))
    assert "\n" not in str(e.value)


def test_sharing_follows_the_table():
    for w, b, v in TABLE:
        full = shared_speed(MEASURED, w, w)
        assert shared_speed(MEASURED, w, b) == pytest.approx(max(v, full))
    assert shared_speed(MEASURED, 4, 3) == shared_speed(MEASURED, 4, 4)  # floored
    for w in (2, 3, 4):  # every rank busy: the all-busy speed, table or not
        assert shared_speed(MEASURED, w, w) == shared_speed(CPU, w, w)
    # A node size the table lacks keeps the formula.
    assert shared_speed(MEASURED, 6, 2) == shared_speed(CPU, 6, 2)
    # Without lending turned on, the table changes nothing.
    off = replace(MEASURED, waiting_ranks_lend_cores=False)
    assert shared_speed(off, 4, 1) == shared_speed(off, 4, 4)


def test_peak_speed_bounds_every_row():
    for w in (1, 2, 3, 4, 6):
        top = peak_speed(MEASURED, w)
        assert all(top >= shared_speed(MEASURED, w, b) for b in range(1, w + 1))
    assert peak_speed(MEASURED, 4) == pytest.approx(0.78)  # the 2-busy row, not the 1-busy
    for pp, dp in ((1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (4, 1)):
        plan = Plan(pp=pp, dp=dp, global_batch=2 * dp, seq=128)
        peak = CostModel(TINY, plan, MEASURED, speed="peak").speed
        w, tokens = pp * dp, plan.micro_batch * plan.seq  # the speeds the plan runs at
        assert all(peak >= shared_speed(MEASURED, w, b, None, tokens) for b in range(1, w + 1))


def test_step_bound_never_exceeds_the_simulation_with_the_table():
    checked = 0
    for pp, dp, m, sched, rec in itertools.product(
        (1, 2, 3, 4), (1, 2), (1, 3, 6), ("baseline", "gpu-style", "ratrain"), ("none", "full")
    ):
        if pp * dp > 4:
            continue
        plan = Plan(pp=pp, dp=dp, global_batch=dp * m, seq=128, schedule=sched, recompute=rec)
        ut = unit_times(TINY, MEASURED, 1, 128, "fp32")
        over = overheads(TINY, plan, MEASURED)
        lb = step_time_lower_bound_s(plan.blocks_per_stage(TINY), m, ut, plan.recompute, over)
        step = simulate(TINY, plan, MEASURED, memory_timeline=False).step_time_s
        assert lb <= step * (1 + 1e-12), (plan, lb, step)
        checked += 1
    assert checked > 50


@pytest.mark.slow  # an exhaustive search: about 50 s on a slow 2-core machine
@pytest.mark.timeout(240)
def test_pruning_never_drops_the_exhaustive_best_with_the_table():
    cap = replace(
        small_cap(2_800_000, platform="cpu-local"),
        eager_kernels=False,
        waiting_ranks_lend_cores=True,
        shared_rank_speed=TABLE,
    )
    req = Request(TINY, cap, 4, 4, 128)
    want, feasible, infeasible = exhaustive(req)
    assert feasible and infeasible
    pruned = search(req, top=1)
    assert pruned.best.tokens_per_s == pytest.approx(want, rel=1e-12)
    assert all(p <= usable_bytes(req) for p in pruned.best.peak_memory_bytes)
