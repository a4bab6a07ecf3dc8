import subprocess
import sys

import pytest
import yaml

from ratrain.errors import RatrainError
from ratrain.platforms import PLATFORM_PRESETS, Platform, load
from ratrain.platforms.load import PRESETS_DIR


@pytest.mark.parametrize("name", PLATFORM_PRESETS)
def test_presets_load_and_every_value_has_provenance(name):
    p = load(name)
    assert isinstance(p, Platform) and p.name == name
    assert set(p.peak_flops) == {"fp16", "bf16", "fp32"}
    assert 0 < p.efficiency <= 1 and p.workspace_bytes < p.usable_memory_bytes
    assert p.main_memory is p.tiers[-1]
    for key, note in p.notes.items():
        kind = note.split(":")[0].split(" ")[0]
        assert kind in ("sourced", "derived", "assumed", "measured"), key
    # One note per number: 3 peaks + efficiency + cap + workspace + headroom + host (2)
    # + links (2x3) + units + algorithm + 4 per tier; a calibrated preset has its measured
    # sections too, and a CPU's host tier is its main memory (host.same_memory).
    base = [k for k in p.notes if not k.startswith(_MEASURED_SECTIONS)]
    assert len(base) == 17 + 4 * len(p.tiers) + p.host_is_main_memory
    assert p.host_is_main_memory == (name == "cpu-local")


_MEASURED_SECTIONS = (
    "compute.efficiency_curves",
    "compute.memory_bound_bytes_per_s",
    "compute.cores_per_node",
    "compute.thread_efficiency",
    "compute.unit_time_factor",
    "compute.collective_compute_s_per_byte",
    "compute.rank_speed",
    "compute.shared_rank_speed",
    "runtime.",
    "network.collectives",
    "measured_on.",
)


def test_cpu_local_is_calibrated_from_a_documented_reference_machine():
    p = load("cpu-local")
    assert p.measured_on and p.measured_on["cores"] >= 1
    assert p.notes["compute.efficiency_curves.gemm.fp32"].startswith("measured")
    assert p.notes["runtime.action_overhead_s.F"].startswith("measured")
    assert "reference machine" in p.description.lower()


def test_a_measured_platform_on_another_host_warns_once(tmp_path):
    from ratrain.platforms.host import HostMismatchWarning

    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    data["name"] = "elsewhere"
    data["measured_on"] = {
        "cpu": {"value": "Some Other CPU", "note": "measured: test"},
        "cores": {"value": 512, "note": "measured: test"},
    }
    path = tmp_path / "elsewhere.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.warns(HostMismatchWarning, match="ratrain calibrate"):
        load(str(path))


def test_mt3000_figures_from_the_public_sources():
    p = load("mt3000")
    assert p.usable_memory_bytes == 20 * 10**9
    assert p.peak_flops["fp16"] == 8.1e12
    assert p.peak_flops["fp32"] == pytest.approx(11.6e12 / 4)  # FP64 per chip over 4 clusters
    assert [t.name for t in p.tiers] == ["am", "gsm", "hbsm", "ddr"]
    assert p.tiers[0].capacity_bytes == 768 * 1024 and p.tiers[0].copies == 24
    assert p.main_memory.bandwidth_bytes_per_s == 30e9
    assert "weaker" in p.notes["compute.peak_flops.fp16"]
    for k in ("network.inter_node.bandwidth_bytes_per_s", "network.inter_node.latency_s"):
        assert p.notes[k].startswith("assumed")  # nothing public on the network


def test_gpu_datasheet_peaks():
    assert load("a100-80g").peak_flops["bf16"] == 312e12
    assert load("h100-80g").peak_flops["bf16"] == 989e12
    assert load("a100-80g").inter_node.bandwidth_bytes_per_s == 25e9  # HDR 200 Gb/s
    assert load("h100-80g").inter_node.bandwidth_bytes_per_s == 50e9  # NDR 400 Gb/s
    assert load("h100-80g").units_per_node == 8


def _write(tmp_path, mutate):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    mutate(data)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_user_file_round_trip(tmp_path):
    path = _write(tmp_path, lambda d: d.update(name="mine"))
    p = load(str(path))
    assert p.name == "mine" and p.peak_flops == load("cpu-local").peak_flops


def _drop_peak(d):
    del d["compute"]["peak_flops"]["fp16"]


def _zero_bw(d):
    d["tiers"][0]["bandwidth_bytes_per_s"]["value"] = 0


def _no_note(d):
    del d["network"]["inter_node"]["latency_s"]["note"]


def _bad_note(d):
    d["host"]["latency_s"]["note"] = "looks right"


def _bad_algo(d):
    d["network"]["algorithm"]["value"] = "butterfly"


def _typo(d):
    d["netwrk"] = d.pop("network")


def _same_memory_text(d):
    d["host"]["same_memory"]["value"] = "yes"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (_drop_peak, "missing field compute.peak_flops.fp16"),
        (_zero_bw, "tiers.dram.bandwidth_bytes_per_s must be positive"),
        (_no_note, "network.inter_node.latency_s has no provenance note"),
        (_bad_note, "host.latency_s has no provenance note"),
        (_bad_algo, "unknown collective algorithm 'butterfly'"),
        (_typo, "unknown field(s) ['netwrk']"),
        (_same_memory_text, "host.same_memory must be true or false, got 'yes'"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, mutate, message):
    with pytest.raises(RatrainError) as e:
        load(_write(tmp_path, mutate))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unknown_preset_and_missing_file(tmp_path):
    with pytest.raises(RatrainError, match="unknown platform preset 'tpu'.*mt3000"):
        load("tpu")
    with pytest.raises(RatrainError, match="not found"):
        load(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(RatrainError, match="not valid YAML"):
        load(bad)


def test_loader_imports_no_torch():
    code = "import sys, ratrain.platforms as p; p.load('mt3000'); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
