"""Whole units against the sum of their kernels.

The kernel curves (`ratrain.calibrate.kernels`) time each kernel alone, again and again
on the same inputs: warm caches, no neighbours. A unit's forward runs them one after the
other on fresh activations, between the norms, casts and views of the model code, and
measures slower than the sum of its kernels timed apart (on the 2-core reference machine
a block's forward by ~15-30%, its backward by about nothing). This measures that
directly: the model's own `Block` and `Head` modules (`ratrain.nn.llama.build_unit`),
forward with autograd recording (as the executor's F) and backward, one thread, at
calibration shapes of their own (`ratrain.calibrate.shapes`, not a validation grid's),
cycling through copies whose weights together exceed the caches (a step runs every unit
in turn, so none finds its weights cached), and at the overhead measurement's tiny shape,
whose time is the modules' dispatch alone.

`ratrain.calibrate.platform_file` turns these into `compute.unit_time_factor`: per unit
kind, direction and dtype, the median over the shapes of

    (t_measured(shape) - t_measured(tiny)) / (t_kernels(shape) - t_kernels(tiny)),

the measured time the kernels take inside the unit over the cost model's sum for them,
with the fixed dispatch taken out (the runtime's fixed cost per action, measured apart,
already counts it).
"""

from __future__ import annotations

import torch

from ratrain.calibrate.shapes import TINY_SHAPE, UNIT_SHAPES
from ratrain.calibrate.timing import Timer
from ratrain.models.spec import ModelSpec
from ratrain.nn.llama import build_unit

__all__ = [
    "unit_plan",
    "unit_items",
    "prepare_units",
    "measure_unit",
    "assemble_units",
    "label",
]


def unit_plan(dtypes: tuple[str, ...], quick: bool) -> list[tuple[str, int]]:
    """(dtype, shape index) to measure; fp32 at every shape (one fewer when quick), bf16 at
    every shape (quick: the two widths, h320 b1 and h448 b2: one shape alone gave a bf16
    backward factor of 0.55 that the grid's bf16 plan did not bear out); fp16 (no fast CPU
    path, no grid plan) not at all."""
    n = 2 if quick else len(UNIT_SHAPES)
    bf16 = (0, 2) if quick else tuple(range(len(UNIT_SHAPES)))
    return [("fp32", i) for i in range(n)] + [("bf16", i) for i in bf16 if "bf16" in dtypes]


_COLD_BYTES = 64 * 2**20
"""derived: more weight bytes than a server CPU's last-level cache (tens of MB), so that a
unit's weights come from main memory, as in a step that runs every unit in turn."""


def _time_unit(timer: Timer, dev, dtype, spec: ModelSpec, kind: str, mb: int, seq: int):
    """(forward s, backward s) of one unit: forward with autograd recording, backward as
    (forward + backward) - forward. Calls cycle through copies of the unit (and inputs) of
    together more than `_COLD_BYTES`, so that no call finds its weights in cache."""
    unit = 1 if kind == "block" else spec.n_layers + 1
    one = build_unit(spec, unit, dtype=dtype).to(dev)
    nbytes = sum(p.numel() * p.element_size() for p in one.parameters())
    copies = [one] + [
        build_unit(spec, unit, dtype=dtype, seed=i).to(dev)  # initialised: no NaN paths
        for i in range(1, 1 + min(7, _COLD_BYTES // max(nbytes, 1)))
    ]
    xs = [
        torch.randn(mb, seq, spec.hidden, device=dev, dtype=dtype, requires_grad=True)
        for _ in copies
    ]
    targets = torch.randint(0, spec.vocab, (mb, seq), device=dev)
    turn = [0]

    def fwd():
        i = turn[0] = (turn[0] + 1) % len(copies)
        m, x = copies[i], xs[i]
        return (m.loss(x, targets) if kind == "head" else m(x)), m, x

    def fwd_only():
        return fwd()[0]

    held: list = []

    def forward():  # untimed, before each timed backward
        y, m, x = fwd()
        x.grad = None
        for p in m.parameters():
            p.grad = None
        held[:] = [y, None if y.ndim == 0 else torch.ones_like(y)]

    def backward():
        y, grad = held
        y.backward(grad)

    t_f = timer.time_s(fwd_only)
    t_b = timer.time_s(backward, setup=forward)  # timed directly, not (F+B) - F
    held.clear()
    return t_f, max(t_b, 0.05 * t_f)


def unit_items(dtypes: tuple[str, ...], quick: bool) -> list[tuple]:
    """The windowed measurements: ("tiny", dtype, kind) for each dtype measured, and
    (dtype, shape index, kind) for each planned shape; kind "block" or "head"."""
    plan = unit_plan(dtypes, quick)
    tiny = [("tiny", dt, kind) for dt in dict.fromkeys(d for d, _ in plan) for kind in _KINDS]
    return tiny + [(dt, i, kind) for dt, i in plan for kind in _KINDS]


_KINDS = ("block", "head")


def prepare_units(device: torch.device) -> None:
    """The first autograd backward of a process runs several times slower for a while (lazy
    initialisation): run one, untimed, before any window."""
    _time_unit(Timer(device, 0.2), device, torch.float32, TINY_SHAPE[0], "block", 1, 16)


def measure_unit(item: tuple, device: torch.device, timer: Timer) -> tuple[float, float]:
    """One window of one `unit_items` item: (forward s, backward s), one thread (the caller
    sets the threads: the kernel curves' setting)."""
    from ratrain.calibrate.kernels import TORCH_DTYPES

    if item[0] == "tiny":
        _, dt, kind = item
        return _time_unit(timer, device, TORCH_DTYPES[dt], TINY_SHAPE[0], kind, 1, 16)
    dt, i, kind = item
    spec, mb, seq = UNIT_SHAPES[i]
    return _time_unit(timer, device, TORCH_DTYPES[dt], spec, kind, mb, seq)


def assemble_units(values: dict[tuple, tuple]) -> dict:
    """{dtype: [(spec fields, micro_batch, seq, kind, t_f, t_b, tiny_t_f, tiny_t_b)]}: the
    block and the head at each planned shape, with the tiny shape's times beside them."""
    out: dict = {}
    for item, (t_f, t_b) in values.items():
        if item[0] == "tiny":
            continue
        dt, i, kind = item
        spec, mb, seq = UNIT_SHAPES[i]
        tiny = values[("tiny", dt, kind)]
        out.setdefault(dt, []).append((spec.to_dict(), mb, seq, kind, t_f, t_b, *tiny))
    return out


def label(item: tuple) -> str:
    if item[0] == "tiny":
        return f"units {item[1]} tiny {item[2]}"
    spec, mb, _ = UNIT_SHAPES[item[1]]
    return f"units {item[0]} h{spec.hidden} b{mb} {item[2]}"
