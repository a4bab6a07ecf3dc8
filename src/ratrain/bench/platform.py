"""The platform file of an emulated network (`ratrain emulate`): the machine's own
calibrated platform (its kernels, memory and runtime costs: the nodes are namespaces of this
machine and share its cores) with the links between nodes as `ratrain.bench.link_probe`
measured them.

Pure: no torch.
"""

from __future__ import annotations

import copy
from pathlib import Path

from ratrain.bench.link_probe import fit, link_fields
from ratrain.yaml_io import read_yaml_file

__all__ = ["emulated_platform", "link_platform", "base_platform_dict"]


def base_platform_dict(name_or_path: str) -> dict:
    """The raw YAML mapping of a preset (`cpu-local`) or a platform file."""
    from ratrain.platforms import PLATFORM_PRESETS

    if name_or_path in PLATFORM_PRESETS:
        import ratrain.platforms as pkg

        path = Path(pkg.__file__).parent / f"{name_or_path}.yaml"
    else:
        path = Path(name_or_path)
    return read_yaml_file(path, "platform file")


def _v(value, note: str) -> dict:
    return {"value": value, "note": note}


def emulated_platform(
    base: dict, probe: dict, link_mbit: float, on: str, name: str | None = None
) -> dict:
    """`base` (a platform mapping) made into the emulated network's: `probe` is
    `link_probe`'s JSON, measured on that network with links of `link_mbit` Mbit/s."""
    out = copy.deepcopy(base)
    nodes, r = int(probe["nodes"]), int(probe["ranks_per_node"])
    out["name"] = name or f"emulated-{nodes}x{r}-{link_mbit:g}mbit"
    out["description"] = (
        f"An emulated network of {nodes} nodes x {r} ranks (network namespaces of one machine "
        f"joined by links shaped to {link_mbit:g} Mbit/s each way, `ratrain emulate`), links "
        f"measured by ratrain link-probe {on}; everything else: {base.get('name')} "
        f"({str(base.get('description', '')).strip()[:200]})"
    )
    alpha, beta = fit(probe["p2p"])
    sizes = len(probe["p2p"])
    note = (
        f"measured: ping-pong across the link between ranks r and r+{r}, all {r} pairs at once "
        f"(so the node's link is shared as a dp-inner pipeline's replicas share it), "
        f"{sizes} sizes, median of repeats, least-squares α + S/β, {on}"
    )
    _with_link(out, nodes, r, beta, max(alpha, 1e-6), note, note + " (floored at 1 us)")
    links = link_fields(probe, on)  # both ends of a link: `ratrain.cost.links`
    if links:
        out["network"]["links"] = links
    return out


def _with_link(
    out: dict,
    nodes: int,
    r: int,
    beta: float,
    alpha: float,
    note: str,
    alpha_note: str,
    efficiency: dict | None = None,
) -> None:
    """Set `out` (a platform mapping) to `nodes` nodes of `r` ranks sharing one machine's
    cores, joined by links of `beta` bytes/s and `alpha` s per message, of which the
    share `efficiency` (a `{"value", "note"}` mapping; 1 where `beta` was measured) carries
    the messages' bytes."""
    net = out["network"]
    net["units_per_node"] = _v(
        r, f"sourced: the emulated network's ranks per node ({nodes} nodes x {r})"
    )
    net["inter_node"] = {
        "bandwidth_bytes_per_s": _v(float(f"{beta:.4g}"), note),
        "latency_s": _v(float(f"{alpha:.4g}"), alpha_note),
        "efficiency": efficiency or _v(1.0, "derived: the bandwidth above is an achieved figure"),
    }
    out["compute"]["units_sharing_cores"] = _v(
        nodes * r,
        "sourced: the emulated nodes are network namespaces of one machine; all "
        f"{nodes * r} ranks share its cores",
    )
    out["workspace_bytes"] = _v(
        0,
        "assumed: the emulated network's caps count live tensor bytes (LiveBytes, "
        "ratrain.observe.memory), for every system alike; nothing is reserved beside them",
    )


TCP_PAYLOAD, TCP_FRAME = 1448, 1514
"""sourced: a full TCP segment on a 1500-byte MTU (the veth's default, `ratrain emulate`)
carries 1500 - 20 (IPv4) - 32 (TCP with the timestamps option, Linux's default) = 1448
bytes of payload, in a frame of 1500 + 14 (Ethernet header) = 1514 bytes, the length tbf
charges against its rate."""

NOTICE_QUEUE_BYTES = 1.16e5
"""assumed: the standing queue of a shaped link, in bytes: `ratrain link-probe`'s notice
case measured 18.5 ms at 50 Mbit/s on the emulated network (4 nodes x 1 rank, tbf, the
2-core machine, 2026-12-06), 116 kB; held in bytes at other rates (TCP's window, not the
shaper's 50 ms limit, set it)."""


LINK_CPU_S_PER_BYTE = 7.0e-8
"""assumed: the compute a byte carried across a shaped link takes from the ranks sharing
the machine's cores (`network.links.cpu_s_per_byte`): `ratrain link-probe --cpu-only`
measured 8.4 and 9.6e-8 at 50 Mbit/s, 6.6 and 7.5e-8 at 100 and 6.4 and 2.9e-8 at 200
(4 nodes x 1 rank, tbf, the 2-core machine, 2026-12-07); the median of the six, held at
every rate (the probe's spread within one rate is as wide as between rates)."""


def link_platform(base: dict, nodes: int, r: int, link_mbit: float) -> dict:
    """`base` made into an emulated network's whose links of `link_mbit` Mbit/s are not
    measured but assumed: each of a node's `r` rank pairs across the link gets 1/r of it
    (as measured on the shaped links: `ratrain.bench.link_probe`), of which TCP's payload
    share (`TCP_PAYLOAD` / `TCP_FRAME`) carries messages, at the base platform's
    inter-node latency, with a standing queue of `NOTICE_QUEUE_BYTES` that a receive's
    notice waits behind (`ratrain.schedule.rendezvous`), and `LINK_CPU_S_PER_BYTE` of the
    shared cores' compute taken by each byte carried (`ratrain.sim.sharing`)."""
    out = copy.deepcopy(base)
    out["name"] = f"whatif-{nodes}x{r}-{link_mbit:g}mbit"
    out["description"] = (
        f"An emulated network of {nodes} nodes x {r} ranks with links of {link_mbit:g} "
        f"Mbit/s, assumed, not measured; everything else: {base.get('name')}"
    )
    lat = base["network"]["inter_node"]["latency_s"]
    alpha = float(lat["value"] if isinstance(lat, dict) else lat)
    beta = link_mbit * 1e6 / 8 / r
    payload = TCP_PAYLOAD / TCP_FRAME
    _with_link(
        out,
        nodes,
        r,
        beta,
        alpha,
        f"assumed: {link_mbit:g} Mbit/s shared evenly by the node's {r} rank pairs across "
        "the link (the shaped links measured 26.4 and 101.8 Mbit/s per pair for 2 pairs at "
        "50 and 200 Mbit/s)",
        f"assumed: {base.get('name')}'s inter-node latency (no latency is emulated)",
        _v(
            float(f"{payload:.4g}"),
            f"sourced: TCP over IPv4 with timestamps on a 1500-byte MTU carries {TCP_PAYLOAD} "
            f"bytes of a message per {TCP_FRAME}-byte Ethernet frame, and tbf meters whole "
            "frames (ratrain link-probe measured 11.96 MB/s for one 4 MiB flow alone on a "
            "100 Mbit/s link: 0.957 of it)",
        ),
    )
    queue_s = NOTICE_QUEUE_BYTES / (link_mbit * 1e6 / 8)
    out["network"].setdefault("links", {})["notice_queue_s"] = _v(
        float(f"{queue_s:.4g}"),
        f"assumed: {NOTICE_QUEUE_BYTES:.3g} B at {link_mbit:g} Mbit/s (NOTICE_QUEUE_BYTES, "
        "ratrain.bench.platform)",
    )
    out["network"]["links"]["cpu_s_per_byte"] = _v(
        LINK_CPU_S_PER_BYTE, "assumed: LINK_CPU_S_PER_BYTE (ratrain.bench.platform)"
    )
    return out
