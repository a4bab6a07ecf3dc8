"""The split backward's calibration (`pipeline: zb-h1`): B_IN and B_W timed through the
runtime's own `backward_input` / `backward_weight` (`ratrain.calibrate.units`), turned into
`unit_time_factor` entries of directions "bin" and "bw" (`platform_file`). Timed at the
tiny shape only, with a tiny budget; the factors from synthetic timings."""

import pytest
import torch
import yaml

from ratrain.calibrate import units as U
from ratrain.calibrate.platform_file import _unit_factors
from ratrain.calibrate.shapes import TINY_SHAPE, UNIT_SHAPES
from ratrain.calibrate.timing import Timer
from ratrain.cost.compute import kernels_time_s, unit_kernels
from ratrain.platforms.load import PRESETS_DIR, parse_platform

CPU = torch.device("cpu")


@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def test_items_add_a_split_item_beside_each_unit_item():
    items = U.unit_items(("fp32", "bf16"), quick=True)
    whole = [it for it in items if it[-1] != U.SPLIT]
    plan = U.unit_plan(("fp32", "bf16"), True)
    kinds = ("block", "head", U.FUSED)  # the fused loss's head: not split by the runtime
    tiny = [("tiny", dt, kind) for dt in ("fp32", "bf16") for kind in kinds]
    assert whole == tiny + [(dt, i, kind) for dt, i in plan for kind in kinds]
    split = [(*it, U.SPLIT) for it in whole if it[-1] != U.FUSED]
    assert [it for it in items if it[-1] == U.SPLIT] == split
    assert U.label(("fp32", 0, "block")) == "units fp32 h320 b1 block"
    assert U.label(("fp32", 0, "block", U.SPLIT)) == "units fp32 h320 b1 block split"
    assert U.label(("tiny", "bf16", "head", U.SPLIT)) == "units bf16 tiny head split"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["block", "head"])
def test_split_item_times_the_runtime_split_backward(one_thread, kind):
    timer = Timer(CPU, 0.005, min_reps=2, statistic="mean")
    t_in, t_w, split = U.measure_unit(("tiny", "fp32", kind, U.SPLIT), CPU, timer)
    assert t_in > 0 and t_w > 0 and split == 1.0
    t_f, t_b = U.measure_unit(("tiny", "fp32", kind), CPU, timer)  # unchanged: two values
    assert t_f > 0 and t_b > 0


@pytest.mark.timeout(120)
def test_a_unit_the_runtime_cannot_split_is_reported(one_thread, monkeypatch):
    """A 16-bit linear on a CPU without 16-bit GEMM units is a custom autograd Function:
    the runtime runs the whole backward in B_IN, and the item says so."""
    from ratrain.kernels import cpu_half

    monkeypatch.setitem(cpu_half._LACKS, torch.bfloat16, True)
    timer = Timer(CPU, 0.005, min_reps=2, statistic="mean")
    _, _, split = U.measure_unit(("tiny", "bf16", "block", U.SPLIT), CPU, timer)
    assert split == 0.0


@pytest.mark.parametrize("kind", ["block", "head"])
def test_split_timing_computes_the_unsplit_gradients(one_thread, monkeypatch, kind):
    """The timed B_IN then B_W leave every weight of the copy they ran on the gradient an
    unsplit backward gives it."""
    built = []

    def copies(*a):
        built.append(make(*a))
        return built[-1]

    make = U._copies
    monkeypatch.setattr(U, "_copies", copies)
    spec, mb, seq = TINY_SHAPE
    U._time_split(Timer(CPU, 0.0, min_reps=1), CPU, torch.float32, spec, kind, mb, seq)
    ms, xs, targets = built[0]
    used = [i for i, m in enumerate(ms) if all(p.grad is not None for p in m.parameters())]
    assert used, "no copy got its weights' gradients"
    m, x = ms[used[-1]], xs[used[-1]]
    split = [p.grad.clone() for p in m.parameters()]
    for p in m.parameters():
        p.grad = None
    y = m.loss(x, targets) if kind == "head" else m(x)
    y.backward(None if y.ndim == 0 else torch.ones_like(y))
    for g, p in zip(split, m.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)


def test_assemble_carries_the_halves_when_measured():
    whole = {("tiny", "fp32", "block"): (1e-4, 2e-4), ("fp32", 0, "block"): (1e-2, 2e-2)}
    (row,) = U.assemble_units(whole)["fp32"]
    assert len(row) == 8  # as before: no split measured
    halves = {
        ("tiny", "fp32", "block", U.SPLIT): (1.5e-4, 0.5e-4, 1.0),
        ("fp32", 0, "block", U.SPLIT): (1.2e-2, 0.9e-2, 1.0),
    }
    (row,) = U.assemble_units({**whole, **halves})["fp32"]
    assert row[4:8] == (1e-2, 2e-2, 1e-4, 2e-4)
    assert row[8:] == (1.2e-2, 0.9e-2, 1.5e-4, 0.5e-4, 1.0)
    halves[("tiny", "fp32", "block", U.SPLIT)] = (1.5e-4, 1e-6, 0.0)  # not split at tiny
    (row,) = U.assemble_units({**whole, **halves})["fp32"]
    assert row[-1] == 0.0


_FACTORS = {"fwd": 1.25, "bwd": 1.1, "bin": 1.3, "bw": 0.9}
"""Synthetic: the factor each direction's timings are built to give."""


def _synthetic_units(split: float = 1.0, halves: bool = True, fixed: dict | None = None):
    """Raw unit rows whose timings are the cost model's kernel sums (on the shipped
    cpu-local platform) times `_FACTORS`, plus a fixed dispatch time, plus `fixed[d]`
    seconds per shape beyond the tiny one's where given."""
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["compute"].pop("unit_time_factor", None)
    plat = parse_platform(data, "test")
    group = {"fwd": "F", "bwd": "B", "bin": "BI", "bw": "BW"}

    def k(spec, kind, d, mb, seq):
        unit = 1 if kind == "block" else spec.n_layers + 1
        return kernels_time_s(
            unit_kernels(spec, unit, mb, seq, group[d], dtype="fp32"), "fp32", plat
        )[0]

    tiny_spec, tiny_mb, tiny_seq = TINY_SHAPE
    dispatch = 3e-4
    rows = []
    for spec, mb, seq in UNIT_SHAPES:
        for kind in ("block", "head"):
            t, t0 = {}, {}
            for d, f in _FACTORS.items():
                k0 = k(tiny_spec, kind, d, tiny_mb, tiny_seq)
                t0[d] = dispatch + k0
                t[d] = t0[d] + f * (k(spec, kind, d, mb, seq) - k0) + (fixed or {}).get(d, 0.0)
            row = (spec.to_dict(), mb, seq, kind, t["fwd"], t["bwd"], t0["fwd"], t0["bwd"])
            if halves:
                row += (t["bin"], t["bw"], t0["bin"], t0["bw"], split)
            rows.append(row)
    return data, {"fp32": rows}


def _factors(data, units, windows=None):
    return _unit_factors(data, units, "mean of runs", "today, here", {"windows": windows})[0]


def test_a_units_fixed_time_is_fitted_beside_its_factor():
    """Timings of factor x kernels + a fixed time per shape give back both, per direction
    (`fit_unit_time`, least relative squares over the 3 shapes); without a fixed time the
    factor is the median over the shapes, as before, and no fixed time is written."""
    fixed = {"fwd": 9e-4, "bwd": 1.3e-3, "bin": 1.5e-3, "bw": 6e-4}
    data, units = _synthetic_units(fixed=fixed)
    factors, fixed_s = _unit_factors(data, units, "mean of runs", "today, here", {})
    for kind in ("block", "head"):
        for d, f in _FACTORS.items():
            key = f"{kind}.{d}.fp32"
            assert factors[key]["value"] == pytest.approx(f, rel=1e-3), key
            assert fixed_s[key]["value"] == pytest.approx(fixed[d], rel=1e-3), key
            assert "fitted as factor x kernels + fixed over 3 shapes" in factors[key]["note"]
            assert fixed_s[key]["note"].startswith("measured")
    data, units = _synthetic_units()
    factors, fixed_s = _unit_factors(data, units, "mean of runs", "today, here", {})
    assert fixed_s == {} and "median of 3 shapes" in factors["block.fwd.fp32"]["note"]


def test_fit_unit_time_falls_back_to_the_median_where_it_cannot_separate():
    from ratrain.calibrate.platform_file import fit_unit_time

    assert fit_unit_time([(1e-3, 2e-3)]) == (2.0, 0.0)  # one shape
    assert fit_unit_time([(1e-3, 2e-3), (1e-3, 2.2e-3)]) == (pytest.approx(2.1), 0.0)
    # a negative fixed time (time grows faster than the kernels): the median factor
    f, c = fit_unit_time([(1e-3, 0.5e-3), (4e-3, 4e-3)])
    assert c == 0.0 and f == pytest.approx((0.5 + 1.0) / 2)
    f, c = fit_unit_time([(1e-3, 1.5e-3), (2e-3, 2.5e-3), (4e-3, 4.5e-3)])
    assert (f, c) == (pytest.approx(1.0), pytest.approx(5e-4))


def test_factors_of_the_split_backward_from_its_timings():
    data, units = _synthetic_units()
    got = _factors(data, units)
    for kind in ("block", "head"):
        for d, f in _FACTORS.items():
            entry = got[f"{kind}.{d}.fp32"]
            assert entry["value"] == pytest.approx(f, rel=1e-3), (kind, d)
            assert entry["note"].startswith("measured") and "median of 3 shapes" in entry["note"]
    assert "backward_input" in got["block.bin.fp32"]["note"]
    assert "backward_weight" in got["head.bw.fp32"]["note"]
    assert "(autograd)" in got["block.fwd.fp32"]["note"]  # the existing notes as they were


def test_no_halves_factor_from_old_rows_or_an_unsplit_unit():
    data, old = _synthetic_units(halves=False)
    assert sorted(_factors(data, old)) == sorted(
        f"{kind}.{d}.fp32" for kind in ("block", "head") for d in ("fwd", "bwd")
    )
    data, unsplit = _synthetic_units(split=0.0)
    assert {k.split(".")[1] for k in _factors(data, unsplit)} == {"fwd", "bwd"}


def test_the_halves_notes_take_the_split_items_windows():
    from ratrain.calibrate.windows import Windowed

    data, units = _synthetic_units()
    windows = {
        "units fp32 h320 b1 block": Windowed(((1.0,), (1.1,)), 0.1),
        "units fp32 h320 b1 block split": Windowed(((1.0,), (1.4,)), 0.4),
    }
    got = _factors(data, units, windows)
    assert got["block.bwd.fp32"]["note"].endswith("median of 2 windows, spread 10%")
    assert got["block.bin.fp32"]["note"].endswith("median of 2 windows, spread 40%")


@pytest.mark.timeout(180)
def test_a_quick_unit_calibration_gives_the_halves_factors(one_thread):
    """The units' part of a quick calibration, fp32, one window of a tiny budget: measured,
    assembled and turned into factors on the shipped cpu-local kernels, it gives "bin" and
    "bw" factors beside "fwd" and "bwd", whose notes name the split items' windows."""
    from ratrain.calibrate.windows import run_windows

    timer = Timer(CPU, 0.01, statistic="mean")
    items = U.unit_items(("fp32",), quick=True)
    got = run_windows(items, lambda it: U.measure_unit(it, CPU, timer), 1, 0.15, U.label)
    units = U.assemble_units({it: w.value for it, w in got.items()})
    split_rows = [row for row in units["fp32"] if row[3] != U.FUSED]
    assert split_rows and all(len(row) == 13 and row[-1] == 1.0 for row in split_rows)
    assert all(len(row) == 8 for row in units["fp32"] if row[3] == U.FUSED)
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["compute"].pop("unit_time_factor", None)
    windows = {U.label(it): w for it, w in got.items()}
    factors = _factors(data, units, windows)
    for kind in ("block", "head"):
        for d in ("fwd", "bwd", "bin", "bw"):
            entry = factors[f"{kind}.{d}.fp32"]
            assert entry["value"] > 0 and entry["note"].startswith("measured"), (kind, d)
            assert "median of 1 windows" in entry["note"] or "spread" in entry["note"]
    # the fused loss's head: its forward (all three GEMMs) measured over its own kernels
    entry = factors[f"{U.FUSED}.fwd.fp32"]
    assert entry["value"] > 0 and "head-fused unit fwd" in entry["note"]
    assert f"{U.FUSED}.bin.fp32" not in factors


def test_halves_factors_below_one_raise_the_peaks_so_bounds_stay_bounds():
    """A "bw" factor under 1 would charge B_W less than its FLOPs at the peak: the peaks
    are raised above it (`_raise_peaks`), so the planner's peak times stay below."""
    from ratrain.calibrate.platform_file import _raise_peaks
    from ratrain.models.presets import get_preset
    from ratrain.planner.time_bound import peak_unit_times, unit_times

    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    c = data["compute"]
    for kind in ("block", "head"):
        for d, f in (("bin", 0.3), ("bw", 0.2)):
            c["unit_time_factor"][f"{kind}.{d}.fp32"] = {"value": f, "note": "measured: test"}
    te, cores = c["thread_efficiency"]["value"], c["cores_per_node"]["value"]
    _raise_peaks(c, 1 + (cores - 1) * te)
    p = parse_platform(data, "test")
    tiny = get_preset("tiny")
    fast, charged = peak_unit_times(tiny, p, 2, 64, "fp32"), unit_times(tiny, p, 2, 64, "fp32")
    for f in ("bi_block", "bw_block", "bi_head", "bw_head", "b_block", "f_block"):
        assert getattr(fast, f) <= getattr(charged, f), f
