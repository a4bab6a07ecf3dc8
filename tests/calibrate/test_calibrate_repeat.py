"""benchmarks/calibrate_repeat.py compares platform files value by value (no calibration
run here: `--files`)."""

import importlib.util
from pathlib import Path

import yaml

from ratrain.platforms.load import PRESETS_DIR

_SPEC = importlib.util.spec_from_file_location(
    "calibrate_repeat", Path(__file__).parents[2] / "benchmarks" / "calibrate_repeat.py"
)
repeat = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(repeat)


def test_compare_finds_the_value_that_moved(tmp_path, capsys):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(data))
    data["tiers"][0]["bandwidth_bytes_per_s"]["value"] *= 1.5
    curve = data["compute"]["efficiency_curves"]["gemm.fp32"]["value"]
    curve[0][1] *= 1.2
    b.write_text(yaml.safe_dump(data))
    res = repeat.compare([a, b])
    (k0, r0), (k1, r1) = res["worst"][:2]
    assert k0 == "tiers[0].bandwidth_bytes_per_s" and abs(r0 - 1.5) < 1e-9
    assert k1.startswith("compute.efficiency_curves.gemm.fp32[") and abs(r1 - 1.2) < 1e-9
    assert all(r == 1.0 for _, r in res["worst"][2:])
    # Only measured values count: the assumed inter-node network is not compared.
    assert not any("inter_node" in k for k, _ in res["worst"])
    assert repeat.main(["--files", str(a), str(b)]) == 0
    assert "tiers[0].bandwidth_bytes_per_s" in capsys.readouterr().out
    assert repeat.main(["--files", str(a)]) == 2
