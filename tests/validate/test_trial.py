"""The trial (`ratrain.validate.trial`): the fastest measured plan is kept, whatever the
prediction said; plans within the margin of the fastest run again, in interleaved rounds,
and are measured by the median of their runs; a plan whose run fails is dropped with a
line; past the time limit no run is started; the regret is the prediction-only pick's
shortfall. The timer is injected, so the measures are known."""

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


def test_a_failing_plan_is_dropped_with_a_line():
    times = {"#1": (1.0,), "#2": MemoryError("out of memory at stage 1"), "#3": (0.9,)}
    lines: list[str] = []
    res = run_trial(CANDS, _timer(times), steps=3, progress=lines.append)
    failed = [x for x in lines if "failed, dropped" in x]
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


def _sequence_timer(seq: dict, calls: list):
    """Each call of a plan takes the next of its step times (every rank, every step)."""

    def timer(c, total, left_s):
        calls.append(c.source)
        got = seq[c.source].pop(0)
        if isinstance(got, BaseException):
            raise got
        return [[got] * total]

    return timer


def test_plans_within_the_margin_run_again_interleaved_and_the_median_of_their_runs_decides():
    # #1's first run was a fast minute (1.00 s); its next two take 1.12 s. #2 measures 1.05
    # s each time; #3, 40% behind after one run, is not run again.
    seq = {"#1": [1.00, 1.12, 1.12], "#2": [1.05, 1.05, 1.05], "#3": [1.40]}
    calls: list = []
    lines: list[str] = []
    res = run_trial(CANDS, _sequence_timer(seq, calls), steps=2, rounds=3, margin=0.08,
                    progress=lines.append)  # fmt: skip
    assert calls == ["#1", "#2", "#3", "#2", "#1", "#1", "#2"]  # reversed every other round
    assert res.rounds == 3
    assert res.runs[0].runs_s == [1.00, 1.12, 1.12] and res.runs[0].step_s == 1.12
    assert res.runs[1].step_s == 1.05 and res.runs[2].runs_s == [1.40]
    assert res.pick is res.runs[1]  # one run each would have kept #1
    assert res.regret == pytest.approx(1 - 1.05 / 1.12)
    assert any("round 2/3: 2 plans within 8%" in x for x in lines)
    doc = res.to_json()
    assert doc["rounds"] == 3 and doc["plans"][0]["runs_step_time_s"] == [1.00, 1.12, 1.12]
    assert " 3  " in trial_lines(res)[3]  # the runs column


def test_a_single_round_keeps_the_first_measures():
    seq = {"#1": [1.00, 1.30, 1.30], "#2": [1.05, 1.05, 1.05], "#3": [1.40]}
    calls: list = []
    res = run_trial(CANDS, _sequence_timer(seq, calls), steps=2, rounds=1)
    assert calls == ["#1", "#2", "#3"] and res.pick is res.runs[0] and res.rounds == 1


def test_rounds_end_when_one_plan_leads_by_more_than_the_margin():
    seq = {"#1": [1.00, 1.00], "#2": [1.06, 1.30], "#3": [1.50]}
    calls: list = []
    res = run_trial(CANDS, _sequence_timer(seq, calls), steps=2, rounds=3, margin=0.08)
    # round 2 runs #1 and #2; #2 (median 1.18 s) is then 15% behind: no third round
    assert calls == ["#1", "#2", "#3", "#2", "#1"] and res.rounds == 2
    assert res.pick is res.runs[0]


def test_a_plan_that_fails_in_a_later_round_is_dropped():
    seq = {"#1": [1.00, RuntimeError("rank 1 died")], "#2": [1.05, 1.05], "#3": [2.0]}
    lines: list[str] = []
    res = run_trial(CANDS, _sequence_timer(seq, []), steps=2, rounds=2, progress=lines.append)
    assert res.runs[0].tokens_per_s is None and "rank 1 died" in res.runs[0].error
    assert res.pick is res.runs[1] and res.regret is None
    assert any("round 2]: failed, dropped" in x or "round 2: failed, dropped" in x for x in lines)


def test_past_the_time_limit_later_rounds_stop_without_a_plan_marked_untried():
    now = [0.0]
    seq = {"#1": [1.0, 1.0], "#2": [1.0, 1.0], "#3": [1.0, 1.0]}

    def timer(c, total, left_s):
        now[0] += 4.0
        return [[seq[c.source].pop(0)] * total]

    res = run_trial(CANDS, timer, steps=2, rounds=3, limit_s=14.0, clock=lambda: now[0])
    # 3 first runs (12 s), one more in round 2 (16 s), then nothing
    assert [len(r.runs_s) for r in res.runs] == [1, 1, 2]  # round 2 runs #3 first
    assert all(r.error is None for r in res.runs)


def test_bad_rounds_or_margin_are_refused():
    with pytest.raises(ValueError, match="rounds"):
        run_trial(CANDS, _timer({}), rounds=0)
    with pytest.raises(ValueError, match="margin"):
        run_trial(CANDS, _timer({}), margin=1.0)


def test_an_interrupt_is_not_a_failed_plan():
    with pytest.raises(KeyboardInterrupt):
        run_trial(CANDS, _timer({"#1": KeyboardInterrupt()}), steps=2)


def test_slowest_median():
    assert slowest_median_s([[9.0, 1.0, 2.0, 3.0], [9.0, 2.0, 2.0, 2.5]], 1) == 2.0
    with pytest.raises(ValueError):
        slowest_median_s([[9.0]], 1)
