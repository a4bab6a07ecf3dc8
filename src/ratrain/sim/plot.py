"""A PNG of a simulated step: the timeline (a row per stage, coloured by action kind) above
memory over time per stage, with the platform's cap drawn as a line.

matplotlib is imported when a plot is drawn (Agg backend), never at import time.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot", "OP_COLOURS"]

OP_COLOURS = {
    "F": "#4c72b0",
    "B": "#dd8452",
    "RC": "#c44e52",
    "UPD": "#55a868",
    "SYNC": "#8172b3",
    "NORM": "#8172b3",
    "OVF": "#8172b3",
    "VF": "#937860",
    "VD": "#937860",
    "OFF": "#da8bc3",
    "REL": "#da8bc3",
    "SEND_F": "#8c8c8c",
    "RECV_F": "#8c8c8c",
    "SEND_B": "#8c8c8c",
    "RECV_B": "#8c8c8c",
}
# Within a stage's row: compute in the middle band, the async resources in thin bands below.
_BAND = {"compute": (0.35, 0.5), "copy": (0.2, 0.12), "dp_net": (0.08, 0.12), "p2p": (0.86, 0.1)}
_GB = 1e9


def _timeline(ax, result, scale: float) -> None:
    bars: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    for e in result.events:
        if e.resource in _BAND and e.end_s > e.start_s:
            bars.setdefault((e.stage, e.resource, e.op), []).append(
                (e.start_s * scale, (e.end_s - e.start_s) * scale)
            )
    for (s, res, op), spans in sorted(bars.items()):
        y0, h = _BAND[res]
        ax.broken_barh(spans, (s + y0, h), facecolors=OP_COLOURS.get(op, "#cccccc"), linewidth=0)
    ax.set_ylim(result.pp, 0)
    ax.set_yticks([s + 0.5 for s in range(result.pp)], [f"stage {s}" for s in range(result.pp)])
    ax.set_title(
        f"{result.model} on {result.platform}, {result.schedule}: step {result.step_time_s:.3g} s, "
        f"bubble {result.bubble_fraction:.1%}"
    )
    from matplotlib.patches import Patch

    kinds = sorted({op for _, _, op in bars}, key=list(OP_COLOURS).index)
    ax.legend(
        handles=[Patch(color=OP_COLOURS[k], label=k) for k in kinds],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize="small",
    )


def _memory(ax, result, scale: float) -> None:
    for s, points in enumerate(result.memory_timeline):
        if not points:
            continue
        ts = [t * scale for t, _ in points] + [result.step_time_s * scale]
        gb = [sum(b.values()) / _GB for _, b in points]
        ax.step(ts, gb + gb[-1:], where="post", label=f"stage {s}", linewidth=1)
    if result.memory_cap_bytes:
        cap = result.memory_cap_bytes / _GB
        ax.axhline(cap, color="red", linestyle="-", linewidth=1, label="usable memory")
        if result.workspace_bytes:
            ax.axhline(
                cap - result.workspace_bytes / _GB,
                color="red",
                linestyle=":",
                linewidth=1,
                label="usable - workspace",
            )
    ax.set_ylabel("GB")
    ax.set_ylim(bottom=0)
    if result.pp <= 16:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")


def plot(result, path: str | Path) -> Path:
    """Draw `result` (a `SimResult`) to a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale, unit = (1e3, "ms") if result.step_time_s < 10 else (1.0, "s")
    has_memory = any(result.memory_timeline)
    rows = min(max(result.pp, 2), 32)
    fig, axes = plt.subplots(
        2 if has_memory else 1,
        1,
        figsize=(14, 2 + 0.4 * rows + (3 if has_memory else 0)),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [max(rows, 3), 4] if has_memory else [1]},
    )
    _timeline(axes[0][0], result, scale)
    if has_memory:
        _memory(axes[1][0], result, scale)
    axes[-1][0].set_xlabel(f"time ({unit})")
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p
