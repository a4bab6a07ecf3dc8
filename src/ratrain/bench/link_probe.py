"""Measure an emulated network's links from inside it: `probe_links`, which
`ratrain link-probe OUT.json --ranks-per-node R` (`ratrain.cli.link_probe`) runs under
torchrun on every node (`torchrun ... -m ratrain link-probe ...`, as `ratrain bench cluster`
launches it).

Rank r of node 2k is paired with rank r of node 2k + 1 (global ranks g and g + R), as the
stages of a pipeline whose ranks are placed dp-inner on two nodes are (with more nodes,
every even node and the next at once, so each node's link carries what it carries in a
dp-inner pipeline's stage boundary):

- p2p: every pair at once ping-pongs a buffer of each size (node 0 sends, node 1 sends it
  back); a one-way time is half a round trip. All R pairs share the node's link, as a
  pipeline's R replicas do.
- all_reduce: every pair's 2-rank group at once (a DP group across the link, pp-inner),
  then the world (all ranks, every node), one fp32 all-reduce of each size.

The median of `reps` repeats per size (each the slowest rank's time); rank 0 writes
`{"p2p": [[bytes, s], ...], "all_reduce": {"2": [[bytes, s], ...], "<world>": [...]},
"nodes": N, "ranks_per_node": R}`.
`fit` turns it into α/β (`ratrain.calibrate.fit.fit_alpha_beta`, least squares).
"""

from __future__ import annotations

import json

from ratrain.errors import RatrainError

__all__ = ["SIZES", "probe_links", "check_world", "fit"]

SIZES = (64 * 1024, 512 * 1024, 2 * 2**20, 8 * 2**20)
"""Bytes per message: from latency-bound to bandwidth-bound at 100 Mbit/s - 1 Gbit/s."""


def _probe(ranks_per_node: int, reps: int, sizes: tuple[int, ...]) -> dict:
    import torch
    import torch.distributed as dist

    from ratrain.calibrate.comm import _timed  # median over repeats of the slowest rank

    rank, world = dist.get_rank(), dist.get_world_size()
    r = ranks_per_node
    check_world(world, r)
    on_first = (rank // r) % 2 == 0
    peer = rank + r if on_first else rank - r
    # every rank creates every group, in the same order (torch.distributed.new_group)
    groups = {g: dist.new_group([g, g + r]) for g in range(world) if (g // r) % 2 == 0}
    mine = groups[rank if on_first else peer]
    out: dict = {"p2p": [], "all_reduce": {"2": [], str(world): []}}
    for size in sizes:
        buf = torch.zeros(size // 4)

        def ping(buf=buf):
            if on_first:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)

        out["p2p"].append([size, _timed(ping, reps) / 2])
        out["all_reduce"]["2"].append(
            [size, _timed(lambda b=buf: dist.all_reduce(b, group=mine), reps)]
        )
        out["all_reduce"][str(world)].append([size, _timed(lambda b=buf: dist.all_reduce(b), reps)])
    return out


def fit(points: list[list[float]]) -> tuple[float, float]:
    """(α s, β bytes/s) of time = α + bytes / β, least squares over `points`."""
    from ratrain.calibrate.fit import fit_alpha_beta

    return fit_alpha_beta([(float(b), float(t)) for b, t in points])


def check_world(world: int, ranks_per_node: int) -> None:
    """Refuse in one line a world that is not an even number of nodes of `ranks_per_node`."""
    r = ranks_per_node
    nodes = world // r if r > 0 and world % r == 0 else 0
    if nodes < 2 or nodes % 2:
        raise RatrainError(f"needs an even number of nodes of {r} ranks, got {world} ranks")


def probe_links(out: str, ranks_per_node: int, reps: int = 3) -> None:
    """This rank's part of the probe, under torchrun (the rendezvous from the environment,
    `ratrain.launch.grid.rendezvous_from_env`); rank 0 writes the JSON to `out`."""
    from ratrain.launch.grid import rendezvous_from_env

    rdzv = rendezvous_from_env()
    if rdzv is None:
        raise RatrainError("run it under torchrun on every node (RANK/WORLD_SIZE unset)")
    check_world(rdzv.world_size, ranks_per_node)
    import torch.distributed as dist

    from ratrain.launch.grid import ParallelGrid

    grid = ParallelGrid.init(1, rdzv.world_size, rdzv, device="cpu")
    try:
        res = _probe(ranks_per_node, reps, SIZES)
        res |= {"nodes": rdzv.world_size // ranks_per_node, "ranks_per_node": ranks_per_node}
        if dist.get_rank() == 0:
            with open(out, "w") as f:
                json.dump(res, f)
        dist.barrier()
    finally:
        grid.destroy()
