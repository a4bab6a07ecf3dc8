"""Faults on the emulated cluster (`ratrain emulate`): a node lost, a link down, preemption,
a full disk, a torchrun restart; each on 2 nodes x 2 ranks and 4 nodes x 1 rank.

For each case: the time from the fault to the last node command's exit, the one-line
account the ranks printed, and the largest |loss| difference between the job finished by
`--resume auto` (or by itself) and an uninterrupted run (fp32: 0 means bit for bit).
Every case runs in its own emulated network, torn down after it; `ip netns list` must hold
none of its namespaces afterwards (the `netns` column).

    python benchmarks/cluster_faults.py                       # every case, both layouts
    python benchmarks/cluster_faults.py --cases node-killed,link-5s --layouts 2x2

Needs root and iproute2 (as `ratrain emulate`); about 15 minutes on 2 shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ratrain.checkpoint import complete_checkpoints
from ratrain.launch.emulate import EmulatedNetwork, NodeRun, torchrun_argv, unavailable

STEPS = 60
SAVE_EVERY = 5
FAULT_AFTER_STEPS = 12
"""The fault comes once the metrics file holds this many steps (mid-run, after 2 saves)."""
LINK_MBIT = 200.0
PORT = 29500


def train_args(steps: int, save: Path, metrics: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The tiny job every case runs: pp 2 x dp 2 over 4 ranks, fp32."""
    return [
        "train", "--pp", "2", "--dp", "2", "--seq", "16", "--micro-batch", "1",
        "--global-batch", "4", "--steps", str(steps), "--dtype", "fp32", "--lr", "3e-3",
        "--warmup", "2", "--quiet", "--threads", "1", "--save", str(save),
        "--save-every", str(SAVE_EVERY), "--metrics", str(metrics), *extra,
    ]  # fmt: skip


def losses(path: Path) -> dict[int, float]:
    if not path.exists():
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def reference(steps: int, work: Path) -> dict[int, float]:
    """An uninterrupted run's losses (local ranks: bit for bit the cluster's,
    tests/launch/test_emulate.py)."""
    m = work / "reference.jsonl"
    argv = train_args(steps, work / "ref-ck", m)
    r = subprocess.run([sys.executable, "-m", "ratrain", *argv], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return losses(m)


def lines_of(outputs: list[str]) -> list[str]:
    """The ratrain lines of every node: errors and stops, each distinct text once."""
    seen: list[str] = []
    for out in outputs:
        for line in out.splitlines():
            if line.startswith("ratrain ") and ("error:" in line or "stopped by" in line):
                if line not in seen:
                    seen.append(line)
    return seen


def netns_left(prefix: str) -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [x.split()[0] for x in r.stdout.splitlines() if x.startswith(prefix)]


@dataclass
class Layout:
    nodes: int
    ranks_per_node: int

    @property
    def name(self) -> str:
        return f"{self.nodes}x{self.ranks_per_node}"


@dataclass
class Row:
    layout: str
    case: str
    exit_s: float | None
    codes: list[int]
    line: str
    resumed_max_diff: float | None
    steps_logged: int
    netns_clean: bool
    note: str = ""


class Trial:
    """One case: an emulated network, the job on it, the fault, and the follow-up run."""

    def __init__(self, layout: Layout, work: Path, steps: int, extra: tuple[str, ...] = ()):
        self.layout, self.work, self.steps, self.extra = layout, work, steps, extra
        self.save, self.metrics = work / "ck", work / "m.jsonl"

    def command(self, max_restarts: int = 0, resume: bool = False) -> list[str]:
        extra = (*self.extra, "--resume", "auto") if resume else self.extra
        argv = train_args(self.steps, self.save, self.metrics, extra)
        lay = self.layout
        return torchrun_argv(
            lay.nodes, lay.ranks_per_node, PORT, "-m", "ratrain", *argv, max_restarts=max_restarts
        )

    def start(self, net: EmulatedNetwork, **kw) -> NodeRun:
        return net.start_on_nodes(self.command(**kw), env={"OMP_NUM_THREADS": "1"})

    def mid_run(self, run: NodeRun, steps: int = FAULT_AFTER_STEPS, within_s: float = 240) -> None:
        end = time.monotonic() + within_s
        while len(losses(self.metrics)) < steps:
            if not run.running() or time.monotonic() > end:
                raise RuntimeError(
                    "the job did not reach its fault point:\n" + run.output(0)[-3000:]
                )
            time.sleep(0.05)


Fault = Callable[[EmulatedNetwork, NodeRun, Trial], None]


def _kill_node(net, run, trial) -> None:
    net.kill_node(net.nodes - 1)


def _kill_torchrun(net, run, trial) -> None:
    run.signal_node(net.nodes - 1, signal.SIGKILL)


def _kill_ranks(net, run, trial) -> None:
    last = net.nodes - 1
    net.kill_node(last, spare={run.procs[last].pid})


def _link_down(seconds: float) -> Fault:
    def fault(net, run, trial) -> None:
        net.set_link(net.nodes - 1, up=False)
        time.sleep(seconds)
        net.set_link(net.nodes - 1, up=True)

    return fault


def _link_down_background(seconds: float) -> Fault:
    """Down now, up after `seconds` on a timer (the exit is timed meanwhile)."""

    def fault(net, run, trial) -> None:
        import threading

        net.set_link(net.nodes - 1, up=False)
        threading.Timer(seconds, lambda: _quietly(net.set_link, net.nodes - 1, True)).start()

    return fault


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:
        pass  # the network may be gone already


def _term_all(net, run, trial) -> None:
    for i in range(net.nodes):
        run.signal_node(i, signal.SIGTERM)


def _term_staggered(net, run, trial) -> None:
    run.signal_node(net.nodes - 1, signal.SIGTERM)
    time.sleep(3.0)
    for i in range(net.nodes - 1):
        run.signal_node(i, signal.SIGTERM)


@dataclass
class Case:
    name: str
    fault: Fault
    resume: bool = True
    """Finish the job with `--resume auto` on every node after the fault."""
    max_restarts: int = 0
    extra: tuple[str, ...] = ()
    disk_bytes: int | None = None
    """Save onto a tmpfs of this size (full part way through a save)."""


def cases(peer_timeout_s: float) -> list[Case]:
    past = peer_timeout_s + 15
    return [
        Case("node-killed", _kill_node),
        Case("torchrun-killed", _kill_torchrun),
        Case("link-5s", _link_down(5.0), resume=False),
        Case(f"link-{past:g}s", _link_down_background(past)),
        Case("sigterm-all", _term_all),
        Case("sigterm-staggered", _term_staggered),
        Case("disk-full", lambda net, run, trial: None, disk_bytes=7 * 2**20),
        Case("restart", _kill_ranks, resume=False, max_restarts=1),
    ]


def run_case(layout: Layout, case: Case, steps: int, ref: dict[int, float], root: Path) -> Row:
    work = Path(tempfile.mkdtemp(prefix=f"{layout.name}-{case.name}-", dir=root))
    trial = Trial(layout, work, steps, case.extra)
    mounted = False
    if case.disk_bytes is not None:
        (work / "ck").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={case.disk_bytes}", "tmpfs",
                        str(work / "ck")], check=True)  # fmt: skip
        mounted = True
    net = EmulatedNetwork(layout.nodes, LINK_MBIT)
    note = ""
    try:
        with net:
            run = trial.start(net, max_restarts=case.max_restarts)
            # a full disk: from the step before the save that does not fit (the third)
            trial.mid_run(run, 3 * SAVE_EVERY - 2 if case.disk_bytes else FAULT_AFTER_STEPS)
            t0 = time.monotonic()
            case.fault(net, run, trial)
            results = run.wait(timeout_s=600)
            ends = [r.exited_at for r in results if r.exited_at is not None]
            exit_s = max(ends) - t0 if ends else None
            codes = [r.returncode for r in results]
            said = lines_of([r.output for r in results])
            if case.disk_bytes is not None:
                note = _disk_note(trial.save)
                subprocess.run(["mount", "-o", "remount,size=256m", str(trial.save)], check=True)
            if case.resume:
                again = trial.start(net, resume=True).wait(timeout_s=600)
                if any(r.returncode for r in again):
                    note += f" resume failed: {lines_of([r.output for r in again])}"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(work / "ck")], capture_output=True)
    got = losses(trial.metrics)
    diff = (
        max(abs(got[k] - ref[k]) for k in ref)
        if set(got) == set(ref)
        else None  # steps missing: not finished
    )
    return Row(layout.name, case.name, exit_s, codes, " | ".join(said), diff, len(got),
               not netns_left(net.prefix), note.strip())  # fmt: skip


def _disk_note(save: Path) -> str:
    done = [d.name for d in complete_checkpoints(save)]
    latest = (save / "latest").read_text().strip() if (save / "latest").exists() else None
    partial = sorted(p.name for p in save.glob(".tmp-*"))
    return f"complete {done}, latest {latest}, partial {partial}"


def print_table(rows: list[Row]) -> None:
    print()
    head = "| layout | case | fault -> last exit (s) | exit codes | max loss diff | steps |"
    print(head + " netns clean |")
    print("| --- | --- | ---: | --- | ---: | ---: | --- |")
    for r in rows:
        ex = f"{r.exit_s:.1f}" if r.exit_s is not None else "-"
        diff = f"{r.resumed_max_diff:g}" if r.resumed_max_diff is not None else "unfinished"
        print(f"| {r.layout} | {r.case} | {ex} | {r.codes} | {diff} | {r.steps_logged} | "
              f"{r.netns_clean} |")  # fmt: skip
    print()
    for r in rows:
        print(f"{r.layout} {r.case}: {r.line or '(no ratrain line)'}")
        if r.note:
            print(f"    {r.note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="2x2,4x1", help="nodes x ranks per node, comma-separated")
    ap.add_argument("--cases", default="all", help="case names, comma-separated (default all)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--peer-timeout", type=float, default=30.0,
                    help="the ranks' --peer-timeout (default 30, ratrain's default)")  # fmt: skip
    args = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"cluster_faults: skipped: {why}", file=sys.stderr)
        return 0
    chosen = cases(args.peer_timeout)
    if args.cases != "all":
        wanted = args.cases.split(",")
        chosen = [c for c in chosen if c.name in wanted]
    for c in chosen:
        c.extra = (*c.extra, "--peer-timeout", f"{args.peer_timeout:g}")
    layouts = [Layout(*map(int, x.split("x"))) for x in args.layouts.split(",")]
    root = Path(tempfile.mkdtemp(prefix="ratrain-cluster-faults-"))
    ref = reference(args.steps, root)
    rows = []
    for layout in layouts:
        for case in chosen:
            row = run_case(layout, case, args.steps, ref, root)
            rows.append(row)
            said = f"exit {row.exit_s} codes {row.codes} diff {row.resumed_max_diff}"
            print(f"{row.layout} {row.case}: {said} netns clean {row.netns_clean}", flush=True)
    print_table(rows)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
