"""Measure the machine at hand and write a platform file (`ratrain calibrate`).

    data = calibrate(device="cpu", nproc=4, quick=True)   # the platform file's mapping
    write_platform(data, "my-machine.yaml")

Everything is measured through the code the runtime runs (the backend's kernels, the
model's own functions, the runtime's optimizer step, its communication wrappers and its
executor), so a change to the runtime is followed by re-running calibration.

What measures (torch, imported when `calibrate` runs): `kernels` (kernel curves, memory-bound
ops, optimizer, thread scaling), `units` (whole units against their kernels), `sharing`
(ranks sharing the node), `comm` (p2p and collectives), `overhead` (the fixed cost per
action), `probe` (the speed probe), timed by `timing` in the interleaved `windows`, with
`load` watching other processes. What turns the figures into a file (no torch, so that
`--merge` runs without it): `platform_file` (every value with its note), `fit` (the α–β
fit), `shapes` (the shapes measured), `merge` (the median of several calibrations).
Setting the file's predictions beside real runs is `ratrain.validate`'s.
"""

from __future__ import annotations

import datetime
import os
import platform as pyplatform
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from ratrain.calibrate.windows import (
    CALIBRATE_STATISTIC,
    DEFAULT_MAX_SPREAD,
    Settled,
    run_windows,
    settle_summary,
)
from ratrain.errors import RatrainError

__all__ = ["calibrate", "write_platform", "machine_description", "busy_signs", "IDLE_CHECK_S"]

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
    settle_s: float | None = None,
    on_settle: Callable[[Settled], None] | None = None,
) -> dict:
    """Measure this machine; the platform file's data (`ratrain.platforms` schema).

    Every kernel and unit figure is the median of `windows` windows (default 3), the
    windows interleaved across quantities (`ratrain.calibrate.windows`); quantities whose
    windows disagree by more than `max_spread` are settled: measured again in further
    rounds, within `settle_s` seconds (default: `windows.settle_limit_s` of the first
    pass), and `on_settle` is told what that did. Those still over are listed in the
    file's `calibration_warnings`, as is other processes' share of the CPU time when above
    `OthersLoad.WARN_SHARE`. A machine that other processes keep busy before the
    measurement starts is said so at once (one line on stderr), and measured anyway."""
    from ratrain.calibrate.load import OthersLoad
    from ratrain.calibrate.platform_file import build_platform
    from ratrain.calibrate.timing import Progress

    windows = windows if windows is not None else 3
    _check_args(device, nproc, dtypes, windows, max_spread)
    _note_busy()
    # Seconds per window of one quantity: a window is the mean of its repetitions.
    window_s = budget_s if budget_s is not None else (0.08 if quick else 0.25)
    cores = _cores() if device == "cpu" else 1
    items = _windowed_items(dtypes, quick)
    bar = Progress(_steps(items, windows, nproc, device), enabled=progress)
    others = OthersLoad()
    try:
        got, probes_s = _measure_windows(
            items, device, cores, window_s, windows, max_spread, bar, settle_s
        )
        sharing, comm, overhead = _measure_ranks(device, nproc, quick, windows, bar)
    finally:
        bar.close()
    if on_settle is not None:
        on_settle(settle_summary(got))
    by_label = {_label(item): w for item, w in got.items()}
    busy = others.share()
    warnings = _warnings(by_label, sharing, busy, max_spread)
    ctx = _context(device, nproc, cores, quick, by_label, busy, probes_s)
    kernels, units = _assemble(got, cores)
    raw = dict(kernels=kernels, comm=comm, overhead=overhead, units=units, sharing=sharing)
    data = build_platform(name, raw, ctx)
    if warnings:
        data["calibration_warnings"] = warnings
    return data


def _check_args(
    device: str, nproc: int, dtypes: tuple[str, ...], windows: int, max_spread: float
) -> None:
    import torch

    if device not in ("cpu", "cuda"):
        raise RatrainError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RatrainError("--device cuda: no CUDA device is available on this machine")
    if nproc < 1:
        raise RatrainError(f"--nproc must be >= 1, got {nproc}")
    if device == "cuda":  # NCCL, and a device per communication rank (--nproc)
        from ratrain.launch.grid import check_cuda

        check_cuda(nproc, nproc)
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or "fp32" not in dtypes:
        raise RatrainError(f"--dtypes must include fp32 and be among {', '.join(DTYPES)}")
    if windows < 1:
        raise RatrainError(f"--windows must be >= 1, got {windows}")
    if not max_spread > 0:
        raise RatrainError(f"--max-spread must be positive, got {max_spread}")


IDLE_CHECK_S = 1.0
"""assumed: a second of the kernel's CPU accounting tells a machine that other processes
keep busy (a build, another job) from an idle one, for a check that costs little against
a calibration's minutes."""


def _note_busy() -> None:
    """One line on stderr, before minutes of measuring, when other processes already keep
    the machine busy: its values may disagree between windows and take settling."""
    from ratrain.calibrate.load import OthersLoad, others_share_now

    share = others_share_now(IDLE_CHECK_S)
    if share is not None and share > OthersLoad.WARN_SHARE:
        print(
            f"ratrain calibrate: note: other processes are using {share:.0%} of this "
            f"machine's CPU time (over {IDLE_CHECK_S:g} s, more than "
            f"{OthersLoad.WARN_SHARE:.0%}): measuring anyway; values that do not repeat "
            "will be re-measured to settle them (this takes longer), and any still noisy "
            "are named at the end",
            file=sys.stderr,
        )


def busy_signs(data: dict) -> list[str]:
    """Why a platform file's measured data look taken on a loaded machine ([] when they do
    not): one rank with all the cores slower per rank than several ranks sharing them, or
    a second thread worth almost nothing."""
    compute = data.get("compute") or {}

    def value(key: str, default):
        entry = compute.get(key)
        return entry.get("value", default) if isinstance(entry, dict) else default

    out = []
    speeds = [float(v) for _, v in value("rank_speed", None) or ()]
    if len(speeds) > 1 and speeds[0] < max(speeds[1:]):
        out.append(
            f"one rank with all the threads measured slower ({speeds[0]:.3g}) than a rank "
            f"sharing the node ({max(speeds[1:]):.3g})"
        )
    cores, eff = value("cores_per_node", None), value("thread_efficiency", None)
    if cores and cores > 1 and eff is not None and eff < 0.2:
        out.append(f"a second thread measured worth {eff:.0%} of the first")
    return out


def _windowed_items(dtypes: tuple[str, ...], quick: bool) -> list[tuple[str, tuple]]:
    """The quantities measured in interleaved windows: ("k", kernel item) and ("u", unit
    item)."""
    from ratrain.calibrate import kernels as K
    from ratrain.calibrate import units as U

    k_items = K.kernel_plan(dtypes, quick)
    u_items = U.unit_items(dtypes, quick)
    return [("k", it) for it in k_items] + [("u", it) for it in u_items]


def _label(item: tuple[str, tuple]) -> str:
    """An item as the notes and the warnings name it."""
    from ratrain.calibrate import kernels as K
    from ratrain.calibrate import units as U

    return (K.label if item[0] == "k" else U.label)(item[1])


def _steps(items: list, windows: int, nproc: int, device: str) -> int:
    """The progress bar's steps: every window of every item, the probes and the rank
    measurements."""
    from ratrain.calibrate.sharing import rank_counts

    n_steps = len(items) * windows + 2
    n_steps += len(rank_counts(nproc)) + 2 if device == "cpu" else 0
    return n_steps


def _measure_windows(items, device, cores, window_s, windows, max_spread, bar, settle_s=None):
    """The kernels and units in interleaved windows, one thread, between two speed probes
    (on CPU), noisy ones settled within `settle_s`: ({item: Windowed}, [probe s])."""
    import torch

    from ratrain.calibrate import kernels as K
    from ratrain.calibrate import units as U
    from ratrain.calibrate.probe import probe_s
    from ratrain.calibrate.timing import Timer

    dev = torch.device(device)
    timer = Timer(dev, window_s, statistic=CALIBRATE_STATISTIC)

    def measure(item):
        kind, it = item
        if kind == "k":
            return K.measure_kernel(it, dev, timer, cores)
        return U.measure_unit(it, dev, timer)

    saved = torch.get_num_threads()
    try:
        if device == "cpu":
            torch.set_num_threads(1)  # the curves are one thread's; sharing is modelled apart
        U.prepare_units(dev)
        probes_s = []  # the speed probe at the start and the end of the windows
        if device == "cpu":
            bar.step("speed probe")
            probes_s.append(probe_s(dev))
        got = run_windows(items, measure, windows, max_spread, _label, bar, settle_s=settle_s)
        if device == "cpu":
            bar.step("speed probe")
            probes_s.append(probe_s(dev))
    finally:
        torch.set_num_threads(saved)
    return got, probes_s


def _measure_ranks(
    device: str, nproc: int, quick: bool, windows: int, bar
) -> tuple[dict, dict, dict]:
    """What takes several ranks or a whole job, all threads: (ranks sharing the node,
    communication, the runtime's fixed cost per action)."""
    from ratrain.calibrate.comm import measure_comm
    from ratrain.calibrate.overhead import measure_action_overhead
    from ratrain.calibrate.sharing import measure_rank_speed

    sharing = measure_rank_speed(nproc, quick, bar, windows) if device == "cpu" else {}
    bar.step(f"p2p and collectives, {nproc} ranks")
    comm = measure_comm(nproc, quick, device) if nproc > 1 else {}
    bar.step("fixed cost per action (tiny training job)")
    overhead = measure_action_overhead(quick, device)
    return sharing, comm, overhead


def _assemble(got: dict, cores: int) -> tuple[dict, dict]:
    """(kernels, units) from each item's windows' median, as the platform file's builder
    reads them."""
    from ratrain.calibrate import kernels as K
    from ratrain.calibrate import units as U

    median = {kind: {} for kind in ("k", "u")}
    for (kind, it), w in got.items():
        median[kind][it] = w.value
    return K.assemble_kernels(median["k"], cores), U.assemble_units(median["u"])


def _warnings(by_label: dict, sharing: dict, busy: float | None, max_spread: float) -> list[str]:
    """Why the figures may not hold: windows that still disagree, a loaded machine."""
    from ratrain.calibrate.load import OthersLoad

    warnings = [
        f"{what}: its windows disagree by {w.spread:.0%} (> {max_spread:.0%}) in the last "
        f"of {w.rounds} rounds"
        for what, w in by_label.items()
        if w.over
    ]
    for k, spread in (sharing or {}).get("spreads", {}).items():
        if spread > max_spread:
            warnings.append(
                f"{k} rank(s) sharing the node: windows disagree by {spread:.0%} "
                f"(> {max_spread:.0%})"
            )
    if busy is not None and busy > OthersLoad.WARN_SHARE:
        warnings.append(
            f"other processes used {busy:.0%} of the machine's CPU time while it was measured"
        )
    return warnings


def _context(
    device: str,
    nproc: int,
    cores: int,
    quick: bool,
    by_label: dict,
    busy: float | None,
    probes_s: list[float],
) -> dict:
    """When, where and how the figures were measured: what the notes say beside them."""
    return {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(device),
        "device": device,
        "nproc": nproc,
        "cores": cores,
        "memory_bytes": _total_memory_bytes(device, nproc),
        "quick": quick,
        "windows": by_label,
        "others_share": busy,
        "probes_s": probes_s,
    }


def _total_memory_bytes(device: str, nproc: int) -> int:
    if device == "cpu":
        return _memory_bytes()
    import torch

    return torch.cuda.get_device_properties(0).total_memory * nproc


def write_platform(data: dict, path: str | Path) -> Path:
    """Write the platform file whole or not at all: through a file beside it, renamed over
    it once written (a failed write leaves an existing file as it was)."""
    p = Path(path)
    text = "# Written by `ratrain calibrate`; every value says how it was obtained.\n"
    text += yaml.safe_dump(data, sort_keys=False, width=100)
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(p)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise RatrainError(f"cannot write {p}: {e.strerror or e}") from None
    return p
