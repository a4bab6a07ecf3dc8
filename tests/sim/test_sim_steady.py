"""A long step timed from two short ones (`ratrain.sim.steady`) equals its full
simulation: step time, bubble and utilization, over schedules, recompute, views, offload,
on mt3000 and a GPU platform."""

import itertools

import pytest

from _steady import assert_same_result
from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.platforms.load import load
from ratrain.sim import simulate, steady
from ratrain.sim.steady import MIN_MICROBATCHES, extrapolate, points

TINY = get_preset("tiny")


def _plans(m: int):
    for pp, sched, rec, view, off in itertools.product(
        (2, 4),
        ("baseline", "gpu-style", "ratrain", "fsdp-pp"),
        ("none", "first:1"),
        ("persistent", "transient"),
        (False, True),
    ):
        if sched in ("baseline", "gpu-style") and (view == "transient" or off):
            continue
        if sched == "fsdp-pp" and off:
            continue
        shard = sched == "fsdp-pp" or view == "transient"
        yield Plan(
            pp=pp,
            dp=2,
            global_batch=2 * m,
            seq=128,
            schedule=sched,
            recompute=rec,
            shard_optimizer=shard,
            view_policy=view,
            compute_dtype="fp16",
            grad_dtype="fp16",
            offload_activations=off,
        )


@pytest.mark.parametrize("platform", ["mt3000", "a100-80g"])
def test_extrapolated_step_equals_the_full_simulation(platform, monkeypatch):
    # Extrapolate even where the saving is small (MIN_SAVING only decides when it pays).
    monkeypatch.setattr(steady, "MIN_SAVING", 1)
    pl = load(platform)

    def short(p):
        return simulate(TINY, p, pl, memory_timeline=False)

    checked, fell_back = 0, []
    for plan in _plans(MIN_MICROBATCHES + 7):
        got = extrapolate(plan, short)
        if got is None:  # not found to repeat: the caller simulates the full step
            fell_back.append(plan)
            continue
        full = simulate(TINY, plan, pl, memory_timeline=False)
        assert_same_result(got, full)
        checked += 1
    # Without offload the tiny model's steps repeat; only offload's copy traffic may not.
    assert all(p.offload_activations for p in fell_back), fell_back
    assert checked >= 16


def test_short_steps_are_simulated_in_full():
    plan = Plan(pp=4, dp=1, global_batch=MIN_MICROBATCHES - 1, seq=128)
    assert points(plan) is None
    assert points(plan.replace(global_batch=MIN_MICROBATCHES + 3)) is None  # saves too little
    long = plan.replace(global_batch=8 * MIN_MICROBATCHES + 3)
    m1, m2 = points(long)
    assert m2 - m1 == 4 and (long.microbatches - m1) % 4 == 0
