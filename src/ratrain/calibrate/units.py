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

The split backward of a zero-bubble pipeline (`pipeline: zb-h1`) is measured as the
runtime runs it, by its own code (`ratrain.runtime.split_backward`, as the executor's
`_saving`, `_backward_input` and `_backward_weight` call it): the forward under
`SavedActivations.hooks()`, then `backward_input` (B_IN) and `backward_weight` (B_W),
each timed apart, at the same shapes, on the same copies cycled the same way. These are
items of their own (`unit_items`, marked "split"), so that the forward and the unsplit
backward are measured exactly as before; `platform_file` turns them into the factors of
directions "bin" and "bw" over the cost model's B_IN and B_W kernels
(`ratrain.cost.compute.unit_kernels` "BI"/"BW"). A unit the runtime cannot split (a
weight's branch leaves the input's path at a custom autograd Function, e.g. the 16-bit
linear of a CPU without 16-bit GEMM units: B_IN runs the whole backward, B_W nothing) is
reported as such (`measure_unit`'s third value 0), and no "bin"/"bw" factor is derived
from it. The head is timed with the plain loss, as its unsplit backward is; under the
fused chunked loss (`Plan.loss_chunk_tokens`) the runtime runs the head's whole backward
in B_IN, which these timings do not measure.

As in the unsplit backward, every timed pass starts with the weights' `.grad` unset, so
autograd writes the gradients rather than adding them into a buffer (the runtime's
`prepare_grads` points `.grad` at the flat buffer); B_W runs right after its B_IN, on the
copy B_IN just used.
"""

from __future__ import annotations

import torch

from ratrain.calibrate.shapes import FUSED, TINY_SHAPE, UNIT_SHAPES
from ratrain.calibrate.timing import Timer
from ratrain.config import DEFAULT_LOSS_CHUNK_TOKENS
from ratrain.models.spec import ModelSpec
from ratrain.nn.llama import build_unit
from ratrain.runtime.split_backward import SavedActivations, backward_input, backward_weight

__all__ = [
    "unit_plan",
    "unit_items",
    "prepare_units",
    "measure_unit",
    "assemble_units",
    "label",
    "SPLIT",
    "FUSED",
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


def _copies(dev, dtype, spec: ModelSpec, kind: str, mb: int, seq: int):
    """(copies of the unit, an input for each, targets): copies of together more than
    `_COLD_BYTES`, so that calls cycling through them find no weights in cache."""
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
    return copies, xs, targets


def _time_unit(timer: Timer, dev, dtype, spec: ModelSpec, kind: str, mb: int, seq: int):
    """(forward s, backward s) of one unit: forward with autograd recording, backward as
    (forward + backward) - forward. Calls cycle through copies of the unit (and inputs) of
    together more than `_COLD_BYTES`, so that no call finds its weights in cache."""
    copies, xs, targets = _copies(dev, dtype, spec, kind, mb, seq)
    turn = [0]

    chunk = DEFAULT_LOSS_CHUNK_TOKENS if kind == FUSED else None

    def fwd():
        i = turn[0] = (turn[0] + 1) % len(copies)
        m, x = copies[i], xs[i]
        return (m(x) if kind == "block" else m.loss(x, targets, chunk)), m, x

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


def _time_split(timer: Timer, dev, dtype, spec: ModelSpec, kind: str, mb: int, seq: int):
    """(B_IN s, B_W s, 1.0 if the runtime splits the unit else 0.0) of one unit's split
    backward, run as the executor runs it under `pipeline: zb-h1`: the forward (untimed)
    under `SavedActivations(params).hooks()`, then `backward_input` (timed), then
    `backward_weight` on what it left (timed apart; nothing to do when the unit could not
    be split). Copies, inputs and their cycling as `_time_unit`'s."""
    copies, xs, targets = _copies(dev, dtype, spec, kind, mb, seq)
    params = [list(m.parameters()) for m in copies]  # the executor's `module_params`
    turn = [0]
    held: dict = {}

    def forward():  # untimed: the executor's F with a split backward (`_saving`)
        i = turn[0] = (turn[0] + 1) % len(copies)
        m, x = copies[i], xs[i]
        x.grad = None
        for p in params[i]:
            p.grad = None
        saved = SavedActivations(params[i])
        with saved.hooks():
            y = m.loss(x, targets) if kind == "head" else m(x)
        held.clear()
        held.update(i=i, x=x, y=y, saved=saved, work=None)
        held["grad"] = None if y.ndim == 0 else torch.ones_like(y)

    def b_in():  # the executor's `_backward_input`; `.grad` is already unset
        h = held
        _, h["work"] = backward_input(
            h["y"], h["grad"], h["x"], params[h["i"]], lambda: None, h["saved"]
        )

    def forward_b_in():  # untimed, before each timed B_W
        forward()
        b_in()

    def b_w():  # the executor's `_backward_weight`: nothing left when B_IN ran it whole
        work = held["work"]
        if work is not None:
            backward_weight(work)

    t_in = timer.time_s(b_in, setup=forward)
    t_w = timer.time_s(b_w, setup=forward_b_in)
    split = 1.0 if held["work"] is not None else 0.0
    held.clear()
    return t_in, t_w, split


def unit_items(dtypes: tuple[str, ...], quick: bool) -> list[tuple]:
    """The windowed measurements: ("tiny", dtype, kind) for each dtype measured, and
    (dtype, shape index, kind) for each planned shape, kind "block", "head" or `FUSED`:
    forward and backward (`_time_unit`); then those of the block and the head again with
    `SPLIT` appended: the split backward's B_IN and B_W (`_time_split`; the runtime does not
    split the fused head)."""
    plan = unit_plan(dtypes, quick)
    tiny = [("tiny", dt, kind) for dt in dict.fromkeys(d for d, _ in plan) for kind in _KINDS]
    whole = tiny + [(dt, i, kind) for dt, i in plan for kind in _KINDS]
    return whole + [(*item, SPLIT) for item in whole if item[-1] != FUSED]


_KINDS = ("block", "head", FUSED)

SPLIT = "split"
"""The last element of a split-backward item (`unit_items`)."""


def prepare_units(device: torch.device) -> None:
    """The first autograd backward of a process runs several times slower for a while (lazy
    initialisation): run one, untimed, before any window."""
    _time_unit(Timer(device, 0.2), device, torch.float32, TINY_SHAPE[0], "block", 1, 16)


def measure_unit(item: tuple, device: torch.device, timer: Timer) -> tuple[float, ...]:
    """One window of one `unit_items` item, one thread (the caller sets the threads: the
    kernel curves' setting): (forward s, backward s); for a `SPLIT` item (B_IN s, B_W s,
    1.0 if the runtime split the unit else 0.0)."""
    from ratrain.calibrate.kernels import TORCH_DTYPES

    split = item[-1] == SPLIT
    time = _time_split if split else _time_unit
    item = item[:-1] if split else item
    if item[0] == "tiny":
        _, dt, kind = item
        return time(timer, device, TORCH_DTYPES[dt], TINY_SHAPE[0], kind, 1, 16)
    dt, i, kind = item
    spec, mb, seq = UNIT_SHAPES[i]
    return time(timer, device, TORCH_DTYPES[dt], spec, kind, mb, seq)


def assemble_units(values: dict[tuple, tuple]) -> dict:
    """{dtype: [(spec fields, micro_batch, seq, kind, t_f, t_b, tiny_t_f, tiny_t_b)]}: the
    block and the head at each planned shape, with the tiny shape's times beside them.
    Where the split backward was measured too, a row goes on with (t_bin, t_bw,
    tiny_t_bin, tiny_t_bw, split): split 1.0 when the runtime split the unit at both
    shapes, else 0.0 (`platform_file` then derives no "bin"/"bw" factor from the row)."""
    out: dict = {}
    for item, times in values.items():
        if item[0] == "tiny" or item[-1] == SPLIT:
            continue
        (dt, i, kind), (t_f, t_b) = item, times
        spec, mb, seq = UNIT_SHAPES[i]
        tiny = values[("tiny", dt, kind)]
        row = (spec.to_dict(), mb, seq, kind, t_f, t_b, *tiny)
        halves, tiny_halves = values.get((*item, SPLIT)), values.get(("tiny", dt, kind, SPLIT))
        if halves is not None and tiny_halves is not None:
            split = min(halves[2], tiny_halves[2])
            row += (*halves[:2], *tiny_halves[:2], split)
        out.setdefault(dt, []).append(row)
    return out


def label(item: tuple) -> str:
    split = item[-1] == SPLIT
    item = item[:-1] if split else item
    tail = " split" if split else ""
    if item[0] == "tiny":
        return f"units {item[1]} tiny {item[2]}{tail}"
    spec, mb, _ = UNIT_SHAPES[item[1]]
    return f"units {item[0]} h{spec.hidden} b{mb} {item[2]}{tail}"
