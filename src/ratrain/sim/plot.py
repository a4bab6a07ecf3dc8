"""A PNG of a simulated step: the timeline (a row per stage, coloured by action kind) above
memory over time per stage, with the platform's cap drawn as a line.

Zero-bubble pipelines' split backward shows as its two passes, B_IN (``BI``) and B_W
(``BW``), in colours of their own; under a V-shaped pipeline (zb-v, 1f1b-v) the actions of
each stage's second chunk (chunks pp..2pp-1, the way back up the V) are hatched.

matplotlib is imported when a plot is drawn (Agg backend), never at import time.
"""

from __future__ import annotations

from pathlib import Path

from ratrain.config import V_PIPELINES, even_split
from ratrain.schedule.ir import Op

__all__ = ["plot", "OP_COLOURS", "second_chunk_units"]

OP_COLOURS = {  # every `Op`'s value (tests/sim/test_sim_plot.py checks), in legend order
    "F": "#4c72b0",
    "B": "#dd8452",
    "BI": "#e8a33d",
    "BW": "#ccb974",
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
_OTHER = "#cccccc"  # an op without a colour (none today)
_SECOND_CHUNK_HATCH = "////"
# Within a stage's row: compute in the middle band, the async resources in thin bands below.
_BAND = {"compute": (0.35, 0.5), "copy": (0.2, 0.12), "dp_net": (0.08, 0.12), "p2p": (0.86, 0.1)}
_GB = 1e9


def second_chunk_units(result) -> set[int]:
    """Under a V-shaped pipeline, the units of each stage's second chunk: chunks pp..2pp-1
    of the 2pp (stage s holds chunks s and 2pp-1-s, in model order); empty otherwise. The
    model's layer count is read off the events (its head, unit L + 1, has a forward)."""
    plan = getattr(result, "plan", None) or {}  # a measured timeline may name none
    if plan.get("pipeline") not in V_PIPELINES:
        return set()
    units = [u for e in result.events if e.action.op is Op.F for u in e.action.units]
    if not units:
        return set()
    last = max(units)  # the head: n_layers + 1
    pp = plan["pp"]
    split = plan.get("layer_split") or even_split(last - 1, 2 * pp)
    return set(range(1 + sum(split[:pp]), last + 1))


def _timeline(ax, result, scale: float) -> None:
    second = second_chunk_units(result)
    bars: dict[tuple[int, str, str, bool], list[tuple[float, float]]] = {}
    for e in result.events:
        if e.resource in _BAND and e.end_s > e.start_s:
            # Layer-level compute of a second chunk (its units all there); not bucketed ones
            chunk2 = bool(second) and e.resource == "compute" and bool(e.action.units)
            chunk2 = chunk2 and all(u in second for u in e.action.units)
            chunk2 = chunk2 and e.action.mb is not None
            bars.setdefault((e.stage, e.resource, e.op, chunk2), []).append(
                (e.start_s * scale, (e.end_s - e.start_s) * scale)
            )
    for (s, res, op, chunk2), spans in sorted(bars.items()):
        y0, h = _BAND[res]
        ax.broken_barh(
            spans,
            (s + y0, h),
            facecolors=OP_COLOURS.get(op, _OTHER),
            edgecolors="white",
            hatch=_SECOND_CHUNK_HATCH if chunk2 else None,
            linewidth=0,
        )
    ax.set_ylim(result.pp, 0)
    ax.set_yticks([s + 0.5 for s in range(result.pp)], [f"stage {s}" for s in range(result.pp)])
    pipeline = result.plan.get("pipeline", "1f1b")
    ax.set_title(
        f"{result.model} on {result.platform}, {result.schedule}"
        f"{f' ({pipeline} pipeline)' if pipeline != '1f1b' else ''}: "
        f"step {result.step_time_s:.3g} s, bubble {result.bubble_fraction:.1%}"
    )
    from matplotlib.patches import Patch

    order = list(OP_COLOURS)
    kinds = sorted(
        {op for _, _, op, _ in bars},
        key=lambda k: (order.index(k) if k in order else len(order), k),
    )
    handles = [Patch(color=OP_COLOURS.get(k, _OTHER), label=k) for k in kinds]
    if any(chunk2 for *_, chunk2 in bars):
        handles.append(
            Patch(
                facecolor="#999999",
                edgecolor="white",
                hatch=_SECOND_CHUNK_HATCH,
                label="2nd chunk (V)",
            )
        )
    ax.legend(
        handles=handles,
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
        ax.axhline(cap, color="red", linestyle="-", linewidth=1, label="cap")
        if result.workspace_bytes:
            ax.axhline(
                cap - result.workspace_bytes / _GB,
                color="red",
                linestyle=":",
                linewidth=1,
                label="usable (cap - workspace)",
            )
        if result.headroom_bytes:
            usable = cap - (result.workspace_bytes + result.headroom_bytes) / _GB
            ax.axhspan(
                usable,
                usable + result.headroom_bytes / _GB,
                color="red",
                alpha=0.12,
                label="headroom (kept free)",
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
