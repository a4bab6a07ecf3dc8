"""`ratrain calibrate` with a tiny budget writes a platform file that loads, whose
measured values say so; the timer and the α–β fit on known data."""

import pytest

from ratrain.calibrate.fit import fit_alpha_beta
from ratrain.cli import main
from ratrain.platforms import load


def test_fit_alpha_beta_recovers_a_line():
    pts = [(s, 2e-4 + s / 1e9) for s in (1e3, 1e5, 1e6, 1e7)]
    a, b = fit_alpha_beta(pts)
    assert a == pytest.approx(2e-4, rel=1e-6) and b == pytest.approx(1e9, rel=1e-6)


@pytest.mark.slow  # about 40 s on an idle 2-core machine, 80 s on a slow one
@pytest.mark.timeout(240)
def test_calibrate_quick_writes_a_loadable_measured_platform(tmp_path, capsys, monkeypatch):
    # Two threads per rank, as a rank with both cores of a 2-core machine runs: the rank
    # counts whose ranks run several threads are measured per microbatch size as well.
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    out = tmp_path / "here.yaml"
    rc = main(
        [
            "calibrate", "--quick", "--budget-s", "0.01", "--dtypes", "fp32", "--nproc", "2",
            "--no-progress", "--allow-noisy", "-o", str(out),
        ]
    )  # fmt: skip
    assert rc == 0 and "values measured" in capsys.readouterr().out
    p = load(str(out))
    assert p.name == "here"
    assert p.host_is_main_memory  # a CPU: offload frees nothing, the planner skips it
    assert "compute.unit_time_factor.head-fused.fwd.fp32" in p.notes
    measured = {k for k, n in p.notes.items() if n.startswith("measured")}
    for key in (
        "compute.efficiency_curves.gemm.fp32",
        "compute.efficiency_curves.gemm_bwd.fp32",
        "compute.efficiency_curves.attention_fwd.fp32",
        "compute.memory_bound_bytes_per_s.rmsnorm.fwd.fp32",
        "compute.memory_bound_bytes_per_s.cross_entropy.bwd.fp32",
        "compute.cores_per_node",
        "tiers.dram.bandwidth_bytes_per_s",
        "network.intra_node.bandwidth_bytes_per_s",
        "network.collectives.all_reduce",
        "runtime.action_overhead_s.F",
        "runtime.action_overhead_s.SEND_F",
        "runtime.sends_held_until_waited",
        "compute.rank_speed",
        "compute.collective_compute_s_per_byte",
        "compute.memory_bound_bytes_per_s.grad_norm.fwd.fp32",
        "compute.unit_time_factor.block.fwd.fp32",
        "compute.unit_time_factor.block.bwd.fp32",
        "compute.unit_time_factor.head.fwd.fp32",
        "compute.unit_time_factor.head.bwd.fp32",
        "compute.unit_time_factor.block.bin.fp32",
        "compute.unit_time_factor.block.bw.fp32",
        "compute.unit_time_factor.head.bin.fp32",
        "compute.unit_time_factor.head.bw.fp32",
    ):
        assert key in measured, key
    # what could not be measured here says so
    assert p.notes["network.inter_node.bandwidth_bytes_per_s"].startswith("assumed")
    assert p.notes["compute.peak_flops.fp32"].startswith("derived")
    # Every windowed figure says how many windows and how far they disagreed.
    for key in (
        "compute.efficiency_curves.gemm.fp32",
        "compute.memory_bound_bytes_per_s.rmsnorm.fwd.fp32",
        "tiers.dram.bandwidth_bytes_per_s",
        "compute.thread_efficiency",
        "compute.unit_time_factor.block.bwd.fp32",
        "compute.rank_speed",
    ):
        assert "median of" in p.notes[key] and "spread" in p.notes[key], key
    assert all(0 < e <= 1 for pts in p.efficiency_curves.values() for _, e in pts)
    assert all(f > 0 for f in p.unit_time_factor.values())
    assert [k for k, _ in p.rank_speed] == [1, 2] and all(v > 0 for _, v in p.rank_speed)
    # Core lending is measured: 1 of 2 ranks computing while the other waits in a receive,
    # the busy rank changing after each shortest (a quarter of the tokens' forward), short
    # (forward) or long (forward+backward) burst.
    assert [(w, b) for w, b, *_ in p.shared_rank_speed] == [(2, 1)] * 3
    shortest, short, long = (row[3] for row in p.shared_rank_speed)
    assert 0 < shortest < short < long and all(row[2] > 0 for row in p.shared_rank_speed)
    assert p.waiting_ranks_lend_cores
    # Ranks of two threads: their speed per microbatch size, 128 to 512 tokens.
    assert [(k, n) for k, n, _ in p.rank_speed_tokens] == [
        (k, n) for k in (1, 2) for n in (128, 256, 512)
    ]
    assert all(v > 0 for *_, v in p.rank_speed_tokens)
    assert p.notes["compute.rank_speed_tokens"].startswith("measured")
    assert p.notes["compute.shared_rank_speed"].startswith("measured")
    assert p.notes["runtime.waiting_ranks_lend_cores"].startswith("measured")
    # The peak stays a bound: no unit is charged less than its FLOPs at the peak.
    from ratrain.models.presets import get_preset
    from ratrain.planner.time_bound import peak_unit_times, unit_times

    tiny = get_preset("tiny")
    fast, charged = peak_unit_times(tiny, p, 2, 64, "fp32"), unit_times(tiny, p, 2, 64, "fp32")
    for f in (
        "f_block",
        "b_block",
        "f_head",
        "b_head",
        "bi_block",
        "bw_block",
        "bi_head",
        "bw_head",
    ):
        assert getattr(fast, f) <= getattr(charged, f), f
    assert p.overhead_s("F") > 0 and p.collectives["all_reduce"][0][0] == 2
    # The speed probe, timed at calibration's start and end, for validate to compare with.
    assert p.measured_on["speed_probe_s"] > 0
    assert p.notes["measured_on.speed_probe_s"].startswith("measured")


def test_calibrate_bad_input_is_one_line(tmp_path, capsys):
    assert main(["calibrate", "-o", str(tmp_path / "x.txt")]) == 2
    assert main(["calibrate", "--dtypes", "bf16", "-o", str(tmp_path / "x.yaml")]) == 2
    assert main(["calibrate", "--windows", "0", "-o", str(tmp_path / "x.yaml")]) == 2
    assert main(["calibrate", "--max-spread", "0", "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("ratrain calibrate: error") for line in err)


def _data(**compute):
    """The shipped cpu-local platform's data, with some compute values replaced."""
    import yaml

    from ratrain.platforms.load import PRESETS_DIR

    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data.pop("calibration_warnings", None)
    for k, v in compute.items():
        data["compute"][k]["value"] = v
    return data


def test_busy_machine_signs():
    from ratrain.calibrate import busy_signs

    d = {"cores_per_node": 2, "thread_efficiency": 0.7}
    assert busy_signs(_data(**d)) == []
    assert busy_signs(_data(**d, rank_speed=[[1, 1.5], [2, 0.8], [4, 0.4]])) == []
    (sign,) = busy_signs(_data(**d, rank_speed=[[1, 0.048], [2, 0.5]]))
    assert "slower (0.048)" in sign
    (sign,) = busy_signs(_data(cores_per_node=2, thread_efficiency=0.05))
    assert "second thread" in sign


@pytest.fixture
def fake_measurements(monkeypatch):
    """`calibrate()` itself, its measurements faked (no torch work): the file's data is the
    shipped cpu-local one; other processes' share of the CPU time is what the test sets."""
    import ratrain.calibrate as cal
    import ratrain.calibrate.load as cal_load
    import ratrain.calibrate.platform_file as pf

    state = {"share_now": 0.0, "share": 0.0, "data": _data()}
    monkeypatch.setattr(cal_load, "others_share_now", lambda s=1.0: state["share_now"])
    monkeypatch.setattr(cal_load.OthersLoad, "share", lambda self: state["share"])
    monkeypatch.setattr(cal, "_measure_windows", lambda *a: ({}, [1.0, 1.0]))
    monkeypatch.setattr(cal, "_measure_ranks", lambda *a: ({}, {}, {}))
    monkeypatch.setattr(cal, "_assemble", lambda got, cores: ({}, {}))
    monkeypatch.setattr(pf, "build_platform", lambda name, raw, ctx: dict(state["data"]))
    return state


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_busy_machine_is_written_noisy_by_default_and_refused_with_strict(
    tmp_path, capsys, fake_measurements
):
    """Other processes took 40% of the CPU time while measured: the default (and
    --allow-noisy) writes the file, saying so loudly; --strict writes nothing there (an
    existing file stays as it was) but keeps the measured data beside it."""
    import yaml

    fake_measurements["share"] = 0.4
    out = tmp_path / "busy.yaml"
    out.write_text("an older calibration\n")
    argv = ["calibrate", "--no-progress", "--dtypes", "fp32", "-o", str(out)]
    assert main([*argv, "--strict"]) == 2
    err = _one_error(capsys)
    assert "not writing" in err and "the machine was busy while measured" in err
    assert "other processes used 40%" in err and "busy.noisy.yaml" in err
    assert out.read_text() == "an older calibration\n"
    for extra in ([], ["--allow-noisy"]):
        assert main([*argv, *extra]) == 0
        err = _one_error(capsys)
        assert "warning: wrote" in err and "other processes used 40%" in err
        data = yaml.safe_load(out.read_text())
        assert any("other processes used 40%" in w for w in data["calibration_warnings"])
        assert "WRITTEN NOISY" in data["description"]
        assert "WRITTEN NOISY" in load(str(out)).description


def test_one_rank_slower_than_shared_ranks_is_named(tmp_path, capsys, fake_measurements):
    """The busy machine of the issue: one rank measured at 0.048 of the reference, slower
    than ranks sharing the node; validate then predicted +3,612% on one plan. The file is
    written with the sign in its warnings; --strict refuses it."""
    import yaml

    fake_measurements["data"] = _data(rank_speed=[[1, 0.048], [2, 0.5]])
    out = tmp_path / "slow.yaml"
    argv = ["calibrate", "--no-progress", "--dtypes", "fp32", "-o", str(out)]
    assert main([*argv, "--strict"]) == 2
    assert "one rank with all the threads measured slower (0.048)" in _one_error(capsys)
    assert not out.exists()
    assert main(argv) == 0
    assert "one rank with all the threads measured slower (0.048)" in _one_error(capsys)
    warns = yaml.safe_load(out.read_text())["calibration_warnings"]
    assert any("slower (0.048)" in w for w in warns)


def test_busy_before_measuring_is_said_at_once_and_measured(tmp_path, capsys, fake_measurements):
    """A machine already busy when calibration starts: one line before measuring, then the
    measurement goes on (its values settle, or are named at the end)."""
    fake_measurements["share_now"] = 0.5
    out = tmp_path / "measured.yaml"
    assert main(["calibrate", "--no-progress", "--dtypes", "fp32", "-o", str(out)]) == 0
    err = _one_error(capsys)
    assert "other processes are using 50%" in err and "measuring anyway" in err
    assert out.exists()


def test_quiet_machine_writes_without_a_note(tmp_path, capsys, fake_measurements):
    out = tmp_path / "ok.yaml"
    assert main(["calibrate", "--no-progress", "--dtypes", "fp32", "-o", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert "WRITTEN NOISY" not in out.read_text()


def test_strict_and_allow_noisy_exclude_each_other(tmp_path, capsys):
    out = str(tmp_path / "x.yaml")
    assert main(["calibrate", "--strict", "--allow-noisy", "-o", out]) == 2
    assert "not allowed with" in _one_error(capsys)
