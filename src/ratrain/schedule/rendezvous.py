"""When a transfer between stages runs: once both ends have posted it. One rule, read by
the simulator's engines (`ratrain.sim.flat`, `ratrain.sim.engine` and the
processor-sharing engine built on it) and the schedule checker's dry run
(`ratrain.schedule.check.dry_run`).

The runtime's SEND and RECV are an isend and an irecv (`ratrain.runtime.comm`), issued
when the stage's walk reaches them. The bytes do not move when the sender posts its
isend: gloo's send waits for the receiver to post the matching buffer, and NCCL's
point-to-point kernels run when both ranks have launched them. Measured on the emulated
network (2 nodes, 50 Mbit/s, 128 KiB, `docs/validation.md`, "A transfer runs once both
ends have posted it"): a receive posted 10, 30 or 60 ms after its send completed 30, 50
and 80 ms after the send was posted, the receive's posting plus the message's 20 ms on
the link, every time.

So, for every SEND and its RECV (`sends_recvs`: the same unit and microbatch):

- the SEND enters its queue once it and its RECV have both been issued (the receiving
  stage's walk has reached the RECV), starts once it is at the queue's head with its deps
  done, and holds the links for the transfer's time (`ratrain.cost.links`,
  `ratrain.schedule.linkshare`);
- the RECV queues for nothing: it completes when its SEND does (it depends on it), once
  issued, taking no time of its own.

The notice. A receive's ready notice travels back to the sender, out through the
receiver's own link, behind the bytes the receiver's sends have already queued there:
measured on the emulated network (4 nodes, 50 Mbit/s, `ratrain link-probe`'s `notice`
case), a receive posted right after its node's 128 KiB send waited 0.91 of that send's
time longer, and one posted into a long flow 18.5 ms longer, the link's standing queue
(TCP keeps about that much in it). So where the platform's links hold a standing queue
(`Platform.link_notice_queue_s`, `LinkUse.notice` naming the receiver's egress), the
SEND is queued `notice_wait_s` after its RECV's issue: the time the actions running on
that egress need to end, at their current rates, at most the standing queue.

Queues. A stage's sends to one peer queue in order (`p2p_queue`): one connection carries
them. A send whose receive is not yet posted holds up nothing (gloo and NCCL match each
message on its own tag), and receives wait for no queue (an irecv runs beside an isend).
With one queue for all of a stage's transfers, a send waiting for its peer's receive
would hold up the stage's other transfers, a wait the runtime does not have, and a V
order that runs would deadlock.

Where the lowerings place them. A stage's walk reaches a pass's RECV just after the
previous pass's SEND: posted in that order, the receive's notice would queue behind the
send's bytes on the stage's own link, and the transfer into the stage would start a whole
transfer late. `post_receives_first` moves each RECV ahead of the SENDs just before it
(the same instant of the walk: nothing else moves), as Megatron-LM posts a pipeline's
send and receive together (`send_forward_recv_backward`). Posted there, a receive still
arrives only after the pass before its own has ended: where the sender ran ahead (a
zero-bubble order's first stages, a stage whose neighbour waits on a slow link), the
transfer then lies on the receiver's critical path. `post_receives_ahead` posts each
receive where the one before it was, one receive ahead, so the transfer overlaps the pass
before; its buffer is held from that moment, one more boundary buffer per stage at most.
Measured on the emulated cluster against receives first (`docs/validation.md`, "Receives
one ahead"): 4 stages at 50 Mbit/s, 1F1B 7%, zb-h1 9% and zb-h2 15% faster; 2x2 dp-inner
at 100 and 50 Mbit/s 6% and 4%.

Pure Python.
"""

from __future__ import annotations

from ratrain.errors import RatrainError
from ratrain.schedule.ir import Op, Schedule

__all__ = [
    "SENDS",
    "sends_recvs",
    "p2p_queue",
    "issue_gates",
    "unposted_sends",
    "post_receives_first",
    "post_receives_ahead",
    "notice_wait_s",
]

_PAIRS = ((Op.SEND_F, Op.RECV_F), (Op.SEND_B, Op.RECV_B))


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


def p2p_queue(stage: int, peer: int) -> tuple[str, int, int]:
    """The queue of `stage`'s sends to `peer` (one connection): a SEND enters it once it and
    its RECV have both been issued."""
    return ("p2p", stage, peer)


def notice_wait_s(share, links, now: float, queue_s: float) -> float:
    """How long a RECV issued `now` waits for its notice to leave through `links`
    (`LinkUse.notice`): what runs there drains (`LinkShare.drain_s`), `queue_s` at most."""
    if not links or queue_s <= 0:
        return 0.0
    return min(share.drain_s(links, now), queue_s)


def unposted_sends(gate: list[int]) -> list:
    """The engines' start state of each action (`gate` from `issue_gates`): None for a SEND
    (its RECV's notice not yet out; an engine sets True when the SEND is issued first, to
    queue it at the notice, and False once the notice is out), False for any other."""
    held: list = [False] * len(gate)
    for m in gate:
        if m >= 0:
            held[m] = None
    return held


def issue_gates(pairs, n: int) -> list[int]:
    """Per action id (`n` of them), the id of the SEND that waits for it to be issued (its
    RECV's), or -1. `pairs`: (send id, recv id)."""
    gate = [-1] * n
    for i, j in pairs:
        gate[j] = i
    return gate


SENDS = (Op.SEND_F, Op.SEND_B)
"""The ops of a transfer's sending end (each queued on its peer's `p2p_queue`)."""
_RECVS = (Op.RECV_F, Op.RECV_B)


def post_receives_first(schedule: Schedule) -> Schedule:
    """Each RECV moved ahead of the SENDs directly before it in its stage's list (in
    place; returns `schedule`). A RECV depends on nothing of its own stage, and the SENDs
    it passes are issued at the same instant of the walk, so no dependency or memory
    moment changes but the receive buffer's, which is taken one transfer's issue sooner."""
    for s, acts in enumerate(schedule.stages):
        if not any(a.op in _RECVS for a in acts):
            continue
        out: list = []
        for a in acts:
            if a.op in _RECVS:
                k = len(out)
                while k and out[k - 1].op in SENDS:
                    k -= 1
                out.insert(k, a)
            else:
                out.append(a)
        schedule.stages[s] = out
    return schedule


def post_receives_ahead(schedule: Schedule) -> Schedule:
    """Each stage's k-th RECV moved to where its (k-1)-th was (in place; returns
    `schedule`); the first stays, the second joins it. Run after `post_receives_first`.
    A receive is then posted while the pass before the one that needs it runs, so its
    transfer can overlap that pass. Its buffer is held from one receive earlier: between
    two of the old places only the moved receive is new, so one more boundary buffer at
    most, which the ledger counts where it walks the RECV (and the runtime allocates it
    there). The RECVs keep their order; nothing else moves."""
    for s, acts in enumerate(schedule.stages):
        at = [i for i, a in enumerate(acts) if a.op in _RECVS]
        if len(at) < 2:
            continue
        slot = {at[k - 1]: acts[at[k]] for k in range(1, len(at))}
        out: list = []
        for i, a in enumerate(acts):
            if a.op not in _RECVS or i == at[0]:
                out.append(a)
            if i in slot:
                out.append(slot[i])
        schedule.stages[s] = out
    return schedule
