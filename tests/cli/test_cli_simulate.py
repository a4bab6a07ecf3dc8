import json
import subprocess
import sys

import pytest
import yaml

from ratrain.cli import main
from ratrain.platforms.load import PRESETS_DIR

TINY = ["simulate", "--model", "tiny", "--platform", "cpu-local"]


def test_table(capsys):
    assert main(TINY + ["--pp", "2", "--dp", "2"]) == 0
    out = capsys.readouterr().out
    assert "tiny on cpu-local, schedule ratrain: pp=2 dp=2" in out
    for key in ("step time", "tokens/s", "bubble", "peak memory"):
        assert key in out
    assert len([ln for ln in out.splitlines() if ln.strip().startswith(("0 ", "1 "))]) == 2


def test_json_is_one_object(capsys):
    args = TINY + ["--pp", "4", "--micro-batch", "2", "--global-batch", "16", "--json"]
    assert main(args + ["--schedule", "baseline", "--check"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schedule"] == "baseline" and d["plan"]["pp"] == 4
    assert d["step_time_s"] > 0 and d["tokens_per_s"] == pytest.approx(16 * 128 / d["step_time_s"])
    assert 0 < d["bubble_fraction"] < 1
    assert len(d["peak_memory_bytes"]) == 4 and all(b > 0 for b in d["peak_memory_bytes"])
    assert len(d["memory_breakdown"]) == 4
    assert sum(d["memory_breakdown"][0].values()) == d["peak_memory_bytes"][0]
    assert "events" not in d


def test_trace_and_plot_files(tmp_path, capsys):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(TINY + ["--pp", "2", "--trace", str(trace), "--plot", str(png)]) == 0
    assert "trace written to" in capsys.readouterr().out
    doc = json.loads(trace.read_text())
    assert any(e["ph"] == "X" for e in doc["traceEvents"])
    assert any(e["ph"] == "C" for e in doc["traceEvents"])
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_platform_file_and_over_cap_warning(tmp_path, capsys):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["name"] = "small"
    data["usable_memory_bytes"]["value"] = 2_000_000
    data["workspace_bytes"]["value"] = 1_000_000
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(TINY[:3] + ["--platform", str(path), "--pp", "2", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["over_cap_stages"] == [0, 1]
    assert "warning: stage 0 peaks at" in cap.err and "over the 0.00 GB small leaves" in cap.err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--platform", "tpu"], "unknown platform preset 'tpu'"),
        (["--pp", "9"], "pp=9 exceeds tiny's 4 layers"),
        (["--global-batch", "3", "--dp", "2"], "not a multiple of micro_batch x dp"),
    ],
)
def test_user_mistakes_are_one_line_errors(args, message, capsys):
    assert main(TINY + args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and err.startswith("ratrain simulate: error:")


@pytest.mark.timeout(120)
def test_defaults_work_on_mt3000_without_torch():
    """`ratrain simulate --model llama2-7b --platform mt3000`, in a fresh interpreter."""
    code = (
        "import json, sys, io, contextlib\n"
        "from ratrain.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    rc = main(['simulate', '--model', 'llama2-7b', '--platform', 'mt3000', '--json'])\n"
        "assert rc == 0 and 'torch' not in sys.modules\n"
        "print(buf.getvalue())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    d = json.loads(out.stdout)
    assert (
        d["plan"]["pp"] == 8 and d["plan"]["seq"] == 4096 and d["plan"]["compute_dtype"] == "fp16"
    )
    assert d["over_cap_stages"] == [] and d["tokens_per_s"] > 0


def test_plan_file_names_the_model(tmp_path, capsys):
    from ratrain.config import Plan, save_plan

    path = tmp_path / "plan.yaml"
    save_plan(Plan(pp=2, global_batch=4, seq=64, model="tiny", schedule="gpu-style"), path)
    assert main(["simulate", "--plan", str(path), "--platform", "cpu-local", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"] == "tiny" and d["schedule"] == "gpu-style" and d["plan"]["seq"] == 64
