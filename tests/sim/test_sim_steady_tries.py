"""The steady-state shortcut's later tries (twice the warm-up, made while all the short
steps stay no longer than the step) give the full simulation's step, and the tries stop
where they would cost more than the step."""

import pytest

from _steady import offload_plan
from ratrain.models.presets import get_preset
from ratrain.platforms.load import load
from ratrain.sim import simulate, steady
from ratrain.sim.steady import MIN_SAVING, extrapolate, points
from ratrain.sim.steady_one import one_point

TINY = get_preset("tiny")


def test_tries_stop_where_the_short_steps_would_outgrow_the_step():
    for m in (60, 90, 130, 400):
        plan, spent, attempt = offload_plan(2, m), 0, 0
        while (pts := points(plan, attempt, spent)) is not None:
            cost = sum(pts)
            assert pts[1] - pts[0] == plan.pp
            if attempt == 0:
                assert MIN_SAVING * cost <= m
            spent, attempt = spent + cost, attempt + 1
            assert spent <= m  # at worst the short steps cost the step once more
        assert attempt >= 1
    assert points(offload_plan(2, 60), 1, sum(points(offload_plan(2, 60)))) is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "platform,pp,m,view",
    [
        ("mt3000", 2, 90, "persistent"),
        ("mt3000", 2, 130, "transient"),
        ("mt3000", 4, 200, "transient"),
    ],
)
def test_a_second_try_equals_the_full_simulation(platform, pp, m, view):
    pl = load(platform)
    plan = offload_plan(pp, m, view)

    def short(p):
        return simulate(TINY, p, pl, memory_timeline=False)

    first = points(plan)
    assert first is not None
    assert steady._from_points(plan, first, short, None) is None  # the first try fails here
    got = extrapolate(plan, short)
    assert got is not None  # the second one repeats
    full = simulate(TINY, plan, pl, memory_timeline=False)
    assert got.step_time_s == pytest.approx(full.step_time_s, rel=1e-9, abs=0)
    assert got.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-8, abs=1e-12)
    for u, v in zip(got.utilization, full.utilization, strict=True):
        assert u == pytest.approx(v, rel=1e-8, abs=1e-12)


def test_a_simulation_is_expected_to_cost_the_last_one_per_microbatch():
    from ratrain.planner import Request
    from ratrain.planner.evaluate import Evaluator, simulated_microbatches

    req = Request(TINY, load("mt3000"), 8, 16, 128)
    ev = Evaluator(req)
    small = offload_plan(2, 8).replace(offload_activations=False)
    assert ev.expected_simulate_s(small) == 0.0  # nothing simulated yet: no estimate
    ev.simulate(small)
    assert ev.last_simulate_microbatches == 8 and ev.last_simulate_s > 0
    double = small.replace(global_batch=2 * small.global_batch)
    assert ev.expected_simulate_s(double) == pytest.approx(2 * ev.last_simulate_s)
    long = small.replace(global_batch=2 * 400)  # timed from one short step
    m2 = one_point(long, 0, 0, MIN_SAVING, steady.MIN_MICROBATCHES)
    assert m2 and simulated_microbatches(long) == m2 < long.microbatches
    assert simulated_microbatches(long, steady=False) == long.microbatches
