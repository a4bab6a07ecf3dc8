"""A structure's first bound (no recompute, no overheads) takes a shorter path through
`step_time_lower_bound_s`: it must be the general path's value bit for bit, on every pass
order, splits of one to many stages and microbatch counts on both sides of the warm-ups."""

import random

import pytest

from ratrain.planner.time_bound import (
    Overheads,
    UnitTimes,
    _plain_bound_s,
    plain_bounds_s,
    step_time_lower_bound_s,
)


def _unit_times(rng: random.Random, split_backward: bool) -> UnitTimes:
    def t() -> float:
        return rng.uniform(1e-4, 2.0) * rng.choice((1.0, 1e-3, 37.0))

    halves = {}
    if split_backward:
        halves = dict(bi_emb=t(), bi_block=t(), bi_head=t(), bw_emb=t(), bw_block=t(), bw_head=t())
    return UnitTimes(
        f_emb=t(),
        b_emb=t(),
        f_block=t(),
        b_block=t(),
        f_head=t(),
        b_head=t(),
        rc_full=t(),
        rc_selective=t(),
        **halves,
    )


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h1", "zb-h2"])
def test_plain_bound_is_the_general_bound_bit_for_bit(pipeline):
    rng = random.Random(f"plain-{pipeline}")
    for _ in range(400):
        pp = rng.choice((1, 2, 3, 5, 8, 17, 48))
        split = tuple(rng.randint(0, 6) for _ in range(pp))
        m = rng.choice((1, 2, pp, 2 * pp + 1, 2 * pp + 2, rng.randint(1, 300)))
        ut = _unit_times(rng, pipeline != "1f1b")
        general = step_time_lower_bound_s(split, m, ut, over=Overheads.none(pp), pipeline=pipeline)
        assert _plain_bound_s(split, m, ut, pipeline) == general
        # and the public call takes the short path where nothing else is given
        assert step_time_lower_bound_s(split, m, ut, pipeline=pipeline) == general


def test_plain_bound_grows_with_the_work():
    """Not a constant: more microbatches or a slower block lengthen the bound."""
    ut = UnitTimes(0.1, 0.2, 1.0, 2.0, 0.5, 1.0, 1.0, 0.3)
    split = (2, 3, 3, 2)
    assert _plain_bound_s(split, 16, ut, "1f1b") > _plain_bound_s(split, 8, ut, "1f1b")
    slower = UnitTimes(0.1, 0.2, 1.5, 2.0, 0.5, 1.0, 1.0, 0.3)
    assert _plain_bound_s(split, 8, slower, "1f1b") > _plain_bound_s(split, 8, ut, "1f1b")


def test_the_pipelines_bounds_together_are_each_alone():
    """`plain_bounds_s` (a structure's bounds under 1F1B and the split backwards, the stage
    times shared): each the general path's value bit for bit, in the order asked."""
    rng = random.Random("plain-together")
    for _ in range(300):
        pp = rng.choice((1, 2, 3, 5, 8, 17, 48))
        split = tuple(rng.randint(0, 6) for _ in range(pp))
        m = rng.choice((1, 2, pp, 2 * pp + 1, 2 * pp + 2, rng.randint(1, 300)))
        ut = _unit_times(rng, True)
        pipes = tuple(rng.sample(("1f1b", "zb-h1", "zb-h2"), rng.randint(1, 3)))
        want = [
            step_time_lower_bound_s(split, m, ut, over=Overheads.none(pp), pipeline=p)
            for p in pipes
        ]
        assert plain_bounds_s(split, m, ut, pipes) == want
