"""Gradient-sync buckets (`Plan.sync_bucket_bytes`): the same buckets in every lowering,
and the checker, the ledger and the simulator reading the bucketed IR."""

from __future__ import annotations

import pytest

from ratrain.config import Plan
from ratrain.cost import CostModel
from ratrain.errors import RatrainError
from ratrain.memory.ledger import replay
from ratrain.models.presets import get_preset
from ratrain.platforms import load
from ratrain.schedule import build_schedule, check_schedule
from ratrain.schedule.ir import Op
from ratrain.schedule.lowering import action_bytes
from ratrain.schedule.passes import sync_buckets
from ratrain.sim import simulate_schedule
from ratrain.sizes.states import grad_bytes_per_param, stored_params

SPEC = get_preset("tiny")  # units: 64 KiB embedding, 180 KiB blocks, 64 KiB head (fp32)
BUCKET = 200_000
PLAN = Plan(
    pp=2,
    dp=2,
    micro_batch=1,
    global_batch=8,
    seq=16,
    compute_dtype="fp32",
    sync_bucket_bytes=BUCKET,
)


def _grad_bytes(plan: Plan, stage: int, bucket) -> int:
    params = stored_params(SPEC, tuple(plan.stage_units(SPEC, stage)))
    return sum(params[u] for u in bucket) * grad_bytes_per_param(plan)


def test_buckets_partition_each_stage_in_backward_order():
    for s in range(PLAN.pp):
        buckets = sync_buckets(SPEC, PLAN, s)
        units = [u for b in buckets for u in reversed(b)]
        assert units == list(reversed(PLAN.stage_units(SPEC, s)))
        assert all(list(b) == sorted(b) for b in buckets)
        assert all(_grad_bytes(PLAN, s, b) >= BUCKET for b in buckets[:-1])
        assert any(len(b) > 1 for b in buckets)  # this size does coalesce
    assert sync_buckets(SPEC, PLAN, 0) == [(1, 2), (0,)]


@pytest.mark.parametrize("kw", [{"sync_bucket_bytes": 0}, {"shard_optimizer": True}])
def test_one_unit_per_bucket_when_off_or_sharded(kw):
    plan = PLAN.replace(**kw)
    for s in range(plan.pp):
        assert sync_buckets(SPEC, plan, s) == [(u,) for u in reversed(plan.stage_units(SPEC, s))]


def test_negative_bucket_size_is_refused():
    with pytest.raises(RatrainError, match="sync_bucket_bytes"):
        PLAN.replace(sync_bucket_bytes=-1)


@pytest.mark.parametrize("kind", ["baseline", "gpu-style", "ratrain"])
@pytest.mark.parametrize("clip", [None, 1.0])
def test_every_lowering_syncs_whole_buckets(kind, clip):
    plan = PLAN.replace(schedule=kind, clip_grad=clip, bucket_bytes=300_000)
    sch = build_schedule(SPEC, plan)
    check_schedule(sch, SPEC, plan)
    for s, acts in enumerate(sch.stages):
        buckets = sync_buckets(SPEC, plan, s)
        assert [tuple(b) for b in sch.meta["sync_buckets"][s]] == buckets
        for a in acts:
            if a.op is Op.GRAD_SYNC:
                assert all(set(b) <= set(a.units) or not set(b) & set(a.units) for b in buckets)
        if kind == "ratrain":  # one sync, one update per bucket, in backward order
            assert [a.units for a in acts if a.op is Op.GRAD_SYNC] == buckets
            assert [a.units for a in acts if a.op is Op.UPDATE] == buckets


def test_ratrain_bucket_sync_waits_for_all_its_units_last_backward():
    sch = build_schedule(SPEC, PLAN)
    m = PLAN.microbatches
    for acts in sch.stages:
        for a in acts:
            if a.op is Op.GRAD_SYNC:
                last_bs = {d.units[0] for d in sch.deps_of(a) if d.op is Op.B and d.mb == m - 1}
                assert last_bs == set(a.units)
                # issued right after the bucket's lowest unit's last backward
                i = acts.index(a)
                assert acts[i - 1].op is Op.B and acts[i - 1].units == (a.units[0],)


def test_ledger_allocates_a_bucket_at_its_first_backward():
    """The ledger holds a bucket's whole gradient from its first backward on, and frees it
    at the bucket's UPDATE."""
    for bucket_bytes in (BUCKET, 0):
        plan = PLAN.replace(sync_bucket_bytes=bucket_bytes)
        sch = build_schedule(SPEC, plan)
        ledger = replay(sch, SPEC, plan)
        for s, acts in enumerate(sch.stages):
            trace = dict(ledger.stages[s].trace)
            first_b = next(i for i, a in enumerate(acts) if a.op is Op.B)
            u = acts[first_b].units[0]
            (bucket,) = [b for b in sync_buckets(SPEC, plan, s) if u in b]
            assert trace[first_b]["grad"] == _grad_bytes(plan, s, bucket)
            assert len(bucket) > 1 or bucket_bytes == 0
            last_update = max(i for i, a in enumerate(acts) if a.op is Op.UPDATE)
            assert trace[last_update]["grad"] == _grad_bytes(plan, s, acts[last_update].units)


def test_simulator_costs_one_collective_per_bucket():
    cost = CostModel(SPEC, PLAN, load("cpu-local"))
    res = simulate_schedule(build_schedule(SPEC, PLAN), cost)
    syncs = [e for e in res.events if e.action.op is Op.GRAD_SYNC]
    assert len(syncs) == sum(len(sync_buckets(SPEC, PLAN, s)) for s in range(PLAN.pp))
    for e in syncs:  # each collective moves its whole bucket
        assert action_bytes(e.action, SPEC, PLAN) == _grad_bytes(
            PLAN, e.action.stage, e.action.units
        )
        assert e.end_s > e.start_s


@pytest.mark.parametrize(
    "kw",
    [
        {"compute_dtype": "bf16", "view_policy": "transient"},
        {"compute_dtype": "fp16", "offload_activations": True, "recompute": "full"},
        {"compute_dtype": "bf16", "recompute": "selective", "view_lookahead": 2},
    ],
)
def test_bucketed_ratrain_checks_with_the_lifecycle_options(kw):
    plan = PLAN.replace(**kw)
    sch = build_schedule(SPEC, plan)
    check_schedule(sch, SPEC, plan)
    replay(sch, SPEC, plan)  # the ledger walks it
    for s, acts in enumerate(sch.stages):
        assert [a.units for a in acts if a.op is Op.GRAD_SYNC] == sync_buckets(SPEC, plan, s)
