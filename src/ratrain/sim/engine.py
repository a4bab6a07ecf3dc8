"""A deterministic discrete-event engine that replays a schedule IR under its execution
semantics (the docstring of `ratrain.schedule.ir`):

- each stage walks its list with one issuing thread; a COMPUTE action blocks the walk, and
  starts once its deps have completed;
- any other action is issued when the walk reaches it and runs on its (stage, resource) in
  issue order (a transfer: on its queue per peer, `ratrain.schedule.rendezvous`), starting
  once the resource is free and its deps have completed; where it
  holds links between nodes (`ratrain.cost.links`) it shares them fairly with the actions
  running on them (`ratrain.schedule.linkshare`);
- a global reduction (NORM, OVF) starts on every stage at once, when every stage's instance
  is at the head of its resource with its deps completed.

A receive cannot complete before its matching send: a RECV_F pairs with the SEND_F of the
same unit and microbatch (RECV_B with SEND_B), as the runtime tags its messages by both,
and the pair becomes a dependency if the schedule did not state it; a send starts only
once its receive has been issued (`ratrain.schedule.rendezvous`).

Time advances through a heap of (time, sequence, action) completion events; every start
happens at the time of the event that enabled it, so the result does not depend on the
order in which simultaneous events are processed. Pure Python.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from ratrain.errors import RatrainError
from ratrain.gcpause import gc_paused
from ratrain.schedule.ir import Action, Op, Resource, Schedule
from ratrain.schedule.linkshare import LinkShare
from ratrain.schedule.rendezvous import notice_wait_s, p2p_queue, unposted_sends
from ratrain.sim.flat import graph, run_plain, sends_recvs

__all__ = ["Timing", "replay", "run_flat", "p2p_pairs"]

_GLOBAL = (Op.GRAD_NORM, Op.OVERFLOW)


class Timing(NamedTuple):
    """When one action was issued, started and ended (seconds from the step's start)."""

    action: Action
    index: int
    """Position in its stage's list."""
    issue_s: float
    start_s: float
    end_s: float


def p2p_pairs(schedule: Schedule) -> list[tuple[Action, Action]]:
    """(send, recv) pairs, matched by unit and microbatch (the flat engine's pairing,
    `ratrain.sim.flat`, as actions)."""
    acts = [a for stage in schedule.stages for a in stage]
    first = list(itertools.accumulate((len(st) for st in schedule.stages), initial=0))
    return [(acts[i], acts[j]) for i, j in sends_recvs(schedule, first)]


class _Engine:
    def __init__(
        self,
        schedule: Schedule,
        durations: list[float],
        resources: list[Resource],
        links=None,
    ) -> None:
        self.schedule = schedule
        g = graph(schedule)
        acts = self.acts = g.acts
        n = len(acts)
        # Global ids number the stages' lists one after another.
        self.lists = [range(g.first[s], g.first[s + 1]) for s in range(schedule.pp)]
        self.pos = [i - g.first[s] for i, s in enumerate(g.stage)]
        self.stage = g.stage
        assert len(durations) == len(resources) == n
        self.res = resources
        compute = Resource.COMPUTE
        self.compute = [a.resource is compute for a in acts]
        self.dur = durations
        self.deps, self.rdeps = g.deps, g.rdeps
        self.pending = [len(d) for d in g.deps]
        # A transfer's queue (`ratrain.schedule.rendezvous`): a SEND's per peer, entered
        # once it and its RECV are issued (`held`: None until the RECV is issued, True if
        # the SEND came first); a RECV queues for nothing (None).
        self.gate = g.gate
        self.held = unposted_sends(g.gate)
        self.key = [
            (s, r) if other < 0 else (None if gate >= 0 else p2p_queue(s, other))
            for s, r, other, gate in zip(g.stage, resources, g.peer, g.gate, strict=True)
        ]
        self._globals()
        self.issue = [-1.0] * n
        self.start = [-1.0] * n
        self.end = [-1.0] * n
        self.walk = [0] * schedule.pp
        self.walk_busy = [False] * schedule.pp
        self.queues: dict[tuple, deque[int]] = {}
        self.busy: dict[tuple, bool] = {}
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.now = 0.0
        # links (`ratrain.cost.links`), shared by `ratrain.schedule.linkshare`'s rule
        self.holds = links.holds if links is not None else [()] * n
        self.valid = [-1] * n  # sequence number of an action's live heap entry
        self.links = LinkShare(self.holds, links.count if links else 0, durations, self._push)
        # a RECV's ready notice: the links it waits on (`LinkUse.notice`); a heap entry of
        # id -(r + 1) is RECV r's notice leaving
        self.notice = (links.notice if links is not None else None) or [()] * n
        self.queue_s = links.queue_s if links is not None else 0.0

    def _globals(self) -> None:
        """Instances of one global reduction: same op, units and mb, one per stage."""
        self.group: dict[int, tuple] = {}
        self.members: dict[tuple, list[int]] = {}
        for i, a in enumerate(self.acts):
            if a.op in _GLOBAL:
                key = (a.op, a.units, a.mb)
                self.group[i] = key
                self.members.setdefault(key, []).append(i)
        self.ready: dict[tuple, set[int]] = {k: set() for k in self.members}

    # -- the event loop -------------------------------------------------------------------
    def run(self) -> None:
        for s in range(self.schedule.pp):
            self._advance(s)
        self._share_links()
        heap = self.heap
        while heap:
            t, seq, i = heapq.heappop(heap)
            if self._stale(seq, i):
                continue  # superseded by a re-queue at a new rate
            self.now = t
            if i < 0:
                self._open(-i - 1)  # a RECV's notice is out
            else:
                self._complete(i)
            if self._instant_done():
                self._share_links()
        self._check_done()

    def _stale(self, seq: int, i: int) -> bool:
        return i >= 0 and bool(self.holds[i]) and seq != self.valid[i]

    def _instant_done(self) -> bool:
        """Every event of this instant is in (stale heap entries dropped from the top)."""
        heap = self.heap
        while heap and self._stale(heap[0][1], heap[0][2]):
            heapq.heappop(heap)
        return not heap or heap[0][0] > self.now

    def _push(self, t: float, i: int) -> int:
        seq = self.seq
        heapq.heappush(self.heap, (t, seq, i))
        self.valid[i] = seq
        self.seq += 1
        return seq

    def _start(self, i: int) -> None:
        self.start[i] = self.now
        if self.holds[i]:
            self.links.begin(i, self.now)  # its end queued by the instant's `_share_links`
            return
        heapq.heappush(self.heap, (self.now + self.dur[i], self.seq, i))
        self.seq += 1

    def _share_links(self) -> None:
        if self.links.dirty:
            self.links.rebalance(self.now)

    def _advance(self, s: int) -> None:
        """Walk stage s's list as far as the semantics allow at the current time."""
        ids = self.lists[s]
        while self.walk[s] < len(ids) and not self.walk_busy[s]:
            i = ids[self.walk[s]]
            if self.compute[i]:
                if self.issue[i] < 0:
                    self.issue[i] = self.now  # the walk reached it; it may still wait
                if self.pending[i]:
                    return  # woken when its last dep completes
                self.walk_busy[s] = True
                self.walk[s] += 1
                self._start(i)
                return
            self.issue[i] = self.now
            self.walk[s] += 1
            key = self.key[i]
            if key is None:  # a RECV: done once its SEND is
                if not self.pending[i]:
                    self._start(i)
            elif self.held[i] is None:  # a SEND before its RECV: queued at its issue
                self.held[i] = True
            else:
                self._enqueue(i)
            if self.gate[i] >= 0:  # a RECV: its notice reaches the SEND
                self._notify(i)

    def _notify(self, i: int) -> None:
        """RECV i was issued: its SEND may be queued once the notice is out, behind what
        runs on the links it waits on (`ratrain.schedule.rendezvous.notice_wait_s`)."""
        wait = notice_wait_s(self.links, self.notice[i], self.now, self.queue_s)
        if wait > 0:
            heapq.heappush(self.heap, (self.now + wait, self.seq, -(i + 1)))
            self.seq += 1
        else:
            self._open(i)

    def _open(self, i: int) -> None:
        """RECV i's notice is out: its SEND, if issued, is queued now."""
        m = self.gate[i]
        if self.held[m]:
            self._enqueue(m)
        self.held[m] = False

    def _enqueue(self, i: int) -> None:
        key = self.key[i]
        self.queues.setdefault(key, deque()).append(i)
        self._try_queue(key)

    def _try_queue(self, key: tuple) -> None:
        q = self.queues.get(key)
        if not q or self.busy.get(key):
            return
        i = q[0]
        if self.pending[i]:
            return
        if i in self.group:
            gkey = self.group[i]
            ready = self.ready[gkey]
            if i in ready:
                return
            ready.add(i)
            if len(ready) < len(self.members[gkey]):
                return
            for j in self.members[gkey]:
                jkey = self.key[j]
                assert self.queues[jkey][0] == j
                self.queues[jkey].popleft()
                self.busy[jkey] = True
                self._start(j)
            return
        q.popleft()
        self.busy[key] = True
        self._start(i)

    def _complete(self, i: int) -> None:
        self.end[i] = self.now
        s = self.stage[i]
        if self.compute[i]:
            self.walk_busy[s] = False
        else:
            if self.holds[i]:
                self.links.finish(i)
            if self.key[i] is not None:
                self.busy[self.key[i]] = False
                self._try_queue(self.key[i])
        for j in self.rdeps[i]:
            self.pending[j] -= 1
            if self.pending[j]:
                continue
            sj = self.stage[j]
            if self.compute[j]:
                ids = self.lists[sj]
                if self.walk[sj] < len(ids) and ids[self.walk[sj]] == j:
                    self._advance(sj)
            elif self.issue[j] >= 0:
                if self.key[j] is None:  # a RECV, issued
                    self._start(j)
                else:
                    self._try_queue(self.key[j])
        if self.compute[i]:
            self._advance(s)

    def _check_done(self) -> None:
        for s, ids in enumerate(self.lists):
            for i in ids:
                if self.end[i] < 0:
                    a = self.acts[i]
                    waits = [str(self.acts[d]) for d in sorted(self.deps[i]) if self.end[d] < 0]
                    why = (
                        f"waits for {', '.join(waits[:3])}"
                        if waits
                        else "waits behind its resource queue"
                    )
                    raise RatrainError(
                        f"schedule deadlocks: stage {s} never completes {a} ({why}); "
                        "check the schedule with ratrain.schedule.check_schedule"
                    )

    def timings(self) -> list[list[Timing]]:
        return [
            [
                Timing(self.acts[i], self.pos[i], self.issue[i], self.start[i], self.end[i])
                for i in ids
            ]
            for ids in self.lists
        ]


@gc_paused()
def run_flat(
    schedule: Schedule, durations: list[float], resources: list[Resource], links=None
) -> tuple[list[float], list[float], list[float]]:
    """The engine on flat lists, in the order of the stages' lists one after another:
    each action's duration and resource in, its (issue, start, end) times out; `links`
    (`ratrain.cost.links.LinkUse`): the links each action holds besides its queue."""
    assert len(durations) == len(resources)
    times = run_plain(graph(schedule), durations, resources, links)
    if times is None:  # deadlock: the reference engine says where
        eng = _Engine(schedule, durations, resources, links)
        eng.run()
        raise AssertionError("the engines disagree on a deadlock")
    return times


@gc_paused()
def replay(
    schedule: Schedule,
    duration_s: Callable[[Action], float],
    resource_of: Callable[[Action], Resource] | None = None,
) -> list[list[Timing]]:
    """Time every action of `schedule` with `duration_s(action)`; per stage, in list order.

    `resource_of(action)` names the resource an action queues on (default: its IR resource;
    a cost model may say that, e.g., an all-gather view fetch occupies the DP network)."""
    acts = [a for stage in schedule.stages for a in stage]
    resources = [resource_of(a) if resource_of else a.resource for a in acts]
    issue, start, end = run_flat(schedule, [float(duration_s(a)) for a in acts], resources)
    out, k = [], 0
    for stage in schedule.stages:
        out.append(
            [
                Timing(a, p, issue[i], start[i], end[i])
                for p, (i, a) in enumerate(enumerate(stage, start=k))
            ]
        )
        k += len(stage)
    return out
