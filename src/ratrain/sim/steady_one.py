"""A long step's simulation from ONE short one: the period is measured inside the run.

`ratrain.sim.steady` times a step of m microbatches from two short steps, m1 and
m2 = m1 + d (d = pp), and takes the period from T(m2) - T(m1). Here only m2 is simulated
(m2 = m mod d, at least the two-run path's m1 + d, so that its middle three periods are
clear of warm-up and cool-down), and the period P is read from the run itself, for d = pp
and, where m - m2 allows, d = 2 pp (`SPANS`; later tries take m2 = m mod 2 pp):

- P is the shift between stage 0's forward of its first unit at microbatch c + d and at
  c, c the first microbatch of the middle 3d, or else (`_anchors`) the first past stage
  0's warm-up;
- per stage, from that forward at c on, over two whole periods, every action (by stage,
  op and units) starts and ends exactly P after its occurrence q before, q being how many
  times it occurs in one period, [a, a + P); an action that occurs in the three periods
  but not in the first (a one-off action amid the steady state) fails it;
- no resource of a stage gets more work in one period (the durations of the actions that
  start in it) than P: a backlog that grows fails it.

Soundness, as for the two-run path: the engine is deterministic and an action's
dependencies reach back less than two periods, so a state that repeats, shifted by P,
over two whole periods repeats for every period inserted: a step of m2 + k d microbatches
is the same step with k more periods, its cool-down and tail shifted by k P. So
T(m) = T(m2) + k P, each resource's busy time grows by its busy time in one period (the
length of the union of its actions within a period's window), and the tail after the
last backward (`exposed`) is the same. The two-run path stays as the check
(`tests/sim/test_sim_steady_one.py` compares both against full simulations). It costs m2
microbatches instead of 2 m1 + d. Pure Python.
"""

from __future__ import annotations

from typing import NamedTuple

from ratrain import deadline
from ratrain.config import Plan
from ratrain.schedule.ir import Op
from ratrain.schedule.rendezvous import SENDS
from ratrain.schedule.zerobubble import warmup
from ratrain.sim.result import busy_s
from ratrain.sim.simulate import memory_microbatches

__all__ = ["SPANS", "one_point", "from_one_run", "extended_result"]


def one_point(plan: Plan, attempt: int, spent: int, min_saving: float, min_m: int):
    """The microbatch count to simulate in place of `plan`'s, or None: the two-run path's
    longer step (`steady.points`), each further `attempt` with twice the warm-up, made
    while the microbatches simulated so far (`spent`) and its own stay no more than the
    step's (so a step that never repeats costs at most twice its full simulation, as on
    the two-run path); the first only when the step is `min_saving` times longer.

    The later tries pay off on long steps and cost most on short ones: llama2-70b on 64
    a100-80g clusters, pp=4 with offload, repeats at 76 microbatches, not at 24 or 40, so
    at 4096 sequences (256 microbatches) the tries cost 140 microbatches in place of 256;
    at 1024 (64 microbatches) the tries at 24 and 40 fail and the full step follows, about
    2x its simulation. Allowing the tries half the step instead bounds that at 1.5x but
    loses the first (measured on a loaded machine)."""
    m, pp = plan.microbatches, max(1, plan.pp)
    d = pp if not attempt else SPANS[-1] * pp  # later tries: room for every span's period
    base = max(memory_microbatches(plan), 4 * plan.pp + 2) * 2**attempt + d
    m2 = base + (m - base) % d
    if m < min_m or m < min_saving * m2 and not attempt or spent + m2 > m:
        return None
    return m2


SPANS = (1, 2)
"""The periods tried, in multiples of pp microbatches: pp, then 2 pp, where the steps'
microbatch count allows it. With receives posted one ahead
(`ratrain.schedule.rendezvous.post_receives_ahead`) a stage's microbatches can alternate
between two timings: llama3.2-1b on 24 mt3000 clusters, pp=3 at micro-batch 4, repeats
every 2 microbatches (3.267935 and 3.246675 s), so every 6 and never every 3."""


def from_one_run(plan: Plan, m2: int, simulate, memory, rel_tol: float, near: float = 0.0):
    """`plan`'s result from the step of `m2` microbatches, or None where that step is not
    found to repeat (see the module docstring) with a period of pp microbatches, or of
    2 pp where `m2` and the step's count differ by a multiple of it (`SPANS`). With
    `near` > 0, where the step does not repeat exactly: its near repeat (`_from_run`),
    whose step time is within `near` of the full step's, relative."""
    res = simulate(plan.replace(global_batch=plan.micro_batch * plan.dp * m2))
    deadline.check()  # between phases: a planner's deadline (`ratrain.deadline`)
    grouped = _grouped(res.events)  # one grouping for every span and slack tried
    for slack in (0.0, near) if near > 0 else (0.0,):
        for span in SPANS:
            d = span * max(1, plan.pp)
            if (plan.microbatches - m2) % d:
                continue
            for c in _anchors(plan, m2, d):
                out = _from_run(plan, res, m2, d, memory, rel_tol, slack, grouped, c)
                if out is not None:
                    return out
    return None


def _anchors(plan: Plan, m2: int, d: int) -> list[int]:
    """The microbatches c whose three periods from stage 0's forward at c are checked, in
    the order tried: the middle 3d of the run's m2, then the first microbatch past stage
    0's warm-up (its forwards run ahead of the steady state until then), where that leaves
    the three periods inside the run and differs. A split backward's warm-up is longer
    (2 (pp - 1) forwards under zb-h2) and its cool-down shorter: qwen2.5-32b on 96 mt3000
    clusters, pp=24 zb-h2, 1024 microbatches, repeats in a run of 136 from c = 47, not from
    the middle's 32, where the full step's steady state begins at 47 on stage 0 (the step
    was simulated at 136 and, that failing, at 256 microbatches)."""
    mid = _middle(m2, d)
    past = warmup(plan.pp, m2, 0, plan.pipeline) + 1
    return [mid] if past == mid or past + 3 * d >= m2 else [mid, past]


def _middle(m2: int, d: int) -> int:
    """The first microbatch of the middle 3d of m2."""
    return (m2 - 3 * d) // 2


class _Grouped(NamedTuple):
    """A run's events as the checks read them, grouped once per run."""

    per_stage: dict[int, list]
    anchor: dict[int, dict[int, float]]
    """stage -> mb -> start of its first F."""
    by_key: dict[int, dict[tuple, list[tuple[float, float]]]]
    """stage -> (op, units) -> its (start, end) times, sorted."""


def _grouped(events) -> _Grouped:
    per_stage: dict[int, list] = {}
    anchor: dict[int, dict[int, float]] = {}
    for e in events:
        per_stage.setdefault(e.stage, []).append(e)
        a = e.action
        if a.op is Op.F:
            first = anchor.setdefault(e.stage, {})
            if a.mb not in first:
                first[a.mb] = e.start_s
    return _Grouped(per_stage, anchor, {s: _by_key(ev) for s, ev in per_stage.items()})


def _by_key(events) -> dict[tuple, list[tuple[float, float]]]:
    by_key: dict[tuple, list[tuple[float, float]]] = {}
    for e in events:
        a = e.action
        by_key.setdefault((a.op, a.units), []).append((e.start_s, e.end_s))
    for times in by_key.values():
        times.sort()
    return by_key


def _from_run(
    plan: Plan,
    res,
    m2: int,
    d: int,
    memory,
    rel_tol: float,
    near: float = 0.0,
    grouped: _Grouped | None = None,
    c: int | None = None,
):
    """`from_one_run` for one period of `d` microbatches. `near` > 0: a near repeat, every
    action's shift and every resource's work per period within δ of the period P, δ such
    that the k periods inserted move the step by at most k δ <= `near` x the extended
    step. Taken, not proved as the exact repeat is: each chain of actions then advances
    by P ± δ per period, and the step's end, the latest of them, stays within k δ of
    T(m2) + k P, whichever chain ends it (checked against full simulations in
    `tests/sim/test_sim_steady_one.py`; two chains whose periods differ by less than δ
    can trade places as the slack between them is used up: the step does not repeat
    exactly however long its warm-up, and the tries with longer ones would fail in turn
    before the full simulation)."""
    tol = rel_tol * res.step_time_s
    k = (plan.microbatches - m2) // d
    c = _middle(m2, d) if c is None else c
    if c < 0:
        return None
    per_stage, anchor, by_key = grouped or _grouped(res.events)
    if 0 not in anchor or c not in anchor[0] or c + d not in anchor[0]:
        return None
    period_s = anchor[0][c + d] - anchor[0][c]
    if period_s <= tol:
        return None
    shift_tol = max(tol, near * (res.step_time_s + k * period_s) / max(1, k)) if near else tol
    extra_busy: list[dict[str, float]] = []
    for s in range(len(res.utilization)):
        start = anchor.get(s, {}).get(c)
        if start is None:
            return None
        busy = _repeats(per_stage.get(s, []), start, period_s, tol, shift_tol, by_key.get(s))
        deadline.check()
        if busy is None:
            return None
        extra_busy.append(busy)
    step_s = res.step_time_s + k * period_s
    util = [
        {r: (u * res.step_time_s + k * extra_busy[s].get(r, 0.0)) / step_s for r, u in us.items()}
        for s, us in enumerate(res.utilization)
    ]
    return extended_result(plan, res, step_s, util, memory)


def _repeats(
    events,
    start: float,
    period_s: float,
    tol: float,
    shift_tol: float | None = None,
    by_key: dict[tuple, list[tuple[float, float]]] | None = None,
) -> dict[str, float] | None:
    """One stage's check from `start` over two periods (None where it fails), and else
    each resource's busy time in one period. `shift_tol`: how far an action's shift and a
    queue's work per period may be from the period (`tol` where None: a repeat). `by_key`:
    the stage's `_by_key(events)`, where already grouped."""
    shift_tol = tol if shift_tol is None else shift_tol
    if by_key is None:
        by_key = _by_key(events)
    one, three = start + period_s - tol, start + 3 * period_s - tol
    for times in by_key.values():
        lo = next((n for n, (s0, _) in enumerate(times) if s0 >= start - tol), len(times))
        if shift_tol > tol:
            # near: an occurrence a shift's drift from a period's edge falls on either side
            # of it; over three periods that is one in three at most
            q = round(sum(1 for s0, _ in times[lo:] if s0 < three) / 3)
        else:
            q = sum(1 for s0, _ in times[lo:] if s0 < one)
        if q == 0:
            if lo < len(times) and times[lo][0] < three:
                return None  # occurs amid the periods but not in each: no repeat
            continue
        if lo + 3 * q > len(times):
            return None
        for n in range(lo, lo + 2 * q):
            (s0, e0), (s1, e1) = times[n], times[n + q]
            if abs(s1 - s0 - period_s) > shift_tol or abs(e1 - e0 - period_s) > shift_tol:
                return None
    # The second period's window: every action overlapping it started at `start` or later
    # (one that began earlier and runs into it would be a backlog, and fails).
    lo_s, hi_s = start + period_s, start + 2 * period_s
    work: dict[str, float] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.end_s > lo_s and e.start_s < hi_s:
            if e.start_s < start - tol:
                return None
            spans.setdefault(e.resource, []).append((e.start_s, e.end_s))
        if lo_s - tol <= e.start_s < hi_s - tol:
            q = _queue_of(e)
            work[q] = work.get(q, 0.0) + (e.end_s - e.start_s)
    if any(w > period_s + shift_tol for w in work.values()):
        return None  # more work per period than the period: a backlog that grows
    return {r: busy_s(iv, lo_s, hi_s) for r, iv in spans.items()}


def _queue_of(e) -> tuple:
    """The queue whose actions run one at a time, for the backlog check: the resource, or
    for a SEND its resource and op. A stage's sends to two peers run side by side, each
    peer's in its own queue (`ratrain.schedule.rendezvous.p2p_queue`), so their durations
    overlap and only each queue's sum is bounded by the period. A send of one op goes to one
    peer but in a V order, where its two peers' sends summed fail the check (the step is
    then simulated in full: slower, never wrong)."""
    op = e.action.op
    return (e.resource, op) if op in SENDS else (e.resource, None)


def extended_result(plan: Plan, short, step_s: float, util: list[dict], memory):
    """`plan`'s result from a short step's (`short`): the extended step time and
    utilization, the short step's exposed tails, no events; the peaks and breakdowns are
    `memory` ((peaks, breakdowns) of the plan) or else the short step's."""
    bubble = [1.0 - u["compute"] for u in util]
    peaks, parts = (
        memory if memory is not None else (short.peak_memory_bytes, short.memory_breakdown)
    )
    return short.__class__(
        step_time_s=step_s,
        tokens_per_s=plan.tokens_per_step / step_s,
        bubble_fraction=sum(bubble) / len(bubble),
        stage_bubble=bubble,
        utilization=util,
        exposed=[dict(e) for e in short.exposed],
        events=[],
        peak_memory_bytes=list(peaks),
        memory_breakdown=[dict(b) for b in parts],
        memory_cap_bytes=short.memory_cap_bytes,
        workspace_bytes=short.workspace_bytes,
        headroom_bytes=short.headroom_bytes,
        schedule=short.schedule,
        platform=short.platform,
        model=short.model,
        plan=plan.to_dict(),
    )
