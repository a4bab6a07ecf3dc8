"""1F1B generation and the three lowerings: structure, policies, validity, speed."""

import time

import pytest

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.memory import replay
from ratrain.models.counts import unit_params
from ratrain.models.presets import get_preset
from ratrain.schedule import (
    Op,
    action_bytes,
    build_schedule,
    check_schedule,
    dry_run,
    format_action,
    parse_action,
    pass_order,
    warmup_passes,
)
from ratrain.schedule.lowering import RELOAD_AHEAD_UNITS

TINY = get_preset("tiny")  # 4 blocks: units 0..5
KINDS = ("baseline", "gpu-style", "ratrain")


def plan_of(pp=2, m=4, **kw) -> Plan:
    kw.setdefault("micro_batch", 1)
    kw.setdefault("seq", 32)
    return Plan(pp=pp, global_batch=m * kw["micro_batch"] * kw.get("dp", 1), **kw)


def ops(acts, op):
    return [a for a in acts if a.op is op]


@pytest.mark.parametrize("pp,m", [(1, 1), (1, 3), (2, 1), (3, 2), (4, 4), (4, 9)])
def test_pass_order_is_1f1b(pp, m):
    for s in range(pp):
        order = pass_order(pp, m, s)
        w = warmup_passes(pp, m, s)
        assert w == min(pp - s - 1, m)
        assert [mb for op, mb in order if op is Op.F] == list(range(m))
        assert [mb for op, mb in order if op is Op.B] == list(range(m))
        assert all(op is Op.F for op, _ in order[:w])
        # in flight never exceeds warmup + 1: the 1F1B memory bound
        in_flight = peak = 0
        for op, _ in order:
            in_flight += 1 if op is Op.F else -1
            peak = max(peak, in_flight)
        assert peak == min(w + 1, m)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pp,m", [(1, 1), (2, 1), (3, 2), (4, 4), (4, 6), (2, 7)])
def test_every_lowering_is_valid(kind, pp, m):
    plan = plan_of(pp, m, schedule=kind, bucket_bytes=400_000)
    sch = build_schedule(TINY, plan)
    check_schedule(sch, TINY, plan)
    assert sch.kind == kind
    assert [tuple(plan.stage_units(TINY, s)) for s in range(pp)] == sch.meta["stage_units"]


def test_forward_and_backward_passes_follow_the_units():
    plan = plan_of(2, 2, schedule="baseline")
    sch = build_schedule(TINY, plan)
    s1 = [format_action(a) for a in sch.stages[1]]
    # stage 1 owns units 3..5 (blocks 3, 4 and the head); no warmup on the last stage;
    # each receive is posted one ahead, where the one before it was (`post_receives_ahead`)
    assert s1[:9] == [
        "1RECV_F0@2",
        "1RECV_F1@2",
        "1F0@3",
        "1F0@4",
        "1F0@5",
        "1B0@5",
        "1B0@4",
        "1B0@3",
        "1SEND_B0@3",
    ]
    s0 = [format_action(a) for a in sch.stages[0]]
    assert s0[:10] == [
        "0F0@0",
        "0F0@1",
        "0F0@2",
        "0SEND_F0@2",
        "0F1@0",
        "0F1@1",
        "0F1@2",
        "0RECV_B0@3",
        "0RECV_B1@3",
        "0SEND_F1@2",
    ]
    recv = parse_action("1RECV_F0@2")
    assert parse_action("0SEND_F0@2") in sch.deps_of(recv)


def test_text_form_round_trips():
    plan = plan_of(2, 3, view_policy="transient", offload_activations=True, recompute="full")
    sch = build_schedule(TINY, plan)
    assert any(a.visit > 0 for a in sch.actions())
    for a in sch.actions():
        assert parse_action(format_action(a)) == a


def test_baseline_tail():
    plan = plan_of(2, 3, schedule="baseline", compute_dtype="fp16", clip_grad=1.0)
    sch = build_schedule(TINY, plan)
    for s, acts in enumerate(sch.stages):
        units = sch.meta["stage_units"][s]
        tail = [a.op for a in acts[-5:]]
        assert tail == [Op.GRAD_SYNC, Op.GRAD_NORM, Op.OVERFLOW, Op.UPDATE, Op.VIEW_FETCH]
        assert acts[-5].units == acts[-2].units == acts[-1].units == units
        assert len(ops(acts, Op.UPDATE)) == 1
        assert set(sch.deps_of(acts[-2])) == {acts[-5], acts[-4], acts[-3]}


def test_baseline_without_global_checks_and_fp32_view():
    plan = plan_of(2, 2, schedule="baseline", clip_grad=None, compute_dtype="fp32")
    sch = build_schedule(TINY, plan)
    assert not [a for a in sch.actions() if a.op in (Op.GRAD_NORM, Op.OVERFLOW, Op.VIEW_FETCH)]
    assert sch.meta["view_fetch"] is None and sch.meta["global_checks"] == ()


def test_gpu_style_buckets_overlap_the_backward():
    m = 3
    plan = plan_of(1, m, schedule="gpu-style", bucket_bytes=400_000, clip_grad=None)
    sch = build_schedule(TINY, plan)
    acts = sch.stages[0]
    buckets = sch.meta["buckets"][0]
    assert sorted(u for b in buckets for u in b) == list(range(6))
    assert len(buckets) > 1 and max(map(len, buckets)) > 1
    for bucket in buckets:
        nbytes = sum(unit_params(TINY, u) * 4 for u in bucket)
        assert nbytes >= plan.bucket_bytes or bucket == buckets[-1]
        i = next(i for i, a in enumerate(acts) if a.op is Op.GRAD_SYNC and a.units == bucket)
        prev = acts[i - 1]
        assert (prev.op, prev.unit, prev.mb) == (Op.B, bucket[0], m - 1)
    # syncs overlap the last backward: the first bucket is issued before the last B
    first_sync = next(i for i, a in enumerate(acts) if a.op is Op.GRAD_SYNC)
    last_b = max(i for i, a in enumerate(acts) if a.op is Op.B)
    assert first_sync < last_b
    assert [a.op for a in acts[-2:]] == [Op.UPDATE, Op.VIEW_FETCH]


@pytest.mark.parametrize("dtype,clip", [("bf16", None), ("bf16", 1.0), ("fp16", None)])
def test_ratrain_per_unit_sync_and_update(dtype, clip):
    m = 3
    plan = plan_of(2, m, compute_dtype=dtype, clip_grad=clip)
    sch = build_schedule(TINY, plan)
    for s, acts in enumerate(sch.stages):
        units = sch.meta["stage_units"][s]
        syncs = ops(acts, Op.GRAD_SYNC)
        assert [a.units for a in syncs] == [(u,) for u in reversed(units)]
        for sync in syncs:
            i = acts.index(sync)
            assert (acts[i - 1].op, acts[i - 1].units, acts[i - 1].mb) == (Op.B, sync.units, m - 1)
        last_b = max(i for i, a in enumerate(acts) if a.op in (Op.B, Op.SEND_B))
        checks = [a for a in acts if a.op in (Op.GRAD_NORM, Op.OVERFLOW)]
        assert len(checks) == (clip is not None) + (dtype == "fp16")
        for upd in ops(acts, Op.UPDATE):
            assert acts.index(upd) > last_b  # never delays a SEND_B an upstream stage waits for
            assert set(checks) <= set(sch.deps_of(upd))
            vf = acts[acts.index(upd) + 1]
            assert vf.op is Op.VIEW_FETCH and vf.units == upd.units and upd in sch.deps_of(vf)


def test_recompute_just_before_its_backward():
    plan = plan_of(2, 3, recompute=("full", "first:1"))
    sch = build_schedule(TINY, plan)
    for s, acts in enumerate(sch.stages):
        for i, a in enumerate(acts):
            if a.op is Op.RECOMPUTE:
                assert plan.recompute_of(TINY, s, a.unit) != "none"
                assert (acts[i + 1].op, acts[i + 1].units, acts[i + 1].mb) == (Op.B, a.units, a.mb)
    rc0 = {a.unit for a in ops(sch.stages[0], Op.RECOMPUTE)}
    rc1 = {a.unit for a in ops(sch.stages[1], Op.RECOMPUTE)}
    assert rc0 == {1, 2} and rc1 == {3}  # embedding and head never recompute


def test_offload_and_reload_placement():
    pp, m = 3, 5
    plan = plan_of(pp, m, offload_activations=True, layer_split=(1, 2, 1))
    sch = build_schedule(TINY, plan)
    check_schedule(sch, TINY, plan)
    assert not ops(sch.stages[pp - 1], Op.OFFLOAD)  # F then B at once: nothing to gain
    acts = sch.stages[0]
    offloaded = {(a.unit, a.mb) for a in ops(acts, Op.OFFLOAD)}
    assert {mb for _, mb in offloaded} == {0, 1, 2, 3}  # mb 4 goes straight to its B
    for a in ops(acts, Op.OFFLOAD):
        i = acts.index(a)
        assert acts[i - 1].op is Op.F and acts[i - 1].units == a.units
    for rel in ops(acts, Op.RELOAD):
        i = acts.index(rel)
        b = next(
            j for j, a in enumerate(acts) if a.op is Op.B and (a.unit, a.mb) == (rel.unit, rel.mb)
        )
        assert i < b
        nxt = next(a for a in acts[i:] if a.op in (Op.B, Op.RECOMPUTE))
        assert nxt.unit <= rel.unit + RELOAD_AHEAD_UNITS
        assert rel in sch.deps_of(acts[b])


@pytest.mark.parametrize("lookahead", [0, 1, 2])
def test_transient_views_bounded_by_lookahead(lookahead):
    plan = plan_of(1, 3, view_policy="transient", view_lookahead=lookahead, recompute="full")
    sch = build_schedule(TINY, plan)
    check_schedule(sch, TINY, plan)
    assert sch.meta["view_policy"] == "transient"
    live, peak = set(), 0
    for a in sch.stages[0]:
        if a.op is Op.VIEW_FETCH:
            live |= set(a.units)
        elif a.op is Op.VIEW_DROP:
            live -= set(a.units)
        peak = max(peak, len(live))
    assert not live  # transient views do not outlive the step
    assert peak <= lookahead + 2
    if lookahead == 0:  # fetched right before each use
        acts = sch.stages[0]
        for i, a in enumerate(acts):
            if a.op is Op.VIEW_FETCH:
                assert acts[i + 1].units == a.units


def test_sharding_policies_in_meta():
    plan = plan_of(2, 2, dp=4, shard_optimizer=True)
    sch = build_schedule(TINY, plan)
    assert sch.meta["grad_sync"] == "reduce-scatter" and sch.meta["view_fetch"] == "all-gather"
    sch = build_schedule(TINY, plan.replace(shard_optimizer=False, compute_dtype="fp32"))
    assert sch.meta["grad_sync"] == "all-reduce" and sch.meta["view_fetch"] is None


def test_baseline_keeps_persistent_views_whatever_the_plan_asks():
    plan = plan_of(2, 2, schedule="baseline", view_policy="transient", offload_activations=True)
    sch = build_schedule(TINY, plan)
    assert sch.meta["view_policy"] == "persistent"
    assert not [a for a in sch.actions() if a.op in (Op.VIEW_DROP, Op.OFFLOAD)]


def test_action_bytes():
    plan = plan_of(2, 2, micro_batch=2, seq=16, grad_dtype="bf16", dp=2, shard_optimizer=True)
    sch = build_schedule(TINY, plan)
    by_op = {a.op: a for a in sch.actions()}
    assert action_bytes(by_op[Op.SEND_F], TINY, plan) == 2 * 16 * TINY.hidden * 2
    sync = by_op[Op.GRAD_SYNC]
    assert action_bytes(sync, TINY, plan) == unit_params(TINY, sync.unit) * 2
    vf = by_op[Op.VIEW_FETCH]
    assert action_bytes(vf, TINY, plan) == unit_params(TINY, vf.unit) * 2
    upd = by_op[Op.UPDATE]
    assert action_bytes(upd, TINY, plan) == -(-unit_params(TINY, upd.unit) * (24 + 2) // 2)
    assert action_bytes(by_op[Op.GRAD_NORM], TINY, plan) == 4
    assert action_bytes(by_op[Op.F], TINY, plan) == 0


def test_dry_run_step_length():
    # one stage, one microbatch, unit durations: 6 F + 6 B + SYNC + UPDATE + VIEW_FETCH
    plan = plan_of(1, 1, schedule="baseline", clip_grad=None)
    assert dry_run(build_schedule(TINY, plan)) == 15
    # a pipeline in steady state (past 4 microbatches, its warm-up with receives posted
    # one ahead): every further microbatch adds the same time
    plan = plan_of(4, 1, schedule="baseline", clip_grad=None, layer_split=(2, 1, 1, 0))
    t = {m: dry_run(build_schedule(TINY, plan.replace(global_batch=m))) for m in (8, 16, 32)}
    assert (t[32] - t[16]) == 2 * (t[16] - t[8]) > 0


def test_bad_plan_is_a_clear_error():
    with pytest.raises(RatrainError, match="layers"):
        build_schedule(TINY, Plan(pp=5))
    with pytest.raises(RatrainError, match="layer_split"):
        build_schedule(TINY, Plan(pp=2, layer_split=(1, 1)))


def test_deterministic():
    plan = plan_of(3, 5, view_policy="transient", offload_activations=True, recompute="selective")
    a, b = build_schedule(TINY, plan), build_schedule(TINY, plan)
    assert a.stages == b.stages and a.deps == b.deps


def test_llama70b_build_and_replay_are_fast():
    spec = get_preset("llama2-70b")
    plan = Plan(pp=16, dp=64, micro_batch=1, global_batch=128 * 64, seq=4096, recompute="full")
    t0 = time.process_time()
    sch = build_schedule(spec, plan)
    ledger = replay(sch, spec, plan)
    elapsed_s = time.process_time() - t0
    assert sch.meta["microbatches"] == 128 and len(ledger.stages) == 16
    assert elapsed_s < 1.0, f"build + replay took {elapsed_s:.2f} s"


def test_schedule_and_memory_do_not_import_torch():
    import subprocess
    import sys

    code = "import sys, ratrain.schedule, ratrain.memory; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
