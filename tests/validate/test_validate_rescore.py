"""`ratrain validate --rescore PREV.json`: the measurements of an earlier run re-predicted
on another platform, without the runtime (a synthetic PREV file)."""

import json

import pytest

from _validate import JOB, MEASURED_S, PLANS, TINY, previous_run
from ratrain.cli import main
from ratrain.config import Plan
from ratrain.models.spec import ModelSpec
from ratrain.platforms import load
from ratrain.sim import simulate
from ratrain.validate import stats
from ratrain.validate.rescore import rescore


def test_rescore_predicts_each_measured_plan_again(tmp_path):
    plat = load("cpu-local")
    results, summary, before = rescore(previous_run(tmp_path), plat, plan_picks=False)
    spec = ModelSpec(name="tiny", **TINY)
    pred = []
    for r in results:
        sim = simulate(spec, Plan(**JOB, **PLANS[r.name]), plat, memory_timeline=False)
        assert r.predicted_step_s == pytest.approx(sim.step_time_s)
        assert r.ledger_peak_bytes == list(sim.peak_memory_bytes)
        assert r.measured_step_s == MEASURED_S[r.name]
        pred.append(sim.step_time_s)
    meas = [MEASURED_S[n] for n in PLANS]
    assert summary["mape"] == pytest.approx(stats.mape(pred, meas))
    assert summary["max_error"] == pytest.approx(stats.max_error(pred, meas))
    assert summary["kendall_tau"] == pytest.approx(stats.kendall_tau(pred, meas))
    assert before["mape"] == 0.5
    # No planner search: the simulator's fastest measured row is judged.
    row = summary["planner_pick"]["tiny"]
    assert row["pick_measured"] is False and row["pick"] == row["sim_pick"]


def test_rescore_judges_the_planner_pick_from_measured_rows(tmp_path):
    plat = load("cpu-local")
    results, summary, _ = rescore(previous_run(tmp_path), plat)
    row = summary["planner_pick"]["tiny"]
    names = [r.name for r in results]
    if row["pick_measured"]:
        assert row["pick"] in names
    else:  # the pick is a plan the file never ran: said, and not judged
        assert "pp=" in row["pick_plan"]
    fastest = min(results, key=lambda r: r.measured_step_s)
    assert row["measured_fastest"] == fastest.name == "a"


def test_rescore_cli_json_and_text(tmp_path, capsys):
    prev = previous_run(tmp_path, models=False)  # an old file: the models come from --grid
    grid = tmp_path / "grid.yaml"
    grid.write_text(json.dumps({"models": {"tiny": TINY}, "plans": []}))
    png = tmp_path / "r.png"
    argv = ["validate", "--rescore", str(prev), "--platform", "cpu-local", "--grid", str(grid)]
    assert main([*argv, "--no-plan-pick", "--json", "--plot", str(png)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["results"]] == list(PLANS)
    assert doc["previous_summary"]["mape"] == 0.5 and doc["models"]["tiny"]["hidden"] == 64
    assert png.stat().st_size > 0
    assert main([*argv, "--no-plan-pick"]) == 0
    out = capsys.readouterr().out
    assert "MAPE" in out and "as measured, with the file's own platform: MAPE 50.0%" in out


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: "not json", "not JSON"),
        (lambda d: {"results": []}, "non-empty results"),
        (lambda d: d["results"][0].pop("plan") and None, "needs name, model, plan"),
        (lambda d: d["results"][0].update(model="huge"), "model 'huge'"),
        (lambda d: d["results"][0]["plan"].update(pp=7), "bad plan"),
        (lambda d: d["results"][0]["plan"].update(colour=1), "unknown field"),
        (lambda d: d["results"][1].update(measured_step_s=0), "positive number"),
        (lambda d: d["results"][1].update(measured_peak_bytes=[[1]]), "pp x dp"),
        (lambda d: d["results"][1].update(name="a"), "unique"),
    ],
)
def test_rescore_bad_file_is_one_line(tmp_path, capsys, mutate, message):
    path = previous_run(tmp_path)
    doc = json.loads(path.read_text())
    new = mutate(doc)
    text = new if isinstance(new, str) else json.dumps(new if isinstance(new, dict) else doc)
    path.write_text(text)
    rc = main(["validate", "--rescore", str(path), "--platform", "cpu-local", "--no-plan-pick"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err


def test_rescore_missing_file(tmp_path, capsys):
    rc = main(["validate", "--rescore", str(tmp_path / "no.json"), "--platform", "cpu-local"])
    assert rc == 2 and "cannot read" in capsys.readouterr().err


def test_the_planner_pick_is_judged_within_its_compute_dtype():
    """The planner's search is pinned to the grid's compute dtype: a plan of another dtype
    measured faster is named beside the verdict, not judged against the pick."""
    from ratrain.validate.results import PlanResult, summarize

    def row(name, dtype, measured):
        plan = {"compute_dtype": dtype}
        return PlanResult(name, "m", plan, measured, measured, [1], [[1]])

    results = [row("a", "fp32", 1.0), row("pick", "fp32", 1.02), row("half", "bf16", 0.7)]
    verdict = summarize(results, {"m": "pick"})["planner_pick"]["m"]
    assert verdict["measured_fastest"] == "a" and verdict["within_5pct"]
    assert verdict["slower_than_fastest"] == pytest.approx(0.02)
    assert verdict["measured_fastest_other_dtype"] == "half"
    slow = [row("a", "fp32", 1.0), row("pick", "fp32", 1.2)]
    verdict = summarize(slow, {"m": "pick"})["planner_pick"]["m"]
    assert not verdict["within_5pct"] and "measured_fastest_other_dtype" not in verdict
