"""`ratrain calibrate --merge` and `ratrain validate --rescore` measure nothing, so they run
where torch is not installed: each runs here in a fresh interpreter whose `import torch`
fails (a meta path finder refuses it), on the inputs the merge and rescore tests build."""

import json
import subprocess
import sys

import pytest
from test_calibrate_merge import _file

from _validate import previous_run

# Refuses torch as an environment without it would, before ratrain is imported; the
# command's argv comes as the script's arguments.
_NO_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
sys.meta_path.insert(0, _NoTorch())
from ratrain.cli import main
rc = main(sys.argv[1:])
assert "torch" not in sys.modules, "torch was imported"
sys.exit(rc)
"""


def _run_without_torch(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *argv], capture_output=True, text=True, timeout=120
    )


def test_the_finder_hides_torch():
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH.split("from ratrain")[0] + "import torch"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "hidden by the test" in out.stderr


@pytest.mark.parametrize(
    "module",
    [
        "ratrain.calibrate",
        "ratrain.calibrate.merge",
        "ratrain.calibrate.platform_file",
        "ratrain.validate.rescore",
    ],
)
def test_the_torch_free_modules_import_without_torch(module):
    code = (
        _NO_TORCH.split("from ratrain")[0] + f"import {module}\nassert 'torch' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.timeout(180)
def test_merge_runs_without_torch(tmp_path):
    files = [_file(tmp_path, n, s) for n, s in (("a", 0.9), ("b", 1.0), ("c", 1.3))]
    out = tmp_path / "m.yaml"
    got = _run_without_torch(["calibrate", "--merge", *map(str, files), "-o", str(out)])
    assert got.returncode == 0, got.stderr
    assert "median of 3 files" in got.stdout
    assert out.exists() and "measured: median of 3 calibrations" in out.read_text()


@pytest.mark.timeout(180)
def test_rescore_runs_without_torch(tmp_path):
    prev = previous_run(tmp_path)
    argv = ["validate", "--platform", "cpu-local", "--rescore", str(prev), "--json"]
    got = _run_without_torch(argv)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert [r["name"] for r in doc["results"]] == ["a", "b", "c"]
    assert all(r["predicted_step_s"] > 0 for r in doc["results"])
    assert doc["summary"]["rescored_from"] == str(prev)
