"""`ratrain link-probe OUT.json --ranks-per-node R`: measure an emulated network's links
from inside it (`ratrain.bench.link_probe`). Runs under torchrun on every node, as
`ratrain bench cluster` launches it; by hand, across an emulated network:

    ratrain emulate --nodes 2 --ranks-per-node 2 --link-mbit 100 -- \\
        link-probe out/links.json --ranks-per-node 2
"""

from __future__ import annotations

import argparse

from ratrain.cli.common import local_processes, nonempty, positive_int

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=nonempty, metavar="OUT.json", help="where rank 0 writes the JSON")
    p.add_argument(
        "--ranks-per-node",
        type=local_processes,
        required=True,
        help="torchrun ranks per node (the world must be an even number of nodes of them)",
    )
    p.add_argument(
        "--reps", type=positive_int, default=3, help="repeats per message size (default 3)"
    )
    p.add_argument(
        "--cpu-only",
        action="store_true",
        help="only what a flow's packets cost the ranks computing on the cores they share "
        "(network.links.cpu_s_per_byte)",
    )


def run(args: argparse.Namespace) -> int:
    from ratrain.bench.link_probe import probe_links
    from ratrain.cli.outputs import prepare_output_file

    prepare_output_file(args.out, "OUT")  # before the probe, not when rank 0 writes it
    probe_links(args.out, args.ranks_per_node, args.reps, args.cpu_only)
    return 0
