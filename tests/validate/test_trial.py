"""The trial (`ratrain.validate.trial`): the fastest measured plan is kept, whatever the
prediction said; a plan whose run fails is skipped with a line; past the time limit the
plans left are not started; the regret is the prediction-only pick's shortfall. The
timer is injected, so the measures are known."""

from __future__ import annotations

import pytest

from ratrain.config import Plan
from ratrain.planner.candidates import TrialCandidate
from ratrain.validate.trial import run_trial, slowest_median_s, trial_lines

TOKENS = 8 * 64


def _cand(i: int, predicted: float, **plan) -> TrialCandidate:
    p = Plan(global_batch=8, seq=64, **plan)
    return TrialCandidate(p, "ratrain", predicted, TOKENS / predicted, f"#{i}")


CANDS = [
    _cand(1, 300.0, pp=2, micro_batch=1, pipeline="zb-h2"),
    _cand(2, 290.0, pp=2, micro_batch=2),
    _cand(3, 280.0, pp=1, micro_batch=2),
]


def _timer(step_s: dict, calls: list | None = None):
    """Each plan's ranks take these steps: a slow warm-up step, then `step_s` (per rank),
    with one outlier step that the median must ignore."""

    def timer(c: TrialCandidate, total: int, left_s: float) -> list[list[float]]:
        if calls is not None:
            calls.append((c.source, total))
        got = step_s[c.source]
        if isinstance(got, BaseException):
            raise got
        return [[10.0] + [s] * (total - 2) + [s * 5] for s in got]

    return timer


def test_the_fastest_measured_is_kept_and_the_regret_is_the_first_plans_shortfall():
    calls: list = []
    # #1 is predicted fastest but measures slowest; #2's slowest rank takes 1.0 s a step
    times = {"#1": (1.5, 1.2), "#2": (0.8, 1.0), "#3": (1.25, 1.25)}
    lines: list[str] = []
    res = run_trial(CANDS, _timer(times, calls), warmup=1, steps=5, progress=lines.append)
    assert calls == [("#1", 6), ("#2", 6), ("#3", 6)]
    assert [r.step_s for r in res.runs] == [1.5, 1.0, 1.25]  # slowest rank, median
    assert res.pick is res.runs[1] and res.prediction_pick is res.runs[0]
    assert res.pick.tokens_per_s == pytest.approx(TOKENS / 1.0)
    assert res.regret == pytest.approx(1 - 1.0 / 1.5)
    assert len([x for x in lines if x.endswith("...")]) == 3  # a progress line per plan
    text = "\n".join(trial_lines(res))
    assert "measured pick: [#2]" in text and "33.3% slower" in text
    doc = res.to_json()
    assert doc["pick"] == 1 and doc["prediction_pick"] == 0
    assert doc["plans"][0]["measured_step_time_s"] == 1.5


def test_when_the_first_plan_measures_fastest_the_regret_is_zero():
    res = run_trial(CANDS, _timer({"#1": (1.0,), "#2": (1.1,), "#3": (1.2,)}), steps=3)
    assert res.pick is res.runs[0] and res.regret == 0.0


def test_a_failing_plan_is_skipped_with_a_line():
    times = {"#1": (1.0,), "#2": MemoryError("out of memory at stage 1"), "#3": (0.9,)}
    lines: list[str] = []
    res = run_trial(CANDS, _timer(times), steps=3, progress=lines.append)
    failed = [x for x in lines if "failed, skipped" in x]
    assert len(failed) == 1 and "MemoryError: out of memory at stage 1" in failed[0]
    assert res.runs[1].tokens_per_s is None and "out of memory" in res.runs[1].error
    assert res.pick is res.runs[2]
    assert "failed" in "\n".join(trial_lines(res))


def test_when_the_first_plan_fails_there_is_no_regret_and_when_all_fail_no_pick():
    boom = RuntimeError("rank 0 died")
    res = run_trial(CANDS, _timer({"#1": boom, "#2": (1.0,), "#3": (1.1,)}), steps=3)
    assert res.pick is res.runs[1] and res.regret is None
    res = run_trial(CANDS, _timer({"#1": boom, "#2": boom, "#3": boom}), steps=3)
    assert res.pick is None and res.regret is None
    assert "no plan of the trial ran" in "\n".join(trial_lines(res))


def test_past_the_time_limit_the_plans_left_are_not_started():
    now = [0.0]

    def timer(c, total, left_s):
        assert left_s == pytest.approx(10.0 - now[0])  # a run may take what is left
        now[0] += 6.0
        return [[1.0] * total]

    lines: list[str] = []
    res = run_trial(
        CANDS, timer, steps=2, limit_s=10.0, progress=lines.append, clock=lambda: now[0]
    )
    assert [r.tokens_per_s is not None for r in res.runs] == [True, True, False]
    assert "time limit" in res.runs[2].error and "time limit" in lines[-1]


def test_an_interrupt_is_not_a_failed_plan():
    with pytest.raises(KeyboardInterrupt):
        run_trial(CANDS, _timer({"#1": KeyboardInterrupt()}), steps=2)


def test_slowest_median():
    assert slowest_median_s([[9.0, 1.0, 2.0, 3.0], [9.0, 2.0, 2.0, 2.5]], 1) == 2.0
    with pytest.raises(ValueError):
        slowest_median_s([[9.0]], 1)
