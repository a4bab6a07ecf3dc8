"""`ratrain bench cluster`: the emulated network's platform file, the result schema and
report, and the command's one-line refusals (the measured sweep itself is a benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from ratrain.bench.cluster import Rate, Setup, result_json, speedups
from ratrain.bench.link_probe import fit
from ratrain.bench.platform import base_platform_dict, emulated_platform
from ratrain.bench.report import markdown
from ratrain.config import Plan
from ratrain.cost.model import CostModel
from ratrain.models.presets import get_preset
from ratrain.platforms import load
from ratrain.sim import simulate

# bytes, seconds: a 6.5 MB/s link with 2 ms latency, exactly
PROBE = {
    "p2p": [[b, 0.002 + b / 6.5e6] for b in (65536, 524288, 2097152, 8388608)],
    "all_reduce": {"2": [[65536, 0.01]], "4": [[65536, 0.01]]},
    "nodes": 2,
    "ranks_per_node": 2,
}


def _platform(tmp_path, probe=PROBE):
    d = emulated_platform(base_platform_dict("cpu-local"), probe, 100, "2026-12-02")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return load(str(path))


def test_fit_recovers_alpha_beta():
    a, b = fit(PROBE["p2p"])
    assert a == pytest.approx(0.002, rel=1e-6)
    assert b == pytest.approx(6.5e6, rel=1e-6)


def test_emulated_platform_is_the_machine_with_measured_links(tmp_path):
    p, base = _platform(tmp_path), load("cpu-local")
    assert p.units_per_node == 2 and p.sharing_units == 4
    assert p.inter_node.bandwidth_bytes_per_s == pytest.approx(6.5e6, rel=1e-3)
    assert p.inter_node.latency_s == pytest.approx(0.002, rel=1e-3)
    assert p.workspace_bytes == 0
    assert p.peak_flops == base.peak_flops and p.rank_speed == base.rank_speed
    assert "measured: ping-pong" in yaml.safe_dump(
        emulated_platform(base_platform_dict("cpu-local"), PROBE, 100, "now")["network"]
    )


def test_cores_are_shared_by_all_emulated_nodes(tmp_path):
    """The nodes are namespaces of one machine: a plan's compute costs what it costs on the
    machine's own platform, whatever the links; only the traffic over them differs."""
    same = {
        "p2p": [[b, 1e-5 + b / 1e12] for b in (65536, 8388608)],
        "all_reduce": {},
        "nodes": 2,
        "ranks_per_node": 2,
    }
    p, base = _platform(tmp_path, same), load("cpu-local")
    spec = get_preset("tiny")
    plan = Plan(pp=2, dp=2, micro_batch=2, global_batch=8, seq=32, compute_dtype="fp32")
    assert CostModel(spec, plan, p).speed == CostModel(spec, plan, base).speed
    slow = _platform(tmp_path)
    dp_across = plan.replace(rank_layout="pp-inner")  # DP groups cross the slow link
    fast_t = simulate(spec, dp_across, p).step_time_s
    slow_t = simulate(spec, dp_across, slow).step_time_s
    assert slow_t > fast_t


def _rate(setup: Setup) -> Rate:
    plan = Plan(pp=2, dp=2, micro_batch=2, global_batch=8, seq=32, compute_dtype="fp32")
    r = Rate(100.0)
    from ratrain.planner.report import describe

    key = describe(plan)
    r.plans[(0.5, "ratrain")] = {"plan": plan, "predicted": 1000.0, "peak": [100, 2**20]}
    r.plans[(0.5, "gpu-style")] = {"plan": None, "why": "no plan fits"}
    r.runs[key] = [900.0, 1100.0, 1000.0]
    r.runs["torch-1f1b/ddp"] = [500.0, 400.0]
    r.runs["torch-1f1b/ddp/ac"] = [450.0, 450.0]
    return r


def test_result_json_schema_and_speedups():
    setup = Setup(caps_gib=(0.5,), systems=("ratrain", "gpu-style", "torch-pp"))
    peers = [
        ("torch-1f1b/ddp", {"system": "torch-1f1b"}),
        ("torch-1f1b/ddp/ac", {"system": "torch-1f1b"}),
    ]
    peaks = {"torch-1f1b/ddp": [2**30, 10], "torch-1f1b/ddp/ac": [2**20, 10]}
    res = result_json(setup, _rate(setup), peers, peaks, {})
    assert res["link_bits_per_s"] == 100e6 and res["nodes"] == 2 and res["ranks_per_node"] == 2
    cap = res["caps"][0]
    assert cap["cap_bytes"] == 2**29
    s = cap["systems"]
    assert set(s) == {"ratrain", "gpu-style", "torch-pp"}  # unrequested systems absent
    assert s["gpu-style"] is None  # no configuration fits: null
    assert s["ratrain"]["tokens_per_s"] == 1000.0 and s["ratrain"]["peak_bytes"] == 2**20
    assert s["ratrain"]["predicted_tokens_per_s"] == 1000.0
    # the faster DDP configuration does not fit the cap (1 GiB peak): the AC one is best
    assert s["torch-pp"]["config"] == "torch-1f1b/ddp/ac"
    assert s["torch-pp"]["tokens_per_s"] == 450.0
    assert cap["speedups"]["torch-pp"] == {"measured": pytest.approx(1000 / 450), "predicted": None}
    md = markdown([res])
    assert "torch-1f1b/ddp/ac" in md and "none fits" in md and "2.222" in md
    assert "mean absolute error 0.0%" in md  # ratrain's plan: predicted 1000, measured 1000


def test_report_again_from_json(tmp_path):
    setup = Setup(caps_gib=(0.5,), systems=("ratrain",))
    res = result_json(setup, _rate(setup), [], {}, {})
    f = tmp_path / "all.json"
    f.write_text(json.dumps([res]))
    argv = [sys.executable, "-m", "ratrain", "bench", "cluster", "--out", str(tmp_path / "o")]
    r = subprocess.run(argv + ["--from-json", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / "cluster.md").read_text().startswith("### 2 nodes x 2 ranks")
    f.write_text("{}")
    r = subprocess.run(argv + ["--from-json", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not a list of results" in r.stderr


def test_speedups_need_both_figures():
    got = speedups({"ratrain": {"tokens_per_s": 10.0}, "deepspeed": None})
    assert got == {"deepspeed": {"measured": None, "predicted": None}}


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--peer-layouts", "2x2,3x1"], "must use the emulated network's 4 ranks"),
        (["--peer-layouts", "two"], "expected PPxDP"),
        (["--caps", "0.1,-1"], "positive numbers"),
        (["--model", "nope"], "unknown model preset"),
        (["--steps", "2", "--warmup", "2"], "leaves no timed step"),
    ],
)
def test_bad_input_is_one_line(flags, words, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "ratrain", "bench", "cluster", "--out", str(tmp_path / "o")] + flags,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_plan_of_fewer_ranks_runs_on_the_first_nodes():
    from ratrain.bench.cluster import _torchrun

    full = _torchrun(Setup(), 29600, "-m", "ratrain", "train")
    assert (
        full[full.index("--nnodes") + 1] == "2" and full[full.index("--nproc-per-node") + 1] == "2"
    )
    two = _torchrun(Setup(), 29600, "-m", "ratrain", "train", ranks=2)
    assert two[:2] == ["sh", "-c"]
    assert '[ "{node_rank}" -lt 1 ]' in two[2] and "--nnodes 1 --nproc-per-node 2" in two[2]
    with pytest.raises(Exception, match="do not fill nodes of 2"):
        _torchrun(Setup(nodes=3), 29600, "-m", "x", ranks=3)


def test_measure_memory_is_said_to_be_ignored_by_the_reference_trainer(tmp_path):
    """One process without --nproc runs the reference trainer, which counts nothing: the
    bench's memory runs pass --nproc, and a user is told."""
    m = tmp_path / "m.jsonl"
    argv = [sys.executable, "-m", "ratrain", "train", "--model", "tiny", "--pp", "1"]
    argv += ["--dp", "1", "--seq", "16", "--global-batch", "8", "--steps", "1", "--quiet"]
    r = subprocess.run(
        argv + ["--measure-memory", "--metrics", str(m)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "--measure-memory applies to the pipeline runtime" in r.stderr
    r = subprocess.run(
        argv + ["--measure-memory", "--nproc", "1", "--metrics", str(m)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(m.read_text().splitlines()[-1])["peak_bytes_source"] == "tensors"
