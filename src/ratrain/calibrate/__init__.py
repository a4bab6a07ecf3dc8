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
) -> dict:
    """Measure this machine; the platform file's data (`ratrain.platforms` schema)."""
    import torch

    from ratrain.calibrate.comm import measure_comm
    from ratrain.calibrate.kernels import kernel_plan, measure_kernels
    from ratrain.calibrate.overhead import measure_action_overhead
    from ratrain.calibrate.platform_file import build_platform
    from ratrain.calibrate.sharing import measure_rank_speed, rank_counts
    from ratrain.calibrate.timing import Progress
    from ratrain.calibrate.units import measure_units, unit_plan

    if device not in ("cpu", "cuda"):
        raise RatrainError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RatrainError("--device cuda: no CUDA device is available on this machine")
    if nproc < 1:
        raise RatrainError(f"--nproc must be >= 1, got {nproc}")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or "fp32" not in dtypes:
        raise RatrainError(f"--dtypes must include fp32 and be among {', '.join(DTYPES)}")
    budget = budget_s if budget_s is not None else (0.1 if quick else 0.4)
    n_steps = len(kernel_plan(dtypes, quick)) + len(unit_plan(dtypes, quick)) + 2
    n_steps += len(rank_counts(nproc)) if device == "cpu" else 0
    bar = Progress(n_steps, enabled=progress)
    try:
        kernels = measure_kernels(
            torch.device(device), dtypes, quick, budget, bar, _cores() if device == "cpu" else 1
        )
        units = measure_units(torch.device(device), dtypes, quick, budget, bar)
        sharing = measure_rank_speed(nproc, quick, bar) if device == "cpu" else {}
        bar.step(f"p2p and collectives, {nproc} ranks")
        comm = measure_comm(nproc, quick, device) if nproc > 1 else {}
        bar.step("fixed cost per action (tiny training job)")
        overhead = measure_action_overhead(quick, device)
    finally:
        bar.close()
    ctx = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(device),
        "device": device,
        "nproc": nproc,
        "cores": _cores() if device == "cpu" else 1,
        "memory_bytes": _memory_bytes()
        if device == "cpu"
        else torch.cuda.get_device_properties(0).total_memory * nproc,
        "quick": quick,
    }
    raw = {"kernels": kernels, "comm": comm, "overhead": overhead, "units": units}
    raw["sharing"] = sharing
    return build_platform(name, raw, ctx)


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
