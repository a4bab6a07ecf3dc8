"""The fsdp-pp baseline family: its lowering is valid, its plans fit their ledger and
simulator, and it runs in the runtime with the reference trainer's losses."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import replace

import pytest

from ratrain.config import Plan, TrainConfig
from ratrain.data import make_source
from ratrain.errors import RatrainError
from ratrain.memory import replay
from ratrain.models.presets import get_preset
from ratrain.planner import Request, search
from ratrain.planner.evaluate import usable_bytes
from ratrain.platforms.load import load
from ratrain.schedule import Op, build_schedule, check_schedule, dry_run
from ratrain.sim import simulate

TINY = get_preset("tiny")


def _plan(**kw) -> Plan:
    base = dict(pp=2, dp=2, global_batch=8, seq=16, schedule="fsdp-pp", shard_optimizer=True)
    return Plan(**{**base, **kw})


@pytest.mark.parametrize(
    "view,la,rec,dtype",
    list(
        itertools.product(("persistent", "transient"), (1, 2), ("none", "full"), ("fp32", "bf16"))
    ),
)
def test_lowering_is_valid_and_shards_like_fsdp(view, la, rec, dtype):
    plan = _plan(view_policy=view, view_lookahead=la, recompute=rec, compute_dtype=dtype)
    sch = build_schedule(TINY, plan)
    check_schedule(sch, TINY, plan)
    dry_run(sch)
    assert sch.meta["grad_sync"] == "reduce-scatter"
    assert sch.meta["view_fetch"] == "all-gather" and sch.meta["view_policy"] == "transient"
    for s, acts in enumerate(sch.stages):
        units = sch.meta["stage_units"][s]
        fetches = [a for a in acts if a.op is Op.VIEW_FETCH]
        syncs = [a for a in acts if a.op is Op.GRAD_SYNC]
        assert all(len(a.units) == 1 for a in fetches + syncs)  # per layer
        assert sorted(a.unit for a in syncs) == list(units)
        # one optimizer step for the stage, its last action: after every reduce-scatter
        assert acts[-1].op is Op.UPDATE and acts[-1].units == tuple(units)
        per_unit = {u: sum(a.unit == u for a in fetches) for u in units}
        if view == "persistent":  # reshard_after_forward=False: one gather per step
            assert set(per_unit.values()) == {1}
        else:  # re-gathered for the forward and for the backward of later microbatches
            assert max(per_unit.values()) > 1


def test_views_never_outlive_the_step():
    plan = _plan(compute_dtype="bf16")
    led = replay(build_schedule(TINY, plan), TINY, plan)
    for st in led.stages:
        first = st.trace[0][1]
        assert st.static_bytes == first["master"] + first["optimizer"]  # no view at the start
        last = st.trace[-1][1]
        assert last["view"] == 0  # freed after the last backward, before the step ends


def test_fsdp_pp_needs_sharding():
    with pytest.raises(RatrainError, match="shard_optimizer"):
        Plan(pp=2, dp=2, global_batch=8, schedule="fsdp-pp")


@pytest.mark.parametrize("platform", ["mt3000", "a100-80g"])
def test_planned_fsdp_pp_plans_fit_their_ledger_and_simulator(platform):
    pl = replace(load(platform), usable_memory_bytes=3_000_000, workspace_bytes=500_000)
    req = Request(TINY, pl, 4, 8, 128, families=("fsdp-pp",))
    res = search(req, top=4)
    assert res.ranked
    for c in res.ranked:
        p = c.plan
        assert c.family == "fsdp-pp" and p.schedule == "fsdp-pp" and p.shard_optimizer
        assert len(set(p.recompute)) == 1 and not p.offload_activations
        led = replay(build_schedule(TINY, p), TINY, p, keep_trace=False)
        assert tuple(s.peak_bytes for s in led.stages) == c.peak_memory_bytes
        assert max(c.peak_memory_bytes) <= usable_bytes(req)
        sim = simulate(TINY, p, pl)
        assert sim.step_time_s == c.step_time_s
        assert tuple(sim.peak_memory_bytes) == c.peak_memory_bytes


def test_fsdp_pp_is_a_baseline_of_plan_baselines():
    from ratrain.planner import COMPARED_FAMILIES

    assert "fsdp-pp" in COMPARED_FAMILIES


# -- the runtime ----------------------------------------------------------------------------

RT_PLAN = Plan(
    pp=2, dp=2, micro_batch=1, global_batch=6, seq=16, compute_dtype="fp32", model="tiny"
)


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_fsdp_pp_runs_with_the_reference_losses():
    from ratrain.train.job import Job, Launch, Outputs, run_job
    from ratrain.train.reference import ReferenceTrainer

    cfg = TrainConfig(steps=6, warmup_steps=1)
    source = functools.partial(make_source, "synthetic", TINY, RT_PLAN.seq, cfg.seed)
    variants = [
        ("zero1", {"schedule": "baseline", "shard_optimizer": True}),
        ("fsdp-step", {"schedule": "fsdp-pp", "shard_optimizer": True}),
        (
            "fsdp-reshard-full",
            {
                "schedule": "fsdp-pp",
                "shard_optimizer": True,
                "view_policy": "transient",
                "recompute": "full",
            },
        ),
    ]
    job = Job(
        TINY,
        RT_PLAN,
        cfg,
        source,
        variants=tuple(variants),
        launch=Launch(device="cpu", timeout_s=60, deadline_s=150),
        outputs=Outputs(progress=False),
    )
    res = run_job(job)

    def losses(name: str) -> list[float]:
        (out,) = [r.runs[name].losses for r in res if r.runs[name].losses]
        return out

    ref = ReferenceTrainer(TINY, RT_PLAN, cfg, source()).train()
    for name in ("fsdp-step", "fsdp-reshard-full"):
        got = losses(name)
        assert len(got) == cfg.steps and all(math.isfinite(x) for x in got)
        assert max(abs(x - y) / abs(y) for x, y in zip(got, ref, strict=True)) <= 1e-5
        # the same arithmetic as ZeRO-1 with the same sharding: bit for bit
        assert got == losses("zero1")
    assert losses("fsdp-step")[-1] < losses("fsdp-step")[0]
