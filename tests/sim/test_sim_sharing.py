"""Processor sharing in the simulator (`ratrain.sim.sharing`, `ratrain.cost.sharing`): a
rank computes faster while its node's other ranks wait; by hand on two-stage schedules,
against the measured table's own rows, unchanged where no cores are shared, independent of
the order of simultaneous events, and the planner's steady-state shortcut still exact."""

import dataclasses
import heapq
import itertools

import pytest
from test_sim_steady import _plans

from ratrain.config import Plan
from ratrain.cost import CostModel
from ratrain.cost.measured import compute_speed
from ratrain.cost.sharing import peak_speed, shared_speed, solo_speed
from ratrain.models.presets import get_preset
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.schedule.ir import Action, Op, Resource, Schedule
from ratrain.sim import simulate, steady
from ratrain.sim.engine import run_flat
from ratrain.sim.flat import graph
from ratrain.sim.sharing import _SharingEngine, node_sharing, run_shared
from ratrain.sim.simulate import _charge_stolen_compute
from ratrain.sim.steady import MIN_MICROBATCHES, extrapolate

# cpu-local (2 cores; rank_speed rows measured) with processor sharing on, by its formula
# (the measured shared_rank_speed table left out: the formula is what is checked here)
CPU = dataclasses.replace(load("cpu-local"), waiting_ranks_lend_cores=True, shared_rank_speed=())
TINY = get_preset("tiny")


def _cost(pp, dp, platform=CPU):
    return CostModel(TINY, Plan(pp=pp, dp=dp, global_batch=2 * dp, seq=128), platform)


def test_speed_model_against_the_tables_own_rows():
    table = dict(CPU.rank_speed)
    # 4 one-thread ranks, 2 of them busy: the k = 4 aggregate shared by 2, against the
    # speed measured with 2 of 4 ranks busy (0.93 vs 0.96 on the reference machine).
    assert shared_speed(CPU, 4, 2) == pytest.approx(4 * table[4] / 2)
    # The shipped table's row for a slowly changing busy set (its longest burst) is what
    # the formula describes: within the machine's window-to-window noise (about ±10%).
    shipped = load("cpu-local")
    assert shared_speed(CPU, 4, 2) == pytest.approx(shared_speed(shipped, 4, 2), rel=0.15)
    for w in (1, 2, 4):
        assert shared_speed(CPU, w, w) == compute_speed(CPU, w)  # all busy: the table
        speeds = [shared_speed(CPU, w, b) for b in range(1, w + 1)]
        assert speeds == sorted(speeds, reverse=True)
        assert peak_speed(CPU, w) == speeds[0]
    assert solo_speed(CPU, 2) == solo_speed(CPU, 4) == 1.0  # one thread: the reference
    assert shared_speed(CPU, 4, 1) == 1.0  # the aggregate 1.82 is capped by one thread
    assert shared_speed(CPU, 1, 1) == table[1]  # one rank with both cores' threads


def _two_stage(dep: bool):
    f0, f1 = Action(Op.F, 0, (1,), 0), Action(Op.F, 1, (2,), 0)
    sch = Schedule([[f0], [f1]])
    if dep:
        sch.add_dep(f1, f0)
    return sch


def test_two_stages_by_hand():
    cost = _cost(2, 1)
    sh = node_sharing(cost)
    busy, alone = compute_speed(CPU, 2), shared_speed(CPU, 2, 1)  # 0.92, 1.0
    res = [Resource.COMPUTE] * 2
    # Both compute from 0: stage 0 (1 s of work) at the all-busy speed; then stage 1,
    # alone, does its remaining 1 s of work at the solo speed.
    _, start, end = run_shared(_two_stage(False), [1.0, 2.0], res, [0.0, 0.0], sh)
    assert start == [0.0, 0.0]
    assert end[0] == 1.0
    assert end[1] == pytest.approx(1.0 + 1.0 * busy / alone, rel=1e-15)
    # One after the other: each alone the whole time, at the cap.
    _, start, end = run_shared(_two_stage(True), [1.0, 2.0], res, [0.0, 0.0], sh)
    assert end[0] == pytest.approx(busy / alone, rel=1e-15)
    assert start[1] == end[0] and end[1] == pytest.approx(3.0 * busy / alone, rel=1e-15)
    # A fixed cost per action does not speed up: stage 1's 2 s hold 0.5 s of it, spread
    # evenly over the action (its remaining 1 s holds 0.25 s).
    _, _, end = run_shared(_two_stage(False), [1.0, 2.0], res, [0.0, 0.5], sh)
    assert end[1] == pytest.approx(1.0 + 0.75 * busy / alone + 0.25, rel=1e-15)


def test_two_stages_of_two_replicas_by_hand():
    # pp=2 x dp=2 on 2 cores: a stage alone has 2 of the 4 ranks busy, which share the
    # k = 4 aggregate: twice the all-busy speed.
    sh = node_sharing(_cost(2, 2))
    assert sh.neighbours == (((0, 2), (1, 2)), ((0, 2), (1, 2)))
    assert sh.rates[0][0][2] == pytest.approx(2.0) and sh.rates[0][0][4] == 1.0
    assert sh.bursts == ()  # the formula: one row of rates whatever the action
    res = [Resource.COMPUTE] * 2
    _, _, end = run_shared(_two_stage(True), [1.0, 2.0], res, [0.0, 0.0], sh)
    assert end == pytest.approx([0.5, 1.5], rel=1e-15)


@pytest.mark.parametrize("platform", ["a100-80g", "mt3000"])
def test_no_sharing_is_the_plain_engine(platform):
    pl = load(platform)
    for pp, dp in ((1, 1), (2, 2), (4, 1)):
        assert node_sharing(_cost(pp, dp, pl)) is None
    assert node_sharing(_cost(1, 1)) is None  # one rank on cpu-local: always alone


def _flat(plan, platform=CPU):
    cost = CostModel(TINY, plan, platform)
    sch = build_schedule(TINY, plan)
    acts = [a for st in sch.stages for a in st]
    costs = [cost.action(a) for a in acts]
    dur, res = [c.time_s for c in costs], [cost.resource(a) for a in acts]
    _charge_stolen_compute(graph(sch), cost, dur, res)  # as simulate does
    return cost, sch, dur, res, costs


def test_replicas_always_busy_together_change_nothing():
    # pp=1 x dp=2: both ranks compute at the same moments, always at the all-busy speed.
    plan = Plan(pp=1, dp=2, global_batch=8, seq=128, shard_optimizer=True)
    cost, sch, dur, res, costs = _flat(plan)
    sh = node_sharing(cost)
    assert sh is not None
    assert run_shared(sch, dur, res, [c.fixed_s for c in costs], sh) == run_flat(sch, dur, res)


class _Logged(_SharingEngine):
    def run(self):
        self.order = []
        super().run()

    def _complete(self, i):
        self.order.append(i)
        super()._complete(i)


class _Reversed(_Logged):
    """Simultaneous events popped in the opposite order."""

    def _push(self, t, i):
        key = -self.seq - 10  # never the "no live entry" marker, -1
        heapq.heappush(self.heap, (t, key, i))
        self.valid[i] = key
        self.seq += 1


@pytest.mark.parametrize(
    "pp,dp,m,sched", [(2, 2, 4, "ratrain"), (4, 1, 6, "gpu-style"), (2, 1, 5, "baseline")]
)
def test_simultaneous_events_in_any_order(pp, dp, m, sched):
    plan = Plan(pp=pp, dp=dp, global_batch=dp * m, seq=128, schedule=sched)
    cost, sch, dur, res, costs = _flat(plan)
    fixed, sh = [c.fixed_s for c in costs], node_sharing(cost)
    # Equal durations everywhere make many events coincide.
    dur = [0.1 if r is Resource.COMPUTE else 0.03 * (d > 0) for d, r in zip(dur, res, strict=True)]
    ref, eng = _Logged(sch, dur, res, fixed, sh), _Reversed(sch, dur, res, fixed, sh)
    ref.run()
    eng.run()
    assert ref.order != eng.order  # the events were handled in another order
    want = (ref.issue, ref.start, ref.end)
    assert want == run_shared(sch, dur, res, fixed, sh)
    assert (eng.issue, eng.start, eng.end) == want
    assert want != run_flat(sch, dur, res)  # sharing changed something


def test_sharing_only_speeds_up_and_the_whole_plan_simulates():
    for pp, dp in itertools.product((2, 4), (1, 2)):
        if pp * dp > 4:
            continue
        plan = Plan(pp=pp, dp=dp, global_batch=4 * dp, seq=128)
        cost, sch, dur, res, costs = _flat(plan)
        plain = run_flat(sch, dur, res)[2]
        shared = simulate(TINY, plan, CPU, memory_timeline=False)
        assert 0 < shared.step_time_s < max(plain)
        for e in shared.events:  # never slower than all-busy, never faster than the peak
            i = sch.stages[e.stage].index(e.action) + sum(len(s) for s in sch.stages[: e.stage])
            if res[i] is Resource.COMPUTE:
                took_s = e.end_s - e.start_s
                fast = costs[i].fixed_s + (dur[i] - costs[i].fixed_s) * cost.speed / peak_speed(
                    CPU, cost.ranks_on_node
                )
                assert fast * (1 - 1e-12) <= took_s <= dur[i] * (1 + 1e-12)


def test_steady_state_shortcut_with_shared_cores(monkeypatch):
    monkeypatch.setattr(steady, "MIN_SAVING", 1)

    def short(p):
        return simulate(TINY, p, CPU, memory_timeline=False)

    checked = 0
    for plan in itertools.islice(_plans(MIN_MICROBATCHES + 7), 0, None, 3):
        got = extrapolate(plan, short)
        if got is None:
            continue
        full = simulate(TINY, plan, CPU, memory_timeline=False)
        assert got.step_time_s == pytest.approx(full.step_time_s, rel=1e-9, abs=0)
        for u, v in zip(got.utilization, full.utilization, strict=True):
            assert u == pytest.approx(v, rel=1e-8, abs=1e-12)
        checked += 1
    assert checked >= 4


def _sync_beside_compute():
    """Stage 0 syncs across the link (1 s alone) while stage 1 computes 2 s of work: the
    two ranks share the cores, and the sync holds stage 0's egress and ingress."""
    from ratrain.cost.links import LinkUse

    sync, f = Action(Op.GRAD_SYNC, 0, (1,)), Action(Op.F, 1, (2,), 0)
    sch = Schedule([[sync], [f]])
    return sch, [Resource.DP_NET, Resource.COMPUTE], LinkUse([(0, 1), ()], 4)


@pytest.mark.parametrize("per_byte,busy_then", [(1e-6, 2.0), (2e-6, 3.0)])
def test_a_transfer_takes_compute_from_the_shared_cores_by_hand(per_byte, busy_then):
    """A link carrying 1 MB/s at 1e-6 compute seconds per byte takes one rank's worth of
    the cores (half per link held, both held by the sync): stage 1 computes as if both
    ranks were busy while the sync runs, then alone; at 2e-6, two ranks' worth: past the
    node's 2 ranks, the all-busy aggregate shared by 3."""
    from ratrain.platforms import Link

    pl = dataclasses.replace(
        CPU,
        inter_node=Link(1e6, 0.0, 1.0),
        link_cpu_s_per_byte=per_byte,
        units_per_node=1,
        units_sharing_cores=2,
    )
    sh = node_sharing(_cost(2, 1, pl))
    assert sh.link_load == pytest.approx(0.5 * per_byte * 1e6)
    alone = sh.rates[1][0][1]  # stage 1 alone on the cores, over the all-busy speed
    sch, res, links = _sync_beside_compute()
    _, _, end = run_shared(sch, [1.0, 2.0], res, [0.0, 0.0], sh, links)
    during = 2.0 / busy_then  # the all-busy aggregate of the 2 ranks, shared by busy_then
    assert end[0] == 1.0
    assert end[1] == pytest.approx(1.0 + (2.0 - during) / alone, rel=1e-12)
    # no load per byte: stage 1 alone from the start
    sh0 = node_sharing(_cost(2, 1, dataclasses.replace(pl, link_cpu_s_per_byte=0.0)))
    _, _, end = run_shared(sch, [1.0, 2.0], res, [0.0, 0.0], sh0, links)
    assert end[1] == pytest.approx(2.0 / alone, rel=1e-12)


def _emulated(nodes, r, mbit):
    from ratrain.bench.platform import base_platform_dict, link_platform
    from ratrain.platforms.load import from_dict

    return from_dict(link_platform(base_platform_dict("cpu-local"), nodes, r, mbit), "emulated")


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h2"])
def test_the_links_load_slows_an_emulated_pipeline(pipeline):
    """4 nodes of 1 rank sharing one machine's cores (`ratrain emulate`'s), links of 50
    Mbit/s: a byte carried costs compute, so the step is longer."""
    pl = _emulated(4, 1, 50.0)
    assert pl.link_cpu_s_per_byte > 0
    free = dataclasses.replace(pl, link_cpu_s_per_byte=0.0)
    plan = Plan(pp=4, global_batch=8, seq=128, pipeline=pipeline)
    slow = simulate(TINY, plan, pl, memory_timeline=False).step_time_s
    assert slow > simulate(TINY, plan, free, memory_timeline=False).step_time_s


@pytest.mark.parametrize(
    "nodes,r,mbit,kw",
    [(2, 2, 100.0, {"pp": 2, "dp": 2, "rank_layout": "pp-inner"}), (2, 1, 50.0, {"pp": 2})],
)
def test_the_links_load_keeps_the_steady_state(nodes, r, mbit, kw, monkeypatch):
    """Emulated plans whose short step repeats (zb-h1, the pipeline or the DP groups across
    the links) still repeat with the links' load, and give the full simulation's step.
    (The 4 x 1 pp=4 plans above repeat within no short step, with the load or without.)"""
    monkeypatch.setattr(steady, "MIN_SAVING", 1)
    pl = _emulated(nodes, r, mbit)
    plan = Plan(global_batch=kw.get("dp", 1) * (MIN_MICROBATCHES + 7), seq=128, **kw)
    plan = plan.replace(pipeline="zb-h1")
    got = extrapolate(plan, lambda p: simulate(TINY, p, pl, memory_timeline=False))
    assert got is not None, "fell back to the full simulation"
    full = simulate(TINY, plan, pl, memory_timeline=False)
    assert got.step_time_s == pytest.approx(full.step_time_s, rel=1e-9, abs=0)
