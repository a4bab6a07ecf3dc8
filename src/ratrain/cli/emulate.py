"""`ratrain emulate`: run a ratrain command across an emulated network on this machine
(`ratrain cluster` is an alias, the command's old name).

Brings up `--nodes` network namespaces joined by links shaped to `--link-mbit` each way
(`ratrain.launch.emulate`), runs `torchrun --nnodes N --nproc-per-node R --node-rank I
--master-addr NODE0 -m ratrain COMMAND ...` on every node (static rendezvous), prints
each node's output prefixed with `[node I]`, and tears everything down afterwards, also
after a failure, a timeout or SIGTERM/SIGINT. `--raw` runs the command itself on every
node instead, with `{node_rank}`, `{nnodes}`, `{master_addr}` and `{node_addr}` substituted.

    ratrain emulate --nodes 2 --ranks-per-node 2 --link-mbit 200 -- \\
        train --pp 2 --dp 2 --steps 5 --metrics m.jsonl
"""

from __future__ import annotations

import argparse
import sys

from ratrain.cli.common import (
    bounded_float,
    local_processes,
    nonneg_int,
    port,
    positive_int,
    timeout_s,
)
from ratrain.errors import RatrainError

__all__ = ["add_arguments", "run", "torchrun_command", "check_node_command"]

MAX_LINK_MBIT = 100_000.0
"""assumed: 100 Gbit/s, above what a veth pair carries on one machine (the shaper would
shape nothing); tc refuses rates it cannot parse (1e300mbit) only once the namespaces are up."""
MAX_LATENCY_MS = 1000.0
"""assumed: a queue of a second of the rate is more than any link holds (tc takes 1000 ms
at 100 Gbit/s)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=positive_int, default=2, help="nodes (default 2)")
    p.add_argument(
        "--ranks-per-node",
        type=local_processes,
        default=1,
        help="torchrun ranks per node (default 1)",
    )
    p.add_argument(
        "--link-mbit",
        type=bounded_float(MAX_LINK_MBIT, "Mbit/s"),
        default=200.0,
        help="each node's link rate in Mbit/s, each direction (default 200)",
    )
    p.add_argument(
        "--latency-ms",
        type=bounded_float(MAX_LATENCY_MS, "ms"),
        default=50.0,
        help="tbf's queue limit in ms of the rate (default 50); no delay is added",
    )
    p.add_argument("--master-port", type=port, default=29500, help="node 0's port (default 29500)")
    p.add_argument("--timeout", type=timeout_s, help="kill the run after this many seconds")
    p.add_argument(
        "--raw",
        action="store_true",
        help="run the command itself on every node (not `torchrun -m ratrain COMMAND`)",
    )
    p.add_argument(
        "--cleanup",
        action="store_true",
        help="remove namespaces left by emulate runs whose process is gone (a SIGKILLed run)",
    )
    p.add_argument(
        "--max-restarts", type=nonneg_int, default=0, help="torchrun --max-restarts (default 0)"
    )
    p.add_argument(
        "node_command",  # not `command`: that is the subcommand's name (`ratrain.cli.main`)
        metavar="command",
        nargs=argparse.REMAINDER,
        help="after --: a ratrain command and its flags (e.g. train --pp 2 --dp 2)",
    )


def torchrun_command(args: argparse.Namespace, rest: list[str]) -> list[str]:
    from ratrain.launch.emulate import torchrun_argv

    return torchrun_argv(
        args.nodes,
        args.ranks_per_node,
        args.master_port,
        "-m",
        "ratrain",
        *rest,
        max_restarts=args.max_restarts,
    )


def check_node_command(rest: list[str]) -> None:
    """The ratrain command every node would run, parsed here first: a bad flag of it is one
    line before any namespace is built, not one per node after torchrun started."""
    import contextlib
    import io

    from ratrain.cli import _build_parser

    parser, module = _build_parser(rest)
    if module is None:
        raise RatrainError(
            f"{rest[0]!r} is not a ratrain command (see ratrain --help); --raw runs any "
            "program on every node"
        )
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(rest)
    except SystemExit as e:
        if e.code:
            raise RatrainError(f"the command after --: {said.getvalue().strip()}") from None


def run(args: argparse.Namespace) -> int:
    from ratrain.launch.emulate import (
        EmulatedNetwork,
        remove_namespaces,
        stale_namespaces,
        unavailable,
    )

    why = unavailable()
    if why:
        raise RatrainError(why)
    if args.cleanup:
        stale = stale_namespaces()
        left = remove_namespaces(stale)
        print(f"ratrain emulate: removed {len(stale) - len(left)} stale namespaces")
        return 1 if left else 0
    rest = list(args.node_command)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise RatrainError("no command given: ratrain emulate [flags] -- train --pp 2 ...")
    if not args.raw:
        check_node_command(rest)
    cmd = rest if args.raw else torchrun_command(args, rest)
    with EmulatedNetwork(args.nodes, args.link_mbit, latency_ms=args.latency_ms) as net:
        print(
            f"ratrain emulate: {args.nodes} nodes ({net.prefix}-n*), links {args.link_mbit:g} "
            f"Mbit/s each way, master {net.master_addr}:{args.master_port}",
            file=sys.stderr,
            flush=True,
        )
        results = net.run_on_nodes(cmd, timeout_s=args.timeout, echo=True)
    bad = [r for r in results if r.returncode != 0]
    for r in bad:
        what = "timed out" if r.timed_out else f"exited with code {r.returncode}"
        print(f"ratrain emulate: node {r.node_rank} {what}", file=sys.stderr)
    return next((r.returncode for r in bad), 0)
