"""Links between nodes, with both ends: which link resources each action holds.

A transfer between nodes leaves through the sender's link and arrives through the
receiver's. Each rank's link to the other nodes is what a platform's `inter_node` figures
describe: the share of its node's link one rank gets when all the node's ranks
communicate at once (`ratrain.platforms.load`). Here each such link has two directions,
each its own resource where the link is full duplex (`Platform.link_full_duplex`, measured
by `ratrain link-probe`), and:

- a SEND between stages on different nodes holds the sender's egress and the receiver's
  ingress for its whole time, so a middle stage's receives from both neighbours (an
  activation from the stage before, a gradient from the stage after) queue on its one
  ingress;
- a DP collective whose group crosses nodes (GRAD_SYNC; VIEW_FETCH when it all-gathers)
  holds its stage's egress and ingress: every rank of a ring sends and receives at every
  step, so a DP sync and a pipeline transfer through the same rank's link contend;
- a transfer or collective within a node holds no link (its own path: the intra-node
  link, costed as before), nor does a receive (its send holds the link), nor a scalar
  global reduction (latency only);
- a transfer runs once both ends have posted it (`ratrain.schedule.rendezvous`): the
  receive's ready notice travels back to the sender. Where the platform's links hold a
  standing queue (`Platform.link_notice_queue_s` > 0, measured by `ratrain link-probe`),
  a receive between nodes names its stage's egress as the notice's way out
  (`LinkUse.notice`): the notice waits there until what runs on it drains, at most the
  standing queue (`LinkUse.queue_s`; `ratrain.schedule.rendezvous.notice_wait_s`).

The simulator replays one pipeline, replica 0: the links named are its ranks', stage s's
`egress(s)` and `ingress(s)`; every other replica's ranks hold their own links the same
way at the same moments (the replicas are identical), which the per-rank share already
accounts for. An action's time alone is its cost model's time (`ratrain.cost.comm`); the
actions running on one direction at once share it fairly, each slowed by the most actions
on any link it holds (`ratrain.schedule.linkshare`, as `ratrain link-probe` measured TCP
flows through one shaped link). The event engines (`ratrain.sim.flat`, `ratrain.sim.engine`)
and the schedule checker's dry run (`ratrain.schedule.check`) take the same per-action link
tuples and follow that one rule.

Approximations, said where they are made: a hierarchical collective holds the links for
its whole time, though only its inter-node phase crosses them; a collective holds only
its own rank's link, not the other members' (theirs are the other replicas'). Pure Python.
"""

from __future__ import annotations

from typing import NamedTuple

from ratrain.cost import comm
from ratrain.schedule.ir import Action, Op

__all__ = ["LinkUse", "link_use", "crosses_nodes", "egress", "ingress"]


class LinkUse(NamedTuple):
    """Per action, the link ids it holds (an empty tuple: none); the number of links; per
    action, the links a receive's ready notice waits on (empty: none), or None where no
    notice waits; and the standing queue's seconds a notice waits behind (see above)."""

    holds: list[tuple[int, ...]]
    count: int
    notice: list[tuple[int, ...]] | None = None
    queue_s: float = 0.0


def egress(stage: int, full_duplex: bool = True) -> int:
    """The link id of stage `stage`'s (replica 0's rank's) outbound direction."""
    return 2 * stage if full_duplex else stage


def ingress(stage: int, full_duplex: bool = True) -> int:
    """The link id of its inbound direction (the same resource when not full duplex)."""
    return 2 * stage + 1 if full_duplex else stage


def _crosses(stage: int, peer: int, cost) -> bool:
    p = cost.plan
    link = comm.p2p_link(stage, peer, p.pp, p.dp, cost.platform, cost.rank_layout)
    return link is cost.platform.inter_node


def _collective_links(cost, fd: bool) -> dict[tuple, tuple[int, ...]]:
    """(op, stage) -> the links a DP collective of that op on that stage holds."""
    p, plat = cost.plan, cost.platform
    out: dict[tuple, tuple[int, ...]] = {}
    for s in range(p.pp):
        g = comm.dp_group(s, p.pp, p.dp, plat.units_per_node, cost.rank_layout)
        if g.n > 1 and g.nodes > 1:
            mine = (egress(s, fd), ingress(s, fd)) if fd else (egress(s, fd),)
            out[(Op.GRAD_SYNC, s)] = mine
            if cost.view_all_gather():
                out[(Op.VIEW_FETCH, s)] = mine
    return out


def crosses_nodes(cost) -> bool:
    """Whether any link is held under `cost`'s plan: some pair of neighbouring stages or
    some stage's DP group spans nodes. False: `link_use` is None whatever the schedule."""
    p = cost.plan
    if any(_crosses(s, s + 1, cost) for s in range(p.pp - 1)):
        return True
    return bool(_collective_links(cost, True))


def link_use(cost, acts: list[Action], peers: list[int]) -> LinkUse | None:
    """The links each of `acts` holds under `cost` (a `CostModel`: its plan, platform and
    rank layout), or None when none holds any (every transfer within a node): the engine's
    plain path. `peers[i]`: the stage of the receive matching send i, or of the send
    matching receive i (-1 for any other action); a V pipeline sends its second chunk's
    activations backwards."""
    fd = cost.platform.link_full_duplex
    queue_s = cost.platform.link_notice_queue_s
    queues = queue_s > 0
    coll = _collective_links(cost, fd)
    cross: dict[tuple[int, int], bool] = {}
    none: tuple[int, ...] = ()
    holds, notice = [], []
    for a, t in zip(acts, peers, strict=True):
        s = a.stage
        if t < 0:  # no transfer: a DP collective's links, if any
            holds.append(coll.get((a.op, s), none) if coll else none)
            notice.append(none)
            continue
        crossing = False
        if t != s:
            crossing = cross.get((s, t))
            if crossing is None:
                crossing = cross[s, t] = _crosses(s, t, cost)
        if a.op in _RECVS:
            holds.append(none)
            notice.append((egress(s, fd),) if crossing and queues else none)
        else:
            holds.append(((egress(s, fd), ingress(t, fd)) if fd else (s, t)) if crossing else none)
            notice.append(none)
    if not any(holds):
        return None
    count = 2 * cost.plan.pp if fd else cost.plan.pp
    return LinkUse(holds, count, notice if queues else None, queue_s)


_RECVS = (Op.RECV_F, Op.RECV_B)
