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
"nodes": N, "ranks_per_node": R, "contention": {...}}`.
`fit` turns it into α/β (`ratrain.calibrate.fit.fit_alpha_beta`, least squares).

What the simulator's link model (`ratrain.cost.links`) needs: one rank per node (local
rank 0 of nodes A = 0, B = 1 and, with 3 or more nodes, C = 2) sends `CONTENTION_BYTES`
while the other ranks wait, each case timed from one barrier to each flow's arrival
(the receiver waits each receive in a thread of its own), median of `reps`:

- `alone`: A -> B, one direction alone;
- `both`: A -> B and B -> A at once, over one pair of ranks;
- `through`: A -> B and B -> C at once (B's ingress and egress at once, as a middle
  stage receives from one neighbour while it sends to the other: is the link full duplex?);
- `fan_in`: A -> B and C -> B at once, each flow's arrival (a middle stage's two receives:
  do they share B's ingress, and fairly or one after the other?);
- `beside_all_reduce`: C -> B (A -> B with 2 nodes) while A and B all-reduce
  `CONTENTION_BYTES` (fp32), the flow's and the all-reduce's times, and the all-reduce alone;
- `notice`: how long a receive's ready notice waits behind its own node's sends
  (`ratrain.schedule.rendezvous`). A posts a send of `NOTICE_BYTES` to B; B posts a
  receive for it and times the arrival from that post: alone (`small_alone`); right after
  B posts a send of `NOTICE_BYTES` to C (A with 2 nodes: `behind_message`); and a
  quarter of the way into B's send of `CONTENTION_BYTES` there (`behind_flow`: the
  standing queue of a long flow).

And what a flow costs the compute beside it, where the nodes' CPUs do the network's work
(`beside_compute`; alone with `--cpu-only`): every rank runs the same burst of GEMMs on one
thread (`CPU_BURST_S` with all computing), alone and while A sends B a flow of
`CPU_CHUNK_BYTES` messages that outlasts it, interleaved, `CPU_REPS` times at least. The
emulated nodes share one machine's cores, so all ranks are taken to share them: the
slowdown over the bytes/s B received within its burst is the compute a byte takes
(`cpu_per_byte`, `network.links.cpu_s_per_byte`, `ratrain.sim.sharing`).

`link_fields` turns them into the platform file's `network.links` block.
"""

from __future__ import annotations

import json
import statistics
import time

from ratrain.errors import RatrainError

__all__ = ["SIZES", "CONTENTION_BYTES", "probe_links", "check_world", "fit", "link_fields"]

SIZES = (64 * 1024, 512 * 1024, 2 * 2**20, 8 * 2**20)
"""Bytes per message: from latency-bound to bandwidth-bound at 100 Mbit/s - 1 Gbit/s."""
CONTENTION_BYTES = 4 * 2**20
"""Bytes per flow of the contention cases: bandwidth-bound (0.34 s at 100 Mbit/s), so a
flow's latency and the barrier's skew (milliseconds) are a few percent of it at most."""
CPU_BURST_S = 1.0
"""Seconds of the beside-compute case's GEMM burst with every rank computing: long beside
the scheduler's time slices and a message's time (tens of milliseconds)."""
CPU_REPS = 5
"""Repeats of the beside-compute case, at least: its figure is a ratio of two bursts a
second apart, and this machine's speed moves by as much within a second now and then (one
probe in eleven at 3 repeats came out a tenth of the others: one repeat's burst beside the
flow ran faster than alone)."""
CPU_CHUNK_BYTES = 128 * 1024
"""Bytes per message of the beside-compute case's flow: a pipeline's activation at a small
micro-batch (bench-256, 128 tokens, fp32), as in the emulated runs."""
NOTICE_BYTES = 128 * 1024
"""Bytes of the notice case's messages: a pipeline's activation at a small micro-batch
(bench-256, 128 tokens, fp32)."""


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


def _flows(flows, nbytes: int, reps: int, beside=None) -> list[float]:
    """Median over `reps` of each (src, dst) flow's time from a barrier to its arrival
    (the receiver's clock), and, where `beside` = (group, members) is given, the time of
    an all-reduce of `nbytes` over that group started at once (last entry). Each arrival
    is waited by a thread of its own (gloo's works report completion only when waited)."""
    import threading

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    rows = []
    for _ in range(reps):
        row = torch.zeros(len(flows) + 1, dtype=torch.float64)
        dist.barrier()
        t0 = time.perf_counter()
        sends = [dist.isend(torch.zeros(nbytes // 4), d) for s, d in flows if s == rank]
        works = {
            k: dist.irecv(torch.empty(nbytes // 4), s)
            for k, (s, d) in enumerate(flows)
            if d == rank
        }
        if beside is not None and rank in beside[1]:
            buf = torch.ones(nbytes // 4)
            works[len(flows)] = dist.all_reduce(buf, group=beside[0], async_op=True)

        def arrive(k, w, row=row, t0=t0):
            w.wait()
            row[k] = time.perf_counter() - t0

        threads = [threading.Thread(target=arrive, args=kw) for kw in works.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for w in sends:
            w.wait()
        dist.all_reduce(row, op=dist.ReduceOp.MAX)
        rows.append(row.tolist())
    return [statistics.median(r[k] for r in rows) for k in range(len(flows) + 1)]


def _notice_wait(a: int, b: int, x: int, ahead: int, delay_s: float, reps: int) -> float:
    """Median over `reps` of the time on B from posting a receive of `NOTICE_BYTES` from A
    (whose send is posted first) to its arrival, B having posted a send of `ahead` bytes to
    x (none if 0) `delay_s` before."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    small = torch.zeros(NOTICE_BYTES // 4)
    got = []
    for _ in range(reps):
        dist.barrier()
        works = []
        if rank == a:
            works.append(dist.isend(small, b))
        if rank == x and ahead:
            works.append(dist.irecv(torch.empty(ahead // 4), b))
        row = torch.zeros(1, dtype=torch.float64)
        if rank == b:
            time.sleep(0.005)  # A's send is posted first
            if ahead:
                works.append(dist.isend(torch.zeros(ahead // 4), x))
            time.sleep(delay_s)
            t0 = time.perf_counter()
            dist.irecv(torch.empty(NOTICE_BYTES // 4), a).wait()
            row[0] = time.perf_counter() - t0
        for w in works:
            w.wait()
        dist.all_reduce(row, op=dist.ReduceOp.MAX)
        got.append(float(row[0]))
    return statistics.median(got)


def _contention(ranks_per_node: int, reps: int, nbytes: int) -> dict:
    """The contention cases of the module's docstring, on local rank 0 of nodes 0..2."""
    import torch.distributed as dist

    world = dist.get_world_size()
    a, b = 0, ranks_per_node
    c = 2 * ranks_per_node if world >= 3 * ranks_per_node else None
    pair = dist.new_group([a, b])  # every rank makes it, in the same order
    _flows([(a, b)], nbytes, 1)  # warm the connections up
    out: dict = {"bytes": nbytes, "reps": reps}
    out["alone"] = _flows([(a, b)], nbytes, reps)[0]
    out["both"] = _flows([(a, b), (b, a)], nbytes, reps)[:2]
    if c is not None:
        out["through"] = _flows([(a, b), (b, c)], nbytes, reps)[:2]
        _flows([(c, b)], nbytes, 1)
        out["fan_in"] = _flows([(a, b), (c, b)], nbytes, reps)[:2]
    src = a if c is None else c
    out["all_reduce_alone"] = _flows([], nbytes, reps, beside=(pair, (a, b)))[-1]
    got = _flows([(src, b)], nbytes, reps, beside=(pair, (a, b)))
    out["beside_all_reduce"] = {"flow": got[0], "all_reduce": got[1], "from": src}
    x = a if c is None else c
    msg_alone = _flows([(b, x)], NOTICE_BYTES, reps)[0]
    out["notice"] = {
        "bytes": NOTICE_BYTES,
        "message_alone": msg_alone,
        "small_alone": _notice_wait(a, b, x, 0, 0.0, reps),
        "behind_message": _notice_wait(a, b, x, NOTICE_BYTES, 0.0, reps),
        "behind_flow": _notice_wait(a, b, x, nbytes, out["alone"] / 4, reps),
    }
    return out


def _burst(n: int, x, w) -> None:
    import torch

    for _ in range(n):
        torch.mm(x, w)


def _beside_compute(ranks_per_node: int, reps: int, flow_bytes_per_s: float) -> dict:
    """What a flow's packets cost the ranks that compute on the cores they share (the
    module's docstring): every rank runs the same burst of GEMMs on one thread, alone, then
    while local rank 0 of node A sends node B a flow that outlasts it, `reps` times each,
    interleaved (`CPU_REPS` times at least). Per repeat, the ranks' mean burst time; on
    B, the bytes that arrived within its own burst over its duration."""
    import math
    import threading

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    a, b = 0, ranks_per_node
    reps = max(reps, CPU_REPS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x, w = torch.randn(128, 256), torch.randn(256, 1024)
        dist.barrier()
        t0 = time.perf_counter()
        _burst(20, x, w)
        per = torch.tensor([(time.perf_counter() - t0) / 20], dtype=torch.float64)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)
        n = max(int(CPU_BURST_S / float(per)), 1)
        chunk = CPU_CHUNK_BYTES
        chunks = math.ceil(3 * CPU_BURST_S * flow_bytes_per_s / chunk) + 1
        row = torch.zeros(3 * reps, dtype=torch.float64)
        for k in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            _burst(n, x, w)
            row[3 * k] = (time.perf_counter() - t0) / world
            dist.barrier()
            sends, arrivals, arrive = [], [], None
            if rank == a:
                src = torch.zeros(chunk // 4)
                sends = [dist.isend(src, b) for _ in range(chunks)]
            if rank == b:
                works = [dist.irecv(torch.empty(chunk // 4), a) for _ in range(chunks)]

                def wait_all(works=works, arrivals=arrivals):
                    for wk in works:
                        wk.wait()
                        arrivals.append(time.perf_counter())

                arrive = threading.Thread(target=wait_all)
                arrive.start()
            t0 = time.perf_counter()
            _burst(n, x, w)
            t1 = time.perf_counter()
            row[3 * k + 1] = (t1 - t0) / world
            if arrive is not None:
                arrive.join()
                row[3 * k + 2] = sum(t0 <= t <= t1 for t in arrivals) * chunk / (t1 - t0)
            for s in sends:
                s.wait()
        dist.all_reduce(row)
    finally:
        torch.set_num_threads(threads)
    r = row.tolist()
    return {
        "ranks": world,
        "chunk_bytes": chunk,
        "reps": reps,
        "alone_s": r[0::3],
        "beside_s": r[1::3],
        "flow_bytes_per_s": r[2::3],
    }


def cpu_per_byte(got: dict) -> float:
    """`cpu_s_per_byte` from `_beside_compute`'s figures: with all w ranks computing, a load
    of L ranks' worth of compute on their cores slows each by (w + L) / w (the simulator's
    processor sharing, `ratrain.sim.sharing`), so L = w (beside / alone - 1) per repeat, over
    the flow's bytes/s then; the median over repeats, floored at 0."""
    w = got["ranks"]
    per = [
        w * (t1 / t0 - 1.0) / rate
        for t0, t1, rate in zip(
            got["alone_s"], got["beside_s"], got["flow_bytes_per_s"], strict=True
        )
        if rate > 0
    ]
    if not per:
        raise RatrainError("the flow carried no bytes during the compute: probe it again")
    return max(statistics.median(per), 0.0)


def link_fields(probe: dict, on: str) -> dict | None:
    """The platform file's `network.links` block from `probe`'s "contention" (None when
    the probe has none): each direction's rate alone and what sharing it does, measured,
    and whether each direction is its own resource, derived (`ratrain.cost.links`). The
    fan-in and beside-all-reduce ratios say whether one direction is shared fairly (both
    flows slowed alike, near 2) or one flow after the other (near 1 and 2): the
    simulator shares fairly (`ratrain.schedule.linkshare`), as measured here."""
    got = probe.get("contention")
    if not got:
        return None
    if got.get("cpu_only"):  # `ratrain link-probe --cpu-only`
        return {"cpu_s_per_byte": cpu_field(got["beside_compute"], on)}
    nbytes, alone = got["bytes"], got["alone"]
    how = f"{nbytes} B per flow, median of {got['reps']}, one rank per node, {on}"

    def v(value, note):
        return {"value": value, "note": note}

    out = {
        "one_flow_bytes_per_s": v(
            float(f"{nbytes / alone:.4g}"), f"measured: one flow alone, one direction; {how}"
        ),
        "both_directions_ratio": v(
            round(max(got["both"]) / alone, 3),
            "measured: the slower of two flows A->B and B->A at once over one alone; " + how,
        ),
    }
    if "through" in got:
        through = max(got["through"]) / alone
        out["through_ratio"] = v(
            round(through, 3),
            "measured: the slower of two flows A->B and B->C at once over one alone; " + how,
        )
        out["full_duplex"] = v(
            through < 1.5,
            "derived: through_ratio < 1.5 (a node's ingress and egress are each their own "
            "resource); the same-pair figure (both_directions_ratio) is the library's, "
            "which the model leaves out",
        )
    else:
        out["full_duplex"] = v(
            max(got["both"]) / alone < 1.5,
            "derived: both_directions_ratio < 1.5 (fewer than 3 nodes probed)",
        )
    if "fan_in" in got:
        first, last = sorted(got["fan_in"])
        out["fan_in_first_ratio"] = v(
            round(first / alone, 3),
            "measured: two flows into one node at once, the first to arrive over one alone; " + how,
        )
        out["fan_in_last_ratio"] = v(
            round(last / alone, 3),
            "measured: two flows into one node at once, the last to arrive over one alone; " + how,
        )
    side = got["beside_all_reduce"]
    out["beside_all_reduce_ratio"] = v(
        round(side["flow"] / alone, 3),
        f"measured: a flow into node B while nodes A and B all-reduce {nbytes} B, over the "
        "flow alone; " + how,
    )
    out["all_reduce_beside_flow_ratio"] = v(
        round(side["all_reduce"] / got["all_reduce_alone"], 3),
        "measured: that all-reduce's time over its time alone; " + how,
    )
    if "notice" in got:
        out.update(_notice_fields(got["notice"], on, got["reps"]))
    if "beside_compute" in got:
        out["cpu_s_per_byte"] = cpu_field(got["beside_compute"], on)
    return out


def cpu_field(got: dict, on: str) -> dict:
    """The platform file's `network.links.cpu_s_per_byte` from `_beside_compute`'s figures."""
    return {
        "value": float(f"{cpu_per_byte(got):.3g}"),
        "note": (
            f"measured: all {got['ranks']} ranks (sharing one machine's cores) ran the same "
            f"GEMM burst on one thread alone and beside a flow of {got['chunk_bytes']} B "
            f"messages from node A to node B, interleaved, median of {got['reps']}: "
            "ranks' worth of compute lost per byte/s carried; " + on
        ),
    }


def _notice_fields(n: dict, on: str, reps: int) -> dict:
    """`notice_queue_s` (`Platform.link_notice_queue_s`): what a receive's notice waits
    behind a long flow of its own node (the link's standing queue), and the figures it
    comes from. Behind one message its wait is, measured, that message's time alone when
    its bytes stand whole in the queue."""
    how = f"{n['bytes']} B messages, median of {reps}, one rank per node, {on}"
    behind_flow = max(n["behind_flow"] - n["small_alone"], 0.0)
    behind_message = max(n["behind_message"] - n["small_alone"], 0.0)
    return {
        "notice_queue_s": {
            "value": float(f"{behind_flow:.3g}"),
            "note": "measured: a receive posted a quarter into its node's long send waits "
            "this much longer for a message than when posted alone; " + how,
        },
        "notice_behind_message_ratio": {
            "value": round(behind_message / n["message_alone"], 3),
            "note": "measured: a receive posted right after its node's send of one message "
            "waits longer by this share of that message's time alone (1: its notice queued "
            "behind the whole message); " + how,
        },
    }


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


def probe_cpu(ranks_per_node: int, reps: int) -> dict:
    """The beside-compute case alone (`ratrain link-probe --cpu-only`): one flow's time to
    size the flow, then `_beside_compute`; `link_fields` reads it as it reads the full
    probe's."""
    a, b = 0, ranks_per_node
    _flows([(a, b)], CONTENTION_BYTES, 1)  # warm the connection up
    alone = _flows([(a, b)], CONTENTION_BYTES, 1)[0]
    got = {"bytes": CONTENTION_BYTES, "reps": reps, "alone": alone, "cpu_only": True}
    got["beside_compute"] = _beside_compute(ranks_per_node, reps, CONTENTION_BYTES / alone)
    return {"contention": got}


def probe_links(out: str, ranks_per_node: int, reps: int = 3, cpu_only: bool = False) -> None:
    """This rank's part of the probe, under torchrun (the rendezvous from the environment,
    `ratrain.launch.grid.rendezvous_from_env`); rank 0 writes the JSON to `out`. `cpu_only`:
    the beside-compute case alone (`probe_cpu`)."""
    from ratrain.launch.grid import rendezvous_from_env

    rdzv = rendezvous_from_env()
    if rdzv is None:
        raise RatrainError("run it under torchrun on every node (RANK/WORLD_SIZE unset)")
    check_world(rdzv.world_size, ranks_per_node)
    import torch.distributed as dist

    from ratrain.launch.grid import ParallelGrid

    grid = ParallelGrid.init(1, rdzv.world_size, rdzv, device="cpu")
    try:
        if cpu_only:
            res = probe_cpu(ranks_per_node, reps)
        else:
            res = _probe(ranks_per_node, reps, SIZES)
            got = res["contention"] = _contention(ranks_per_node, reps, CONTENTION_BYTES)
            rate = got["bytes"] / got["alone"]
            got["beside_compute"] = _beside_compute(ranks_per_node, reps, rate)
        res |= {"nodes": rdzv.world_size // ranks_per_node, "ranks_per_node": ranks_per_node}
        if dist.get_rank() == 0:
            with open(out, "w") as f:
                json.dump(res, f)
        dist.barrier()
    finally:
        grid.destroy()
