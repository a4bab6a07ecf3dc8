"""The speed probe: how fast this machine computes now, against when it was calibrated.

A platform file's figures hold for the machine as it ran while `ratrain calibrate`
measured it. A VM's speed moves (on the 2-core reference machine a GEMM's best time ranged
over ±15% from one minute to the next, and whole runs drifted by 10-25%), so a validation
run some minutes later may meet a faster or slower machine than the file describes. The
probe makes that visible: calibrate times it at its start and its end and records the
figure (`measured_on.speed_probe_s`); `ratrain validate` times it again around every pass
and reports the machine's speed relative to calibration. It is a diagnostic only: no
prediction or measurement is scaled by it.

The probe is the model's own `Block` (`ratrain.nn.llama.build_unit`), fp32, forward
with autograd recording and backward, at one of calibrate's unit shapes (hidden 448, 2 x 128
tokens), on one thread: the work a step is made of. Its time is the median of `windows`
windows, each the fastest repetition within `budget_s`.
"""

from __future__ import annotations

import statistics

import torch

__all__ = ["PROBE_WHAT", "probe_s", "relative_speeds", "machine_speed", "describe"]

PROBE_WHAT = "the model's Block forward+backward (fp32, hidden 448, 2x128 tokens), one thread"


def probe_s(device: torch.device | str = "cpu", windows: int = 3, budget_s: float = 0.2) -> float:
    """Seconds of one probe (see the module docstring), on one thread."""
    from ratrain.calibrate.timing import Timer
    from ratrain.calibrate.units import UNIT_SHAPES, _time_unit

    dev = torch.device(device)
    spec, mb, seq = UNIT_SHAPES[2]
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        timer = Timer(dev, budget_s)
        times = [
            sum(_time_unit(timer, dev, torch.float32, spec, "block", mb, seq))
            for _ in range(max(windows, 1))
        ]
    finally:
        torch.set_num_threads(saved)
    return statistics.median(times)


def relative_speeds(calibrated_s: float | None, probes_s: list[float]) -> list[float]:
    """The machine's speed at each probe relative to calibration (> 1: faster now);
    empty when the platform file has no probe."""
    if not calibrated_s or not probes_s:
        return []
    return [calibrated_s / p for p in probes_s if p > 0]


DRIFT_WARN = 0.10
"""assumed: a machine more than 10% faster or slower than calibrated moves every prediction
by as much as the validation's 10% MAPE target: worth saying."""


def machine_speed(calibrated_s: float | None, probes_s: list[float]) -> dict | None:
    """The validation's `machine_speed` summary: the probe's times during it and the
    machine's speed relative to calibration at each; None when there is nothing to compare."""
    rel = relative_speeds(calibrated_s, probes_s)
    if not rel:
        return None
    return {
        "calibrated_probe_s": calibrated_s,
        "probes_s": list(probes_s),
        "relative_speed": rel,
        "moved": min(rel) < 1 - DRIFT_WARN or max(rel) > 1 + DRIFT_WARN,
    }


def describe(speed: dict | None) -> str | None:
    """One line for validate's table."""
    if not speed:
        return None
    lo, hi = min(speed["relative_speed"]), max(speed["relative_speed"])
    line = (
        f"machine speed during validation (the speed probe, {len(speed['probes_s'])} times): "
        f"{lo:.2f}x .. {hi:.2f}x of calibration"
    )
    if speed["moved"]:
        line += (
            f"; it moved more than {DRIFT_WARN:.0%} since calibration, and every prediction "
            "assumes calibration's speed: re-calibrate, or validate on a quieter machine"
        )
    return line
