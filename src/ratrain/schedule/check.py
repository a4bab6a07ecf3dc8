"""Validity checks of a schedule: structure, pairing, lifetimes, gradients, and a dry run.

Pure Python (no torch). `check_schedule` raises `ScheduleError` listing every problem
found; `find_problems` returns them. The checks:

- structure: one list per stage, each action on its own stage, no duplicates, every
  dependency present in the schedule, microbatches in range;
- compute: every (unit, mb) of a stage has exactly one F and either one B or one B_IN and
  one B_W (a split backward, `ratrain.schedule.zerobubble`), the F first;
- transfers: every SEND paired with exactly one RECV on the stage across its boundary (same mb and
  unit) that depends on it, and every RECV with its SEND;
- lifetimes, walking each stage's list in program order: a view is read only while live
  (persistent views are live from the start; VIEW_DROP ends a view), and a read after
  an asynchronous VIEW_FETCH depends on it; an activation is used only after its F,
  before its B, on the device (not offloaded without a RELOAD the use depends on), and a
  B whose unit recomputes has its RECOMPUTE; of a split backward, B_IN(u, mb) is the B
  above (it needs the RECOMPUTE) and B_W(u, mb) comes after it on the same stage (what
  B_IN kept for it), depending on it;
- gradients: each unit synced exactly once after all its B (its last B_W when split: the
  gradient exists from the first B_W), updated exactly once after
  its sync (a dependency, directly or through the global checks), waiting for every
  global check the plan needs, and never read by F/B/RECOMPUTE after its update;
- a forward-only schedule (``meta["forward_only"]``, `ratrain.schedule.eval`): one F per
  (unit, mb) of its own ``meta["microbatches"]``, and no action but F, SEND_F, RECV_F,
  VIEW_FETCH and VIEW_DROP (the lifetimes checked as above);
- a dry run in the execution semantics of `ratrain.schedule.ir` with unit durations
  (`dry_run`), which reports the stuck actions of a deadlock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.schedule.eval import FORWARD_OPS
from ratrain.schedule.ir import WEIGHT_VISIT, Action, Op, Resource, Schedule, format_action
from ratrain.schedule.linkshare import LinkShare
from ratrain.schedule.passes import global_checks, reads_view
from ratrain.schedule.rendezvous import notice_wait_s, p2p_queue, sends_recvs

__all__ = ["ScheduleError", "check_schedule", "find_problems", "dry_run"]

_SHOWN = 8  # problems spelled out in the error message
_GLOBAL = (Op.GRAD_NORM, Op.OVERFLOW)
_READS_UNIT = (Op.F, Op.B, Op.B_IN, Op.B_W, Op.RECOMPUTE)  # none may follow the UPDATE


class ScheduleError(RatrainError):
    """A schedule that would compute the wrong thing or hang; `.problems` lists why."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        shown = "; ".join(problems[:_SHOWN])
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        super().__init__(f"invalid schedule, {len(problems)} problem(s): {shown}{more}")


def check_schedule(schedule: Schedule, spec: ModelSpec, plan: Plan) -> None:
    problems = find_problems(schedule, spec, plan)
    if problems:
        raise ScheduleError(problems)


def find_problems(schedule: Schedule, spec: ModelSpec, plan: Plan) -> list[str]:
    forward_only = bool(schedule.meta.get("forward_only"))
    if forward_only:  # an evaluation (`ratrain.schedule.eval`): its own microbatch count
        m = schedule.meta.get("microbatches", plan.microbatches)
        plan = plan.replace(global_batch=plan.dp * plan.micro_batch * m)
    problems = _placement(schedule, plan)
    if problems:
        return problems  # actions out of place: the other checks would misread them
    problems += _missing_deps(schedule)
    problems += _compute(schedule, spec, plan, (Op.F,) if forward_only else (Op.F, Op.B))
    problems += _transfers(schedule)
    problems += _lifetimes(schedule, spec, plan)
    if forward_only:
        problems += _forward_only(schedule)
    else:
        problems += _gradients(schedule, spec, plan)
    if not problems:  # the dry run needs every dependency present
        try:
            dry_run(schedule)
        except ScheduleError as e:
            problems += e.problems
    return problems


def _f(a: Action) -> str:
    return format_action(a)


def _placement(sch: Schedule, plan: Plan) -> list[str]:
    if sch.pp != plan.pp:
        return [f"{sch.pp} stage lists for pp={plan.pp}"]
    seen: Counter[Action] = Counter(sch.actions())
    out = [f"{_f(a)} appears {n} times" for a, n in seen.items() if n > 1]
    m = plan.microbatches
    for s, acts in enumerate(sch.stages):
        for a in acts:
            if a.stage != s:
                out.append(f"{_f(a)} is in stage {s}'s list")
            if a.mb is not None and not 0 <= a.mb < m:
                out.append(f"{_f(a)}: microbatch out of range 0..{m - 1}")
    return out


def _missing_deps(sch: Schedule) -> list[str]:
    present = set(sch.actions())
    out = []
    for a, deps in sch.deps.items():
        if a in present:  # deps of actions a lowering dropped are harmless
            out += [
                f"{_f(a)} depends on {_f(d)}, which is not in the schedule"
                for d in deps
                if d not in present
            ]
    return out


def _compute(sch: Schedule, spec: ModelSpec, plan: Plan, ops=(Op.F, Op.B)) -> list[str]:
    out = []
    m = plan.microbatches
    for s, acts in enumerate(sch.stages):
        units = set(plan.stage_units(spec, s))
        for a in acts:
            if a.op not in _GLOBAL and a.op not in (Op.RECV_F, Op.RECV_B, Op.SEND_F, Op.SEND_B):
                if not set(a.units) <= units or not a.units:
                    out.append(
                        f"{_f(a)} touches units outside stage {s}'s {min(units)}..{max(units)}"
                    )
        split = Op.B in ops and any(a.op is Op.B_IN or a.op is Op.B_W for a in acts)
        for op in ops:
            if split and op is Op.B:
                out += _split_backward(s, acts, units, m)
                continue
            n = Counter((a.unit, a.mb) for a in acts if a.op is op and len(a.units) == 1)
            for u in sorted(units):
                for mb in range(m):
                    if n[(u, mb)] != 1:
                        out.append(f"stage {s} has {n[(u, mb)]} {op.value}({u}, {mb}), expected 1")
    return out


def _split_backward(s: int, acts: list[Action], units: set[int], m: int) -> list[str]:
    """A stage with a split backward: per (unit, mb) exactly one B, or one B_IN and one
    B_W (and no B)."""
    n = {
        op: Counter((a.unit, a.mb) for a in acts if a.op is op and len(a.units) == 1)
        for op in (Op.B, Op.B_IN, Op.B_W)
    }
    out = []
    for u in sorted(units):
        for mb in range(m):
            b, bi, bw = (n[op][(u, mb)] for op in (Op.B, Op.B_IN, Op.B_W))
            if (b, bi, bw) not in ((1, 0, 0), (0, 1, 1)):
                out.append(
                    f"stage {s} has {b} B, {bi} BI and {bw} BW of ({u}, {mb}), "
                    "expected one B or one BI and one BW"
                )
    return out


def _transfers(sch: Schedule) -> list[str]:
    """Every send has its receive, on the stage that owns the unit on the other side of
    the boundary (the unit after a SEND_F's, before a SEND_B's: the next or previous stage,
    or in a V the stage of the other chunk), and the receive depends on it."""
    out = []
    owner = {u: s for s, us in enumerate(sch.meta.get("stage_units", ())) for u in us}

    def peer(a: Action, unit: int, step: int) -> int:
        return owner.get(unit, a.stage + step)

    all_acts = set(sch.actions())
    for a in all_acts:
        if a.op is Op.SEND_F or a.op is Op.SEND_B:
            fwd = a.op is Op.SEND_F
            op = Op.RECV_F if fwd else Op.RECV_B
            r = Action(op, peer(a, a.unit + (1 if fwd else -1), 1 if fwd else -1), a.units, a.mb)
            if r not in all_acts:
                out.append(f"{_f(a)} has no matching {_f(r)}")
            elif a not in sch.deps_of(r):
                out.append(f"{_f(r)} does not depend on its {_f(a)}")
        elif a.op is Op.RECV_F or a.op is Op.RECV_B:
            fwd = a.op is Op.RECV_F
            op = Op.SEND_F if fwd else Op.SEND_B
            snd = Action(op, peer(a, a.unit, -1 if fwd else 1), a.units, a.mb)
            if snd not in all_acts:
                out.append(f"{_f(a)} has no matching {_f(snd)}")
    return sorted(out)


def _lifetimes(sch: Schedule, spec: ModelSpec, plan: Plan) -> list[str]:
    out = []
    for s, acts in enumerate(sch.stages):
        out += _view_lifetimes(sch, s, acts)
        out += _activation_lifetimes(sch, spec, plan, s, acts)
    return out


def _view_lifetimes(sch: Schedule, s: int, acts: list[Action]) -> list[str]:
    if sch.meta.get("view_fetch") is None:
        return []  # the view is the master: always live
    out = []
    persistent = sch.meta.get("view_policy", "persistent") == "persistent"
    live = set(sch.meta["stage_units"][s]) if persistent else set()
    dropped: set[int] = set()
    pending: dict[int, Action] = {}
    for a in acts:
        if a.op is Op.VIEW_FETCH:
            live |= set(a.units)
            pending.update({u: a for u in a.units})
        elif a.op is Op.VIEW_DROP:
            out += [f"{_f(a)} drops a view that is not live" for u in a.units if u not in live]
            live -= set(a.units)
            dropped |= set(a.units)
        elif reads_view(a):
            u = a.unit
            if u not in live:
                why = "after its VIEW_DROP" if u in dropped else "without a VIEW_FETCH"
                out.append(f"{_f(a)} reads the view of unit {u} {why}")
            elif u in pending:
                vf = pending.pop(u)
                if vf not in sch.deps_of(a):
                    out.append(f"{_f(a)} reads unit {u}'s view without depending on {_f(vf)}")
    return out


def _activation_lifetimes(sch, spec, plan, s: int, acts: list[Action]) -> list[str]:
    out = []
    f_at = {(a.unit, a.mb): i for i, a in enumerate(acts) if a.op is Op.F}
    state: dict[tuple[int, int], str] = {}  # "device" | "host" | "freed"
    recomputed: set[tuple[int, int]] = set()
    reloads: dict[tuple[int, int], Action] = {}
    for i, a in enumerate(acts):
        if a.op not in (Op.F, Op.B, Op.B_IN, Op.B_W, Op.RECOMPUTE, Op.OFFLOAD, Op.RELOAD):
            continue
        key = (a.unit, a.mb)
        st = state.get(key)
        if a.op is Op.F:
            if st is not None:
                out.append(f"{_f(a)} runs again")
            state[key] = "device"
            continue
        if a.op is Op.B_W:  # needs what its B_IN kept, on this stage, before
            if st == "weight-host":
                out.append(f"{_f(a)} reads what its B_IN kept, offloaded, without a RELOAD")
            elif st != "weight":
                out.append(f"{_f(a)} before its B_IN" if st != "freed" else f"{_f(a)} runs again")
            elif Action(Op.B_IN, s, a.units, a.mb) not in sch.deps_of(a):
                out.append(f"{_f(a)} does not depend on its B_IN")
            if key in reloads and reloads.pop(key) not in sch.deps_of(a):
                out.append(f"{_f(a)} does not depend on the RELOAD of what its B_IN kept")
            state[key] = "freed"
            continue
        if st in ("weight", "weight-host"):  # between B_IN and B_W: only moves, visit #1
            moves = {"weight": (Op.OFFLOAD, "weight-host"), "weight-host": (Op.RELOAD, "weight")}
            op, then = moves[st]
            if a.op is op and a.visit == WEIGHT_VISIT:
                state[key] = then
                if op is Op.RELOAD:
                    reloads[key] = a
            elif a.op in (Op.OFFLOAD, Op.RELOAD):
                out.append(f"{_f(a)} moves what B_IN kept for B_W: expected {op.name}#1")
            else:
                out.append(f"{_f(a)} uses activations its B_IN already freed")
            continue
        if a.op in (Op.OFFLOAD, Op.RELOAD) and a.visit != 0:
            out.append(f"{_f(a)} moves activations before their B_IN: expected visit 0")
        if st is None:
            when = "before its F" if f_at.get(key, -1) > i else "without its F"
            out.append(f"{_f(a)} {when}")
            continue
        if st == "freed":
            out.append(f"{_f(a)} uses activations its B already freed")
            continue
        if a.op is Op.OFFLOAD:
            state[key] = "host"
        elif a.op is Op.RELOAD:
            if st != "host":
                out.append(f"{_f(a)} reloads activations that were not offloaded")
            state[key] = "device"
            reloads[key] = a
        else:  # RECOMPUTE or B: reads the activations on the device
            if st == "host":
                out.append(f"{_f(a)} reads offloaded activations without a RELOAD")
            if key in reloads:
                rel = reloads.pop(key)
                if rel not in sch.deps_of(a):
                    out.append(f"{_f(a)} does not depend on {_f(rel)}")
            if a.op is Op.RECOMPUTE:
                recomputed.add(key)
            else:
                policy = plan.recompute_of(spec, s, a.unit)
                if policy != "none" and key not in recomputed:
                    out.append(f"{_f(a)} needs a RECOMPUTE (policy {policy})")
                state[key] = "weight" if a.op is Op.B_IN else "freed"
    return out


def _forward_only(sch: Schedule) -> list[str]:
    """A forward-only schedule holds forward passes and view fetches/drops, nothing else."""
    return [
        f"{_f(a)} in a forward-only schedule (F, SEND_F, RECV_F, VF and VD only)"
        for a in sch.actions()
        if a.op not in FORWARD_OPS
    ]


def _reaches(sch: Schedule, a: Action, target: Action) -> bool:
    """Whether `a` depends on `target` directly or through global checks / syncs."""
    stack, seen = [a], set()
    while stack:
        x = stack.pop()
        for d in sch.deps_of(x):
            if d == target:
                return True
            if d not in seen and d.op in (*_GLOBAL, Op.GRAD_SYNC):
                seen.add(d)
                stack.append(d)
    return False


def _gradients(sch: Schedule, spec: ModelSpec, plan: Plan) -> list[str]:
    out = []
    needed = global_checks(plan)
    for s, acts in enumerate(sch.stages):
        last_b: dict[int, int] = {}
        syncs: dict[int, list[tuple[int, Action]]] = {}
        updates: dict[int, list[tuple[int, Action]]] = {}
        checks = [a for a in acts if a.op in _GLOBAL]
        for i, a in enumerate(acts):
            if a.op is Op.B or a.op is Op.B_W:  # what adds to the unit's gradient
                last_b[a.unit] = i
            elif a.op is Op.GRAD_SYNC:
                for u in a.units:
                    syncs.setdefault(u, []).append((i, a))
            elif a.op is Op.UPDATE:
                for u in a.units:
                    updates.setdefault(u, []).append((i, a))
        for op in needed:
            n = sum(a.op is op for a in checks)
            if n != 1:
                out.append(f"stage {s} has {n} {op.value}, expected 1 (the plan needs it)")
        updated_at = {}
        for u in plan.stage_units(spec, s):
            su, up = syncs.get(u, []), updates.get(u, [])
            if len(su) != 1:
                out.append(f"stage {s}: unit {u} synced {len(su)} times, expected once")
            if len(up) != 1:
                out.append(f"stage {s}: unit {u} updated {len(up)} times, expected once")
            if len(su) == 1 and su[0][0] < last_b.get(u, -1):
                last = acts[last_b[u]].op.value
                out.append(f"{_f(su[0][1])} is issued before the last {last} of unit {u}")
            if len(su) == 1 and len(up) == 1:
                (i_s, sync), (i_u, upd) = su[0], up[0]
                if i_u < i_s or not _reaches(sch, upd, sync):
                    out.append(f"{_f(upd)} does not wait for {_f(sync)}")
            if up:
                updated_at[u] = up[0][0]
        for upd in {a for lst in updates.values() for _, a in lst}:
            out += [
                f"{_f(upd)} does not wait for {_f(g)}"
                for g in checks
                if g.op in needed and g not in sch.deps_of(upd)
            ]
        for i, a in enumerate(acts):
            if a.op in _READS_UNIT and i > updated_at.get(a.unit, len(acts)):
                out.append(f"{_f(a)} reads unit {a.unit} after its UPDATE")
    return out


def dry_run(sch: Schedule, duration=None, links=None, notice=None, queue_s=0.0) -> int:
    """Execute the schedule in the semantics of `ratrain.schedule.ir` with unit durations
    (VIEW_DROP takes 0). Returns the step's length in those units; raises `ScheduleError`
    naming the stuck actions if it deadlocks.

    `links` (action -> the ids of the links between nodes it holds, `ratrain.cost.links`):
    those actions share their links fairly (`ratrain.schedule.linkshare`, the simulator's
    rule); the length may then be fractional. A SEND is queued only once its RECV is
    issued, and transfers queue per peer (`ratrain.schedule.rendezvous`, the simulator's
    rule); `notice` (a RECV -> the link ids its ready notice waits on, `LinkUse.notice`):
    its SEND is queued `notice_wait_s` after the RECV's issue (what runs there drains,
    `queue_s` at most)."""
    dur = duration or (lambda a: 0 if a.resource is Resource.NONE else 1)
    acts_all = [a for st in sch.stages for a in st]
    gid = {a: i for i, a in enumerate(acts_all)} if links else {}
    stage_of = [s for s, st in enumerate(sch.stages) for _ in st]
    holds = [tuple(links.get(a, ())) for a in acts_all] if links else []
    count = 1 + max((k for h in holds for k in h), default=-1)
    pp = sch.pp
    remaining: dict[Action, int] = {}
    dependents: dict[Action, list[Action]] = {}
    for a in sch.actions():
        deps = sch.deps_of(a)
        remaining[a] = len(deps)
        for d in deps:
            dependents.setdefault(d, []).append(a)
    first = list(itertools.accumulate((len(st) for st in sch.stages), initial=0))
    gate: dict[Action, Action] = {}  # a RECV -> its SEND, queued once both are issued
    key_of: dict[Action, tuple | None] = {}  # a transfer's queue (a RECV's: none)
    recv_of: dict[Action, Action] = {}
    for i, j in sends_recvs(sch, first):
        send, recv = acts_all[i], acts_all[j]
        gate[recv], recv_of[send] = send, recv
        key_of[send] = p2p_queue(stage_of[i], stage_of[j])
        key_of[recv] = None
    issued: set[Action] = set()
    recv_waits: list[list[Action]] = [[] for _ in range(pp)]  # issued RECVs, not yet started

    def enqueue(s: int, a: Action) -> None:
        queues[s].setdefault(key_of.get(a, a.resource), deque()).append(a)

    opened: set[Action] = set()  # RECVs whose notice is out

    def open_(recv: Action) -> None:
        opened.add(recv)
        send = gate[recv]
        if send in issued:
            enqueue(key_of[send][1], send)

    def notify(recv: Action) -> None:
        nonlocal seq
        links_of = notice.get(recv, ()) if notice else ()
        wait = notice_wait_s(share, links_of, t, queue_s)
        if wait > 0:  # an event of stage -1: the notice is out
            seq += 1
            heapq.heappush(events, (t + wait, seq, -1, recv))
        else:
            open_(recv)

    n_global = Counter(a.op for a in remaining if a.op in _GLOBAL)
    pc = [0] * pp
    running: list[Action | None] = [None] * pp  # compute action in progress
    queues: list[dict] = [{} for _ in range(pp)]  # per stage, by Resource or transfer queue
    busy: list[dict] = [{} for _ in range(pp)]
    ready: dict[Op, set[int]] = {op: set() for op in _GLOBAL}
    events: list[tuple[int, int, int, Action]] = []  # (time, seq, stage, action)
    t, seq = 0, 0
    completed: set[Action] = set()

    def push(at, i: int) -> int:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, stage_of[i], acts_all[i]))
        return seq

    share = LinkShare(holds, count, [dur(a) for a in acts_all] if links else [], push)

    def start(s: int, a: Action) -> None:
        nonlocal seq
        i = gid.get(a)
        if i is not None and holds[i]:
            share.begin(i, t)  # its end queued by the instant's rebalance
            return
        seq += 1
        heapq.heappush(events, (t + dur(a), seq, s, a))

    def stale(entry) -> bool:
        i = gid.get(entry[3])
        return i is not None and share.stale(i, entry[1])

    def scan(s: int) -> bool:
        """Start what stage s's queues can start now; whether anything started."""
        started = False
        for r, q in queues[s].items():
            if busy[s].get(r) is not None or not q or remaining[q[0]]:
                continue
            a = q[0]
            if a.op in _GLOBAL:
                ready[a.op].add(s)
                if len(ready[a.op]) < n_global[a.op]:
                    continue
                for s2 in ready.pop(a.op):  # the whole collective starts at once
                    g = queues[s2][r].popleft()
                    busy[s2][r] = g
                    start(s2, g)
                ready[a.op] = set()
            else:
                q.popleft()
                busy[s][r] = a
                start(s, a)
            started = True
        return started

    while True:
        progressed = True
        while progressed:
            progressed = False
            for s in range(pp):
                acts = sch.stages[s]
                while running[s] is None and pc[s] < len(acts):
                    a = acts[pc[s]]
                    if a.resource is Resource.COMPUTE:
                        if remaining[a] == 0:
                            running[s] = a
                            start(s, a)
                            pc[s] += 1
                            progressed = True
                        break
                    issued.add(a)
                    if a in gate:  # a RECV: no queue; its notice goes to its SEND
                        recv_waits[s].append(a)
                        scan(s)  # what the walk queued before it is running (the engines')
                        notify(a)
                    elif a not in recv_of or recv_of[a] in opened:
                        enqueue(s, a)
                    pc[s] += 1
                    progressed = True
                for a in [r for r in recv_waits[s] if not remaining[r]]:
                    recv_waits[s].remove(a)
                    start(s, a)
                    progressed = True
                progressed = scan(s) or progressed
        while events and stale(events[0]):
            heapq.heappop(events)
        if share.dirty and (not events or events[0][0] > t):
            share.rebalance(t)  # every event of this instant is in
            continue
        if not events:
            break
        t = events[0][0]
        while events and events[0][0] == t:
            entry = heapq.heappop(events)
            if stale(entry):
                continue
            _, _, s, a = entry
            if s < 0:  # a RECV's notice is out
                open_(a)
                continue
            completed.add(a)
            if a.resource is Resource.COMPUTE:
                running[s] = None
            else:
                busy[s][key_of.get(a, a.resource)] = None
                if gid.get(a) is not None and holds[gid[a]]:
                    share.finish(gid[a])
            for b in dependents.get(a, ()):
                remaining[b] -= 1
    if len(completed) < len(remaining):
        raise ScheduleError(_stuck(sch, completed, pc, queues, t))
    return t


def _stuck(sch: Schedule, completed: set[Action], pc: list[int], queues, t: int) -> list[str]:
    def waits(a: Action) -> str:
        deps = [_f(d) for d in sch.deps_of(a) if d not in completed]
        return ", ".join(deps) or "the other stages to join the collective"

    out = [f"deadlock at t={t}"]
    for s, acts in enumerate(sch.stages):
        if pc[s] < len(acts) and acts[pc[s]].resource is Resource.COMPUTE:
            out.append(f"stage {s} waits at {_f(acts[pc[s]])} for {waits(acts[pc[s]])}")
        for r, q in queues[s].items():
            if q:
                out.append(
                    f"stage {s} {_queue_name(r)} queue stuck at {_f(q[0])}, "
                    f"waiting for {waits(q[0])}"
                )
    return out


def _queue_name(key) -> str:
    """A dry-run queue's name: its resource, or a transfer queue's peer and direction."""
    if isinstance(key, Resource):
        return key.value
    _, peer, send = key
    return f"{'send to' if send else 'receive from'} stage {peer}"
