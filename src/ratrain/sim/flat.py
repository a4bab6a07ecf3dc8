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
from dataclasses import replace
from typing import NamedTuple

from ratrain.errors import RatrainError
from ratrain.schedule.ir import _RESOURCE, Op, Resource, Schedule
from ratrain.schedule.linkshare import LinkShare
from ratrain.schedule.rendezvous import (
    issue_gates,
    notice_wait_s,
    p2p_queue,
    sends_recvs,
    unposted_sends,
)

__all__ = ["Graph", "Needed", "graph", "run_plain", "sends_recvs"]

_GLOBAL = (Op.GRAD_NORM, Op.OVERFLOW)
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
    gate: list[int]
    """Per action: the SEND that waits for it to be issued (a RECV's), or -1
    (`ratrain.schedule.rendezvous`)."""
    peer: list[int]
    """Per action: the stage at the other end of a transfer (SEND or RECV), or -1."""


class Needed(RatrainError):
    """An action `graph` was asked to leave out is one another action depends on."""


def graph(schedule: Schedule, absent: frozenset = frozenset()) -> Graph:
    """The schedule's dependencies as integer lists, with its checks: every action unique,
    every dependency in some stage's list, every send matched by a receive.

    `absent`: ops whose actions are left out (their entries in `schedule.deps` too), for
    actions that time nothing else (`ratrain.sim.simulate`: a VIEW_DROP, which no action
    waits for); `Needed` where some action depends on one of them."""
    if absent:
        schedule = replace(
            schedule, stages=[[a for a in st if a.op not in absent] for st in schedule.stages]
        )
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
                if a.op in absent:
                    continue
                raise RatrainError(f"schedule: deps name {a}, which is in no stage's list")
        lst = list(map(get_id, map(id, ds)))
        if None in lst:
            lst = [resolve(d) for d in ds]
            for d, j in zip(ds, lst, strict=True):
                if j is None:
                    if d.op in absent:
                        raise Needed(f"schedule: {a} depends on {d}, which was left out")
                    raise RatrainError(f"schedule: {a} depends on {d}, which is in no stage's list")
        deps[i] = lst
    pairs = sends_recvs(schedule, first)
    peer = [-1] * n
    for send, recv in pairs:
        deps[recv] = [*deps[recv], send]
        peer[send], peer[recv] = stage[recv], stage[send]
    rdeps: list[list[int]] = [[] for _ in range(n)]
    for i, lst in enumerate(deps):
        if len(lst) > 1 and len(set(lst)) < len(lst):
            lst = deps[i] = list(dict.fromkeys(lst))  # distinct, as a set of deps
        for d in lst:
            rdeps[d].append(i)
    return Graph(acts, first, stage, deps, rdeps, issue_gates(pairs, n), peer)


def run_plain(
    g: Graph, durations: list[float], resources: list[Resource], links=None
) -> tuple[list[float], list[float], list[float]] | None:
    """Replay `g` with each action's duration and resource; its (issue, start, end) times,
    or None where the schedule deadlocks (the caller explains why with `_Engine`).

    `links` (a `ratrain.cost.links.LinkUse`, or None): the link ids each action holds
    besides its queue, shared fairly by the actions running on them
    (`ratrain.schedule.linkshare`). A SEND starts only once its RECV is issued, and
    transfers queue per peer (`ratrain.schedule.rendezvous`)."""
    n, pp, stage = len(g.acts), len(g.first) - 1, g.stage
    rdeps = g.rdeps
    pending = list(map(len, g.deps))
    gate = g.gate
    held = unposted_sends(gate)  # per SEND: its RECV's notice out yet, or it issued first
    # Compute or not by the IR's resource (as `_Engine`), whatever queue `resources` names.
    compute = [a.op in _COMPUTE_OPS for a in g.acts]
    qid, n_queues = _queue_ids(stage, resources, pp, g.peer, gate)
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
    notice = _Notice(gate, held, qid, queues, busy, try_queue, share, links, heap, seq)
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
        (gate, held, notice.issued),
    )
    for s in range(pp):
        advance(s, 0.0)
    ctx = (heap, end, compute, stage, qid, busy, queues, try_queue, rdeps, pending)
    walks = (walk, walk_busy, advance, issue, start, durations, seq)
    if share is None:
        _loop(ctx, walks)
    else:
        share.rebalance(0.0)
        _loop_shared(ctx, walks, share, notice.open)
    if min(end, default=0.0) < 0:
        return None
    return issue, start, end


def _loop(ctx, walks) -> None:
    """The event loop: each completion frees its queue or its stage's walk and wakes what
    waited for it."""
    heap, end, compute, stage, qid, busy, queues, try_queue, rdeps, pending = ctx
    walk, walk_busy, advance, issue, start, dur, seq = walks
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        now, _, i = pop(heap)
        end[i] = now
        ci = compute[i]
        if ci:
            walk_busy[stage[i]] = False
        else:
            q = qid[i]
            if q >= 0:
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
            elif issue[j] >= 0:
                q = qid[j]
                if q < 0:  # a RECV, issued: done when its SEND is
                    start[j] = now
                    push(heap, (now + dur[j], seq(), j))
                elif not busy[q]:
                    try_queue(q, now)
        if ci:
            advance(stage[i], now)


def _loop_shared(ctx, walks, share: LinkShare, notice_out=None) -> None:
    """`_loop` with links shared (`LinkShare`): stale ends skipped, rates settled once
    every event of an instant is in; an entry of a negative id -(r + 1) is RECV r's notice
    leaving (`_Notice.open`)."""
    heap, end, compute, stage, qid, busy, queues, try_queue, rdeps, pending = ctx
    walk, walk_busy, advance, issue, start, dur, seq = walks
    pop, push = heapq.heappop, heapq.heappush
    holds, valid = share.holds, share.valid
    while heap:
        now, k, i = pop(heap)
        if i < 0:
            notice_out(-i - 1, now)
        else:
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
                if q >= 0:
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
                elif issue[j] >= 0:
                    q = qid[j]
                    if q < 0:  # a RECV, issued: done when its SEND is
                        start[j] = now
                        push(heap, (now + dur[j], seq(), j))
                    elif not busy[q]:
                        try_queue(q, now)
            if ci:
                advance(stage[i], now)
        if share.dirty:
            while (
                heap and heap[0][2] >= 0 and holds[heap[0][2]] and valid[heap[0][2]] != heap[0][1]
            ):
                pop(heap)  # stale: not an event of this instant
            if not heap or heap[0][0] > now:
                share.rebalance(now)  # every event of this instant is in


def _queue_ids(
    stage: list[int], resources: list[Resource], pp: int, peer: list[int], gate: list[int]
) -> tuple[list[int], int]:
    """Per action, its FIFO's integer id, one FIFO per (stage, resource), a transfer's per
    `ratrain.schedule.rendezvous.p2p_queue` (-1 for a RECV: it queues for nothing); and
    their count."""
    rid = {r.value: k for k, r in enumerate(Resource)}  # by value: no enum hash per action
    nr = len(rid)
    qid = [s * nr + rid[r._value_] for s, r in zip(stage, resources, strict=True)]
    n_queues = pp * nr
    p2p: dict[tuple, int] = {}
    for i, other in enumerate(peer):
        if other >= 0:
            if gate[i] >= 0:  # a RECV (it gates its SEND)
                qid[i] = -1
                continue
            key = p2p_queue(stage[i], other)
            k = p2p.get(key)
            if k is None:
                k = p2p[key] = n_queues + len(p2p)
            qid[i] = k
    return qid, n_queues + len(p2p)


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


class _Notice:
    """A RECV's ready notice to its SEND (`ratrain.schedule.rendezvous`): out at once, or,
    where the RECV names links its notice waits on (`LinkUse.notice`), `notice_wait_s`
    later (an entry of id -(r + 1) on the heap); then its SEND, if issued, is queued."""

    def __init__(self, gate, held, qid, queues, busy, try_queue, share, links, heap, seq):
        self.gate, self.held, self.qid, self.queues = gate, held, qid, queues
        self.busy, self.try_queue = busy, try_queue
        notice = links.notice if links is not None else None
        self.notice = notice if notice is not None and any(notice) else None
        self.share, self.heap, self.seq = share, heap, seq
        self.queue_s = links.queue_s if links is not None else 0.0

    def issued(self, i: int, now: float) -> None:
        if self.notice is not None and self.notice[i]:
            wait = notice_wait_s(self.share, self.notice[i], now, self.queue_s)
            if wait > 0:
                heapq.heappush(self.heap, (now + wait, self.seq(), -(i + 1)))
                return
        self.open(i, now)

    def open(self, i: int, now: float) -> None:
        m = self.gate[i]
        if self.held[m]:
            q = self.qid[m]
            self.queues[q].append(m)
            if not self.busy[q]:
                self.try_queue(q, now)
        self.held[m] = False


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
    first,
    compute,
    qid,
    queues,
    busy,
    pending,
    dur,
    times,
    heap,
    seq,
    walk,
    walk_busy,
    try_queue,
    gates,
):
    """`advance(s, now)`: walk stage s's list from where it stopped, queueing each
    non-compute action and starting the next compute one once its deps are done (the walk
    then waits for it to end). A SEND is queued once it and its RECV are both issued
    (`gates`: per action the SEND a RECV frees, whether a SEND waits for its RECV, and
    `_Notice.issued`, called with a RECV once issued); a RECV queues for nothing. `times`:
    the (issue, start) lists it fills."""
    issue, start = times
    gate, held, notify = gates
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
            m = gate[i]
            if q >= 0:
                if held[i] is None:  # a SEND before its RECV: queued at the RECV's issue
                    held[i] = True
                else:
                    queues[q].append(i)
                    if not busy[q]:  # (try_queue's own first test, saving the call)
                        try_queue(q, now)
            elif not pending[i]:  # a RECV whose SEND is done
                start[i] = now
                push(heap, (now + dur[i], seq(), i))
            i += 1
            walk[s] = i
            if m >= 0:  # a RECV: its notice goes to its SEND
                notify(i - 1, now)
        walk[s] = i

    return advance
