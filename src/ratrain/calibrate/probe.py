"""The speed probe: how fast this machine computes now, against when it was calibrated.

A platform file's figures hold for the machine as it ran while `ratrain calibrate`
measured it. A VM's speed moves (on the 2-core reference machine a GEMM's best time ranged
over ±15% from one minute to the next, and whole runs drifted by 10-25%), so a validation
run some minutes later may meet a faster or slower machine than the file describes. The
probe makes that visible: calibrate times it at its start and its end and records the
figure (`measured_on.speed_probe_s`); `ratrain validate` times it again around every pass
and reports the machine's speed relative to calibration (`ratrain.validate.speed`). It is
a diagnostic only: no prediction or measurement is scaled by it.

The probe is the model's own `Block` (`ratrain.nn.llama.build_unit`), fp32, forward
with autograd recording and backward, at one of calibrate's unit shapes (hidden 448, 2 x 128
tokens: `ratrain.calibrate.shapes.PROBE_SHAPE`), on one thread: the work a step is made of. Its time is the median of `windows`
windows, each the fastest repetition within `budget_s`.
"""

from __future__ import annotations

import statistics

import torch

from ratrain.calibrate.shapes import PROBE_SHAPE
from ratrain.calibrate.timing import Timer
from ratrain.calibrate.units import _time_unit

__all__ = ["probe_s"]


def probe_s(device: torch.device | str = "cpu", windows: int = 3, budget_s: float = 0.2) -> float:
    """Seconds of one probe (see the module docstring), on one thread."""
    dev = torch.device(device)
    spec, mb, seq = PROBE_SHAPE
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
