"""A transfer runs once both ends have posted it (`ratrain.schedule.rendezvous`), and a
receive's ready notice waits behind its stage's egress where the platform's links hold a
standing queue (`Platform.link_notice_queue_s`, `ratrain.cost.links.LinkUse.notice`)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.platforms import Link, load
from ratrain.schedule.ir import Op
from ratrain.sim import simulate
from ratrain.sim.engine import p2p_pairs

TINY = get_preset("tiny")


def _platform(queue_s: float):
    """a100-80g, a node per rank, links slow enough that transfers outlast the compute."""
    slow = Link(bandwidth_bytes_per_s=2e6, latency_s=1e-4)
    return dataclasses.replace(
        load("a100-80g"), units_per_node=1, inter_node=slow, link_notice_queue_s=queue_s
    )


def _events(plan: Plan, queue_s: float, receives_first: bool = True):
    """The simulation and its events by action; `receives_first=False`: each RECV left
    where the lowering put it, after the SENDs issued at the same moment."""
    sch = _lowered(plan) if not receives_first else None
    res = simulate(TINY, plan, _platform(queue_s), schedule=sch, memory_timeline=False)
    return res, {e.action: e for e in res.events}


def _lowered(plan: Plan):
    from ratrain.schedule.build import _LOWERINGS

    return _LOWERINGS[plan.schedule](TINY, plan)


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h1", "zb-h2"])
def test_a_send_starts_once_its_receive_is_posted(pipeline):
    """Every send starts no earlier than its receive's issue, and the receive ends with
    it; on a 1F1B-like pipeline some sends wait for a receive posted after them (the
    walk reaches a RECV only just before the pass that needs it)."""
    plan = Plan(pp=3, dp=1, micro_batch=1, global_batch=6, seq=32, pipeline=pipeline)
    res, ev = _events(plan, queue_s=0.0)
    sch_pairs = [(ev[s], ev[r]) for s, r in _pairs(res)]
    assert sch_pairs
    for send, recv in sch_pairs:
        assert send.start_s >= recv.issue_s
        assert send.start_s >= send.issue_s
        assert recv.end_s == send.end_s
    assert any(r.issue_s > s.issue_s for s, r in sch_pairs)  # a send waited for its receive


def _pairs(res):
    """(send, recv) actions of the simulated schedule (the same whatever the order)."""
    return p2p_pairs(_lowered(Plan.from_dict(res.plan)))


def test_a_receive_notice_waits_behind_its_egress():
    """With a standing queue longer than a transfer, a receive issued while its stage's
    sends hold its egress lets its send start only once those have ended, and the step is
    longer than without; with a queue a tenth of a transfer, the notice waits that long at
    most: the step lies between."""
    plan = Plan(pp=3, dp=1, micro_batch=1, global_batch=6, seq=32)
    res, ev = _events(plan, queue_s=10.0, receives_first=False)
    plain, _ = _events(plan, queue_s=0.0, receives_first=False)
    assert res.step_time_s > plain.step_time_s
    outbound = {
        s: [e for e in res.events if e.stage == s and e.action.op in (Op.SEND_F, Op.SEND_B)]
        for s in range(plan.pp)
    }
    behind = 0
    for s, r in _pairs(res):
        send, recv = ev[s], ev[r]
        ahead = [
            e.end_s
            for e in outbound[recv.stage]
            if e.start_s <= recv.issue_s < e.end_s and e.action != s
        ]
        if ahead:
            behind += 1
            assert send.start_s >= max(ahead)
    assert behind  # the case arises on this plan
    transfer_s = min(e.end_s - e.start_s for v in outbound.values() for e in v)
    short, ev_short = _events(plan, 0.1 * transfer_s, False)  # the standing queue binds
    assert plain.step_time_s < short.step_time_s < res.step_time_s
    for s, r in _pairs(short):
        assert ev_short[s].start_s >= ev_short[r].issue_s


def test_receives_posted_first_leave_no_notice_waiting():
    """Built as `build_schedule` builds it (each RECV ahead of the SENDs issued at the same
    moment, `post_receives_first`), the same plan loses nothing to the notice here, and is
    faster than with the lowering's order."""
    plan = Plan(pp=3, dp=1, micro_batch=1, global_batch=6, seq=32)
    first, _ = _events(plan, queue_s=10.0)
    assert first.step_time_s == _events(plan, queue_s=0.0)[0].step_time_s
    assert first.step_time_s < _events(plan, queue_s=10.0, receives_first=False)[0].step_time_s


_KW = [
    {"pp": 4},
    {"pp": 3, "pipeline": "zb-h2"},
    {"pp": 2, "pipeline": "zb-v"},
    {"pp": 2, "dp": 2, "schedule": "ratrain"},
    {"pp": 3, "schedule": "fsdp-pp", "shard_optimizer": True},
]


def _received_first(plan: Plan):
    from ratrain.schedule.rendezvous import post_receives_first

    return post_receives_first(_lowered(plan))


@pytest.mark.parametrize("kw", _KW)
def test_build_posts_each_receive_first_and_one_ahead(kw):
    """`build_schedule`'s lists are the lowering's with only the RECVs moved, in their
    order: each ahead of the run of SENDs directly before it (`post_receives_first`: no
    RECV follows a SEND), then each stage's k-th RECV where its (k-1)-th was
    (`post_receives_ahead`: as many other actions before it)."""
    from ratrain.schedule import build_schedule, check_schedule

    plan = Plan(micro_batch=1, global_batch=8 * kw.get("dp", 1), seq=32, **kw)
    built, lowered, first = build_schedule(TINY, plan), _lowered(plan), _received_first(plan)
    check_schedule(built, TINY, plan)
    recvs = (Op.RECV_F, Op.RECV_B)
    moved = 0
    for got, was, mid in zip(built.stages, lowered.stages, first.stages, strict=True):
        assert sorted(map(str, got)) == sorted(map(str, was))
        assert [a for a in got if a.op not in recvs] == [a for a in was if a.op not in recvs]
        assert [a for a in got if a.op in recvs] == [a for a in was if a.op in recvs]
        for before, a in itertools.pairwise(got):
            assert not (a.op in recvs and before.op in (Op.SEND_F, Op.SEND_B))
        moved += mid != was

        def others_before(acts):
            out, n = [], 0
            for a in acts:
                if a.op in recvs:
                    out.append(n)
                else:
                    n += 1
            return out

        placed, slots = others_before(got), others_before(mid)
        assert placed == slots[:1] + slots[:-1]
    assert moved  # the lowering does post receives after sends


@pytest.mark.parametrize("kw", _KW)
def test_one_ahead_holds_one_more_boundary_buffer_at_most(kw):
    """The ledger's peak per stage, built (receives one ahead) against receives first:
    never lower, and at most one boundary buffer higher."""
    from ratrain.memory.ledger import replay
    from ratrain.schedule import build_schedule
    from ratrain.sizes.activations import boundary_bytes

    plan = Plan(micro_batch=1, global_batch=8 * kw.get("dp", 1), seq=32, **kw)
    boundary = boundary_bytes(TINY, plan)
    ahead = replay(build_schedule(TINY, plan), TINY, plan, keep_trace=False).stages
    first = replay(_received_first(plan), TINY, plan, keep_trace=False).stages
    for a, f in zip(ahead, first, strict=True):
        assert f.peak_bytes <= a.peak_bytes <= f.peak_bytes + boundary


def test_a_receive_one_ahead_overlaps_the_pass_before():
    """Where a stage's passes are long beside a transfer (cpu-local, a slow link between a
    node per rank), receives posted one ahead let more transfers into a stage run while
    that stage computes than receives posted first do, and the step is shorter (the
    emulated cluster measured the same, `docs/validation.md`, "Receives one ahead")."""
    slow = Link(bandwidth_bytes_per_s=2e7, latency_s=1e-4)
    pl = dataclasses.replace(load("cpu-local"), units_per_node=1, inter_node=slow)
    for pipeline in ("1f1b", "zb-h1"):
        plan = Plan(pp=3, dp=1, micro_batch=1, global_batch=12, seq=32, pipeline=pipeline)
        ahead = simulate(TINY, plan, pl, memory_timeline=False)
        first = simulate(TINY, plan, pl, schedule=_received_first(plan), memory_timeline=False)
        assert overlapped(ahead) > overlapped(first)
        assert ahead.step_time_s < first.step_time_s


def overlapped(res) -> int:
    """How many transfers between stages run partly while their receiving stage computes."""
    ev = {e.action: e for e in res.events}
    busy = [(e.stage, e.start_s, e.end_s) for e in res.events if e.resource == "compute"]
    return sum(
        any(st == ev[r].stage and s0 < ev[s].end_s and ev[s].start_s < s1 for st, s0, s1 in busy)
        for s, r in _pairs(res)
    )
