"""The emulated network (`ratrain.launch.emulate`, `ratrain emulate`, alias `ratrain
cluster`): network namespaces joined by shaped links. Needs root and iproute2; skips with
the one line saying why not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ratrain.launch.emulate import EmulatedNetwork, unavailable

WHY = unavailable()
pytestmark = [pytest.mark.dist, pytest.mark.skipif(WHY is not None, reason=WHY or "")]


def _netns() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _qdisc_of(ns: str, dev: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev],
        capture_output=True,
        text=True,
    ).stdout


def _server_client(server: str, client: str) -> list[str]:
    """Node 0 runs the Python source `server`; every other node `client`, given node 0's
    address."""
    return [
        "sh",
        "-c",
        f'if [ {{node_rank}} = 0 ]; then exec {sys.executable} -c "$0"; '
        f'else exec {sys.executable} -c "$1" {{master_addr}}; fi',
        server,
        client,
    ]


SERVER = r"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5001)); s.listen(1)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print("RATE", n * 8 / (time.perf_counter() - t0) / 1e6, n)
"""
CLIENT = r"""
import socket, sys, time
for _ in range(200):
    try:
        s = socket.create_connection((sys.argv[1], 5001)); break
    except OSError: time.sleep(0.05)
s.sendall(b"x" * (6 << 20)); s.close()
"""


@pytest.mark.timeout(60)
def test_link_rate_and_teardown():
    c = EmulatedNetwork(2, 200)
    with c:
        names = c.namespaces()
        assert set(names) <= set(_netns())
        assert "tbf" in _qdisc_of(c.node(1), "eth0") and "200Mbit" in _qdisc_of(c.node(1), "eth0")
        assert "tbf" in _qdisc_of(c.switch, "n0")
        res = c.run_on_nodes(_server_client(SERVER, CLIENT), timeout_s=30)
        assert [r.returncode for r in res] == [0, 0], [r.output for r in res]
        line = next(x for x in res[0].output.splitlines() if x.startswith("RATE"))
        rate, n = float(line.split()[1]), int(line.split()[2])
        assert n == 6 << 20
        # node 1 -> node 0 crosses two 200 Mbit/s token buckets
        print(f"measured {rate:.1f} Mbit/s node 1 -> node 0 at 200 Mbit/s")
        assert 120 < rate < 260, rate
    assert not set(names) & set(_netns())


ECHO_SERVER = r"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5002)); s.listen(1)
c, _ = s.accept()
for _ in range(3):
    n = 0
    while n < (128 << 10):
        n += len(c.recv(1 << 20))
    c.sendall(b"k")
"""
BURST_CLIENT = r"""
import socket, sys, time
for _ in range(200):
    try:
        s = socket.create_connection((sys.argv[1], 5002)); break
    except OSError: time.sleep(0.05)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(3):
    time.sleep(0.3)  # the link idles: a token bucket refills
    t0 = time.perf_counter(); s.sendall(b"x" * (128 << 10)); s.recv(1)
    print("MSG", time.perf_counter() - t0)
"""


@pytest.mark.timeout(60)
def test_a_message_after_idle_is_not_let_through_faster_than_the_rate():
    """A pipeline sends a 128 KiB activation now and then: at 50 Mbit/s it takes about
    21 ms, whatever the link did before, so the bucket of the shaper must be small."""
    with EmulatedNetwork(2, 50) as c:
        res = c.run_on_nodes(_server_client(ECHO_SERVER, BURST_CLIENT), timeout_s=30)
        assert [r.returncode for r in res] == [0, 0], [r.output for r in res]
        times = [float(x.split()[1]) for x in res[1].output.splitlines() if x.startswith("MSG")]
    nominal = (128 << 10) * 8 / 50e6
    assert len(times) == 3 and min(times) > 0.6 * nominal, (times, nominal)


@pytest.mark.timeout(60)
def test_killed_node_commands_leave_nothing():
    c = EmulatedNetwork(2, 100)
    with c:
        names = c.namespaces()
        # each node leaves a process outside the command's process group, too
        cmd = ["sh", "-c", "setsid sleep 300 & sleep 300"]

        def kill_later():
            time.sleep(1.0)
            for p in list(c._procs):
                os.killpg(p.pid, signal.SIGKILL)

        threading.Thread(target=kill_later, daemon=True).start()
        t = time.monotonic()
        res = c.run_on_nodes(cmd, timeout_s=30)
        assert time.monotonic() - t < 20
        assert [r.returncode for r in res] == [-signal.SIGKILL] * 2
        pids = subprocess.run(
            ["ip", "netns", "pids", c.node(0)], capture_output=True, text=True
        ).stdout.split()
        assert pids  # the setsid sleep survives the command until the teardown
    assert not set(names) & set(_netns())
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read()


@pytest.mark.timeout(60)
def test_timeout_kills_and_tears_down():
    with EmulatedNetwork(2, 100) as c:
        names = c.namespaces()
        res = c.run_on_nodes(["sleep", "300"], timeout_s=1)
        assert all(r.timed_out and r.returncode == 124 for r in res)
    assert not set(names) & set(_netns())


TRAIN = [
    "train",
    "--pp", "2",
    "--dp", "2",
    "--seq", "16",
    "--micro-batch", "2",
    "--global-batch", "8",
    "--steps", "4",
    "--dtype", "fp32",
    "--quiet",
]  # fmt: skip


@pytest.mark.timeout(120)
def test_train_across_nodes_bit_exact_with_loopback(tmp_path):
    cl, lo = tmp_path / "emulated.jsonl", tmp_path / "local.jsonl"
    r = subprocess.run(
        [
            sys.executable, "-m", "ratrain", "emulate",
            "--nodes", "2", "--ranks-per-node", "2", "--link-mbit", "200", "--timeout", "100",
            "--", *TRAIN, "--metrics", str(cl),
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[node 0] final loss" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "ratrain", *TRAIN, "--metrics", str(lo)],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    a = [json.loads(x) for x in cl.read_text().splitlines()]
    b = [json.loads(x) for x in lo.read_text().splitlines()]
    assert [x["step"] for x in a] == [0, 1, 2, 3]
    assert [x["loss"] for x in a] == [x["loss"] for x in b]  # bit for bit
    assert [x["grad_norm"] for x in a] == [x["grad_norm"] for x in b]


@pytest.mark.timeout(60)
def test_sigterm_to_emulate_command_tears_down():
    p = subprocess.Popen(
        [sys.executable, "-m", "ratrain", "emulate", "--nodes", "2", "--raw", "--",
         "sleep", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    prefix = f"rtc{p.pid}x"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        mine = [n for n in _netns() if n.startswith(prefix)]
        if len(mine) == 3:
            break
        time.sleep(0.1)
    assert len(mine) == 3, mine
    time.sleep(0.5)  # the node commands are running
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "torn down" in err
    assert not [n for n in _netns() if n.startswith(prefix)]


def test_cli_refuses_empty_command(capsys):
    from ratrain.cli import main

    assert main(["emulate", "--nodes", "2"]) == 2
    assert "no command given" in capsys.readouterr().err
