"""`ratrain validate`: the statistics on known data; a 2-plan grid through the runtime."""

import json

import pytest

from ratrain.cli import main
from ratrain.errors import RatrainError
from ratrain.validate import stats
from ratrain.validate.grid import default_grid, load_grid


def test_mape_and_max_error():
    assert stats.mape([1.1, 0.8], [1.0, 1.0]) == pytest.approx(0.15)
    assert stats.max_error([1.1, 0.8], [1.0, 1.0]) == pytest.approx(0.2)
    assert stats.errors([3.0], [2.0]) == [0.5]
    with pytest.raises(ValueError):
        stats.mape([1.0], [0.0])


def test_kendall_tau_known_values():
    assert stats.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert stats.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # one discordant pair of six: (5 - 1) / 6
    assert stats.kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)
    # tau-b with a tie in x: pairs 5 untied in x, 6 in y; C=5, D=0 -> 5/sqrt(5*6)
    assert stats.kendall_tau([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / 30**0.5)


def test_best_within():
    pick, slower = stats.best_within([1.0, 2.0, 3.0], [1.04, 1.0, 2.0])
    assert pick == 0 and slower == pytest.approx(0.04)
    assert stats.best_within([2.0, 1.0], [2.0, 1.0]) == (1, 0.0)


def test_default_grid_covers_the_issue_axes():
    grid = default_grid()
    assert len(grid) >= 12 and len({g.model for g in grid}) == 2
    plans = [g.plan for g in grid]
    assert {p.schedule for p in plans} == {"baseline", "gpu-style", "ratrain"}
    assert {p.recompute[0] for p in plans} == {"none", "selective", "full"}
    assert {p.compute_dtype for p in plans} == {"fp32", "bf16"}
    assert {p.pipeline for p in plans} == {"1f1b", "zb-h1", "zb-h2"}
    assert any(p.shard_optimizer for p in plans) and any(
        p.view_policy == "transient" for p in plans
    )
    assert {p.pp for p in plans} >= {1, 2} and {p.dp for p in plans} >= {1, 2}
    assert len({p.micro_batch for p in plans}) >= 3
    # one job per model: the planner's pick among them is meaningful
    for model in {g.model for g in grid}:
        assert len({g.plan.global_batch for g in grid if g.model == model}) == 1
    assert all(g.plan.pp * g.plan.dp <= 2 for g in default_grid(2))


def test_grid_file_errors(tmp_path):
    bad = tmp_path / "g.yaml"
    bad.write_text("plans: [{model: nope}]\n")
    with pytest.raises(RatrainError, match="unknown model"):
        load_grid(bad)
    with pytest.raises(RatrainError, match="cannot read"):
        load_grid(tmp_path / "missing.yaml")


GRID = """
models:
  tiny: {n_layers: 2, hidden: 64, n_heads: 4, n_kv_heads: 4, ffn: 172, vocab: 256}
plans:
  - {name: a, model: tiny, micro_batch: 2, global_batch: 4, seq: 32}
  - {name: b, model: tiny, pp: 2, micro_batch: 1, global_batch: 4, seq: 32, compute_dtype: bf16}
"""


@pytest.mark.timeout(240)
def test_validate_two_plan_grid(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    png = tmp_path / "v.png"
    rc = main(
        [
            "validate", "--platform", "cpu-local", "--grid", str(grid), "--steps", "2", "--passes", "1",
            "--json", "--plot", str(png),
        ]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    s = doc["summary"]
    assert s["plans"] == len(doc["results"]) and s["mape"] >= 0 and -1 <= s["kendall_tau"] <= 1
    assert doc["models"]["tiny"]["hidden"] == 64  # what `validate --rescore` reads back
    for r in doc["results"]:
        assert r["measured_step_s"] > 0 and r["predicted_step_s"] > 0
        assert len(r["step_times_s"]) == 3
        assert all(m > 0 for reps in r["measured_peak_bytes"] for m in reps)
        assert len(r["ledger_peak_bytes"]) == r["plan"]["pp"]
        # The ledger is never under the measured peak and at most 10% over it, on every
        # rank, down to this toy size (32-token microbatches, where the step-long token ids
        # and the held SEND buffers weigh most).
        assert all(0.0 <= e <= 0.10 for e in r["memory_errors"]), (r["name"], r["memory_errors"])
    names = [r["name"] for r in doc["results"]]
    pick = s["planner_pick"]["tiny"]
    assert pick["pick"] in names and pick["sim_pick"] in names
    assert names[:2] == ["a", "b"] and len(names) in (2, 3)  # plus ratrain plan's pick
    assert pick["within_5pct"] == (pick["slower_than_fastest"] <= 0.05)
    assert png.stat().st_size > 0 and (tmp_path / "v-worst.png").stat().st_size > 0
    assert (tmp_path / "v-worst-sim.json").exists()


def test_step_breakdown_on_known_events():
    from types import SimpleNamespace

    from ratrain.schedule.ir import Action, Op
    from ratrain.validate.breakdown import kind_of, merge, step_breakdown

    assert kind_of("F", (0,), 2) == "F.emb" and kind_of("B", (3,), 2) == "B.head"
    assert kind_of("F", (1,), 2) == "F.block" and kind_of("UPD", (1, 2), 2) == "UPD"

    def rec(name, op, res, t0, t1, replica=0):
        args = {"replica": replica}
        return dict(name=name, stage=0, op=op, resource=res, start_s=t0, end_s=t1, args=args)

    records = [
        rec("0F0@1", "F", "compute", 10.0, 10.3),
        rec("0B0@1", "B", "compute", 10.4, 11.0),
        rec("0SYNC@1", "SYNC", "dp_net", 11.0, 11.2),
        rec("0F0@1", "F", "compute", 10.0, 19.0, replica=1),  # other replicas are left out
    ]
    ev = SimpleNamespace
    sim = SimpleNamespace(
        step_time_s=1.0,
        pp=1,
        events=[
            ev(action=Action(Op.F, 0, (1,), 0), resource="compute", start_s=0.0, end_s=0.2),
            ev(action=Action(Op.B, 0, (1,), 0), resource="compute", start_s=0.2, end_s=0.6),
            ev(action=Action(Op.GRAD_SYNC, 0, (1,)), resource="dp_net", start_s=0.6, end_s=0.7),
        ],
    )
    out = step_breakdown(records, sim, n_layers=2)
    assert out["F.block"] == pytest.approx([0.3, 0.2])
    assert out["B.block"] == pytest.approx([0.6, 0.4])
    assert out["SYNC"] == pytest.approx([0.2, 0.1])
    assert out["step"] == pytest.approx([1.2, 1.0])
    assert out["idle"] == pytest.approx([1.2 - 0.9, 1.0 - 0.6])
    both = merge([out, out])
    assert both["F.block"] == pytest.approx([0.6, 0.4])


@pytest.mark.timeout(180)
def test_validate_passes_split_the_timed_steps(tmp_path):
    import statistics

    from ratrain.platforms import load
    from ratrain.validate.run import validate

    grid_file = tmp_path / "g.yaml"
    grid_file.write_text(GRID.split("  - {name: b")[0])  # plan a only (one rank)
    grid = load_grid(grid_file)
    results, summary = validate(
        grid, load("cpu-local"), steps=3, warmup=1, plan_picks=False, passes=2
    )
    (r,) = results
    # 3 timed steps over 2 passes: 2 per pass, each after its own warm-up step
    assert len(r.step_times_s) == 2 * (1 + 2)
    timed = r.step_times_s[1:3] + r.step_times_s[4:6]
    assert r.measured_step_s == pytest.approx(statistics.median(timed))
    assert summary["plans"] == 1
    with pytest.raises(RatrainError, match="passes"):
        validate(grid, load("cpu-local"), plan_picks=False, passes=0)


@pytest.mark.timeout(120)
def test_a_plan_that_fails_to_run_is_one_line(tmp_path, capfd, monkeypatch):
    """A rank raising (the RATRAIN_FAULT hook) ends validate with one line naming the plan,
    the rank, what and the step, after the progress line is closed; exit code 1."""
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID.split("  - {name: b")[0])  # plan a only (one rank)
    monkeypatch.setenv("RATRAIN_FAULT", "0:0:step-raise")
    argv = ["validate", "--platform", "cpu-local", "--grid", str(grid), "--steps", "1"]
    assert main([*argv, "--passes", "1", "--no-plan-pick"]) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("ratrain validate: error: plan a: rank 0 failed (RuntimeError: ")
    assert lines[-1].endswith("at step 0") and "injected fault" in lines[-1]
    assert all(line.startswith("validate [") for line in lines[:-1]), lines
