"""Merge calibrations of one machine into one platform file: every measured value the median
of the files' (`ratrain calibrate --merge A.yaml B.yaml C.yaml -o out.yaml`).

On a machine whose speed drifts (the 2-core reference VM moves ±15-35% over minutes), one
calibration reads each quantity at one moment: two calibrations minutes apart gave rank
speeds 17% and unit factors 18% apart (docs/validation.md). Calibrating several times and
taking each value's median is the remedy a user has on such a machine; this writes it.

What is merged, value by value (each `{value, note}` whose note starts with `measured`):
- a number: the median over the files;
- a table (rows of numbers, e.g. `rank_speed`, `shared_rank_speed`): cell by cell, when
  every file has the same rows (the same leading key column, e.g. k or w, b): the median of
  each cell; a kernel curve's efficiency is taken as achieved FLOP/s (efficiency x that
  file's peak: calibrate rescales the two together) and divided by the merged peak;
- anything else (flags, a table whose rows differ between files): the first file's, and
  its note says so.
The peaks and the default efficiency are derived again as calibrate derives them (the
fastest merged kernel x the merged thread scaling), and then raised above the merged rank
speeds and unit factors (`platform_file._raise_peaks`), so the planner's bounds stay
bounds. Values not measured (assumed, derived) are the first file's.
"""

from __future__ import annotations

import copy
import re
import statistics
from pathlib import Path

from ratrain.calibrate.platform_file import _raise_peaks, peak_entry
from ratrain.calibrate.windows import TIMED_AS
from ratrain.errors import RatrainError
from ratrain.yaml_io import read_yaml_file

__all__ = ["merge_platforms"]

_DTYPES = ("fp32", "bf16", "fp16")


def _read(path: Path) -> dict:
    data = read_yaml_file(path, "--merge")
    compute = data.get("compute") if isinstance(data, dict) else None
    if not isinstance(compute, dict) or "peak_flops" not in compute:
        raise RatrainError(f"--merge {path}: not a platform file written by ratrain calibrate")
    return data


def _leaves(node, path: tuple = ()):
    """(path, entry) of every measured `{value, note}` entry."""
    if isinstance(node, dict) and "value" in node and "note" in node:
        if str(node["note"]).startswith("measured"):
            yield path, node
        return
    if isinstance(node, dict):
        for k, sub in node.items():
            yield from _leaves(sub, (*path, k))


def _at(data: dict, path: tuple):
    node = data
    for k in path:
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rows(v) -> bool:
    return isinstance(v, list) and all(
        isinstance(r, list) and r and all(_number(x) for x in r) for r in v
    )


def _median_number(values: list):
    """The median; the first file's value itself where all agree; whole where all are."""
    if all(v == values[0] for v in values):
        return values[0]
    m = statistics.median(values)
    if all(isinstance(v, int) for v in values):
        return int(round(m))
    return float(f"{m:.4g}")


def _when(data: dict, path: Path) -> str:
    """When a file was calibrated (its description's "YYYY-MM-DD HH:MM UTC"), else its name."""
    found = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", str(data.get("description", "")))
    return found.group(0) if found else path.name


def _median_table(tables: list[list[list[float]]]) -> list[list[float]] | None:
    """Cell by cell, or None where the files' rows differ in number, width or key column."""
    first = tables[0]
    for t in tables[1:]:
        if len(t) != len(first) or any(
            len(a) != len(b) or a[0] != b[0] for a, b in zip(t, first, strict=True)
        ):
            return None
    out = []
    for i, row in enumerate(first):
        cells = [row[0]]
        for j in range(1, len(row)):
            cells.append(_median_number([t[i][j] for t in tables]))
        out.append(cells)
    return out


def _statistic(data: dict) -> str | None:
    """The statistic a file's kernel windows took, as its kernel curves' notes say it."""
    notes = " ".join(
        str(e.get("note", "")) for e in data["compute"].get("efficiency_curves", {}).values()
    )
    found = [stat for stat, words in TIMED_AS.items() if f"{words} repeated" in notes]
    return found[0] if len(found) == 1 else None


def _check_statistics(datas: list[dict], paths: list[Path]) -> None:
    """Files whose kernels were timed by different statistics (the fastest call, before
    calibrate charged the mean) measure different things: refuse to take their median."""
    kinds = [(p, _statistic(d)) for d, p in zip(datas, paths, strict=True)]
    if len({k for _, k in kinds if k}) > 1:
        said = ", ".join(f"{p}: the {TIMED_AS[k]} its calls" for p, k in kinds if k)
        raise RatrainError(
            f"--merge: the files timed their kernels differently ({said}); merge only "
            "calibrations taken the same way (re-run ratrain calibrate for the older ones)"
        )


def merge_platforms(paths: list[str | Path], name: str | None = None) -> dict:
    """The merged platform data (see the module docstring); at least two files."""
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise RatrainError("--merge needs at least two platform files written by calibrate")
    datas = [_read(p) for p in paths]
    _check_statistics(datas, paths)
    out = copy.deepcopy(datas[0])
    names = ", ".join(_when(d, p) for d, p in zip(datas, paths, strict=True))
    n = len(datas)
    for path, entry in _leaves(out):
        others = [_at(d, path) for d in datas]
        values = [o.get("value") if isinstance(o, dict) else None for o in others]
        curve = len(path) == 3 and path[:2] == ("compute", "efficiency_curves")
        merged = None
        if all(_number(v) for v in values):
            merged = _median_number(values)
        elif all(_rows(v) for v in values):
            if curve:  # as achieved FLOP/s; divided by the merged peak below
                dt = path[2].rsplit(".", 1)[1]
                peaks = [d["compute"]["peak_flops"][dt]["value"] for d in datas]
                values = [[[f, e * pk] for f, e in v] for v, pk in zip(values, peaks, strict=True)]
            merged = _median_table(values)
        if merged is None:
            if curve:  # kept as the first file's, as achieved FLOP/s like the others
                pk = datas[0]["compute"]["peak_flops"][path[2].rsplit(".", 1)[1]]["value"]
                entry["value"] = [[f, e * pk] for f, e in entry["value"]]
            entry["note"] = (
                f"{entry['note']} (from {paths[0].name} alone: the files' values differ in "
                "kind or rows)"
            )
            continue
        entry["value"] = merged
        entry["note"] = (
            f"measured: median of {n} calibrations ({names}); the first's: {entry['note']}"
        )
    _derive_peaks(out["compute"], datas[0]["compute"].get("cores_per_node", {}).get("value", 1))
    if name:
        out["name"] = name
    first = str(out.get("description", ""))
    measured = first[first.find("Measured by") :] if "Measured by" in first else first
    out["description"] = f"Median of {n} calibrations ({names}); the first: {measured}"
    warnings = [w for d in datas for w in d.get("calibration_warnings", [])]
    if warnings:
        out["calibration_warnings"] = sorted(set(warnings))
    return out


def _derive_peaks(compute: dict, cores: int) -> None:
    """Peaks, curves' efficiencies and the default efficiency from the merged achieved
    FLOP/s (the curves still hold achieved figures here), as `build_platform` derives them."""
    te = compute.get("thread_efficiency", {}).get("value", 1.0)
    speedup = 1 + (max(int(cores), 1) - 1) * te
    curves = compute.get("efficiency_curves", {})
    for dt in _DTYPES:
        mine = {k: e for k, e in curves.items() if k.rsplit(".", 1)[1] == dt}
        if not mine or dt not in compute["peak_flops"]:
            continue
        best = max(r for e in mine.values() for _, r in e["value"])
        compute["peak_flops"][dt] = peak_entry(dt, best, speedup, "merged")
        peak = compute["peak_flops"][dt]["value"]
        for e in mine.values():
            e["value"] = [[f, float(f"{r / peak:.4g}")] for f, r in e["value"]]
    if "efficiency" in compute:
        compute["efficiency"]["value"] = float(f"{1 / speedup:.4g}")
    _raise_peaks(compute, speedup)
