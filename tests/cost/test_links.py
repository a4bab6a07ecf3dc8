"""Links between nodes with both ends (`ratrain.cost.links`): what each action holds, and
the engines and the checker's dry run holding them."""

from __future__ import annotations

import dataclasses

import pytest

from ratrain.config import Plan
from ratrain.cost.links import egress, ingress, link_use
from ratrain.cost.model import CostModel
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.platforms import Link, load
from ratrain.platforms.load import from_dict
from ratrain.schedule import build_schedule, dry_run
from ratrain.schedule.ir import Op
from ratrain.sim import simulate
from ratrain.sim.engine import replay
from ratrain.sim.flat import graph, run_plain

TINY = get_preset("tiny")


def _platform(units_per_node: int, **kw):
    """a100-80g with `units_per_node` ranks per node and a slow inter-node link, so the
    transfers between nodes are long beside the compute."""
    slow = Link(bandwidth_bytes_per_s=2e6, latency_s=1e-4)
    return dataclasses.replace(
        load("a100-80g"), units_per_node=units_per_node, inter_node=slow, **kw
    )


def _plan(pp: int, dp: int, m: int = 8, **kw) -> Plan:
    return Plan(pp=pp, dp=dp, micro_batch=1, global_batch=m * dp, seq=32, **kw)


def _holds(plan: Plan, platform, posted_ahead: int | None = None):
    """(schedule, graph, links held); `posted_ahead`: that stage posts all its receives
    first (a transfer runs once both ends have posted it, `ratrain.schedule.rendezvous`:
    so its receives can overlap)."""
    sch = build_schedule(TINY, plan)
    if posted_ahead is not None:
        acts = sch.stages[posted_ahead]
        recvs = [a for a in acts if a.op in (Op.RECV_F, Op.RECV_B)]
        sch.stages[posted_ahead] = recvs + [a for a in acts if a not in recvs]
    g = graph(sch)
    return sch, g, link_use(CostModel(TINY, plan, platform), g.acts, g.peer)


def _times(plan: Plan, platform, with_links: bool = True, posted_ahead: int | None = None):
    """The flat engine's (graph, durations, (issue, start, end)) on `plan`'s costs, with
    its links held or, to compare, none."""
    _, g, use = _holds(plan, platform, posted_ahead)
    cost = CostModel(TINY, plan, platform)
    dur = [cost.time_s(a) for a in g.acts]
    res = [cost.resource(a) for a in g.acts]
    return g, dur, run_plain(g, dur, res, use if with_links else None)


def _on_link(g, dur, times, picked) -> tuple[float, float]:
    """(time alone, time busy) of the actions `picked(a)` through one link: the sum of
    their durations alone, and the length of the union of their spans. A link carries
    one at full rate at most, so the first is never above the second."""
    _, start, end = times
    spans = sorted((start[i], end[i]) for i, a in enumerate(g.acts) if picked(a))
    alone = sum(dur[i] for i, a in enumerate(g.acts) if picked(a))
    busy, reach = 0.0, float("-inf")
    for s0, e0 in spans:
        busy += max(0.0, e0 - max(s0, reach))
        reach = max(reach, e0)
    return alone, busy


def _into(stage: int):
    """The transfers into `stage`: activations from the stage before, gradients after."""
    return lambda a: (
        (a.op is Op.SEND_F and a.stage == stage - 1) or (a.op is Op.SEND_B and a.stage == stage + 1)
    )


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h2"])
def test_a_middle_stage_receives_through_one_ingress(pipeline):
    """pp=3, a node per stage, stage 1 posting its receives ahead: the activations from
    stage 0 and the gradients from stage 2 both arrive through stage 1's ingress and share
    it: never more than one link's worth at once; with no link held they overlap at full
    rate each, and the step is shorter."""
    plan = _plan(3, 1, pipeline=pipeline)
    platform = _platform(1)
    _, g, use = _holds(plan, platform, posted_ahead=1)
    for a, h in zip(g.acts, use.holds, strict=True):
        if a.op is Op.SEND_F:
            assert h == (egress(a.stage), ingress(a.stage + 1))
        elif a.op is Op.SEND_B:
            assert h == (egress(a.stage), ingress(a.stage - 1))
        else:
            assert h == ()
    g, dur, shared = _times(plan, platform, posted_ahead=1)
    alone, busy = _on_link(g, dur, shared, _into(1))
    assert alone <= busy * (1 + 1e-9)
    g, dur, free = _times(plan, platform, with_links=False, posted_ahead=1)
    alone0, busy0 = _on_link(g, dur, free, _into(1))
    assert alone0 == alone and alone0 > busy0 * 1.01  # they did overlap
    assert max(shared[2]) > max(free[2])


def test_a_dp_sync_and_a_send_through_one_link_contend():
    """pp=2 x dp=2, a node per rank: stage 1's gradient all-reduces and the gradients it
    sends stage 0 share stage 1's egress (the ratrain schedule syncs a layer while the
    backward goes on): both slowed, never more than the link at once; with no link held
    they ran at once at full rate."""
    plan = _plan(2, 2, m=4, schedule="ratrain")
    platform = _platform(1)
    _, g, use = _holds(plan, platform)
    for a, h in zip(g.acts, use.holds, strict=True):
        if a.op is Op.GRAD_SYNC:
            assert h == (egress(a.stage), ingress(a.stage))
        elif a.op is Op.SEND_B:
            assert h == (egress(1), ingress(0))

    def out_of_1(a):
        return a.stage == 1 and a.op in (Op.GRAD_SYNC, Op.SEND_B)

    g, dur, shared = _times(plan, platform)
    alone, busy = _on_link(g, dur, shared, out_of_1)
    assert alone <= busy * (1 + 1e-9)
    g, dur, free = _times(plan, platform, with_links=False)
    alone0, busy0 = _on_link(g, dur, free, out_of_1)
    assert alone0 - busy0 > 1e-3  # they did overlap, 2 ms of 0.23 s
    # the send beside the sync is slowed, not queued behind it: it starts when issued
    _, start, end = shared
    sends = [i for i, a in enumerate(g.acts) if a.op is Op.SEND_B]
    assert any(end[i] - start[i] > dur[i] * 1.5 for i in sends)
    assert all(abs(start[i] - free[1][i]) < 1e-12 for i in sends[:1])


def test_the_simulator_holds_the_links():
    """`simulate` reads the same link model: on one node per stage the step is the flat
    engine's with links; under processor sharing (cpu-local) the links are shared too."""
    plan = _plan(3, 1)
    res = simulate(TINY, plan, _platform(1))
    assert res.step_time_s == max(_times(plan, _platform(1))[2][2])
    cpu = dataclasses.replace(load("cpu-local"), units_per_node=1, inter_node=Link(1e6, 1e-4))
    plan = _plan(3, 1, pipeline="zb-h2")
    r = simulate(TINY, plan, cpu)
    spans = sorted((e.start_s, e.end_s) for e in r.events if _into(1)(e.action))
    cost = CostModel(TINY, plan, cpu)
    alone = sum(cost.time_s(e.action) for e in r.events if _into(1)(e.action))
    busy, reach = 0.0, float("-inf")
    for s0, e0 in spans:
        busy += max(0.0, e0 - max(s0, reach))
        reach = max(reach, e0)
    assert alone <= busy * (1 + 1e-9)


def test_transfers_inside_a_node_hold_no_link():
    """pp=4 on nodes of 2: the 0-1 and 2-3 boundaries stay in their nodes; only 1-2
    crosses, and with every rank on one node nothing holds a link and nothing changes."""
    plan = _plan(4, 1)
    _, g, use = _holds(plan, _platform(2))
    for a, h in zip(g.acts, use.holds, strict=True):
        crossing = (a.op is Op.SEND_F and a.stage == 1) or (a.op is Op.SEND_B and a.stage == 2)
        assert bool(h) == crossing, a
    assert _holds(plan, _platform(8))[2] is None
    assert _holds(_plan(2, 4), _platform(8))[2] is None


def test_half_duplex_links_are_one_resource():
    plan = _plan(2, 1)
    _, g, use = _holds(plan, _platform(1, link_full_duplex=False))
    held = {a.op: h for a, h in zip(g.acts, use.holds, strict=True) if h}
    assert held[Op.SEND_F] == (0, 1) and held[Op.SEND_B] == (1, 0) and use.count == 2


def _mixed(a):
    if a.op is Op.VIEW_DROP:
        return 0
    return 1 + (3 * a.stage + (a.mb or 0) + 7 * sum(a.units) + len(a.op.value)) % 5


@pytest.mark.parametrize("queue_s", [0.0, 2.5, 1e9])
@pytest.mark.parametrize(
    "pp, dp, upn, kw",
    [
        (3, 1, 1, {}),
        (4, 1, 2, {"schedule": "gpu-style"}),
        (2, 2, 1, {"schedule": "ratrain"}),
        (4, 2, 1, {"schedule": "ratrain", "shard_optimizer": True}),
        (3, 2, 2, {"schedule": "baseline", "rank_layout": "dp-inner"}),
        (3, 1, 1, {"pipeline": "zb-h2"}),
    ],
)
def test_the_engines_and_the_dry_run_agree_with_links(pp, dp, upn, kw, queue_s):
    """The flat engine, the reference engine and the checker's dry run hold the same links
    by the same rule, with the receives' notices waiting behind their egress (all of what
    runs there, what ends within 2.5 time units) or not, and give the same step length."""
    queues = queue_s > 0
    from ratrain.sim.engine import _Engine

    plan = _plan(pp, dp, m=5, **kw)
    sch, g, use = _holds(plan, _platform(upn, link_notice_queue_s=queue_s))
    assert use is not None
    assert (use.notice is not None) == queues
    acts = g.acts
    dur = [float(_mixed(a)) for a in acts]
    res = [a.resource for a in acts]
    _, _, end = run_plain(g, dur, res, use)
    eng = _Engine(sch, dur, res, use)
    eng.run()
    assert eng.end == end
    by_action = {a: h for a, h in zip(acts, use.holds, strict=True) if h}
    notice = {a: h for a, h in zip(acts, use.notice or [()] * len(acts), strict=True) if h}
    assert bool(notice) == queues
    assert max(end) == dry_run(sch, _mixed, by_action, notice, use.queue_s)
    plain = max(t.end_s for st in replay(sch, _mixed) for t in st)
    assert plain == dry_run(sch, _mixed)
    assert max(end) >= plain


def _with_links(links: dict) -> dict:
    from ratrain.bench.platform import base_platform_dict

    d = base_platform_dict("a100-80g")
    d["network"]["links"] = links
    return d


def test_the_platform_file_carries_the_link_fields():
    ok = {
        "full_duplex": {"value": False, "note": "measured: both ways at once halve"},
        "one_flow_bytes_per_s": {"value": 1.2e7, "note": "measured: one flow"},
    }
    p = from_dict(_with_links(ok))
    assert not p.link_full_duplex
    assert p.link_measured == {"one_flow_bytes_per_s": 1.2e7}
    assert load("a100-80g").link_full_duplex
    bad = dict(ok, full_duplex={"value": "yes", "note": "assumed: x"})
    with pytest.raises(RatrainError, match="full_duplex must be true or false"):
        from_dict(_with_links(bad))
    with pytest.raises(RatrainError, match="provenance"):
        from_dict(_with_links({"full_duplex": {"value": True, "note": "guess"}}))


def test_link_fields_from_a_probe():
    from ratrain.bench.link_probe import link_fields

    probe = {
        "contention": {
            "bytes": 4 << 20,
            "reps": 3,
            "alone": 0.35,
            "both": [0.36, 0.70],
            "through": [0.37, 0.36],
            "fan_in": [0.69, 0.70],
            "all_reduce_alone": 0.7,
            "beside_all_reduce": {"flow": 0.6, "all_reduce": 0.9, "from": 2},
        }
    }
    f = link_fields(probe, "now")
    assert f["full_duplex"]["value"] is True  # B's ingress and egress at once: no slower
    assert f["through_ratio"]["value"] == pytest.approx(0.37 / 0.35, abs=1e-3)
    assert f["fan_in_first_ratio"]["value"] == pytest.approx(0.69 / 0.35, abs=1e-3)
    assert f["one_flow_bytes_per_s"]["note"].startswith("measured:")
    fifo = {k: v for k, v in probe["contention"].items() if k != "through"}
    g = link_fields({"contention": fifo}, "now")
    assert g["full_duplex"]["value"] is False  # no "through" case: the same pair's figure
    assert link_fields({}, "now") is None
    for entry in f.values():
        assert entry["note"].split(":")[0] in ("measured", "derived", "assumed")


def test_the_links_cpu_per_byte_is_read_and_checked():
    note = "measured: a flow beside compute"
    p = from_dict(_with_links({"cpu_s_per_byte": {"value": 7e-8, "note": note}}))
    assert p.link_cpu_s_per_byte == 7e-8 and "cpu_s_per_byte" not in p.link_measured
    assert load("a100-80g").link_cpu_s_per_byte == 0.0  # a NIC does that work
    with pytest.raises(RatrainError, match="cpu_s_per_byte"):
        from_dict(_with_links({"cpu_s_per_byte": {"value": -1e-8, "note": note}}))


def test_cpu_per_byte_from_a_probe():
    from ratrain.bench.link_probe import cpu_per_byte, link_fields

    got = {
        "ranks": 4,
        "chunk_bytes": 131072,
        "reps": 3,
        "alone_s": [1.0, 1.0, 2.0],
        "beside_s": [1.1, 1.2, 2.2],
        "flow_bytes_per_s": [5e6, 5e6, 4e6],
    }
    # L = 4 x (beside / alone - 1) ranks' worth per byte/s: 8e-8, 1.6e-7, 1e-7
    assert cpu_per_byte(got) == pytest.approx(1e-7)
    f = link_fields({"contention": {"cpu_only": True, "beside_compute": got}}, "now")
    assert list(f) == ["cpu_s_per_byte"]
    assert f["cpu_s_per_byte"]["value"] == pytest.approx(1e-7)
    assert f["cpu_s_per_byte"]["note"].startswith("measured:")
    faster = dict(got, beside_s=[0.9, 0.9, 1.8])  # the machine sped up: no negative load
    assert cpu_per_byte(faster) == 0.0
    with pytest.raises(RatrainError, match="no bytes"):
        cpu_per_byte(dict(got, flow_bytes_per_s=[0.0, 0.0, 0.0]))
