"""`ratrain calibrate --merge`: several calibrations of one machine become one file whose
measured values are the medians, kernel curves merged as achieved FLOP/s, the peaks derived
again and still above what the cost model can charge; bad input is a one-line error."""

import copy

import pytest
import yaml

from ratrain.cli import main
from ratrain.platforms.load import PRESETS_DIR, load


def _file(tmp_path, name, scale, rank1=None, extra_row=False, timed="mean"):
    """The shipped cpu-local file with its measured speeds scaled, as another calibration of
    the same machine at another moment would read them; its kernels timed by `timed` (mean
    or fastest call), as its curves' notes say."""
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    c = data["compute"]
    for entry in c["efficiency_curves"].values():
        for was in ("fastest of repeated", "mean of repeated"):
            entry["note"] = entry["note"].replace(was, f"{timed} of repeated")
    for entry in c["peak_flops"].values():
        entry["value"] *= scale  # achieved FLOP/s = efficiency x peak: all scaled
    c["rank_speed"]["value"] = [[k, v * scale] for k, v in c["rank_speed"]["value"]]
    if rank1 is not None:
        c["rank_speed"]["value"][0][1] = rank1
    if extra_row:
        c["rank_speed"]["value"].append([8, 0.2])
    c["thread_efficiency"]["value"] = 0.8
    tmp_path.mkdir(exist_ok=True)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _gemm_achieved(p):
    plat = load(str(p))
    return [e * plat.peak_flops["fp32"] for _, e in plat.efficiency_curves["gemm.fp32"]]


def test_the_merge_is_the_median_value_by_value(tmp_path, capsys):
    files = [_file(tmp_path, n, s) for n, s in (("a", 0.9), ("b", 1.0), ("c", 1.3))]
    out = tmp_path / "m.yaml"
    assert main(["calibrate", "--merge", *map(str, files), "-o", str(out), "--name", "m"]) == 0
    assert "median of 3 files" in capsys.readouterr().out
    m, b = load(str(out)), load(str(files[1]))
    assert m.name == "m"
    # rank speeds: the middle file's, row by row
    assert [k for k, _ in m.rank_speed] == [k for k, _ in b.rank_speed]
    assert [v for _, v in m.rank_speed] == pytest.approx([v for _, v in b.rank_speed], rel=1e-3)
    # the kernels' achieved FLOP/s are the middle file's, whatever the peaks became
    assert _gemm_achieved(out) == pytest.approx(_gemm_achieved(files[1]), rel=2e-3)
    assert m.notes["compute.rank_speed"].startswith("measured: median of 3 calibrations")
    assert m.notes["compute.peak_flops.fp32"].startswith("derived")
    # The peak stays a bound: no curve above 1, and one rank's best kernel at the rank
    # speed of one rank stays below it.
    assert all(0 < e <= 1 for pts in m.efficiency_curves.values() for _, e in pts)
    best = max(_gemm_achieved(out))
    assert best * max(v for _, v in m.rank_speed) <= m.peak_flops["fp32"] * (1 + 1e-3)


def test_rows_that_differ_keep_the_first_file_and_say_so(tmp_path):
    a = _file(tmp_path, "a", 1.0, rank1=1.2)
    b = _file(tmp_path, "b", 1.0, rank1=1.6, extra_row=True)
    out = tmp_path / "m.yaml"
    assert main(["calibrate", "--merge", str(a), str(b), "-o", str(out)]) == 0
    m = load(str(out))
    assert m.rank_speed[0][1] == pytest.approx(1.2)
    assert "alone" in m.notes["compute.rank_speed"]


@pytest.mark.parametrize("case", ["one", "missing", "not-platform", "timed-otherwise"])
def test_bad_merges_are_one_line_errors(tmp_path, capsys, case):
    a = _file(tmp_path, "a", 1.0)
    other = {
        "one": [],
        "missing": [str(tmp_path / "nope.yaml")],
        "not-platform": [str(tmp_path / "x.yaml")],
        # an older calibration of the same name, kept in another directory
        "timed-otherwise": [str(_file(tmp_path / "old", "a", 1.0, timed="fastest"))],
    }[case]
    (tmp_path / "x.yaml").write_text("name: x\n")
    rc = main(["calibrate", "--merge", str(a), *other, "-o", str(tmp_path / "m.yaml")])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "--merge" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m.yaml").exists()


def test_merging_does_not_touch_its_inputs(tmp_path):
    a, b = _file(tmp_path, "a", 0.9), _file(tmp_path, "b", 1.1)
    before = [copy.deepcopy(p.read_text()) for p in (a, b)]
    assert main(["calibrate", "--merge", str(a), str(b), "-o", str(tmp_path / "m.yaml")]) == 0
    assert [p.read_text() for p in (a, b)] == before
