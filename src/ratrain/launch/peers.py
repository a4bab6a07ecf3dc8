"""Telling a lost peer from a slow one: every rank of a launched job (torchrun, Slurm)
beats a counter in the job's store from a thread of its own, and watches the others'.

Why: a rank whose peer vanished without closing its connections (a node powered off, a
link down) waits in a gloo/NCCL collective until the collective timeout (`--timeout`,
300 s: it must exceed the longest legitimate wait, a pipeline's fill or a save). A
heartbeat does not depend on how long a step takes, so a lost peer is told apart within
`--peer-timeout` (default `DEFAULT_PEER_TIMEOUT_S`) whatever the step length.

`PeerWatch`: a beater thread adds 1 to `beat<rank>` every `HEARTBEAT_PERIOD_S` and reads
every rank's counter (one `multi_get`); a judge thread ends the process with one line
(`os._exit(1)`: the main thread may be blocked in a collective) when

- a peer's counter has not moved for `lost_after_s` (the peer is lost: named by its node,
  address and ranks, as each rank wrote them at the start);
- no store round trip succeeded for `lost_after_s` (the store's host, node 0, is lost or
  this node's link is down);
- this rank's parent (its torchrun agent) is gone: its ranks would run on as orphans.

A rank that leaves on purpose (done, stopped, or failing itself) adds `LEFT` to its counter
first, so it is never taken for a lost one. When the main thread's collective fails at once
(a killed peer's connections are closed by its kernel), `suspects` waits a few beats and
names the peers whose counters stopped: the cause, not the peers that failed after it.
Keys live under `ratrain/peers/<run id>/<attempt>/`: a torchrun restart starts afresh.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "PeerWatch",
    "DEFAULT_PEER_TIMEOUT_S",
    "HEARTBEAT_PERIOD_S",
    "LEFT",
    "describe_ranks",
    "peer_address",
]

DEFAULT_PEER_TIMEOUT_S = 30.0
"""assumed: 6x the 5 s link outage a job should ride out (TCP retransmits carry it), and
far above a beat's period; with the judge's period and the teardown, a lost node ends the
others within about 35 s (measured on the emulated cluster: docs/guide/failures.md)."""
HEARTBEAT_PERIOD_S = 1.0
"""assumed: one small store round trip per rank per second."""
LEFT = 1 << 40
"""Added to a counter by a rank that leaves on purpose."""
_SUSPECT_BEATS = 3
"""A collective failed: peers silent for this many periods are the lost ones."""


@dataclass(frozen=True)
class Where:
    """Where a rank runs: its node (torchrun's GROUP_RANK, else its host name) and the
    address it reaches the store's host from."""

    node: str
    addr: str

    def encode(self) -> bytes:
        return f"{self.node} {self.addr}".encode()

    @staticmethod
    def decode(b: bytes) -> Where:
        node, _, addr = b.decode(errors="replace").partition(" ")
        return Where(node, addr)


def _my_address(master_addr: str, master_port: int) -> str:
    """The local address this host uses towards the store's host (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, master_port))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


def describe_ranks(ranks: list[int], where: dict[int, Where]) -> str:
    """`node 1 (10.0.0.2; ranks 2, 3)` when `ranks` are all of that node's ranks, else
    `rank 3 (node 1, 10.0.0.2)`, joined with `and`."""
    by_node: dict[str, list[int]] = {}
    for r in sorted(ranks):
        w = where.get(r)
        by_node.setdefault(w.node if w else "?", []).append(r)
    parts = []
    for node, rs in by_node.items():
        everyone = sorted(r for r, w in where.items() if w.node == node)
        addr = next((where[r].addr for r in rs if r in where), "?")
        if node != "?" and rs == everyone:
            label = "rank" if len(rs) == 1 else "ranks"
            parts.append(f"node {node} ({addr}; {label} {', '.join(map(str, rs))})")
        else:
            parts += [f"rank {r} (node {node}, {addr})" for r in rs]
    return " and ".join(parts)


_PEER_ADDR = re.compile(r"\[([0-9a-fA-F.:]+)\]:\d+")


def peer_address(text: str) -> str | None:
    """The peer address a gloo error names (`Connection closed by peer [10.0.0.2]:4567`)."""
    m = _PEER_ADDR.search(text)
    return m.group(1) if m else None


class PeerWatch:
    """The heartbeat of one rank (see the module). `store`: a client of the job's store
    (`connect`); `report(cause)` is how the judge ends the process: it writes the line."""

    def __init__(
        self,
        store,
        rank: int,
        world_size: int,
        where: Where,
        lost_after_s: float,
        report: Callable[[str], None],
        period_s: float = HEARTBEAT_PERIOD_S,
        store_addr: str = "",
    ):
        self.store, self.rank, self.world = store, rank, world_size
        self.where_me, self.lost_after_s, self.period_s = where, lost_after_s, period_s
        self.report, self.store_addr = report, store_addr
        self.where: dict[int, Where] = {}
        now = time.monotonic()
        self.last_ok = now
        self.values = [0] * world_size
        self.changed = [now] * world_size
        self.parent = os.getppid()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._fired = False

    # -- life ----------------------------------------------------------------------------
    @classmethod
    def connect(
        cls,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        lost_after_s: float,
        report: Callable[[str], None],
    ) -> PeerWatch:
        """A watch on the store at `master_addr:master_port` (torchrun's agent store on
        node 0, or rank 0's), under this run's and attempt's prefix."""
        import torch.distributed as dist

        client = dist.TCPStore(
            master_addr,
            master_port,
            is_master=False,
            timeout=datetime.timedelta(seconds=lost_after_s),
            wait_for_workers=False,
        )
        run = os.environ.get("TORCHELASTIC_RUN_ID", os.environ.get("SLURM_JOB_ID", "job"))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"ratrain/peers/{run}/{attempt}/", client)
        node = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", socket.gethostname()))
        where = Where(node, _my_address(master_addr, master_port))
        return cls(store, rank, world_size, where, lost_after_s, report,
                   store_addr=f"{master_addr}:{master_port}")  # fmt: skip

    def start(self) -> PeerWatch:
        self.store.add(f"beat{self.rank}", 1)  # before `where`: a peer that sees it reads both
        self.store.set(f"where{self.rank}", self.where_me.encode())
        for target, name in ((self._beat, "ratrain-beat"), (self._judge, "ratrain-judge")):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self

    def leave(self) -> None:
        """Stop watching, and tell the others this rank leaves on purpose (bounded: the
        store may be out of reach)."""
        self._stop.set()
        done = threading.Event()

        def mark() -> None:
            try:
                self.store.add(f"beat{self.rank}", LEFT)
            except Exception:
                pass
            done.set()

        threading.Thread(target=mark, name="ratrain-leave", daemon=True).start()
        done.wait(2 * self.period_s)

    # -- threads -------------------------------------------------------------------------
    def _beat(self) -> None:
        keys = [f"beat{r}" for r in range(self.world)]
        wheres = [f"where{r}" for r in range(self.world)]
        while not self._stop.is_set():
            try:
                self.store.add(keys[self.rank], 1)
                if len(self.where) < self.world and self.store.check(wheres):
                    self.where = {r: Where.decode(b) for r, b in
                                  enumerate(self.store.multi_get(wheres))}  # fmt: skip
                if self.where:
                    self._note([int(b) for b in self.store.multi_get(keys)])
                self.last_ok = time.monotonic()
            except Exception:
                pass  # the judge sees the round trips stop
            self._stop.wait(self.period_s)

    def _note(self, values: list[int]) -> None:
        now = time.monotonic()
        for r, v in enumerate(values):
            if v != self.values[r]:
                self.values[r], self.changed[r] = v, now

    def _judge(self) -> None:
        while not self._stop.wait(self.period_s):
            cause = self.verdict(time.monotonic())
            if cause is not None:
                self.fire(cause)

    def verdict(self, now: float) -> str | None:
        """Why this rank must end now (None: it need not)."""
        if os.getppid() != self.parent:
            return f"lost its launcher (pid {self.parent} is gone)"
        if now - self.last_ok > self.lost_after_s:
            return (
                f"lost contact with the job's store at {self.store_addr} (node 0, or this "
                f"node's link) for {self.lost_after_s:g} s"
            )
        silent = self.silent(now, self.lost_after_s)
        if silent:
            lost = describe_ranks(silent, self.where)
            return f"lost {lost}: no heartbeat for {self.lost_after_s:g} s"
        return None

    def silent(self, now: float, for_s: float) -> list[int]:
        """Peers that have not left and whose counters have not moved for `for_s`."""
        if not self.where:
            return []
        return [
            r
            for r in range(self.world)
            if r != self.rank and self.values[r] < LEFT and now - self.changed[r] > for_s
        ]

    def fire(self, cause: str) -> None:
        with self._lock:
            if self._fired:
                return
            self._fired = True
        self.leave()
        try:
            self.report(cause)
        finally:
            sys.stderr.flush()
            os._exit(1)

    def claim(self) -> bool:
        """Take the reporting over from the judge (the main thread will say it); False when
        the judge has already."""
        with self._lock:
            if self._fired:
                return False
            self._fired = True
            return True

    def suspects(self, error: str = "") -> str | None:
        """After a failed collective: the lost peers (those silent for a few beats, waited
        for), or the node whose address the error names; None when neither is known. A
        fault within the job's first beats may come before this rank has read where its
        peers are: the beats it waits read that too."""
        end = time.monotonic() + (_SUSPECT_BEATS + 2) * self.period_s
        while True:
            now = time.monotonic()
            if now - self.last_ok > _SUSPECT_BEATS * self.period_s:
                return (
                    f"lost contact with the job's store at {self.store_addr} (node 0, or "
                    "this node's link)"
                )
            silent = self.silent(now, _SUSPECT_BEATS * self.period_s)
            if silent:  # the peers killed with it stop within a beat of it: all of them
                time.sleep(self.period_s)
                silent = self.silent(time.monotonic(), _SUSPECT_BEATS * self.period_s)
                return f"lost {describe_ranks(silent, self.where)}"
            if now > end:
                break
            time.sleep(self.period_s / 4)
        addr = peer_address(error)
        ranks = [r for r, w in self.where.items() if w.addr == addr and r != self.rank]
        return f"lost its connection to {describe_ranks(ranks, self.where)}" if ranks else None
