"""How actions share the links between nodes they hold: one rule, read by the simulator's
engines (`ratrain.sim.flat`, `ratrain.sim.engine`) and the schedule checker's dry run
(`ratrain.schedule.check.dry_run`). Which links an action holds is the cost model's
(`ratrain.cost.links`); here a link is an integer id.

An action that holds links starts as any other (its queue free, its deps done) and
progresses at 1/n of its full rate, n the most actions running at once on any link it
holds: a fair share, as `ratrain link-probe` measured TCP flows through one shaped link
(two flows into one node, or a flow beside an all-reduce, both slowed alike). Its
duration is its time alone. Whenever the set of running actions changes, once every event
of that instant is in (`rebalance`, in order of id, so the result does not depend on the
order simultaneous events are handled), each running action whose rate changes has its
remaining time brought up to date and its end re-queued through `push(t, i)`, which
returns the entry's sequence number; an entry whose number is no longer `valid[i]` is
stale and skipped by the engine. Pure Python.
"""

from __future__ import annotations

__all__ = ["LinkShare"]


class LinkShare:
    """The links' state during one replay: who runs on each link, and at what rate."""

    def __init__(self, holds, count: int, dur, push) -> None:
        self.holds = holds
        """Per action id, the link ids it holds (an empty tuple: none)."""
        self.members: list[dict[int, None]] = [{} for _ in range(count)]
        """Per link, the ids of the actions running on it."""
        self.changed: set[int] = set()  # links whose count changed since the last rebalance
        n = len(holds)
        self.left = [0.0] * n  # remaining time at the full rate
        self.rate = [0.0] * n  # 0: not rated yet
        self.since = [0.0] * n
        self.valid = [-1] * n
        self.dirty = False
        self.dur, self.push = dur, push

    def begin(self, i: int, now: float) -> None:
        """i starts now; its end is queued by this instant's `rebalance`."""
        for k in self.holds[i]:
            self.members[k][i] = None
        self.changed.update(self.holds[i])
        self.left[i], self.rate[i], self.since[i] = self.dur[i], 0.0, now
        self.dirty = True

    def stale(self, i: int, seq: int) -> bool:
        """Whether the heap entry (seq, i) was superseded (only actions holding links)."""
        return bool(self.holds[i]) and self.valid[i] != seq

    def drain_s(self, links, now: float) -> float:
        """Seconds until the actions running on `links` now have all ended, at their
        current rates (an action not rated yet: its time alone); 0 if none runs there
        (`ratrain.schedule.rendezvous`: a receive's notice waits behind them)."""
        left, rate, since = self.left, self.rate, self.since
        out = 0.0
        for link in links:
            for k in self.members[link]:
                r = rate[k]
                rest = left[k] if not r else max(left[k] - (now - since[k]) * r, 0.0) / r
                out = max(out, rest)
        return out

    def finish(self, i: int) -> None:
        for k in self.holds[i]:
            del self.members[k][i]
        self.changed.update(self.holds[i])
        self.valid[i] = -1
        self.dirty = True

    def rebalance(self, now: float) -> None:
        """Every event of the instant `now` is in: each running action at its share. Only
        the actions on a link whose count changed can change rate; they are taken in order
        of id, as all running actions would be (the others keep their rate and their
        queued end)."""
        self.dirty = False
        holds, left, rate, since = self.holds, self.left, self.rate, self.since
        members = self.members
        affected: set[int] = set()
        for k in self.changed:
            affected.update(members[k])
        self.changed.clear()
        for i in sorted(affected):
            r = 1.0 / max(len(members[k]) for k in holds[i])
            if r == rate[i]:
                continue
            if rate[i]:
                left[i] = max(left[i] - (now - since[i]) * rate[i], 0.0)
            since[i], rate[i] = now, r
            self.valid[i] = self.push(now + left[i] / r, i)
