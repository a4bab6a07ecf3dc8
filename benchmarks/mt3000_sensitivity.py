"""How sensitive the paper-table predictions are to each assumed mt3000 constant.

For every number of `platforms/mt3000.yaml` whose note starts with ``assumed`` (and the
``derived`` fp32 peak, which rests on an assumption), the platform is rebuilt with that one
value at 0.5x and 1.5x (efficiencies capped at 1, counts rounded), and the paper's
comparison (`ratrain.planner.paper.compare_models`: the best RATrain plan against the
best GPU-style baseline per model, 1024 clusters, 4M-token batches) is re-planned. The
table shows the speedups at the preset's value and at each end of the sweep, and which
measurement would replace the constant on the real machine.

    python benchmarks/mt3000_sensitivity.py [--quick] [--json] [--models llama2-7b,...]

`--quick` plans llama2-7b only. Pure Python (no torch); about 10 s per platform variant
for the four models on one core.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import yaml

from ratrain.planner.paper import PAPER_MODELS, compare_models
from ratrain.platforms.load import PRESETS_DIR, parse_platform

# What would measure each constant on the real machine (`ratrain calibrate` on an MT-3000
# node, given a torch backend there), or why calibration cannot.
REPLACED_BY = {
    "workspace_bytes": "not a speed: measured peak vs ledger (ratrain validate)",
    "compute.peak_flops.bf16": "GEMM curves per dtype (calibrate: efficiency_curves.gemm.bf16)",
    "compute.peak_flops.fp32": "GEMM curves per dtype (calibrate: efficiency_curves.gemm.fp32)",
    "compute.efficiency": "GEMM/attention efficiency curves (calibrate)",
    "network.intra_node.bandwidth_bytes_per_s": "p2p ping-pong fit (calibrate --nproc 4)",
    "network.intra_node.latency_s": "p2p ping-pong fit (calibrate --nproc 4)",
    "network.intra_node.efficiency": "folded into the measured bandwidth (set to 1)",
    "network.inter_node.bandwidth_bytes_per_s": "needs a multi-node run (not measured by calibrate yet)",
    "network.inter_node.latency_s": "needs a multi-node run (not measured by calibrate yet)",
    "network.inter_node.efficiency": "needs a multi-node run (not measured by calibrate yet)",
    "host.bandwidth_bytes_per_s": "a pinned host copy timing (calibrate measures it on CUDA only)",
    "host.latency_s": "a pinned host copy timing",
}


def _entries(node, path=""):
    """(dotted key, entry) for every {value, note} number in the YAML tree."""
    if isinstance(node, dict):
        if "value" in node and "note" in node:
            yield path, node
            return
        for k, v in node.items():
            yield from _entries(v, f"{path}{k}." if path or k else k)
    elif isinstance(node, list):
        for t in node:
            name = t.get("name", "?") if isinstance(t, dict) else "?"
            for k, v in t.items():
                if k != "name":
                    yield from _entries(v, f"{path}{name}.{k}.")


def _key(dotted: str) -> str:
    return dotted.rstrip(".")


def swept_constants(data: dict) -> list[str]:
    out = []
    for key, e in _entries(data):
        note = str(e["note"]).lower()
        numeric = isinstance(e["value"], int | float) and not isinstance(e["value"], bool)
        if numeric and (note.startswith("assumed") or "assumed fp32" in note):
            out.append(_key(key))
    return out


def _set(data: dict, key: str, factor: float) -> dict:
    d = copy.deepcopy(data)
    for k, e in _entries(d):
        if _key(k) == key:
            v = e["value"] * factor
            if key.endswith("efficiency"):
                v = min(v, 1.0)
            if isinstance(e["value"], int) and not key.endswith("_s"):
                v = max(1, round(v))
            e["value"] = v
    return d


def speedups(data: dict, models) -> dict[str, float | None]:
    platform = parse_platform(data, "mt3000-sweep")
    return {r.model: r.speedup() for r in compare_models(platform, models=models)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="llama2-7b only")
    ap.add_argument("--models", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    models = (
        tuple(args.models.split(","))
        if args.models
        else (("llama2-7b",) if args.quick else PAPER_MODELS)
    )
    data = yaml.safe_load((PRESETS_DIR / "mt3000.yaml").read_text())
    base = speedups(data, models)
    rows = []
    keys = swept_constants(data)
    for i, key in enumerate(keys):
        sys.stderr.write(f"\r[{i + 1}/{len(keys)}] {key:<60}")
        lo, hi = speedups(_set(data, key, 0.5), models), speedups(_set(data, key, 1.5), models)
        rows.append(
            {
                "constant": key,
                "low": lo,
                "high": hi,
                "replaced_by": REPLACED_BY.get(
                    key, "tile-level DMA microbenchmarks (not in calibrate)"
                ),
            }
        )
    sys.stderr.write("\n")
    if args.json:
        print(json.dumps({"models": models, "base": base, "rows": rows}, indent=1))
        return 0
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    head = " | ".join(f"{m} 0.5x / 1x / 1.5x" for m in models)
    print(f"| constant | {head} | max change | calibration would replace it by |")
    print("|" + " --- |" * (len(models) + 3))
    for r in sorted(rows, key=lambda r: -_spread(r, base, models)):
        cells = " | ".join(
            f"{fmt(r['low'][m])} / {fmt(base[m])} / {fmt(r['high'][m])}" for m in models
        )
        print(
            f"| `{r['constant']}` | {cells} | {_spread(r, base, models):.1%} | {r['replaced_by']} |"
        )
    return 0


def _spread(r, base, models) -> float:
    out = 0.0
    for m in models:
        for v in (r["low"][m], r["high"][m]):
            if v is not None and base[m]:
                out = max(out, abs(v / base[m] - 1))
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    raise SystemExit(main())
