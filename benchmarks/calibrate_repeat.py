"""How well `ratrain calibrate` repeats: run it N times, compare the files value by value, and
(with `--rescore`) score each file on the same validation measurements.

    python benchmarks/calibrate_repeat.py [--runs 2] [--quick] [--nproc 4] [--out-dir DIR]
        [--rescore PREV.json] [--files A.yaml B.yaml ...] [--json]

- runs `ratrain calibrate [--quick] --nproc N -o DIR/cal-<i>.yaml` N times back to back
  (or, with `--files`, compares existing files without calibrating);
- per measured value (kernel curves as achieved FLOP/s, i.e. efficiency x the file's
  peak, since calibrate rescales both together), the ratio max/min over the files: the
  worst 15 values, and a summary (median, share within 5/10/20%);
- with `--rescore PREV.json` (an earlier `ratrain validate --json`): each file's MAPE, max
  error and Kendall tau on those same measurements (`ratrain validate --rescore`), so the
  figures differ only by the calibration. The issue's acceptance figure: two back-to-back
  calibrations re-scored on one validate run agree within a few MAPE points.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ratrain.errors import RatrainError


def _flat(data: dict) -> dict[str, float]:
    """Every measured number of a platform file by a dotted key (rows indexed)."""
    peaks = {dt: e["value"] for dt, e in data["compute"]["peak_flops"].items()}
    out: dict[str, float] = {}

    def walk(node, key: str) -> None:
        if isinstance(node, dict) and "value" in node and "note" in node:
            if not str(node["note"]).startswith("measured"):
                return
            v = node["value"]
            if isinstance(v, bool):
                return
            if isinstance(v, (int, float)):
                out[key] = float(v)
            elif isinstance(v, list):
                curve = key.startswith("compute.efficiency_curves.")
                scale = peaks[key.rsplit(".", 1)[1]] if curve else 1.0
                for row in v:
                    if isinstance(row, list) and len(row) >= 2:
                        # tables: [x, y...] keyed by x; a curve's y as achieved FLOP/s
                        for j, y in enumerate(row[1:], 1):
                            out[f"{key}[{row[0]:g}][{j}]"] = float(y) * scale
        elif isinstance(node, dict):
            for k, sub in node.items():
                walk(sub, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{key}[{i}]")

    walk(data, "")
    return out


def compare(files: list[Path]) -> dict:
    """Per value present in every file: the ratio max/min over the files."""
    flats = [_flat(yaml.safe_load(f.read_text())) for f in files]
    common = set(flats[0]).intersection(*flats[1:])
    ratios = {}
    for k in sorted(common):
        vals = [f[k] for f in flats]
        if min(vals) > 0:
            ratios[k] = max(vals) / min(vals)
        elif max(vals) != min(vals):
            ratios[k] = math.inf
    devs = sorted(r - 1 for r in ratios.values())
    return {
        "files": [str(f) for f in files],
        "values": len(ratios),
        "median_spread": statistics.median(devs) if devs else 0.0,
        "within": {
            f"{p}%": sum(d <= p / 100 for d in devs) / max(len(devs), 1) for p in (5, 10, 20)
        },
        "worst": sorted(ratios.items(), key=lambda kv: -kv[1])[:15],
        "values_by_file": {
            k: [f[k] for f in flats] for k, _ in sorted(ratios.items(), key=lambda kv: -kv[1])[:15]
        },
    }


def rescored(files: list[Path], prev: str) -> list[dict]:
    from ratrain.platforms import load
    from ratrain.validate.rescore import rescore

    rows = []
    for f in files:
        _, s, _ = rescore(prev, load(str(f)), plan_picks=False)
        rows.append(
            {
                "file": str(f),
                "mape": s["mape"],
                "max_error": s["max_error"],
                "kendall_tau": s["kendall_tau"],
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="calibrations to run (default 2)")
    ap.add_argument("--quick", action="store_true", help="ratrain calibrate --quick")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--out-dir", default=None, help="where the files go (default: a temp dir)")
    ap.add_argument("--files", nargs="+", default=None, help="compare these files, run nothing")
    ap.add_argument("--rescore", metavar="PREV.json", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.files:
            files = [Path(f) for f in args.files]
            took = []
        else:
            if args.runs < 2:
                raise RatrainError("--runs must be >= 2 (a comparison needs two files)")
            out = Path(args.out_dir or tempfile.mkdtemp(prefix="calibrate-repeat-"))
            out.mkdir(parents=True, exist_ok=True)
            files, took = [], []
            for i in range(args.runs):
                f = out / f"cal-{i + 1}.yaml"
                cmd = [sys.executable, "-m", "ratrain", "calibrate", "--nproc", str(args.nproc)]
                cmd += ["--no-progress", "-o", str(f)] + (["--quick"] if args.quick else [])
                print(f"[{i + 1}/{args.runs}] {' '.join(cmd[1:])}", file=sys.stderr)
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True)
                took.append(time.perf_counter() - t0)
                files.append(f)
        if len(files) < 2:
            raise RatrainError("need at least two platform files to compare")
        res = compare(files)
        res["calibrate_s"] = took
        if args.rescore:
            res["rescored"] = rescored(files, args.rescore)
    except RatrainError as e:
        print(f"calibrate_repeat: error: {e}", file=sys.stderr)
        return 2
    except (OSError, subprocess.CalledProcessError, yaml.YAMLError, KeyError) as e:
        print(f"calibrate_repeat: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return 0
    _print(res)
    return 0


def _print(res: dict) -> None:
    if res["calibrate_s"]:
        print("calibrate took " + ", ".join(f"{t:.0f} s" for t in res["calibrate_s"]))
    print(f"{'value (max/min over ' + str(len(res['files'])) + ' files)':<72} {'ratio':>7}  values")
    for k, r in res["worst"]:
        vals = " ".join(f"{v:.4g}" for v in res["values_by_file"][k])
        print(f"{k[:72]:<72} {r:7.3f}  {vals}")
    w = res["within"]
    print(
        f"{res['values']} measured values: median spread {res['median_spread']:.1%}; within 5%: "
        f"{w['5%']:.0%}, 10%: {w['10%']:.0%}, 20%: {w['20%']:.0%}"
    )
    if res.get("rescored"):
        print(f"\n{'file':<48} {'MAPE':>7} {'max':>7} {'tau':>6}")
        for r in res["rescored"]:
            tau = r["kendall_tau"]
            print(
                f"{r['file'][-48:]:<48} {r['mape']:7.1%} {r['max_error']:7.1%} "
                + (f"{tau:6.2f}" if tau is not None else "     -")
            )
        mapes = [r["mape"] for r in res["rescored"]]
        print(f"MAPE range over the files: {(max(mapes) - min(mapes)) * 100:.1f} points")


if __name__ == "__main__":
    sys.exit(main())
