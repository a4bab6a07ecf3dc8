"""How fast one rank computes while only some of its node's ranks compute: processor sharing.

`compute_speed(platform, w)` is the measured speed of each of w ranks when all w compute at
once (`Platform.rank_speed`, or the thread model without it). A rank that waits (its
pipeline bubble, a receive, an all-gather) lends its cores to the others, so the speed of a
rank depends on how many of the node's ranks compute at that moment. With b of the node's
w ranks busy, each running the launcher's t = cores // w threads:

    speed(b) = max(min(w x speed(w) / b, solo), speed(w))

- w x speed(w): the node's aggregate at full occupancy, measured (the table's row for w),
  shared among the b busy ranks: the cores give the ranks that compute what they gave all w;
- solo: what one rank's own t threads reach with the node to itself, which no sharing can
  exceed: 1 for t = 1 (by definition of the reference speed: one thread on a core of its
  own, what the kernel curves and the table's k = 1 reference were measured at); for t > 1
  the platform's thread scaling 1 + (t - 1) x `thread_efficiency` (measured on a GEMM),
  and no more than the table's k = 1 row (one rank with all the cores, measured);
- at b = w it is the measured speed(w) itself, so a step where every rank computes all the
  time is timed as before.

Checked against the table's own rows on the reference 2-core machine (`cpu-local`): w = 4
ranks of one thread, b = 2 busy gives 4 x 0.455 / 2 = 0.91, against the measured k = 2 row
0.92 (tests/sim/test_sim_sharing.py). Nothing here is fitted to a validation grid.

Only platforms whose ranks share a node's cores (`cores_per_node` or `rank_speed` set) and
that say their waiting ranks lend their cores (`runtime.waiting_ranks_lend_cores`, see
`shares_cores`) have sharing; elsewhere every rank computes at its all-busy speed.
`ratrain calibrate` turns it on for CPU machines and measures, for w ranks on the node and
b < w of them computing while the others wait in a blocked receive (as the executor
waits), the busy ranks' speed (`Platform.shared_rank_speed`); where a platform has that
row, `shared_speed` is the measured figure, not the formula. Those rows are measured per
burst (how long a rank computes between waits, the busy set moving on after each, as in a
pipeline): with millisecond bursts a waiting rank's core is not all lent (the scheduler
leaves a core idle while two ranks share the other), so `shared_speed(..., burst_s)`
interpolates the rows in log burst. The formula takes a waiting
rank to use no CPU; gloo's waits use some, so without the table 4-rank plans on 2 cores
came out 12-16% fast on the validation grid (docs/validation.md). Pure Python.
"""

from __future__ import annotations

from ratrain.cost.measured import _log_interp, _table_speed, compute_speed, threads_per_rank
from ratrain.platforms import Platform

__all__ = ["shares_cores", "solo_speed", "shared_speed", "peak_speed", "bursts"]


def shares_cores(platform: Platform) -> bool:
    """Whether a node's ranks share its cores, so that a rank's speed follows how many of
    them compute: a platform that measured or states its cores per node and says that its
    waiting ranks lend their cores (`Platform.waiting_ranks_lend_cores`)."""
    shared = bool(platform.rank_speed) or platform.cores_per_node is not None
    return shared and platform.waiting_ranks_lend_cores


def solo_speed(platform: Platform, ranks_on_node: int) -> float:
    """One of the node's `ranks_on_node` ranks computing with the node to itself: its own
    t = cores // ranks threads, at the reference speed per thread (1 for t = 1)."""
    cores = platform.cores_per_node
    t = threads_per_rank(cores, ranks_on_node) if cores else 1
    if t == 1:
        return 1.0
    speed = 1.0 + (t - 1) * platform.thread_efficiency
    if platform.rank_speed:  # one rank with every core (the k = 1 row) bounds fewer threads
        speed = min(speed, _table_speed(platform.rank_speed, 1))
    return speed


def _rows(platform: Platform):
    """The table's rows as (w, b, speed, burst seconds or None)."""
    for row in platform.shared_rank_speed:
        yield (*row[:3], row[3] if len(row) > 3 else None)


def _measured(platform: Platform, w: int, busy: int, burst_s: float | None) -> float | None:
    """The table's speed for w ranks with `busy` computing: a row without a burst as it is;
    rows measured per burst interpolated in log burst at `burst_s`, held at the ends (the
    longest burst's where `burst_s` is None: the busy set changing slowly)."""
    rows = [(x, v) for rw, rb, v, x in _rows(platform) if rw == w and rb == busy]
    if not rows:
        return None
    plain = [v for b, v in rows if b is None]
    timed = sorted((b, v) for b, v in rows if b is not None)
    if not timed:
        return plain[0]
    if burst_s is None:
        return plain[0] if plain else timed[-1][1]
    return _log_interp(timed, burst_s)


def shared_speed(
    platform: Platform,
    ranks_on_node: int,
    busy: int,
    burst_s: float | None = None,
    tokens: int | None = None,
) -> float:
    """Speed of one rank (relative to one thread on a core of its own) while `busy` of its
    node's `ranks_on_node` ranks compute, itself included, each computing about `burst_s`
    (one thread's seconds) between waits: the measured table's row where the platform has
    one (`Platform.shared_rank_speed`, never below the all-busy speed: a rank that waits
    takes no more from the cores than one that computes), else the formula of the module
    docstring. `tokens` (per microbatch) picks the all-busy speed (`compute_speed`)."""
    w = max(ranks_on_node, 1)
    full = compute_speed(platform, w, tokens)
    if busy >= w or not shares_cores(platform):
        return full
    measured = _measured(platform, w, max(busy, 1), burst_s)
    if measured is not None:
        return max(measured, full)
    return max(min(w * full / max(busy, 1), solo_speed(platform, w)), full)


def bursts(platform: Platform, ranks_on_node: int) -> tuple[float, ...]:
    """The burst lengths the table measured for `ranks_on_node` ranks, ascending."""
    w = max(ranks_on_node, 1)
    return tuple(sorted({x for rw, _, _, x in _rows(platform) if rw == w and x}))


def peak_speed(platform: Platform, ranks_on_node: int, tokens: int | None = None) -> float:
    """The fastest any of the node's ranks computes under sharing: an upper bound on
    `shared_speed` for every busy count and burst (a measured table need not fall with the
    busy count or rise with the burst, so every count and every measured burst is taken),
    and on the all-busy speed at `tokens` per microbatch."""
    w = max(ranks_on_node, 1)
    at = (None, *bursts(platform, w))
    return max(shared_speed(platform, w, b, x, tokens) for b in range(1, w + 1) for x in at)
