"""Processor sharing in the event engine: ranks that share a node's cores compute faster
while the node's other ranks wait.

On a platform whose ranks share a node's cores (`ratrain.cost.sharing.shares_cores`), the
cost model charges every compute action at the speed of a rank whose node's ranks all
compute (`CostModel.speed`). Here a compute action (F, B, RECOMPUTE, UPDATE) instead has an
amount of work, its charged time at that speed, and progresses at a rate that follows how
many of its node's ranks compute at each moment: `shared_speed(w, b) / CostModel.speed`
for b of the node's w ranks busy (`ratrain.cost.sharing`), 1 when all are. Only the part of
an action's time that the cost model divides by the speed follows the rate; its fixed cost
per action (`ActionCost.fixed_s`) does not: at a constant rate r an action of time d and
fixed part x takes x + (d - x) / r, and while the rate changes it progresses at the
matching blend. A DP collective's CPU work added to the next compute action
(`ratrain.sim.simulate._charge_stolen_compute`) is compute and follows the rate.

Who is busy. The simulator replays one pipeline; the dp replicas are identical copies and
compute at the same moments. The ranks on a node (the cost model's rank layout,
`ratrain.cost.comm.rank_of`, and `Platform.sharing_units`) that compute at a moment are, summed over
the stages computing then, that stage's replicas on the node. Assumed for several nodes:
the busy count of a stage is that of the node holding its replica 0; every node holding a
replica of it is taken to hold the same stages, which is exact when nodes hold whole
pipelines or whole ranges of one pipeline's stages (the node size a multiple of pp or a
divisor of it), and with one node (cpu-local) trivially.

The links' load. Where a node's CPU does the network's work (the emulated network of
`ratrain emulate`: every packet through the shaped links is routed and queued by this
machine's kernel on the cores the ranks compute on), a byte carried between nodes takes
`Platform.link_cpu_s_per_byte` seconds of one rank's compute (measured by `ratrain
link-probe`: the ranks' burst of GEMMs alone and beside a flow). A transfer running at its
full rate then holds `NodeSharing.link_load` ranks' worth of compute on the cores of the
stage of each link it holds (half at each end: a SEND holds its sender's egress and its
receiver's ingress; a collective holds its own rank's two, as it sends and receives), times
its share of the links (`ratrain.schedule.linkshare`). That load is added to the busy count
the rates are read at, as a fraction of a rank: linear between the rows, and past the
node's w ranks the all-busy aggregate shared by all of it (w / busy). So a flow slows the
ranks that compute while it runs, and where cores sit idle it mostly takes theirs.

The engine: a running compute action keeps its remaining work and its rate; whenever the
set of stages computing changes, or the links' load does, the remaining work of every
running compute action whose rate changes is brought up to date and its completion
re-queued (a stale heap entry is skipped when popped: each action's valid entry is the
sequence number it was last pushed with). Rates are recomputed once all events of one
instant are processed, so the result does not depend on the order in which simultaneous
events are handled. Pure Python.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass

from ratrain.cost.comm import rank_of
from ratrain.cost.model import CostModel
from ratrain.cost.sharing import bursts, shared_speed, shares_cores
from ratrain.schedule.ir import Resource, Schedule
from ratrain.sim.engine import _Engine

__all__ = ["NodeSharing", "node_sharing", "run_shared"]


@dataclass(frozen=True)
class NodeSharing:
    """Who shares a stage's cores, and at what rate its compute then progresses."""

    neighbours: tuple[tuple[tuple[int, int], ...], ...]
    """Per stage s: (stage s', ranks of s' on the node of s's replica 0), for s' with any."""
    rates: tuple[tuple[tuple[float, ...], ...], ...]
    """Per stage, per burst of `bursts` (one row where the platform measured none): rate at b
    busy ranks on its node (index b, 0..w), relative to the cost model's all-busy speed (1
    at b = w)."""
    bursts: tuple[float, ...] = ()
    """The burst lengths (one thread's seconds of computing between waits) the rates were
    measured at, ascending; an action's rate is interpolated in log burst at its own one
    thread's duration, held at the ends. Empty: one row, whatever the action."""
    speed: float = 1.0
    """The cost model's all-busy speed: an action's one-thread seconds are its time at it
    times this (its fixed part aside)."""
    link_load: float = 0.0
    """Ranks' worth of compute that each link a transfer holds takes from the cores of that
    link's stage while the transfer runs at its full rate (half of
    `Platform.link_cpu_s_per_byte` x the link's payload bytes/s: a transfer holds its
    sender's egress and its receiver's ingress, and both ends' kernels do the work; a
    collective holds its own rank's two, sending and receiving); 0: transfers take none."""
    full_duplex: bool = True
    """How link ids name stages (`ratrain.cost.links.egress`): two per stage, else one."""


def node_sharing(cost: CostModel) -> NodeSharing | None:
    """The sharing of `cost`'s plan on its platform, or None where no rank's speed can
    change (no shared cores, or one rank per node): the engine's plain path."""
    platform, plan = cost.platform, cost.plan
    if not shares_cores(platform):
        return None
    pp, dp, upn = plan.pp, plan.dp, platform.sharing_units
    node = [[rank_of(s, r, pp, dp, cost.rank_layout) // upn for r in range(dp)] for s in range(pp)]
    tokens = plan.micro_batch * plan.seq
    neighbours, rates, ws = [], [], set()
    for s in range(pp):
        home = node[s][0]
        near = tuple((t, node[t].count(home)) for t in range(pp) if home in node[t])
        ws.add(sum(c for _, c in near))
        neighbours.append(near)
    # one burst set for the plan: every stage's node holds the same rank count here (the
    # module docstring's assumption for several nodes)
    at = bursts(platform, max(ws)) or (None,)
    for near in neighbours:
        w = sum(c for _, c in near)
        rates.append(
            tuple(
                tuple(
                    shared_speed(platform, w, max(b, 1), x, tokens) / cost.speed
                    for b in range(w + 1)
                )
                for x in at
            )
        )
    if all(len(r[0]) <= 2 for r in rates):  # one rank per node: always alone, rate fixed
        return None
    measured = tuple(x for x in at if x is not None)
    net = platform.inter_node
    load = 0.5 * platform.link_cpu_s_per_byte * net.bandwidth_bytes_per_s * net.efficiency
    return NodeSharing(
        tuple(neighbours), tuple(rates), measured, cost.speed, load, platform.link_full_duplex
    )


def _rate_at(row: tuple[float, ...], busy: float) -> float:
    """A rate row (index b: b of the node's w ranks busy) at `busy` ranks' worth of work,
    which the links' load makes fractional: linear between the rows; past w, the node's
    aggregate at w shared by all of it."""
    w = len(row) - 1
    if busy >= w:
        return row[w] * w / busy
    lo = int(busy)
    g = busy - lo
    return row[lo] if g == 0.0 else row[lo] * (1.0 - g) + row[lo + 1] * g


def _blend(sharing: NodeSharing, d: float, fixed: float) -> tuple[int, float]:
    """(j, g): an action of time d (fixed part `fixed`) runs at the rates of burst row j
    blended by g with row j + 1: its one thread's seconds interpolated in log burst among
    the measured bursts, held at the ends."""
    xs = sharing.bursts
    if len(xs) < 2:
        return 0, 0.0
    one = (d - fixed) * sharing.speed + fixed
    if one <= xs[0]:
        return 0, 0.0
    if one >= xs[-1]:
        return len(xs) - 1, 0.0
    j = bisect.bisect_right(xs, one) - 1
    return j, math.log(one / xs[j]) / math.log(xs[j + 1] / xs[j])


class _SharingEngine(_Engine):
    def __init__(
        self, schedule, durations, resources, fixed, sharing: NodeSharing, links=None
    ) -> None:
        super().__init__(schedule, durations, resources, links)
        n = len(durations)
        self.sharing = sharing
        # The share of each action's time that follows the rate (compute actions only).
        self.frac = [
            (d - x) / d if c and d > 0 else 0.0
            for d, x, c in zip(durations, fixed, self.compute, strict=True)
        ]
        self.blend = [_blend(sharing, d, x) for d, x in zip(durations, fixed, strict=True)]
        self.left = [0.0] * n  # remaining work, in seconds at rate 1
        self.rate = [0.0] * n  # current progress per second (0: not yet rated)
        self.since = [0.0] * n  # when `left` was last brought up to date
        self.valid = [-1] * n  # sequence number of the action's live heap entry
        self.running = [-1] * schedule.pp  # the compute action running on each stage
        self.dirty = False
        # the links' load on each stage's node, in ranks' worth of compute (`link_load`)
        self.net = [0.0] * schedule.pp

    def run(self) -> None:
        for s in range(self.schedule.pp):
            self._advance(s)
        self._share_links()
        self._rebalance()
        heap = self.heap
        while heap:
            t, seq, i = heapq.heappop(heap)
            if i < 0:  # a RECV's notice is out (`_Engine._notify`)
                self.now = t
                self._open(-i - 1)
            elif seq != self.valid[i]:
                continue  # superseded by a re-queue at a new rate
            else:
                self.now = t
                self.valid[i] = -1
                self._complete(i)
            while heap and heap[0][2] >= 0 and heap[0][1] != self.valid[heap[0][2]]:
                heapq.heappop(heap)
            if not heap or heap[0][0] > self.now:
                self._share_links()  # every event of this instant is in: links, then rates
                self._rebalance()
        self._check_done()

    def _start(self, i: int) -> None:
        self.start[i] = self.now
        if not self.compute[i]:
            if self.holds[i]:
                self.links.begin(i, self.now)  # its end queued by `_share_links`
            else:
                self._push(self.now + self.dur[i], i)
            return
        self.running[self.stage[i]] = i
        self.left[i], self.rate[i], self.since[i] = self.dur[i], 0.0, self.now
        self.dirty = True  # queued by the next rebalance, at the rate of the new busy set

    def _complete(self, i: int) -> None:
        if self.compute[i]:
            self.running[self.stage[i]] = -1
            self.dirty = True
        super()._complete(i)

    def _share_links(self) -> None:
        if not self.links.dirty:
            return
        self.links.rebalance(self.now)
        if self.sharing.link_load:
            self._link_loads()

    def _link_loads(self) -> None:
        """Each stage's node's load from the transfers running now: per link held, the
        link's stage's ranks on the node times `link_load` times the transfer's rate."""
        sh, links = self.sharing, self.links
        per = [0.0] * self.schedule.pp
        rate = links.rate
        for k, members in enumerate(links.members):
            if members:
                per[k // 2 if sh.full_duplex else k] += sum(rate[i] for i in members)
        net = [sh.link_load * sum(c * per[t] for t, c in near) for near in sh.neighbours]
        if net != self.net:
            self.net = net
            self.dirty = True

    def _rebalance(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        running, sh, net = self.running, self.sharing, self.net
        for s, i in enumerate(running):
            if i < 0:
                continue
            busy = sum(c for t, c in sh.neighbours[s] if running[t] >= 0)
            j, g = self.blend[i]
            rows = sh.rates[s]
            if net[s]:
                r = _rate_at(rows[j], busy + net[s])
                if g != 0.0:
                    r = r * (1 - g) + _rate_at(rows[j + 1], busy + net[s]) * g
            else:
                r = rows[j][busy] if g == 0.0 else rows[j][busy] * (1 - g) + rows[j + 1][busy] * g
            f = self.frac[i]
            rate = 1.0 if r == 1.0 else 1.0 / (f / r + 1.0 - f)  # exact when all are busy
            if rate == self.rate[i]:
                continue
            if self.rate[i]:
                self.left[i] = max(self.left[i] - (self.now - self.since[i]) * self.rate[i], 0.0)
            self.since[i], self.rate[i] = self.now, rate
            self._push(self.now + self.left[i] / rate, i)


def run_shared(
    schedule: Schedule,
    durations: list[float],
    resources: list[Resource],
    fixed: list[float],
    sharing: NodeSharing,
    links=None,
) -> tuple[list[float], list[float], list[float]]:
    """`ratrain.sim.engine.run_flat` under processor sharing: `fixed` is each action's part
    of its duration that does not follow the rate (`ActionCost.fixed_s`); `links` as
    there."""
    eng = _SharingEngine(schedule, durations, resources, fixed, sharing, links)
    eng.run()
    return eng.issue, eng.start, eng.end
