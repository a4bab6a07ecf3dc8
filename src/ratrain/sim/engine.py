"""A deterministic discrete-event engine that replays a schedule IR under its execution
semantics (the docstring of `ratrain.schedule.ir`):

- each stage walks its list with one issuing thread; a COMPUTE action blocks the walk, and
  starts once its deps have completed;
- any other action is issued when the walk reaches it and runs on its (stage, resource) in
  issue order, starting once the resource is free and its deps have completed;
- a global reduction (NORM, OVF) starts on every stage at once, when every stage's instance
  is at the head of its resource with its deps completed.

A receive cannot complete before its matching send: the k-th RECV_F of stage s pairs with the
k-th SEND_F of stage s−1 (RECV_B of s with SEND_B of s+1), as point-to-point libraries match
messages in order, and the pair becomes a dependency if the schedule did not state it.

Time advances through a heap of (time, sequence, action) completion events; every start
happens at the time of the event that enabled it, so the result does not depend on the
order in which simultaneous events are processed. Pure Python.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from ratrain.errors import RatrainError
from ratrain.schedule.ir import Action, Op, Resource, Schedule

__all__ = ["Timing", "replay", "run_flat", "p2p_pairs"]

_GLOBAL = (Op.GRAD_NORM, Op.OVERFLOW)
_PAIRS = ((Op.SEND_F, Op.RECV_F, 1), (Op.SEND_B, Op.RECV_B, -1))


class Timing(NamedTuple):
    """When one action was issued, started and ended (seconds from the step's start)."""

    action: Action
    index: int
    """Position in its stage's list."""
    issue_s: float
    start_s: float
    end_s: float


def p2p_pairs(schedule: Schedule) -> list[tuple[Action, Action]]:
    """(send, recv) pairs, matched in order per stage boundary and direction."""
    out = []
    for send_op, recv_op, step in _PAIRS:
        for s in range(schedule.pp):
            peer = s + step
            if not 0 <= peer < schedule.pp:
                continue
            sends = [a for a in schedule.stages[s] if a.op is send_op]
            recvs = [a for a in schedule.stages[peer] if a.op is recv_op]
            if len(sends) != len(recvs):
                raise RatrainError(
                    f"schedule: stage {s} has {len(sends)} {send_op.value} but stage {peer} has "
                    f"{len(recvs)} {recv_op.value}; every send needs a matching receive"
                )
            out.extend(zip(sends, recvs, strict=True))
    return out


class _Engine:
    def __init__(
        self, schedule: Schedule, durations: list[float], resources: list[Resource]
    ) -> None:
        self.schedule = schedule
        acts = [a for stage in schedule.stages for a in stage]
        self.acts = acts
        self.gid = {a: i for i, a in enumerate(acts)}
        if len(self.gid) != len(acts):
            raise RatrainError("schedule: an action appears twice; each action must be unique")
        n = len(acts)
        # Global ids number the stages' lists one after another.
        self.lists, self.pos, self.stage = [], [], []
        for s, stage in enumerate(schedule.stages):
            first = len(self.pos)
            self.lists.append(range(first, first + len(stage)))
            self.pos.extend(range(len(stage)))
            self.stage.extend([s] * len(stage))
        assert len(durations) == len(resources) == n
        self.res = resources
        compute = Resource.COMPUTE
        self.compute = [a.resource is compute for a in acts]
        self.dur = durations
        self._deps(schedule)
        self._globals()
        self.issue = [-1.0] * n
        self.start = [-1.0] * n
        self.end = [-1.0] * n
        self.walk = [0] * schedule.pp
        self.walk_busy = [False] * schedule.pp
        self.queues: dict[tuple[int, Resource], deque[int]] = {}
        self.busy: dict[tuple[int, Resource], bool] = {}
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.now = 0.0

    def _deps(self, schedule: Schedule) -> None:
        n = len(self.acts)
        gid = self.gid
        deps: list[set[int]] = [set() for _ in range(n)]
        for a, ds in schedule.deps.items():
            i = gid.get(a)
            if i is None:
                raise RatrainError(f"schedule: deps name {a}, which is in no stage's list")
            for d in ds:
                j = gid.get(d)
                if j is None:
                    raise RatrainError(f"schedule: {a} depends on {d}, which is in no stage's list")
                deps[i].add(j)
        for send, recv in p2p_pairs(schedule):
            deps[self.gid[recv]].add(self.gid[send])
        self.deps = deps
        self.pending = [len(d) for d in deps]
        self.rdeps: list[list[int]] = [[] for _ in range(n)]
        for i, ds in enumerate(deps):
            for d in sorted(ds):
                self.rdeps[d].append(i)

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
        while self.heap:
            self.now, _, i = heapq.heappop(self.heap)
            self._complete(i)
        self._check_done()

    def _start(self, i: int) -> None:
        self.start[i] = self.now
        heapq.heappush(self.heap, (self.now + self.dur[i], self.seq, i))
        self.seq += 1

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
            key = (s, self.res[i])
            self.queues.setdefault(key, deque()).append(i)
            self._try_queue(key)

    def _try_queue(self, key: tuple[int, Resource]) -> None:
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
                jkey = (self.stage[j], self.res[j])
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
            self.busy[(s, self.res[i])] = False
            self._try_queue((s, self.res[i]))
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
                self._try_queue((sj, self.res[j]))
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


def run_flat(
    schedule: Schedule, durations: list[float], resources: list[Resource]
) -> tuple[list[float], list[float], list[float]]:
    """The engine on flat lists, in the order of the stages' lists one after another:
    each action's duration and resource in, its (issue, start, end) times out."""
    eng = _Engine(schedule, durations, resources)
    eng.run()
    return eng.issue, eng.start, eng.end


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
    eng = _Engine(schedule, [float(duration_s(a)) for a in acts], resources)
    eng.run()
    return eng.timings()
