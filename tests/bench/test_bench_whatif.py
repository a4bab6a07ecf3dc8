"""`ratrain bench cluster --predict`: the simulator's answer on an emulated network with
assumed links, the breakdown of a simulated step, and the bench's own calibration."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from ratrain.bench import cluster as bench_cluster
from ratrain.bench.cluster import Setup, calibrate_base
from ratrain.bench.platform import base_platform_dict, link_platform
from ratrain.bench.whatif import predict_point, sim_breakdown, speedup_over_others
from ratrain.config import Plan
from ratrain.cost.comm import message_time_s
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.platforms import from_dict, load
from ratrain.sim import simulate


def test_link_platform_shares_the_link_among_a_nodes_pairs():
    base = base_platform_dict("cpu-local")
    p = from_dict(link_platform(base, 2, 2, 80.0))
    assert p.inter_node.bandwidth_bytes_per_s == pytest.approx(80e6 / 8 / 2)
    assert p.inter_node.latency_s == load("cpu-local").inter_node.latency_s
    assert p.units_per_node == 2 and p.sharing_units == 4 and p.workspace_bytes == 0
    slow = from_dict(link_platform(base, 4, 1, 10.0))
    assert slow.inter_node.bandwidth_bytes_per_s == pytest.approx(10e6 / 8)
    assert slow.units_per_node == 1 and slow.sharing_units == 4
    # messages get TCP's payload share of the frames tbf meters: a 1 MB message takes
    # 1514/1448 of its bytes' time at the rate
    t = message_time_s(1e6, slow.inter_node) - slow.inter_node.latency_s
    assert t == pytest.approx(1e6 * 1514 / 1448 / (10e6 / 8), rel=1e-3)


@pytest.mark.parametrize("mbit", [5.0, 1000.0])
def test_breakdown_adds_up_to_the_step(mbit):
    """compute + recompute + exposed communication + bubble is the step, per stage and so
    on average; a slower link only grows the communication and waiting."""
    spec = get_preset("tiny")
    plat = from_dict(link_platform(base_platform_dict("cpu-local"), 2, 2, mbit))
    plan = Plan(
        pp=2,
        dp=2,
        micro_batch=2,
        global_batch=16,
        seq=32,
        recompute=("full",) * 2,
        rank_layout="pp-inner",
    )
    b = sim_breakdown(simulate(spec, plan, plat, rank_layout="pp-inner"))
    parts = b["compute"] + b["recompute"] + b["exposed_comm"] + b["bubble"]
    assert parts == pytest.approx(b["step"], rel=1e-9)
    assert b["recompute"] > 0 and b["compute"] > 0


def test_a_slow_link_is_exposed_when_dp_crosses_it():
    spec = get_preset("tiny")
    plan = Plan(pp=2, dp=2, micro_batch=2, global_batch=16, seq=32, rank_layout="pp-inner")
    got = {}
    for mbit in (1.0, 1000.0):
        plat = from_dict(link_platform(base_platform_dict("cpu-local"), 2, 2, mbit))
        # without the compute a byte carried takes (`ratrain.sim.sharing`), the compute
        # does not depend on the link
        plat = dataclasses.replace(plat, link_cpu_s_per_byte=0.0)
        got[mbit] = sim_breakdown(simulate(spec, plan, plat, rank_layout="pp-inner"))
    assert got[1.0]["exposed_comm"] > got[1000.0]["exposed_comm"]
    assert got[1.0]["step"] > got[1000.0]["step"]
    assert got[1.0]["compute"] == pytest.approx(got[1000.0]["compute"], rel=1e-9)


def test_predict_point_plans_every_family_under_the_cap():
    plat = from_dict(link_platform(base_platform_dict("cpu-local"), 2, 2, 100.0))
    fams = ("ratrain", "gpu-style")
    got = predict_point("tiny", plat, 0.5, 4, 32, 16, fams, budget_s=None)
    assert set(got) == set(fams)
    for v in got.values():
        assert v["peak_bytes"] <= 0.5 * 2**30
        assert v["tokens_per_s"] > 0 and v["plan"].split()[0] in ("ratrain", "gpu-style")
    sp = speedup_over_others(got)
    assert sp == pytest.approx(got["ratrain"]["tokens_per_s"] / got["gpu-style"]["tokens_per_s"])
    none = predict_point("tiny", plat, 1e-6, 4, 32, 16, ("ratrain",), budget_s=None)
    assert none == {"ratrain": None} and speedup_over_others(none) is None


def test_predict_cli_writes_the_table_and_json(tmp_path):
    out, js = tmp_path / "o", tmp_path / "w.json"
    argv = [sys.executable, "-m", "ratrain", "bench", "cluster", "--predict", "--quiet"]
    argv += ["--base-platform", "cpu-local", "--model", "tiny", "--link-mbit", "20,500"]
    argv += ["--caps", "0.5", "--seq", "32", "--systems", "ratrain,gpu-style"]
    argv += ["--out", str(out), "--json", str(js)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(js.read_text())["rows"]
    assert [(x["link_mbit"], x["cap_gib"]) for x in rows] == [(20.0, 0.5), (500.0, 0.5)]
    assert all(set(x["systems"]) == {"ratrain", "gpu-style"} for x in rows)
    assert "ratrain / best other" in (out / "whatif.md").read_text()


def test_predict_needs_ratrain(tmp_path):
    argv = [sys.executable, "-m", "ratrain", "bench", "cluster", "--predict", "--quiet"]
    argv += ["--base-platform", "cpu-local", "--systems", "gpu-style", "--out", str(tmp_path)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "needs ratrain" in r.stderr and "Traceback" not in r.stderr


def test_a_failed_calibration_is_one_line_naming_the_way_out(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_cluster, "_cli", lambda argv: (2, "ratrain calibrate: boom\n"))
    with pytest.raises(RatrainError, match="--base-platform cpu-local"):
        calibrate_base(Setup(progress=False), tmp_path)


def test_the_bench_calibrates_with_fp32_on_the_clusters_ranks(monkeypatch, tmp_path):
    seen = []

    def fake(argv):
        seen.append(argv)
        return 0, ""

    monkeypatch.setattr(bench_cluster, "_cli", fake)
    path = calibrate_base(Setup(progress=False), tmp_path)
    argv = seen[0]
    assert argv[0] == "calibrate" and "--quick" in argv
    assert argv[argv.index("--dtypes") + 1] == "fp32"
    assert argv[argv.index("--nproc") + 1] == "4"
    assert argv[argv.index("-o") + 1] == str(path)


def test_trace_breakdown_of_a_simulated_trace_equals_the_simulations(tmp_path):
    from ratrain.bench.whatif import trace_breakdown
    from ratrain.sim.trace import write_trace

    spec = get_preset("tiny")
    plat = from_dict(link_platform(base_platform_dict("cpu-local"), 2, 2, 5.0))
    plan = Plan(pp=2, dp=2, micro_batch=2, global_batch=16, seq=32, recompute=("full",) * 2)
    sim = simulate(spec, plan, plat)
    path = tmp_path / "t.json"
    write_trace(sim, path)
    got, want = trace_breakdown(path), sim_breakdown(sim)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-5), k
    assert got["waiting"] == pytest.approx(got["exposed_comm"] + got["bubble"])
