"""The event engine's plain path on integer ids: the same semantics, event order and float
operations as `ratrain.sim.engine._Engine` (which stays the overridable reference that the
processor-sharing engine extends), at a fraction of the Python work per action.

Actions are numbered by their position in the stages' lists laid one after another (the
engine's global ids). `graph` turns a schedule's dependencies into integer lists once;
`run_plain` replays them with every per-action fact (stage, compute or not, resource queue,
duration, pending deps) in flat lists and every resource queue addressed by an integer, so
the hot loop hashes no `Action`, no enum member and no tuple key. `tests/sim/test_sim_flat.py`
checks it against `_Engine` on random schedules. Pure Python.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import NamedTuple

from ratrain.errors import RatrainError
from ratrain.schedule.ir import _RESOURCE, Op, Resource, Schedule
from ratrain.schedule.linkshare import LinkShare

__all__ = ["Graph", "graph", "run_plain", "sends_recvs"]

_GLOBAL = (Op.GRAD_NORM, Op.OVERFLOW)
_PAIRS = ((Op.SEND_F, Op.RECV_F), (Op.SEND_B, Op.RECV_B))
# `Action.resource` by op, for a membership test by identity hash in the hot paths.
_COMPUTE_OPS = frozenset(op for op, r in _RESOURCE.items() if r is Resource.COMPUTE)


class Graph(NamedTuple):
    """A schedule's actions and dependencies on global ids."""

    acts: list
    """The actions, stage after stage, in list order."""
    first: list[int]
    """Per stage: the global id of its list's first action (and `first[pp]` = n)."""
    stage: list[int]
    deps: list[list[int]]
    """Per action: the distinct actions it waits for (stated deps, then the p2p pairing)."""
    rdeps: list[list[int]]
    """Per action: the actions that wait for it, in increasing id."""


def sends_recvs(schedule: Schedule, first: list[int]) -> list[tuple[int, int]]:
    """(send, recv) global ids (`first[s]`: stage s's first id): a send and the receive
    that name the same unit and microbatch (the runtime tags each message by both), on
    whichever stages they are. Every send needs a matching receive and every receive a
    send."""
    recvs: dict[tuple, int] = {}
    recv_ops = {recv_op: send_op for send_op, recv_op in _PAIRS}
    send_ops = {send_op: recv_op for send_op, recv_op in _PAIRS}
    sends = []
    for s, lst in enumerate(schedule.stages):
        base = first[s]
        for k, a in enumerate(lst):
            op = a.op
            if op in recv_ops:
                recvs[(op, a.units, a.mb)] = base + k
            elif op in send_ops:
                sends.append((base + k, a))
    out = []
    for i, a in sends:
        j = recvs.pop((send_ops[a.op], a.units, a.mb), None)
        if j is None:
            raise RatrainError(
                f"schedule: {a} has no {send_ops[a.op].value} of its unit and microbatch; "
                "every send needs a matching receive"
            )
        out.append((i, j))
    if recvs:
        op, units, mb = next(iter(recvs))
        raise RatrainError(
            f"schedule: {op.value} of unit {units} microbatch {mb} has no "
            f"{recv_ops[op].value}; every receive needs a matching send"
        )
    return out


def graph(schedule: Schedule) -> Graph:
    """The schedule's dependencies as integer lists, with its checks: every action unique,
    every dependency in some stage's list, every send matched by a receive."""
    acts = [a for stage in schedule.stages for a in stage]
    n = len(acts)
    gid = {a: i for i, a in enumerate(acts)}
    if len(gid) != n:
        raise RatrainError("schedule: an action appears twice; each action must be unique")
    # Most deps name the very objects in the lists: find those by identity (no hashing of
    # an Action), the others (equal, distinct objects) by value.
    by_id = {id(a): i for i, a in enumerate(acts)}
    first, stage = [0], []
    for s, lst in enumerate(schedule.stages):
        first.append(first[-1] + len(lst))
        stage += [s] * len(lst)
    get_id, get = by_id.get, gid.get

    def resolve(d) -> int | None:
        j = get_id(id(d))
        return get(d) if j is None else j

    deps: list = [()] * n  # no deps: one shared empty tuple
    stated = schedule.deps
    for i, (a, ds) in zip(map(get_id, map(id, stated)), stated.items(), strict=True):
        if i is None:
            i = get(a)
            if i is None:
                raise RatrainError(f"schedule: deps name {a}, which is in no stage's list")
        lst = list(map(get_id, map(id, ds)))
        if None in lst:
            lst = [resolve(d) for d in ds]
            for d, j in zip(ds, lst, strict=True):
                if j is None:
                    raise RatrainError(f"schedule: {a} depends on {d}, which is in no stage's list")
        deps[i] = lst
    for send, recv in sends_recvs(schedule, first):
        deps[recv] = [*deps[recv], send]
    rdeps: list[list[int]] = [[] for _ in range(n)]
    for i, lst in enumerate(deps):
        if len(lst) > 1 and len(set(lst)) < len(lst):
            lst = deps[i] = list(dict.fromkeys(lst))  # distinct, as a set of deps
        for d in lst:
            rdeps[d].append(i)
    return Graph(acts, first, stage, deps, rdeps)


def run_plain(
    g: Graph, durations: list[float], resources: list[Resource], links=None
) -> tuple[list[float], list[float], list[float]] | None:
    """Replay `g` with each action's duration and resource; its (issue, start, end) times,
    or None where the schedule deadlocks (the caller explains why with `_Engine`).

    `links` (a `ratrain.cost.links.LinkUse`, or None): the link ids each action holds
    besides its queue, shared fairly by the actions running on them
    (`ratrain.schedule.linkshare`)."""
    n, pp, stage = len(g.acts), len(g.first) - 1, g.stage
    rdeps = g.rdeps
    pending = list(map(len, g.deps))
    # Compute or not by the IR's resource (as `_Engine`), whatever queue `resources` names.
    compute = [a.op in _COMPUTE_OPS for a in g.acts]
    qid, n_queues = _queue_ids(stage, resources, pp)
    queues = [deque() for _ in range(n_queues)]
    busy = [False] * n_queues
    issue, start, end = [-1.0] * n, [-1.0] * n, [-1.0] * n
    walk = g.first[:pp]  # next global id each stage's walk reaches
    walk_busy = [False] * pp
    heap: list[tuple[float, int, int]] = []
    seq = itertools.count().__next__  # one counter: ties end in the order they started
    share = None
    if links is not None:

        def push(t: float, i: int) -> int:
            k = seq()
            heapq.heappush(heap, (t, k, i))
            return k

        share = LinkShare(links.holds, links.count, durations, push)
    try_queue = _queue_starter(
        g.acts, qid, queues, busy, pending, durations, start, heap, seq, share
    )
    advance = _stage_walker(
        g.first,
        compute,
        qid,
        queues,
        busy,
        pending,
        durations,
        (issue, start),
        heap,
        seq,
        walk,
        walk_busy,
        try_queue,
    )
    for s in range(pp):
        advance(s, 0.0)
    ctx = (heap, end, compute, stage, qid, busy, queues, try_queue, rdeps, pending)
    walks = (walk, walk_busy, advance, issue)
    if share is None:
        _loop(ctx, walks)
    else:
        share.rebalance(0.0)
        _loop_shared(ctx, walks, share)
    if min(end, default=0.0) < 0:
        return None
    return issue, start, end


def _loop(ctx, walks) -> None:
    """The event loop: each completion frees its queue or its stage's walk and wakes what
    waited for it."""
    heap, end, compute, stage, qid, busy, queues, try_queue, rdeps, pending = ctx
    walk, walk_busy, advance, issue = walks
    pop = heapq.heappop
    while heap:
        now, _, i = pop(heap)
        end[i] = now
        ci = compute[i]
        if ci:
            walk_busy[stage[i]] = False
        else:
            q = qid[i]
            busy[q] = False
            if queues[q]:
                try_queue(q, now)
        for j in rdeps[i]:
            p = pending[j] - 1
            pending[j] = p
            if p:
                continue
            if compute[j]:
                sj = stage[j]
                if walk[sj] == j:
                    advance(sj, now)
            elif issue[j] >= 0 and not busy[qid[j]]:
                try_queue(qid[j], now)
        if ci:
            advance(stage[i], now)


def _loop_shared(ctx, walks, share: LinkShare) -> None:
    """`_loop` with links shared (`LinkShare`): stale ends skipped, rates settled once
    every event of an instant is in."""
    heap, end, compute, stage, qid, busy, queues, try_queue, rdeps, pending = ctx
    walk, walk_busy, advance, issue = walks
    pop = heapq.heappop
    holds, valid = share.holds, share.valid
    while heap:
        now, k, i = pop(heap)
        if holds[i]:
            if valid[i] != k:
                continue  # superseded by a re-queue at a new rate
            share.finish(i)
        end[i] = now
        ci = compute[i]
        if ci:
            walk_busy[stage[i]] = False
        else:
            q = qid[i]
            busy[q] = False
            if queues[q]:
                try_queue(q, now)
        for j in rdeps[i]:
            p = pending[j] - 1
            pending[j] = p
            if p:
                continue
            if compute[j]:
                sj = stage[j]
                if walk[sj] == j:
                    advance(sj, now)
            elif issue[j] >= 0 and not busy[qid[j]]:
                try_queue(qid[j], now)
        if ci:
            advance(stage[i], now)
        if share.dirty:
            while heap and holds[heap[0][2]] and valid[heap[0][2]] != heap[0][1]:
                pop(heap)  # stale: not an event of this instant
            if not heap or heap[0][0] > now:
                share.rebalance(now)  # every event of this instant is in


def _queue_ids(stage: list[int], resources: list[Resource], pp: int) -> tuple[list[int], int]:
    """Per action, its FIFO's integer id, one FIFO per (stage, resource); and their count."""
    rid = {r.value: k for k, r in enumerate(Resource)}  # by value: no enum hash per action
    nr = len(rid)
    qid = [s * nr + rid[r._value_] for s, r in zip(stage, resources, strict=True)]
    return qid, pp * nr


def _global_groups(acts: list) -> tuple[list[int], list[list[int]]]:
    """Global reductions: per action, its group (-1: none), and each group's members, the
    instances with the same (op, units, mb), one per stage."""
    group = [-1] * len(acts)
    members: list[list[int]] = []
    keys: dict[tuple, int] = {}
    for i, a in enumerate(acts):
        if a.op in _GLOBAL:
            k = keys.setdefault((a.op, a.units, a.mb), len(keys))
            if k == len(members):
                members.append([])
            members[k].append(i)
            group[i] = k
    return group, members


def _queue_starter(acts, qid, queues, busy, pending, dur, start, heap, seq, share=None):
    """`try_queue(q, now)`: start the head of FIFO q if it is free and its action ready; a
    global reduction starts on every stage at once, when its last instance is ready; an
    action that holds links runs at its share of them (`share`, `LinkShare`). (A closure
    over the replay's lists: the hot loop makes no attribute lookups.)"""
    group, members = _global_groups(acts)
    ready: list[set[int]] = [set() for _ in members]
    push = heapq.heappush
    holds = share.holds if share is not None else None

    def try_queue(q: int, now: float) -> None:
        dq = queues[q]
        if not dq or busy[q]:
            return
        i = dq[0]
        if pending[i]:
            return
        k = group[i]
        if k >= 0:
            rd = ready[k]
            if i in rd:
                return
            rd.add(i)
            if len(rd) < len(members[k]):
                return
            for j in members[k]:
                qj = qid[j]
                assert queues[qj][0] == j
                queues[qj].popleft()
                busy[qj] = True
                start[j] = now
                push(heap, (now + dur[j], seq(), j))
            return
        dq.popleft()
        busy[q] = True
        start[i] = now
        if holds is not None and holds[i]:
            share.begin(i, now)
            return
        push(heap, (now + dur[i], seq(), i))

    return try_queue


def _stage_walker(
    first, compute, qid, queues, busy, pending, dur, times, heap, seq, walk, walk_busy, try_queue
):
    """`advance(s, now)`: walk stage s's list from where it stopped, queueing each
    non-compute action and starting the next compute one once its deps are done (the walk
    then waits for it to end). `times`: the (issue, start) lists it fills."""
    issue, start = times
    stop = first[1:]
    push = heapq.heappush

    def advance(s: int, now: float) -> None:
        if walk_busy[s]:
            return
        i, e = walk[s], stop[s]
        while i < e:
            if compute[i]:
                if issue[i] < 0:
                    issue[i] = now  # the walk reached it; it may still wait
                if pending[i]:
                    break  # woken when its last dep completes
                walk_busy[s] = True
                walk[s] = i + 1
                start[i] = now
                push(heap, (now + dur[i], seq(), i))
                return
            issue[i] = now
            q = qid[i]
            queues[q].append(i)
            i += 1
            walk[s] = i
            if not busy[q]:  # (try_queue's own first test, saving the call)
                try_queue(q, now)
        walk[s] = i

    return advance
