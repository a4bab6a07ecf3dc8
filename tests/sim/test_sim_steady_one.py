"""A long step timed from ONE short step whose period is measured inside it
(`ratrain.sim.steady_one`) equals its full simulation, and so does the two-run path
it replaces (kept as the check): schedules, recompute, views, offload, on mt3000 and a GPU
platform, and deep pipelines (pp 16 and 32) of a small model."""

import dataclasses
import itertools

import pytest

from _steady import assert_same_result
from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.platforms.load import load
from ratrain.sim import simulate, steady
from ratrain.sim.steady import MIN_MICROBATCHES, MIN_SAVING, extrapolate, points
from ratrain.sim.steady_one import from_one_run, one_point

TINY = get_preset("tiny")
DEEP = dataclasses.replace(TINY, name="tiny-deep", n_layers=32)
"""tiny's blocks, 32 of them: pipelines up to 32 stages at test cost."""


def _plans(m: int):
    for pp, sched, rec, view, off in itertools.product(
        (2, 4),
        ("baseline", "gpu-style", "ratrain", "fsdp-pp"),
        ("none", "first:1", "selective"),
        ("persistent", "transient"),
        (False, True),
    ):
        if sched in ("baseline", "gpu-style") and (view == "transient" or off):
            continue
        if sched == "fsdp-pp" and off:
            continue
        yield Plan(
            pp=pp,
            dp=2,
            global_batch=2 * m,
            seq=128,
            schedule=sched,
            recompute=rec,
            shard_optimizer=sched == "fsdp-pp" or view == "transient",
            view_policy=view,
            compute_dtype="fp16",
            grad_dtype="fp16",
            offload_activations=off,
        )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("platform", ["mt3000", "a100-80g"])
def test_one_run_equals_the_full_simulation_and_the_two_run_path(platform, monkeypatch):
    monkeypatch.setattr(steady, "MIN_SAVING", 1)  # extrapolate even where it saves little
    pl = load(platform)

    def short(p):
        return simulate(TINY, p, pl, memory_timeline=False)

    one_runs, fell_back = 0, []
    for plan in _plans(MIN_MICROBATCHES + 7):
        m2 = one_point(plan, 0, 0, 1, MIN_MICROBATCHES)
        assert m2 is not None and (plan.microbatches - m2) % plan.pp == 0
        got = extrapolate(plan, short)  # one run, later tries included
        two = extrapolate(plan, short, runs=2)
        if got is None:
            fell_back.append(plan)
            assert two is None or plan.offload_activations, plan
            continue
        full = simulate(TINY, plan, pl, memory_timeline=False)
        assert_same_result(got, full)
        if two is not None:
            assert_same_result(two, full)
        one_runs += from_one_run(plan, m2, short, None, steady.REL_TOL) is not None
    # Without offload every step repeats within one run; only offload's copies may not.
    assert all(p.offload_activations for p in fell_back), fell_back
    assert one_runs >= 30


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "pp,sched,rec,view,off",
    [
        (16, "ratrain", "first:1", "transient", False),
        (16, "gpu-style", "none", "persistent", False),
        (16, "ratrain", "none", "transient", True),
        (32, "ratrain", "none", "transient", False),
        (32, "fsdp-pp", "selective", "persistent", False),
    ],
)
def test_deep_pipelines_from_one_run(pp, sched, rec, view, off):
    pl = load("mt3000")
    m = 16 * pp + 5  # as the 70B case on 256 clusters: 512 microbatches over 32 stages
    plan = Plan(
        pp=pp,
        dp=1,
        global_batch=m,
        seq=128,
        schedule=sched,
        recompute=rec,
        view_policy=view,
        shard_optimizer=sched == "fsdp-pp",
        compute_dtype="fp16",
        grad_dtype="fp16",
        offload_activations=off,
    )

    def short(p):
        return simulate(DEEP, p, pl, memory_timeline=False)

    m2 = one_point(plan, 0, 0, MIN_SAVING, MIN_MICROBATCHES)
    assert m2 is not None
    assert points(plan) is None  # the two-run path declines here: 2 m1 + d > m / 2
    got = extrapolate(plan, short)
    full = simulate(DEEP, plan, pl, memory_timeline=False)
    if got is None:
        assert off, "a deep pipeline without offload repeats"
        return
    assert_same_result(got, full)


def test_a_one_off_action_amid_the_periods_is_no_repeat():
    """A one-off action in the middle of the run (not in every period) fails the check,
    and so does a shift that differs from the period."""
    from ratrain.schedule.ir import Action, Op
    from ratrain.sim.result import SimEvent
    from ratrain.sim.steady_one import _repeats

    def ev(op, unit, mb, t, dur=1.0, res="compute"):
        return SimEvent(0, Action(op, 0, (unit,), mb), res, t, t + dur, t)

    steady_events = [ev(Op.F, 1, i, 2.0 * i) for i in range(8)]
    assert _repeats(steady_events, 2.0, 2.0, 1e-12) == {"compute": 1.0}
    one_off = [*steady_events, SimEvent(0, Action(Op.UPDATE, 0, (1,)), "compute", 5.5, 5.6, 5.5)]
    assert _repeats(one_off, 2.0, 2.0, 1e-12) is None
    drifting = [ev(Op.F, 1, i, 2.0 * i + 0.01 * i * i) for i in range(8)]
    assert _repeats(drifting, 2.0, 2.0, 1e-12) is None
    overloaded = [ev(Op.F, 1, i, 2.0 * i, dur=1.5) for i in range(8)]
    overloaded += [ev(Op.B, 1, i, 2.0 * i + 0.5, dur=1.0) for i in range(8)]
    assert _repeats(overloaded, 2.0, 2.0, 1e-12) is None  # 2.5 s of compute per 2 s period


@pytest.mark.parametrize("view,pipeline", [("transient", "1f1b"), ("persistent", "zb-h1")])
def test_a_period_of_twice_the_depth(view, pipeline):
    """With receives posted one ahead a 3-stage step on a100-80g alternates between two
    microbatch timings, so it repeats every 6 microbatches and never every 3: the span of
    pp fails on the run, the span of 2 pp (`steady_one.SPANS`) repeats, and gives the full
    simulation's result."""
    from ratrain.sim.steady_one import _from_run

    pl = load("a100-80g")
    plan = Plan(pp=3, dp=1, global_batch=120, seq=128, view_policy=view, pipeline=pipeline)
    m2 = one_point(plan, 1, 0, 1, 0)
    assert m2 is not None and (plan.microbatches - m2) % 6 == 0

    def short(p):
        return simulate(TINY, p, pl, memory_timeline=False)

    run = short(plan.replace(global_batch=m2))
    assert _from_run(plan, run, m2, 3, None, steady.REL_TOL) is None
    got = from_one_run(plan, m2, short, None, steady.REL_TOL)
    assert got is not None
    assert_same_result(got, simulate(TINY, plan, pl, memory_timeline=False))


def test_a_near_repeat_is_timed_within_near_of_the_full_step():
    """Two chains of the first stage a period 0.06% apart (llama2-7b, pp=3 zb-h2, transient
    views fetched across dp=8): the step never repeats exactly, so the exact path finds
    nothing and the planner's near path (`steady.NEAR`) times it from a short step, within
    NEAR of the full simulation."""
    spec, pf = get_preset("llama2-7b"), load("h100-80g")
    plan = Plan(
        pp=3,
        dp=8,
        micro_batch=1,
        global_batch=8 * 128,
        seq=2048,
        layer_split=(11, 11, 10),
        recompute=("none",) * 3,
        shard_optimizer=True,
        view_policy="transient",
        compute_dtype="bf16",
        grad_dtype="bf16",
        model="llama2-7b",
        pipeline="zb-h2",
        rank_layout="dp-inner",
    )
    short = lambda p: simulate(spec, p, pf, memory_timeline=False)  # noqa: E731
    assert extrapolate(plan, short) is None
    near = extrapolate(plan, short, near=steady.NEAR)
    full = short(plan)
    assert near is not None and not near.events
    assert near.step_time_s == pytest.approx(full.step_time_s, rel=steady.NEAR)
    assert near.step_time_s != full.step_time_s  # extrapolated, not simulated in full


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pp", [4, 8])
def test_a_split_backward_repeats_from_past_its_warm_up(pp):
    """zb-h2's warm-up (2 (pp - 1) forwards on stage 0) reaches past the middle of the
    short step: the three periods are checked from the first microbatch past it, and the
    step then equals its full simulation."""
    from ratrain.sim.steady_one import _anchors, _from_run, _grouped

    pl = load("a100-80g")
    plan = Plan(
        pp=pp,
        dp=1,
        global_batch=16 * pp + 5,
        seq=128,
        schedule="ratrain",
        compute_dtype="fp16",
        grad_dtype="fp16",
        pipeline="zb-h2",
    )

    def short(p):
        return simulate(DEEP, p, pl, memory_timeline=False)

    m2 = one_point(plan, 0, 0, MIN_SAVING, MIN_MICROBATCHES)
    mid, past = _anchors(plan, m2, pp)
    assert past == 2 * (pp - 1) + 1 > mid
    run = short(plan.replace(global_batch=m2))
    grouped = _grouped(run.events)
    # From the middle it is no repeat: stage 0 still runs its warm-up forwards there.
    assert _from_run(plan, run, m2, pp, None, steady.REL_TOL, 0.0, grouped, mid) is None
    got = from_one_run(plan, m2, short, None, steady.REL_TOL)
    assert got is not None
    assert_same_result(got, simulate(DEEP, plan, pl, memory_timeline=False))
