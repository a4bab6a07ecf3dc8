"""`ratrain validate --cluster` (`ratrain.bench.validate_cluster`): the grid run on the
emulated cluster, shaped and unshaped, beside its predictions. The grid, the summary and
the refusals need no root; the run itself does (`test_one_plan_on_the_emulated_cluster`,
skipped with the one line saying why where network namespaces are not available)."""

from __future__ import annotations

import json
import statistics

import pytest

from _cli import one_line_error
from ratrain.bench import validate_cluster as vc
from ratrain.cli import main
from ratrain.launch.emulate import unavailable

TWO = [
    {"name": "a", "nodes": 2, "ranks_per_node": 1, "link_mbit": 50, "plan": {"pp": 2, "dp": 1}},
    {
        "name": "b",
        "nodes": 2,
        "ranks_per_node": 1,
        "link_mbit": 100,
        "plan": {"pp": 1, "dp": 2, "schedule": "gpu-style"},
        "model": "tiny",
        "seq": 64,
        "global_batch": 4,
    },
]


def _grid(tmp_path, doc) -> str:
    p = tmp_path / "grid.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_default_grid_plans_fill_their_clusters():
    assert len(vc.DEFAULT_CASES) == 13
    for case in vc.DEFAULT_CASES:
        vc._check(case, case.name)  # raises where pp x dp is not the cluster's ranks
    pipes = {vc.plan_of(c).pipeline for c in vc.DEFAULT_CASES}
    assert {"1f1b", "zb-h1", "zb-h2", "zb-v"} <= pipes
    assert {c.link_mbit for c in vc.DEFAULT_CASES} >= {50.0, 100.0, 200.0}


def test_a_grid_file_is_read_and_checked(tmp_path):
    cases = vc.load_cases(_grid(tmp_path, TWO))
    assert [c.name for c in cases] == ["a", "b"]
    assert cases[1].model == "tiny" and cases[1].seq == 64 and cases[1].global_batch == 4
    assert vc.plan_of(cases[0]).microbatches == 16


@pytest.mark.parametrize(
    "doc,needle",
    [
        ({"nodes": 2}, "non-empty list"),
        ([{**TWO[0], "plan": {"pp": 4, "dp": 1}}], "pp x dp = 4 ranks"),
        ([{**TWO[0], "links": 3}], "unknown key(s) links"),
        ([{**TWO[0], "plan": {"pp": 2, "lr": 1}}], "plan takes"),
        ([{**TWO[0], "link_mbit": 0}], "link_mbit must be a positive number"),
        ([{k: v for k, v in TWO[0].items() if k != "nodes"}], "missing nodes"),
    ],
)
def test_bad_grid_files_are_one_line(tmp_path, capsys, doc, needle):
    path = _grid(tmp_path, doc)
    one_line_error(capsys, ["validate", "--platform", "cpu-local", "--cluster", path], needle)


@pytest.mark.parametrize(
    "extra,flag",
    [
        (["--plot", "x.png"], "--plot"),
        (["--grid", "g.yaml"], "--grid"),
        (["--no-plan-pick"], "--no-plan-pick"),
    ],
)
def test_flags_of_the_local_grid_are_refused(capsys, extra, flag):
    argv = ["validate", "--platform", "cpu-local", "--cluster", *extra]
    one_line_error(capsys, argv, flag, "does not apply to --cluster")


def test_without_namespaces_it_says_why(capsys, monkeypatch):
    monkeypatch.setattr(
        "ratrain.launch.emulate.unavailable", lambda: "an emulated network needs root"
    )
    argv = ["validate", "--platform", "cpu-local", "--cluster"]
    one_line_error(capsys, argv, "--cluster", "needs root")


def test_runs_interleave_and_the_summary_reads_the_medians(tmp_path):
    cases = vc.load_cases(_grid(tmp_path, TWO))
    calls = []
    # measured: case a shaped 2.0/2.2, unshaped 1.0/1.2; case b shaped 3.0, unshaped 3.0
    times = {("a", 50.0): [2.0, 2.2], ("a", vc.UNSHAPED_MBIT): [1.0, 1.2]}
    times |= {("b", 100.0): [3.0, 3.0], ("b", vc.UNSHAPED_MBIT): [3.0, 3.0]}

    def run(case, rate, steps, warmup, port, timeout_s):
        calls.append((case.name, rate))
        return times[case.name, rate][sum(c == (case.name, rate) for c in calls) - 1]

    rows = vc.validate_cluster(cases, "cpu-local", passes=2, steps=3, warmup=1, run=run)
    # pass 1 in grid order, pass 2 reversed; shaped before unshaped
    assert [c[0] for c in calls] == ["a", "a", "b", "b", "b", "b", "a", "a"]
    assert rows[0]["measured"] == {"shaped": [2.0, 2.2], "unshaped": [1.0, 1.2]}
    s = vc.summarize(rows)
    pa, pb = rows[0]["predicted"], rows[1]["predicted"]
    assert pa["shaped"] > 0 and pb["unshaped"] > 0
    err_a = abs(pa["shaped"] - 2.1) / 2.1
    err_b = abs(pb["shaped"] - 3.0) / 3.0
    assert s["mape"] == pytest.approx((err_a + err_b) / 2)
    assert s["max_error"] == pytest.approx(max(err_a, err_b))
    # what the links add: a measured 2.1 - 1.1 s; b none (not measured there)
    add_a = pa["shaped"] - pa["unshaped"]
    assert s["links_add_errors"][0] == pytest.approx((add_a - 1.0) / 1.0)
    assert s["links_add_errors"][1] is None
    text = vc.table(rows, s)
    assert "a " in text and "not measured there" in text
    assert statistics.median(rows[0]["measured"]["shaped"]) == pytest.approx(2.1)


WHY = unavailable()


@pytest.mark.dist
@pytest.mark.skipif(WHY is not None, reason=WHY or "")
def test_one_plan_on_the_emulated_cluster(tmp_path, capsys):
    grid = [
        {
            "name": "tiny pp=2",
            "nodes": 2,
            "ranks_per_node": 1,
            "link_mbit": 100,
            "plan": {"pp": 2, "dp": 1},
            "model": "tiny",
            "seq": 32,
            "global_batch": 4,
        }
    ]
    argv = ["validate", "--platform", "cpu-local", "--cluster", _grid(tmp_path, grid)]
    argv += ["--steps", "2", "--warmup", "1", "--passes", "1", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["results"]
    assert len(row["measured"]["shaped"]) == len(row["measured"]["unshaped"]) == 1
    assert row["measured"]["shaped"][0] > 0 and row["predicted"]["shaped"] > 0
    assert doc["summary"]["plans"] == 1
