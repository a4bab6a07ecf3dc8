"""A measured final choice on the command line: `ratrain plan --trial K` (one real run on
the tiny model, and the table with an injected timer), `ratrain train --plan auto` and its
resume, and `ratrain bench cluster`'s two picks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli import one_line_error
from ratrain.cli import main
from ratrain.config import load_plan
from ratrain.planner.report import describe

PLAN = ["plan", "--model", "tiny", "--platform", "cpu-local", "--clusters", "2"]
JOB = ["--seq", "32", "--global-batch", "4", "--pin", "compute_dtype=fp32"]


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_plan_trial_runs_the_plans_and_writes_the_fastest_measured(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    argv = [*PLAN, *JOB, "--trial", "2", "--trial-steps", "2", "--json", "-o", str(out)]
    assert main([*argv, "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    trial = doc["trial"]
    runs = trial["plans"]
    assert runs[0]["source"] == "#1" and runs[0]["plan"] == doc["ranked"][0]["plan"]
    assert len(runs) >= 2 and trial["timed_steps"] == 2 and trial["warmup_steps"] == 1
    assert 1 <= trial["rounds"] <= 3  # the default rounds
    assert all(len(r["runs_step_time_s"]) <= trial["rounds"] for r in runs)
    measured = [r for r in runs if r["measured_tokens_per_s"] is not None]
    assert measured, runs
    best = max(measured, key=lambda r: r["measured_tokens_per_s"])
    assert runs[trial["pick"]] is not None and runs[trial["pick"]] == best
    if runs[0]["measured_tokens_per_s"] is not None:
        want = 1 - runs[0]["measured_tokens_per_s"] / best["measured_tokens_per_s"]
        assert trial["regret"] == pytest.approx(want)
    plan, extras = load_plan(out)  # -o writes the measured pick
    assert describe(plan) == best["describe"]
    assert extras["measured"]["tokens_per_s"] == best["measured_tokens_per_s"]


def _fake_timer(fastest_last: bool = True, calls: list | None = None):
    """A timer that measures the last candidate fastest (the first slowest)."""

    def make(spec):
        order: list[str] = []

        def timer(c, total, left_s):
            if c.source not in order:
                order.append(c.source)
            if calls is not None:
                calls.append(c.source)
            i = order.index(c.source)
            return [[5.0] + [1.0 / (i + 1) if fastest_last else 1.0 + i] * (total - 1)]

        return timer

    return make


def test_plan_trial_prints_the_table_and_both_picks(capsys, monkeypatch):
    import ratrain.validate.trial as trial

    monkeypatch.setattr(trial, "local_timer", _fake_timer())
    assert main([*PLAN, *JOB, "--trial", "2"]) == 0
    cap = capsys.readouterr()
    assert "measured tok/s" in cap.out and "predicted tok/s" in cap.out
    assert "measured pick: [" in cap.out and "(regret)" in cap.out
    assert "measured pick, per stage" in cap.out
    assert cap.err.count(" steps ...") >= 2  # a progress line per trial plan


def test_plan_trial_flags_are_checked(capsys):
    one_line_error(capsys, [*PLAN, "--trial", "0"], "--trial")
    one_line_error(
        capsys, [*PLAN, "--trial", "2", "--trial-time-limit", "-1"], "--trial-time-limit"
    )


TRAIN = ["train", "--model", "tiny", "--seq", "16", "--global-batch", "4", "--nproc", "2"]


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_train_plan_auto_trains_the_measured_pick_and_a_resume_keeps_it(
    tmp_path, capfd, monkeypatch
):
    import ratrain.train.command as command
    import ratrain.validate.trial as trial

    calls: list = []
    monkeypatch.setattr(trial, "local_timer", _fake_timer(calls=calls))
    ck = tmp_path / "ck"
    argv = [*TRAIN, "--plan", "auto", "--steps", "2", "--save", str(ck), "--quiet"]
    assert main(argv) == 0
    err = capfd.readouterr().err
    said = [x for x in err.splitlines() if "--plan auto chose" in x]
    assert len(said) == 1, err
    meta = json.loads((ck / "step-00000002" / "ratrain.json").read_text())
    saved = meta["job"]["plan"]
    last = calls[-1]  # the fake timer measures the last plan tried fastest
    assert f"[{last}]" in said[0]
    assert saved["pp"] == meta["plan"]["pp"] and saved["schedule"] == meta["plan"]["schedule"]
    # the resume: no trial, the checkpoint's plan
    monkeypatch.setattr(trial, "local_timer", lambda spec: pytest.fail("a resume ran a trial"))
    seen = {}
    monkeypatch.setattr(command, "run_distributed", lambda r, s, p, cfg, src: seen.update(
        plan=p) or 0)  # fmt: skip
    resume = [*TRAIN, "--plan", "auto", "--steps", "3", "--save", str(ck), "--resume", "auto"]
    assert main(resume) == 0
    assert seen["plan"].to_dict() == meta["plan"]
    assert "the checkpoint's plan, chosen by its trial" in capfd.readouterr().err


def test_train_plan_auto_refuses_a_launcher(capsys, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    one_line_error(capsys, [*TRAIN, "--plan", "auto"], "--plan auto", "ratrain plan --trial")


def test_bench_cluster_reports_both_picks_and_the_regret():
    from ratrain.bench.cluster import Rate, _plan_key, picks
    from ratrain.cli.bench_cluster import picks_lines
    from ratrain.config import Plan

    fast = Plan(pp=2, micro_batch=2, global_batch=8)
    first = Plan(pp=2, micro_batch=1, global_batch=8, pipeline="zb-h2")
    runs = [
        {"measured_tokens_per_s": 1800.0},
        {"measured_tokens_per_s": 2400.0},
    ]
    entry = {
        "plan": fast,
        "predicted": 1990.0,
        "trial": {"plans": runs, "pick": 1, "regret": 0.25, "wall_s": 40.0},
        "prediction_pick": {"plan": first, "path": Path("p.yaml"), "predicted": 2025.0},
    }
    rate = Rate(400.0, runs={_plan_key(fast): [2386.0], _plan_key(first): [1848.0]})
    got = picks(rate, entry)
    assert got["prediction"]["tokens_per_s"] == 1848.0 and got["trial"]["tokens_per_s"] == 2386.0
    assert got["regret"] == pytest.approx(1 - 1848.0 / 2386.0)  # by the repeats
    assert got["regret_trial"] == 0.25
    assert picks(rate, {"plan": fast, "predicted": 1.0}) is None  # no trial: no picks
    res = [{"link_bits_per_s": 4e8, "caps": [{"cap_bytes": 123 * 2**20, "picks": got}]}]
    text = "\n".join(picks_lines(res))
    assert "| 400 | 123 |" in text and "22.5%" in text and "2 in 40 s" in text
    assert picks_lines([{"link_bits_per_s": 4e8, "caps": [{"cap_bytes": 1}]}]) == []


def test_bench_cluster_ratrain_entry_is_the_trials_pick(tmp_path, monkeypatch):
    """ratrain's entry at one cap: the candidates run on the network (a fake one here that
    measures the last candidate fastest), the fastest measured written as the family's
    plan file, the prediction-only pick kept beside it and timed in the repeats too."""
    import ratrain.bench.cluster as cluster

    timed: list[Path] = []

    def fake_timed(net, setup, plan_path, ranks, metrics, steps=None):
        timed.append(plan_path)
        i = int(plan_path.stem.rsplit("trial", 1)[1])
        return {"times": [5.0] + [1.0 / i] * (steps - 1)}

    monkeypatch.setattr(cluster, "ratrain_timed", fake_timed)
    setup = cluster.Setup(model="tiny", seq=32, global_batch=4, nodes=1, ranks_per_node=2,
                          out=tmp_path, progress=False, trial=2, warmup=1)  # fmt: skip
    rate = cluster.Rate(100.0, platform=Path("cpu-local"))
    path = tmp_path / "plan-ratrain.yaml"
    plan, extras = cluster.ratrain_trial(object(), setup, rate, 0.25, path)
    n = len(extras["trial"]["plans"])
    assert n >= 2 and len(timed) == n
    assert extras["trial"]["pick"] == n - 1  # the fake measured the last fastest
    assert load_plan(path)[0] == plan
    pred = extras["prediction_pick"]
    assert pred["plan"] != plan and load_plan(pred["path"])[0] == pred["plan"]
    assert extras["trial"]["plans"][0]["describe"] == describe(pred["plan"])
    rate.plans[(0.25, "ratrain")] = {"plan": plan, "path": path, **extras}
    keys = [k for k, _ in cluster._jobs(setup, rate, [])]
    assert keys == [cluster._plan_key(plan), cluster._plan_key(pred["plan"])]
