"""A long step's simulation from short ones: the 1F1B steady state repeats.

The evaluator uses ONE short step whose period is measured inside it
(`ratrain.sim.steady_one`, `extrapolate(runs=1)`); the two-run path described here
(`runs=2`) is the check it replaced, kept for the tests.

A step of m microbatches costs the simulator O(m x units) events: at a global batch of
4096 on 8 clusters that is millions of events and tens of seconds per candidate. Past its
warm-up, a 1F1B step repeats: each further `d` microbatches (d = pp, so that any pattern
whose period divides the pipeline depth repeats too) shift every later action by the same
time, and the cool-down and the step's tail (syncs, update) are the same.

So the step of m microbatches is simulated at m1 and m2 = m1 + d, with m1 chosen so that
m = m2 + k d, and the longer one is checked to have reached its steady state: in the
middle of it, over two whole periods, every repeated action starts and ends exactly one
increment (T(m2) - T(m1), to `REL_TOL`) after its occurrence one period earlier, and no
resource gets more work per period than the increment (a backlog that would grow). The
engine is deterministic and an action's dependencies reach back less than two periods, so
the state of the step repeats, shifted: k more periods add k increments to the step time
and to each resource's busy time. A step found not to repeat yet is tried again with twice
the warm-up (while the short steps stay shorter than the step), and then simulated in
full. `tests/sim/test_sim_steady.py` compares the result against full simulations over
schedules, recompute, views and offload.

Memory needs no extrapolation: every point has at least `memory_microbatches(plan)`
microbatches, whose per-stage peak equals the full step's (`ratrain.sim.simulate`); the
planner's evaluator passes the shortened replay's peaks. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable

from ratrain.config import Plan
from ratrain.sim.simulate import memory_microbatches
from ratrain.sim.steady_one import extended_result, from_one_run, one_point

__all__ = ["MIN_MICROBATCHES", "MIN_SAVING", "NEAR", "REL_TOL", "points", "extrapolate"]

MIN_MICROBATCHES = 48
"""assumed: below this many microbatches a full simulation costs well under a second; the
extrapolation's two short simulations pay off only above it."""

MIN_SAVING = 2
"""derived: the short step (one run: m2 = m1 + pp microbatches; two runs: 2 m1 + pp
together) is simulated only when the full step is at least 2x as long: where it repeats
it costs at most half the full step.
Where they do not, tries with twice the warm-up follow while all the short steps together
stay no longer than the full step, which is then simulated after them: at worst twice its
cost. At 3x and one try, before, qwen2.5-32b on 8 a100-80g at 256 sequences (8 stages,
256 microbatches, offload) was simulated in full, 5 s, where its second try repeats: 2.3 s
for both tries."""

REL_TOL = 1e-9
"""derived: float rounding of sums over a step's events (about 1e5 terms at 1e-16 each),
with margin; two increments that differ by more are not a repeated steady state."""


NEAR = 1e-3
"""assumed: how far from the full simulation the planner lets a step whose short step
repeats only nearly be timed (`extrapolate(near=...)`), relative: a hundredth of the
cost model's own error against measured steps (about 10%) and a fiftieth of the 5% gap
the search certifies. Without it, llama2-7b on 24 h100-80g clusters at 8192 x 2048 (pp=3
zb-h2 with transient views, 1024 microbatches, two chains of the first stage a period
0.06% apart) tried 6 short steps and then simulated the full one: 5.3 s of an answer of
5.6 s. `ratrain simulate` takes none (the exact repeat, else the full step)."""


def points(plan: Plan, attempt: int = 0, spent: int = 0) -> tuple[int, int] | None:
    """The two microbatch counts to simulate in place of `plan`'s, or None when the full
    step is cheap enough (or not `MIN_SAVING` times longer than the two). Each further
    `attempt` doubles the warm-up allowed before the steady state; it is made while the
    microbatches simulated so far (`spent`) and its own stay no more than the step's."""
    m, d = plan.microbatches, max(1, plan.pp)
    base = max(memory_microbatches(plan), 4 * plan.pp + 2) * 2**attempt
    m1 = base + (m - base) % d
    cost = 2 * m1 + d
    if m < MIN_MICROBATCHES or m < MIN_SAVING * cost and not attempt or spent + cost > m:
        return None
    return m1, m1 + d


def _with_microbatches(plan: Plan, m: int) -> Plan:
    return plan.replace(global_batch=plan.micro_batch * plan.dp * m)


def _busy_s(res) -> list[dict[str, float]]:
    return [{r: u * res.step_time_s for r, u in util.items()} for util in res.utilization]


def _close(a: float, b: float, scale_s: float) -> bool:
    """Equal up to rounding of sums as large as `scale_s` (the step time)."""
    return abs(a - b) <= REL_TOL * scale_s


def _occurrences(events) -> dict[tuple, list[tuple[float, float]]]:
    """Per (stage, op, units): the (start, end) of each occurrence, in schedule order."""
    out: dict[tuple, list[tuple[float, float]]] = {}
    for e in events:
        a = e.action
        out.setdefault((a.stage, a.op, a.units), []).append((e.start_s, e.end_s))
    return out


def _shifts_by(long_events, short_events, period_s: float, scale_s: float) -> bool:
    """Whether, in the middle of the longer step, every action that repeats (d more
    microbatches add q more of it) starts and ends `period_s` after its occurrence q before,
    over two whole periods: the simulated state repeats, shifted, so the step's further
    periods repeat too (the engine is deterministic and its dependencies reach back less
    than two periods). A backlog still building on some resource fails it."""
    short = _occurrences(short_events)
    for key, times in _occurrences(long_events).items():
        q = len(times) - len(short.get(key, ()))
        if q <= 0:
            continue
        lo = (len(times) - 3 * q) // 2  # the middle 3q: clear of warm-up and cool-down
        if lo < 0:
            return False
        for n in range(lo, lo + 2 * q):
            (s0, e0), (s1, e1) = times[n], times[n + q]
            if not (_close(s1 - s0, period_s, scale_s) and _close(e1 - e0, period_s, scale_s)):
                return False
    return True


def extrapolate(
    plan: Plan,
    simulate: Callable[[Plan], object],
    memory=None,
    runs: int = 1,
    near: float = 0.0,
):
    """`plan`'s simulation result from short steps (`simulate` runs one), or None when the
    step is short or no short step is found to repeat: with `runs` = 1 one short step whose
    period is measured inside it (`ratrain.sim.steady_one`), with 2 two short steps
    whose difference is the period. `near` > 0 (one run only): a short step that does not
    repeat exactly but nearly, its step time then within `near` of the full step's,
    relative (`steady_one._from_run`; `NEAR` is the planner's). A step whose short steps
    do not repeat yet (a backlog still building) is tried again with twice the warm-up,
    while that stays shorter than the step. The result carries no events and no memory timeline; its peaks and
    breakdowns are `memory` ((peaks, breakdowns) of the plan, from the shortened replay)
    or else the (longer) short step's."""
    attempt = spent = 0
    if runs == 1:
        while (m2 := one_point(plan, attempt, spent, MIN_SAVING, MIN_MICROBATCHES)) is not None:
            res = from_one_run(plan, m2, simulate, memory, REL_TOL, near)
            if res is not None:
                return res
            attempt, spent = attempt + 1, spent + m2
        return None
    while (pts := points(plan, attempt, spent)) is not None:
        res = _from_points(plan, pts, simulate, memory)
        if res is not None:
            return res
        attempt, spent = attempt + 1, spent + sum(pts)
    return None


def _from_points(plan: Plan, pts: tuple[int, int], simulate, memory):
    m = plan.microbatches
    r2, r3 = (simulate(_with_microbatches(plan, k)) for k in pts)
    d_s = r3.step_time_s - r2.step_time_s
    scale_s = r3.step_time_s
    if not _shifts_by(r3.events, r2.events, d_s, scale_s):
        return None
    b2, b3 = _busy_s(r2), _busy_s(r3)
    for s in range(len(b3)):
        for r in b3[s]:
            if b3[s][r] - b2[s][r] > d_s + REL_TOL * scale_s:
                # The resource gets more work per increment than the step's clock advances:
                # its backlog grows, and once the slack is used up it sets a longer period.
                return None
    if r3.exposed != r2.exposed and not all(
        _close(x[k], y[k], scale_s) for x, y in zip(r2.exposed, r3.exposed, strict=True) for k in x
    ):
        return None
    k = (m - pts[1]) // (pts[1] - pts[0])  # further increments past the second point
    step_s = r3.step_time_s + k * d_s
    util = [
        {r: (v + k * (v - b2[s][r])) / step_s for r, v in b3[s].items()} for s in range(len(b3))
    ]
    return extended_result(plan, r3, step_s, util, memory)
