"""`ratrain plan` and `ratrain bench paper`: output, plan files that `ratrain simulate`
reads with the same memory, infeasibility with exit code 2, user errors."""

import json

import pytest
import yaml

from ratrain.cli import main


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.timeout(120)
def test_plan_memory_equals_simulate_of_the_written_plan(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    png = tmp_path / "mem.png"
    rc = main(
        [
            "plan",
            "--model",
            "llama2-7b",
            "--platform",
            "mt3000",
            "--clusters",
            "64",
            "--top",
            "2",
            "--time-budget",  # its first fit is timed at about 2 s on a slow machine
            "5",
            "--quiet",
            "--json",
            "-o",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    got = _json(capsys)
    for key in ("feasible", "plan", "predicted", "search_time_s", "candidates_evaluated"):
        assert key in got
    assert got["feasible"] and got["global_batch"] == 1024 and got["seq"] == 4096
    pred = got["predicted"]
    assert len(pred["peak_memory_bytes"]) == got["plan"]["pp"]
    assert max(pred["peak_memory_bytes"]) <= 20e9 - 0.5e9
    assert png.stat().st_size > 0
    assert yaml.safe_load(out.read_text())["plan"]["model"] == "llama2-7b"

    assert main(["simulate", "--plan", str(out), "--platform", "mt3000", "--json"]) == 0
    sim = _json(capsys)
    assert sim["peak_memory_bytes"] == pred["peak_memory_bytes"]
    assert sim["step_time_s"] == pytest.approx(pred["step_time_s"], rel=1e-12)
    assert sim["tokens_per_s"] == pytest.approx(pred["tokens_per_s"], rel=1e-12)


@pytest.mark.timeout(120)
def test_llama2_70b_on_8_clusters_is_explained_with_exit_code_2(capsys):
    rc = main(["plan", "--model", "llama2-70b", "--clusters", "8", "--quiet", "--time-budget", "0"])
    assert rc == 2
    text = capsys.readouterr().out
    assert "no plan fits" in text and "over by" in text
    assert "cheapest change that fits: use" in text and "clusters instead of 8" in text
    assert "optimizer" in text  # the state class that dominates the overflowing stage


@pytest.mark.timeout(120)
def test_infeasible_json_has_the_explanation(capsys):
    rc = main(
        [
            "plan",
            "--model",
            "llama2-7b",
            "--clusters",
            "8",
            "--quiet",
            "--json",
            "--pin",
            "pp=2",
            "--pin",
            "recompute=none",
        ]
    )
    assert rc == 2
    got = _json(capsys)
    assert got["feasible"] is False
    ex = got["explanation"]
    assert ex["over_bytes"] > 0 and ex["stage"] is not None and ex["largest_class"]
    assert any("recompute" in c["change"] for c in ex["changes"])
    assert all(max(c["peak_memory_bytes"]) <= 19.5e9 for c in ex["changes"])


def test_table_output_and_batch_in_tokens(capsys):
    rc = main(
        [
            "plan",
            "--model",
            "tiny",
            "--platform",
            "cpu-local",
            "--clusters",
            "4",
            "--global-batch-tokens",
            "1024",
            "--seq",
            "128",
            "--quiet",
            "--baselines",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "global batch 8 x 128 tokens" in text
    assert "tokens/s" in text and "why #1" in text and "vs best gpu-style" in text
    assert "largest classes at the peak" in text


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--pin", "nosuch=1"], "unknown field"),
        (["--pin", "pp=x"], "expected an integer"),
        (["--global-batch-tokens", "1000", "--seq", "128"], "not a multiple"),
        (["--seq", "100000"], "max_seq"),
        (["--time-budget", "-1"], "--time-budget"),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(argv, message, capsys):
    rc = main(["plan", "--model", "tiny", "--clusters", "4", "--quiet", *argv])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_help_says_the_global_batch_is_in_sequences(capsys):
    assert main(["plan", "--help"]) == 0
    assert "sequences per optimizer step" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_bench_paper_writes_table_json_and_plot(tmp_path, capsys):
    rc = main(
        [
            "bench",
            "paper",
            "--out",
            str(tmp_path),
            "--models",
            "llama2-7b",
            "--clusters",
            "512,1024",
            "--quiet",
        ]
    )
    assert rc == 0
    md = (tmp_path / "paper_eval.md").read_text()
    assert "112,790.55" in md and "1.35x" in md and "| llama2-7b |" in md
    data = json.loads((tmp_path / "paper_eval.json").read_text())
    row = data["models"][0]
    assert row["speedup"]["best_baseline"] > 0
    assert set(row["baselines"]) == {"gpu-style", "zero1-pp", "fsdp-pp"}
    (abl,) = data["ablation"]
    assert abl["model"] == "llama2-7b" and len(abl["relative"]) == 6
    assert "Where RATrain's gain comes from" in md
    (zb,) = data["zero_bubble"]  # what ZB adds: the ablation's 1F1B-only plan beside it
    assert zb["ratrain_1f1b_tokens_per_s"] == pytest.approx(
        abl["full_tokens_per_s"] * abl["relative"]["ratrain-no-zb"]
    )
    assert "What zero-bubble pass orders add" in md and "best zb-h2 plan tokens/s" in md
    assert [p["clusters"] for p in data["scaling"]] == [512, 1024]
    assert data["scaling"][0]["efficiency"] == pytest.approx(1.0)
    assert (tmp_path / "paper_eval.png").stat().st_size > 0


def test_default_global_batch_is_sized_to_the_model_and_clusters(capsys):
    from ratrain.cli.plan import SEQS_PER_CLUSTER, default_global_batch

    assert SEQS_PER_CLUSTER == 16
    assert default_global_batch(128, 4) == 64  # tiny (seq 128) on 4 clusters
    assert default_global_batch(4096, 64) == default_global_batch(4096, 1024) == 1024  # paper
    assert default_global_batch(2**23, 1) == 1
    # tiny on cpu-local: a small default, said with its rule (was 32,768 sequences)
    argv = ["plan", "--model", "tiny", "--platform", "cpu-local", "--clusters", "4", "--quiet"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "global batch 64 x 128 tokens" in text
    assert "global batch 64 sequences (default: 16 sequences per cluster" in text
    assert main([*argv, "--json"]) == 0
    got = _json(capsys)
    assert got["global_batch"] == 64 and got["global_batch_default"].startswith("16 sequences")
    # --global-batch overrides it, and then no rule is claimed
    assert main([*argv, "--global-batch", "8", "--json"]) == 0
    got = _json(capsys)
    assert got["global_batch"] == 8 and got["global_batch_default"] is None
    # llama2-7b on 1024 MT-3000 clusters keeps the paper's 1024 x 4096
    argv = ["plan", "--model", "llama2-7b", "--platform", "mt3000", "--clusters", "1024"]
    assert main([*argv, "--quiet", "--json"]) == 0
    got = _json(capsys)
    assert got["feasible"] and (got["global_batch"], got["seq"]) == (1024, 4096)


def test_help_states_the_default_batch_rule(capsys):
    assert main(["plan", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "default: 16 sequences per cluster, at most 4M tokens" in text


@pytest.mark.timeout(120)
def test_memory_cap_replaces_the_platforms_usable_memory(capsys):
    # mt3000: 20 GB usable. A larger cap admits fewer stages, a smaller one nothing at all.
    # The budget: the first plan that fits came after about 3 s of search on a slow, loaded
    # 2-core machine, where the default's hard deadline (5 x 1.2 s) leaves it only 2x.
    args = ["plan", "--model", "llama2-7b", "--clusters", "8", "--json", "--quiet"]
    args += ["--time-budget", "5"]
    assert main(args) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*args, "--memory-cap", "30"]) == 0
    big = json.loads(capsys.readouterr().out)
    assert big["predicted"]["limit_bytes"] > default["predicted"]["limit_bytes"]
    assert max(big["predicted"]["peak_memory_bytes"]) <= big["predicted"]["limit_bytes"]
    assert max(big["predicted"]["peak_memory_bytes"]) > 20e9  # only fits the larger cap
    assert main(["plan", "--model", "llama2-7b", "--clusters", "8", "--memory-cap", "8"]) == 2
    assert "no plan fits 8.09 GB per stage" in capsys.readouterr().out  # 8 GiB - workspace


@pytest.mark.parametrize("command", ["plan", "simulate"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "x"])
def test_memory_cap_bad_value_is_one_line(command, value, capsys):
    extra = ["--clusters", "8"] if command == "plan" else []
    assert main([command, *extra, "--memory-cap", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --memory-cap: expected a" in err[0] and "positive" in err[0]


def test_simulate_memory_cap(capsys):
    args = ["simulate", "--model", "llama2-7b", "--pp", "8", "--json"]
    assert main([*args, "--memory-cap", "10"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["memory_cap_bytes"] == 10 * 2**30
    assert r["over_cap_stages"] and "over the 10.24 GB" in captured.err
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["memory_cap_bytes"] == 20e9


def test_a_baseline_not_found_in_time_is_not_said_not_to_fit(monkeypatch, capsys):
    """A baseline family's search that stops at the hard deadline with no plan found says
    so ("unfinished" in --json), instead of "no plan fits"."""
    from ratrain.cli import plan as cli_plan
    from ratrain.deadline import Budget

    argv = ["plan", "--model", "tiny", "--platform", "cpu-local", "--clusters", "4", "--quiet"]
    real = cli_plan._baselines
    # the main search as usual; each baseline's with a hard deadline already past
    monkeypatch.setattr(
        cli_plan,
        "_baselines",
        lambda req, progress, budget: real(req, None, Budget.for_plan(1e-12)),
    )
    assert main([*argv, "--baselines"]) == 0
    out = capsys.readouterr().out
    assert "vs best gpu-style: no gpu-style plan found within the time budget" in out
    assert "no gpu-style plan fits" not in out
    assert main([*argv, "--baselines", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["baselines"]
    assert got == {"gpu-style": "unfinished", "zero1-pp": "unfinished", "fsdp-pp": "unfinished"}
