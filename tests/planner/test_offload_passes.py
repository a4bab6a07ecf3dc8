"""The offload counts of the step-time bound (`time_bound._offload_passes`): in closed
form from 2 pp + 2 microbatches on, they equal the walk of the whole pass order."""

import pytest

from ratrain.planner import time_bound


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h1", "zb-h2"])
def test_closed_form_equals_the_walk(pipeline):
    walked = time_bound._offload_passes_walked
    checked = 0
    for pp in (*range(1, 11), 13, 16, 24):
        for s in range(pp):
            edge = 2 * pp + 2  # the closed form's first count
            for m in (1, 2, pp, edge - 1, edge, edge + 1, edge + 2, 3 * pp + 7, 6 * pp + 11, 97):
                got = time_bound._offload_passes(pp, m, s, pipeline)
                assert got == walked(pp, m, s, pipeline), (pp, m, s)
                checked += m >= 2 * pp + 2
    assert checked > 300


def test_counts_grow_with_the_microbatches():
    # Every microbatch but the last is offloaded on a stage before the last.
    pairs, solos = time_bound._offload_passes(4, 400, 0, "1f1b")
    assert (pairs, solos) == (396, 3)
    assert time_bound._offload_passes(4, 400, 3, "zb-h2") == (0, 0)


@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
def test_weight_visits_closed_form_equals_the_pass_order(pipeline):
    from ratrain.schedule.lowering import weight_offloaded_mbs

    checked = 0
    for pp in (*range(1, 11), 13, 16, 24):
        for s in range(pp):
            edge = 2 * pp + 2
            for m in (1, 2, pp, edge - 1, edge, edge + 1, 3 * pp + 7, 97):
                got = time_bound._weight_visits(pp, m, s, pipeline)
                assert got == len(weight_offloaded_mbs(pp, m, s, pipeline)), (pp, m, s)
                checked += m >= edge and got > 0
    assert checked > 100
    # zb-h1 defers every weight pass but the last on the stages after the first; zb-h2
    # on the later half.
    assert time_bound._weight_visits(8, 100, 0, "zb-h1") == 0
    assert time_bound._weight_visits(8, 100, 1, "zb-h1") == 99
    assert time_bound._weight_visits(8, 100, 3, "zb-h2") == 0
    assert time_bound._weight_visits(8, 100, 4, "zb-h2") == 99
