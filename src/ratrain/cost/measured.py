"""Measured platform terms: efficiency curves, memory-bound kernels, shared cores.

A platform file written by `ratrain calibrate` carries, beside the flat peak x efficiency
model, what the machine was measured to do (see `ratrain.platforms`):

- efficiency curves per kernel kind and dtype: achieved / peak FLOP/s against the kernel's
  FLOPs, interpolated linearly in log FLOPs and held flat beyond the measured range;
- the bandwidth of each of the model's memory-bound kernels (norms, RoPE, the SwiGLU
  product, residual adds, the cross-entropy, the backward's adding of weight gradients
  into the gradient buffer, and the global norm's local sum of squares over a stage's
  gradients, keyed by the gradient dtype) per direction and dtype, in *nominal* bytes:
  the elements the op reads once at the compute dtype (`NOMINAL_BYTES`); the measured
  bandwidth is those bytes over the op's measured time, so the count of passes an
  implementation makes is in the measurement, not in a constant here;
- the cores a node's ranks share: ranks on one node divide its cores, so 4 ranks on 2
  cores run their kernels at half the speed of one rank per core.

Pure Python.
"""

from __future__ import annotations

import bisect
import math

from ratrain.platforms import Platform

__all__ = [
    "MEMORY_BOUND_OPS",
    "curve_efficiency",
    "memory_bound_key",
    "memory_bound_time_s",
    "compute_speed",
    "threads_per_rank",
    "measured_collective_s",
    "unit_factor",
    "unit_fixed_s",
    "UNIT_DIRECTIONS",
]

MEMORY_BOUND_OPS = (
    "rmsnorm",
    "rope",
    "swiglu",
    "add",
    "cross_entropy",
    "grad_accumulate",
    "grad_norm",
)
"""The model's memory-bound kernels the cost model charges when the platform measured them."""


def curve_efficiency(points: tuple[tuple[float, float], ...], flops: float) -> float:
    """Efficiency at `flops` on a (FLOPs, efficiency) curve: linear in log FLOPs between
    points, flat beyond the ends."""
    xs = [p[0] for p in points]
    if flops <= xs[0]:
        return points[0][1]
    if flops >= xs[-1]:
        return points[-1][1]
    i = bisect.bisect_right(xs, flops)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    w = (math.log(flops) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + w * (y1 - y0)


def memory_bound_key(op: str, backward: bool, dtype: str) -> str:
    return f"{op}.{'bwd' if backward else 'fwd'}.{dtype}"


def memory_bound_time_s(
    op: str, elements: int, dtype: str, backward: bool, platform: Platform
) -> float | None:
    """Time of one memory-bound op over `elements` at the compute dtype, or None when the
    platform did not measure it (then it is not charged)."""
    from ratrain.config import DTYPE_BYTES

    bw = platform.memory_bound_bytes_per_s.get(memory_bound_key(op, backward, dtype))
    if bw is None:
        return None
    return elements * DTYPE_BYTES[dtype] / bw


def threads_per_rank(cores: int, world: int) -> int:
    """The launcher's policy (`ratrain.launch.spawn`): the cores divided by the ranks."""
    return max(1, cores // max(world, 1))


def compute_speed(platform: Platform, ranks_on_node: int, tokens: int | None = None) -> float:
    """Kernel speed of one rank relative to one thread on a core of its own (the speed the
    curves were measured at). Without `cores_per_node` every unit has its own: 1.

    A node's cores deliver, to k busy instruction streams, the aggregate speed that k
    threads of one GEMM reach: 1 + (k - 1) x `thread_efficiency` (measured). Streams of
    different ranks share what the cores give in the same way as one rank's threads do (on
    SMT siblings or a shared memory bus they cannot get more), so each of the node's ranks
    gets its share of the aggregate of all their threads, the cores being the limit. All
    ranks are taken as busy at once: a rank idle in its bubble leaves the others more, which
    the simulator credits by processor sharing (`ratrain.cost.sharing.shared_speed`,
    `ratrain.sim.sharing`).

    A platform that measured it (`Platform.rank_speed`, `ratrain.calibrate.sharing`) gives
    the speed at each rank count directly: that table is used instead. Where it also
    measured a rank count per microbatch size (`Platform.rank_speed_tokens`: ranks of more
    than one thread, whose speed-up grows with the tokens each kernel splits) and `tokens`
    (per microbatch) is given, that count's rows are interpolated in log tokens instead.
    """
    k = max(ranks_on_node, 1)
    rows = [(n, v) for rk, n, v in platform.rank_speed_tokens if rk == k]
    if rows and tokens:
        return _log_interp(rows, tokens)
    if platform.rank_speed:
        return _table_speed(platform.rank_speed, max(ranks_on_node, 1))
    cores = platform.cores_per_node
    if cores is None:
        return 1.0
    ranks = max(ranks_on_node, 1)
    busy = min(ranks * threads_per_rank(cores, ranks), cores)  # streams the cores run
    return (1.0 + (busy - 1) * platform.thread_efficiency) / ranks


def _log_interp(rows: list[tuple[int, float]], x: float) -> float:
    """rows (x ascending, y) interpolated linearly in log x, held at the ends."""
    if x <= rows[0][0]:
        return rows[0][1]
    if x >= rows[-1][0]:
        return rows[-1][1]
    i = bisect.bisect_left([r[0] for r in rows], x)
    (x0, y0), (x1, y1) = rows[i - 1], rows[i]
    f = math.log(x / x0) / math.log(x1 / x0)
    return y0 + f * (y1 - y0)


def _table_speed(rows: tuple[tuple[int, float], ...], k: int) -> float:
    """Measured speed at k ranks. Between measured counts the node's aggregate (k x speed)
    is interpolated linearly and shared by the k ranks: the aggregate is what the cores
    deliver and varies smoothly with k, where a rank's own speed goes as 1/k (interpolating
    that instead credits 3 ranks on 2 cores with more than any measured aggregate). Beyond
    the last count, the aggregate there is shared by k."""
    ks = [r[0] for r in rows]
    if k <= ks[0]:
        return rows[0][1]
    if k >= ks[-1]:
        return rows[-1][1] * ks[-1] / k
    i = bisect.bisect_left(ks, k)
    (k0, v0), (k1, v1) = rows[i - 1], rows[i]
    aggregate = k0 * v0 + (k - k0) / (k1 - k0) * (k1 * v1 - k0 * v0)
    return aggregate / k


def measured_collective_s(kind: str, nbytes: float, n: int, platform: Platform) -> float | None:
    """Wall time of an intra-node collective from its measured α–β fit at group size `n`
    (the nearest measured size), or None when this kind was not measured."""
    rows = platform.collectives.get(kind)
    if not rows:
        return None
    _, alpha_s, bytes_per_s = min(rows, key=lambda r: (abs(r[0] - n), r[0]))
    return alpha_s + nbytes / bytes_per_s


UNIT_DIRECTIONS = {"F": "fwd", "B": "bwd", "BI": "bin", "BW": "bw"}
"""The `unit_time_factor` direction of each compute op, by its IR name (`Op.value`; a
recomputation is charged as a forward)."""


FUSED_HEAD = "head-fused"
"""The head's unit kind under the fused chunked loss (`ratrain.calibrate.shapes.FUSED`)."""


def _unit_key(spec, unit: int, direction: str, fused_loss: bool) -> tuple[str, str] | None:
    """(unit kind, direction) under which the platform keys a unit's measured terms, or
    None for the embedding (a gather, no GEMM). See `unit_factor`."""
    if unit == 0:
        return None
    kind = "head" if unit == spec.n_layers + 1 else "block"
    if kind == "head" and fused_loss:
        kind = FUSED_HEAD
        direction = "bwd" if direction in ("bin", "bw") else direction
    return kind, direction


def _unit_term(table: dict, spec, unit: int, direction: str, dtype: str, fused: bool):
    """The unit's entry of `table` (`Platform.unit_time_factor` or `.unit_fixed_s`) with
    `unit_factor`'s fallbacks: the fused head to the plain head's, a split backward's half
    to the whole backward's; None where the platform has none."""
    key = _unit_key(spec, unit, direction, fused)
    if key is None or not table:
        return None
    kind, direction = key
    got = table.get(f"{kind}.{direction}.{dtype}")
    if got is None and kind == FUSED_HEAD:
        kind = "head"
        got = table.get(f"{kind}.{direction}.{dtype}")
    if got is None and direction in ("bin", "bw"):
        got = table.get(f"{kind}.bwd.{dtype}")
    return got


def unit_factor(
    platform: Platform, spec, unit: int, direction: str, dtype: str, fused_loss: bool = False
) -> float:
    """The measured time of a unit's kernels inside the unit over their sum timed apart
    (`Platform.unit_time_factor`): blocks and the head; 1 for the embedding (a gather, no
    GEMM) and where the platform did not measure it.

    `fused_loss`: the head runs the fused chunked loss (`Plan.loss_chunk_tokens`), whose
    factors are "head-fused.<direction>.<dtype>" where the platform measured them; else the
    plain head's (assumed: the fused head's kernels run as much slower inside the unit as
    the plain head's do). Its backward is not split: "bin" takes "bwd"'s.

    `direction`: "fwd", "bwd", or a split backward's halves "bin" (B_IN's kernels) and
    "bw" (B_W's), which `ratrain calibrate` measures through the runtime's own split
    backward (`ratrain.calibrate.units`). A platform without a half's factor (written
    before the halves were measured, or whose runtime could not split the unit) gives it
    the unit's "bwd" factor, the one both halves took before: assumed, B_IN's and B_W's
    kernels run as much slower inside the unit as the whole backward's do."""
    got = _unit_term(platform.unit_time_factor, spec, unit, direction, dtype, fused_loss)
    return 1.0 if got is None else got


def unit_fixed_s(
    platform: Platform, spec, unit: int, direction: str, dtype: str, fused_loss: bool = False
) -> float:
    """Seconds a unit's action takes beyond its kernels x `unit_factor` whatever its size
    (`Platform.unit_fixed_s`, one thread; the cost model divides it by the rank's speed as
    it does the kernels): keyed and looked up as `unit_factor`, 0 where not measured.

    `ratrain calibrate` fits time = factor x kernels + fixed over its unit shapes
    (`ratrain.calibrate.platform_file._unit_factors`): on the 2-core machine a block's
    forward at 128 tokens took ~0.9 ms more than a factor alone, fitted at 512 tokens,
    would charge, so that a plan of many small microbatches measured slower than one
    factor predicted (docs/validation.md)."""
    got = _unit_term(platform.unit_fixed_s, spec, unit, direction, dtype, fused_loss)
    return 0.0 if got is None else got
