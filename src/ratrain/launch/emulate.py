"""An emulated network on one machine: N nodes as network namespaces joined by
rate-limited links, and a command run on every node (`ratrain emulate`).

Topology (all of it inside namespaces this module creates, named with a per-run prefix
`rtc<pid>x<n>-`): a "switch" namespace `PREFIX-sw` holding a bridge `br0`; per node a
namespace `PREFIX-nI` whose `eth0` (address `SUBNET.(I+1)/24`) is one end of a veth pair
whose other end `nI` is a port of the bridge. Both ends are shaped with a token bucket
(`tc qdisc ... root tbf rate R burst B latency L`), so traffic is limited in both
directions. Nothing is created in the root namespace: the veth pair is made inside the
switch namespace with its peer placed straight into the node's.

`run_on_nodes` runs a command on every node (`ip netns exec NODE env ... cmd`, each in its
own process group) with `{node_rank}`, `{nnodes}`, `{master_addr}` and `{node_addr}`
substituted and `GLOO_SOCKET_IFNAME`/`TP_SOCKET_IFNAME` set to the node's interface,
waits for all, and returns their exit codes and output. `EmulatedNetwork` is a context
manager: leaving it (normally, on an exception, on SIGTERM/SIGINT turned into
`EmulationInterrupted`, on a timeout) kills every process left in its namespaces and
deletes the namespaces, which takes the veths, the bridge and the qdiscs with them.
`ip netns list` is the check.

Needs root, `ip` and `tc` (iproute2), and kernel support for network namespaces, veth,
bridges and tbf; `unavailable()` says in one line what is missing.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from ratrain.errors import RatrainError

__all__ = [
    "EmulatedNetwork",
    "EmulationInterrupted",
    "NodeResult",
    "NodeRun",
    "unavailable",
    "stale_namespaces",
    "remove_namespaces",
    "PREFIX_STEM",
    "DEFAULT_SUBNET",
    "IFNAME",
    "torchrun_argv",
]

PREFIX_STEM = "rtc"
"""Every namespace this module makes is named `rtc<pid>x<n>-...`."""
DEFAULT_SUBNET = "10.213.0"
"""The nodes' /24 (inside the run's own namespaces only: every run has its own bridge)."""
IFNAME = "eth0"
"""The node's interface, in the node's namespace."""
_COUNTER = itertools.count()


class EmulationInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived while the emulated network was up; it was torn down."""

    def __init__(self, signum: int):
        super().__init__(
            f"stopped by {signal.Signals(signum).name}; the emulated network was torn down"
        )
        self.exit_code = 128 + signum


@dataclass
class NodeResult:
    node_rank: int
    returncode: int
    output: str
    timed_out: bool = False
    exited_at: float | None = None
    """When the command exited (`time.monotonic`), if seen."""


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RatrainError(f"`{' '.join(cmd)}` failed: {(r.stderr or r.stdout).strip()}")
    return r


def unavailable() -> str | None:
    """None when an emulated network can run here, else one line saying why not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "an emulated network needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"an emulated network needs `{tool}` (iproute2), not found on PATH"
    probe = f"{PREFIX_STEM}{os.getpid()}probe{next(_COUNTER)}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"an emulated network needs network namespaces: {r.stderr.strip()}"
    try:
        r = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                probe,
                "ip",
                "link",
                "add",
                "v0",
                "type",
                "veth",
                "peer",
                "name",
                "v1",
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            return f"an emulated network needs veth links: {r.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def _namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _kill_namespace_pids(ns: str) -> None:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    for tok in r.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def remove_namespaces(names) -> list[str]:
    """Kill every process in each namespace and delete it; returns those it could not."""
    left = []
    for ns in names:
        _kill_namespace_pids(ns)
        r = subprocess.run(["ip", "netns", "delete", ns], capture_output=True, text=True)
        if r.returncode != 0 and ns in _namespaces():
            left.append(ns)
    return left


def stale_namespaces() -> list[str]:
    """Namespaces of this module whose creating process is gone (a run killed with
    SIGKILL cannot tear itself down; `ratrain emulate --cleanup` removes these)."""
    out = []
    for ns in _namespaces():
        if not ns.startswith(PREFIX_STEM):
            continue
        digits = "".join(itertools.takewhile(str.isdigit, ns[len(PREFIX_STEM) :]))
        if digits and not os.path.exists(f"/proc/{digits}"):
            out.append(ns)
    return out


def _burst_bytes(mbit: float) -> int:
    # 2 ms of the rate (the kernel's timer granularity), at least a few MTU-sized packets:
    # a bucket much larger than that lets whole messages through at the veth's own speed
    # whenever the link was idle (a 128 KiB bucket passed a pipeline's 128 KiB activations
    # at about 8x the rate), so the link would not be the link its rate names. tbf splits
    # GSO packets larger than the bucket itself.
    return max(16 * 1024, int(mbit * 1e6 / 8 * 0.002))


@dataclass
class EmulatedNetwork:
    """`nodes` network namespaces joined through a bridge by links of `link_mbit` each way."""

    nodes: int
    link_mbit: float
    subnet: str = DEFAULT_SUBNET
    latency_ms: float = 50.0
    prefix: str = field(default_factory=lambda: f"{PREFIX_STEM}{os.getpid()}x{next(_COUNTER)}")
    _made: list[str] = field(default_factory=list, repr=False)
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _old_handlers: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.nodes < 1 or self.nodes > 200:
            raise RatrainError(f"--nodes must be 1..200, got {self.nodes}")
        if not self.link_mbit > 0:
            raise RatrainError(f"--link-mbit must be positive, got {self.link_mbit}")

    # names --------------------------------------------------------------------------
    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def node(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    @property
    def master_addr(self) -> str:
        return self.addr(0)

    def namespaces(self) -> list[str]:
        return [self.switch] + [self.node(i) for i in range(self.nodes)]

    # lifetime -----------------------------------------------------------------------
    def __enter__(self) -> EmulatedNetwork:
        self._install_handlers()
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            raise EmulationInterrupted(signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    def up(self) -> None:
        rate = f"{self.link_mbit:g}mbit"
        tbf = [
            "tbf",
            "rate",
            rate,
            "burst",
            str(_burst_bytes(self.link_mbit)),
            "latency",
            f"{self.latency_ms:g}ms",
        ]
        self._add_ns(self.switch)
        sw = self.switch
        _ip("ip", "link", "set", "lo", "up", ns=sw)
        _ip("ip", "link", "add", "br0", "type", "bridge", ns=sw)
        _ip("ip", "link", "set", "br0", "up", ns=sw)
        for i in range(self.nodes):
            n = self.node(i)
            self._add_ns(n)
            port = f"n{i}"
            _ip(
                "ip", "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", n, ns=sw
            )
            _ip("ip", "link", "set", port, "master", "br0", ns=sw)
            _ip("ip", "link", "set", port, "up", ns=sw)
            _ip("tc", "qdisc", "add", "dev", port, "root", *tbf, ns=sw)
            _ip("ip", "link", "set", "lo", "up", ns=n)
            _ip("ip", "addr", "add", f"{self.addr(i)}/24", "dev", IFNAME, ns=n)
            _ip("ip", "link", "set", IFNAME, "up", ns=n)
            _ip("tc", "qdisc", "add", "dev", IFNAME, "root", *tbf, ns=n)

    def _add_ns(self, name: str) -> None:
        _ip("ip", "netns", "add", name)
        self._made.append(name)

    def down(self) -> None:
        """Kill the node commands' process groups and everything left in the namespaces,
        then delete the namespaces (their veths, bridge and qdiscs go with them)."""
        for sig in self._old_handlers:  # a second signal must not cut the teardown short
            signal.signal(sig, signal.SIG_IGN)
        try:
            self._kill_procs()
            left = remove_namespaces(reversed(self._made))
            self._made = left
        finally:
            self._restore_handlers()
        if left:
            raise RatrainError(f"could not remove namespaces {', '.join(left)}")

    def _kill_procs(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()

    # running ------------------------------------------------------------------------
    def command_for(self, i: int, cmd: list[str], env: dict[str, str] | None = None) -> list[str]:
        values = {
            "node_rank": str(i),
            "nnodes": str(self.nodes),
            "master_addr": self.master_addr,
            "node_addr": self.addr(i),
        }
        argv = [_substitute(a, values) for a in cmd]
        envs = {"GLOO_SOCKET_IFNAME": IFNAME, "TP_SOCKET_IFNAME": IFNAME, **(env or {})}
        return [
            "ip",
            "netns",
            "exec",
            self.node(i),
            "env",
            *(f"{k}={v}" for k, v in envs.items()),
            *argv,
        ]

    def run_on_nodes(
        self,
        cmd: list[str],
        *,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        echo: bool = False,
    ) -> list[NodeResult]:
        """Run `cmd` on every node at once and wait for all. On a failing node the others
        run on (a distributed job ends on its own); after `timeout_s` every node command's
        process group is killed and those nodes are marked `timed_out` (exit code 124)."""
        return self.start_on_nodes(cmd, env=env, echo=echo).wait(timeout_s)

    def start_on_nodes(
        self, cmd: list[str], *, env: dict[str, str] | None = None, echo: bool = False
    ) -> NodeRun:
        """`cmd` started on every node; `NodeRun.wait` collects it (faults can be injected
        meanwhile: `kill_node`, `set_link`, `signal_node`)."""
        run = NodeRun(self)
        for i in range(self.nodes):
            p = subprocess.Popen(
                self.command_for(i, cmd, env),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                start_new_session=True,
            )
            self._procs.append(p)
            run.add(p, echo)
        return run

    # faults ---------------------------------------------------------------------------
    def node_pids(self, i: int) -> list[int]:
        r = subprocess.run(["ip", "netns", "pids", self.node(i)], capture_output=True, text=True)
        return [int(tok) for tok in r.stdout.split() if tok.isdigit()]

    def kill_node(self, i: int, *, spare: set[int] = frozenset()) -> list[int]:
        """SIGKILL every process on node `i` but `spare` (a node lost: its torchrun and its
        ranks die at once, and its kernel closes their connections); the pids killed."""
        killed = []
        for pid in self.node_pids(i):
            if pid in spare:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        return killed

    def set_link(self, i: int, up: bool) -> None:
        """Take node `i`'s link down or up at the switch (its port `nI`), as a pulled cable
        or a failed switch port: packets are dropped both ways, no connection is closed."""
        _ip("ip", "link", "set", f"n{i}", "up" if up else "down", ns=self.switch)


@dataclass
class NodeRun:
    """The node commands `EmulatedNetwork.start_on_nodes` started: their processes, output
    and the time (`time.monotonic`) each exited."""

    net: EmulatedNetwork
    procs: list[subprocess.Popen] = field(default_factory=list)
    outputs: list[list[str]] = field(default_factory=list)
    exited_at: list[float | None] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def add(self, p: subprocess.Popen, echo: bool) -> None:
        i = len(self.procs)
        self.procs.append(p)
        self.outputs.append([])
        self.exited_at.append(None)
        t = threading.Thread(target=_pump, args=(p, self.outputs[i], i, echo), daemon=True)
        t.start()
        self.threads.append(t)
        threading.Thread(target=self._note_exit, args=(i,), daemon=True).start()

    def _note_exit(self, i: int) -> None:
        self.procs[i].wait()
        self.exited_at[i] = time.monotonic()

    def signal_node(self, i: int, signum: int) -> None:
        """Send `signum` to node `i`'s command (its torchrun), as a scheduler does."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.procs[i].pid, signum)

    def output(self, i: int) -> str:
        return "".join(self.outputs[i])

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self, timeout_s: float | None = None) -> list[NodeResult]:
        """Wait for every node command; after `timeout_s` kill what is left (exit 124)."""
        procs, n = self.procs, len(self.procs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        timed_out = [False] * n
        while any(p.poll() is None for p in procs):
            if deadline is not None and time.monotonic() > deadline:
                for i, p in enumerate(procs):
                    if p.poll() is None:
                        timed_out[i] = True
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(p.pid, signal.SIGKILL)
                # what the node commands left behind (e.g. torchrun's workers) goes too
                for i in range(n):
                    _kill_namespace_pids(self.net.node(i))
                deadline = None
            time.sleep(0.05)
        # A process a command left behind (daemonized) may hold its output pipe open: read
        # on for at most 2 s more, then return (the teardown kills it).
        stop = time.monotonic() + 2.0
        for t in self.threads:
            t.join(timeout=max(0.0, stop - time.monotonic()))
        return [
            NodeResult(
                i,
                124 if timed_out[i] else p.returncode,
                self.output(i),
                timed_out[i],
                self.exited_at[i],
            )
            for i, p in enumerate(procs)
        ]


def torchrun_argv(
    nnodes: int, nproc_per_node: int, master_port: int, *rest: str, max_restarts: int = 0
) -> list[str]:
    """torchrun (this Python's) for one node of an `EmulatedNetwork` run: static rendezvous
    on node 0's address, `{node_rank}` and `{master_addr}` left for `run_on_nodes` to fill
    in, then `rest` (e.g. `-m ratrain train ...`)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc_per_node),
        "--node-rank",
        "{node_rank}",
        "--master-addr",
        "{master_addr}",
        "--master-port",
        str(master_port),
        "--max-restarts",
        str(max_restarts),
        *rest,
    ]


def _substitute(arg: str, values: dict[str, str]) -> str:
    """`arg` with each `{key}` of `values` replaced (other braces stay: JSON, shell)."""
    for k, v in values.items():
        arg = arg.replace("{" + k + "}", v)
    return arg


def _pump(p: subprocess.Popen, sink: list[str], i: int, echo: bool) -> None:
    assert p.stdout is not None
    for line in p.stdout:
        sink.append(line)
        if echo:
            sys.stdout.write(f"[node {i}] {line}")
            sys.stdout.flush()
