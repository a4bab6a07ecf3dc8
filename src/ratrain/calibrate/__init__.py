"""Measure the machine at hand and write a platform file (`ratrain calibrate`).

    data = calibrate(device="cpu", nproc=4, quick=True)   # the platform file's mapping
    write_platform(data, "my-machine.yaml")

Everything is measured through the code the runtime runs (the backend's kernels, the
model's own functions, the runtime's optimizer step, its communication wrappers and its
executor), so a change to the runtime is followed by re-running calibration. See
`ratrain.calibrate.kernels`, `.comm`, `.overhead`; `.platform_file` writes the notes.
"""

from __future__ import annotations

import datetime
import os
import platform as pyplatform
from pathlib import Path

import yaml

from ratrain.calibrate.windows import DEFAULT_MAX_SPREAD, run_windows
from ratrain.errors import RatrainError

__all__ = ["calibrate", "write_platform", "machine_description"]

DTYPES = ("fp32", "bf16", "fp16")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def machine_description(device: str = "cpu") -> str:
    """What the figures were measured on: CPU model and cores (or the GPU), torch version."""
    import torch

    if device == "cuda":
        what = f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
    else:
        what = f"{_cpu_model()}, {_cores()} cores"
    return f"{pyplatform.node()} ({what}; torch {torch.__version__})"


def calibrate(
    device: str = "cpu",
    nproc: int = 2,
    *,
    quick: bool = False,
    budget_s: float | None = None,
    dtypes: tuple[str, ...] = DTYPES,
    name: str = "calibrated",
    progress: bool = True,
    windows: int | None = None,
    max_spread: float = DEFAULT_MAX_SPREAD,
) -> dict:
    """Measure this machine; the platform file's data (`ratrain.platforms` schema).

    Every kernel and unit figure is the median of `windows` windows (default 3), the
    windows interleaved across quantities (`ratrain.calibrate.windows`); quantities whose
    windows disagree by more than `max_spread` are measured once more, and those still
    over are listed in the file's `calibration_warnings`."""
    import torch

    from ratrain.calibrate import kernels as K
    from ratrain.calibrate import units as U
    from ratrain.calibrate.comm import measure_comm
    from ratrain.calibrate.load import OthersLoad
    from ratrain.calibrate.overhead import measure_action_overhead
    from ratrain.calibrate.platform_file import build_platform
    from ratrain.calibrate.probe import probe_s
    from ratrain.calibrate.sharing import measure_rank_speed, rank_counts
    from ratrain.calibrate.timing import CALIBRATE_STATISTIC, Progress, Timer

    if device not in ("cpu", "cuda"):
        raise RatrainError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RatrainError("--device cuda: no CUDA device is available on this machine")
    if nproc < 1:
        raise RatrainError(f"--nproc must be >= 1, got {nproc}")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or "fp32" not in dtypes:
        raise RatrainError(f"--dtypes must include fp32 and be among {', '.join(DTYPES)}")
    windows = windows if windows is not None else 3
    if windows < 1:
        raise RatrainError(f"--windows must be >= 1, got {windows}")
    if not max_spread > 0:
        raise RatrainError(f"--max-spread must be positive, got {max_spread}")
    # Seconds per window of one quantity: a window is the mean of its repetitions.
    budget = budget_s if budget_s is not None else (0.08 if quick else 0.25)
    cores = _cores() if device == "cpu" else 1
    k_items = K.kernel_plan(dtypes, quick)
    u_items = U.unit_items(dtypes, quick)
    items = [("k", it) for it in k_items] + [("u", it) for it in u_items]
    n_steps = len(items) * windows + 2
    n_steps += len(rank_counts(nproc)) + 2 if device == "cpu" else 0
    bar = Progress(n_steps, enabled=progress)
    dev = torch.device(device)
    timer = Timer(dev, budget, statistic=CALIBRATE_STATISTIC)

    def measure(item):
        kind, it = item
        if kind == "k":
            return K.measure_kernel(it, dev, timer, cores)
        return U.measure_unit(it, dev, timer)

    def label(item):
        return (K.label if item[0] == "k" else U.label)(item[1])

    saved = torch.get_num_threads()
    others = OthersLoad()
    try:
        if device == "cpu":
            torch.set_num_threads(1)  # the curves are one thread's; sharing is modelled apart
        U.prepare_units(dev)
        probes = []  # the speed probe at the start and the end of the windows
        if device == "cpu":
            bar.step("speed probe")
            probes.append(probe_s(dev))
        got = run_windows(items, measure, windows, max_spread, label, bar)
        if device == "cpu":
            bar.step("speed probe")
            probes.append(probe_s(dev))
        torch.set_num_threads(saved)
        sharing = measure_rank_speed(nproc, quick, bar, windows) if device == "cpu" else {}
        bar.step(f"p2p and collectives, {nproc} ranks")
        comm = measure_comm(nproc, quick, device) if nproc > 1 else {}
        bar.step("fixed cost per action (tiny training job)")
        overhead = measure_action_overhead(quick, device)
    finally:
        torch.set_num_threads(saved)
        bar.close()
    kernels = K.assemble_kernels({it: got[("k", it)].value for it in k_items}, cores)
    units = U.assemble_units({it: got[("u", it)].value for it in u_items})
    spreads = {label(item): w for item, w in got.items()}
    warnings = [
        f"{what}: its windows disagree by {w.spread:.0%} (> {max_spread:.0%}) after a "
        "re-measurement"
        for what, w in spreads.items()
        if w.over
    ]
    for k, spread in (sharing or {}).get("spreads", {}).items():
        if spread > max_spread:
            warnings.append(
                f"{k} rank(s) sharing the node: windows disagree by {spread:.0%} "
                f"(> {max_spread:.0%})"
            )
    busy = others.share()
    if busy is not None and busy > OthersLoad.WARN_SHARE:
        warnings.append(
            f"other processes used {busy:.0%} of the machine's CPU time while it was measured"
        )
    ctx = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(device),
        "device": device,
        "nproc": nproc,
        "cores": cores,
        "memory_bytes": _memory_bytes()
        if device == "cpu"
        else torch.cuda.get_device_properties(0).total_memory * nproc,
        "quick": quick,
        "windows": {label(item): w for item, w in got.items()},
        "others_share": busy,
        "probes_s": probes,
    }
    raw = {"kernels": kernels, "comm": comm, "overhead": overhead, "units": units}
    raw["sharing"] = sharing
    data = build_platform(name, raw, ctx)
    if warnings:
        data["calibration_warnings"] = warnings
    return data


def write_platform(data: dict, path: str | Path) -> Path:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(
            "# Written by `ratrain calibrate`; every value says how it was obtained.\n"
            + yaml.safe_dump(data, sort_keys=False, width=100)
        )
    except OSError as e:
        raise RatrainError(f"cannot write {p}: {e.strerror}") from None
    return p
