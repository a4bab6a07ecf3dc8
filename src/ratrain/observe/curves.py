"""Training curves from metrics files (`ratrain train --metrics`, `ratrain plot`).

`read_run` takes one JSON-lines file apart into its steps; `plot_curves` draws several runs
on one figure, one colour each: the loss (and the held-out `eval_loss`, dashed) against
steps and against tokens, tokens/s against steps, and each step's peak memory (the
highest over the ranks, of what the record's `peak_bytes_source` says it counts) beside
the memory cap, a horizontal line, where a record or the caller gives one.

A resumed run continues its file (`JsonlWriter(append=True)`): where a step is written
twice, the later record wins. A record's tokens so far are `tokens` where it has them,
else (`step` + 1: steps count from 0) x the tokens of one step (`tokens_per_s` x `step_time_s`, rounded).

matplotlib is imported when a figure is drawn (Agg backend), never at import time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ratrain.errors import RatrainError

__all__ = ["Run", "read_run", "plot_curves", "PEAK_LABELS"]

PEAK_LABELS = {
    "tensors": "peak live tensor bytes",
    "rss": "peak RSS (tensors + runtime)",
}
"""What a record's `peak_bytes_per_rank` counts, by its `peak_bytes_source`
(`ratrain.observe.memory.peaks_per_rank`)."""

_GIB = 2**30


@dataclass
class Run:
    """One metrics file's records, one per step (the later record of a repeated step),
    in step order."""

    label: str
    records: list[dict] = field(default_factory=list)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the records that have a finite number under `key`."""
        xs, ys = [], []
        for r in self.records:
            v = _number(r.get(key))
            if v is not None:
                xs.append(r["step"])
                ys.append(v)
        return xs, ys

    def tokens_at(self, record: dict) -> float | None:
        """The tokens trained on up to and including `record`'s step."""
        t = _number(record.get("tokens"))
        if t is not None:
            return t
        rate, secs = _number(record.get("tokens_per_s")), _number(record.get("step_time_s"))
        if rate is None or secs is None:
            return None
        return (record["step"] + 1) * round(rate * secs)  # steps count from 0

    def peaks(self) -> tuple[list[int], list[float], set[str]]:
        """(steps, the highest rank's peak bytes, the sources those peaks count)."""
        xs, ys, sources = [], [], set()
        for r in self.records:
            per_rank = [v for v in (r.get("peak_bytes_per_rank") or []) if _number(v) is not None]
            per_rank = [v for v in per_rank if v >= 0]
            if per_rank:
                xs.append(r["step"])
                ys.append(float(max(per_rank)))
                sources.add(str(r.get("peak_bytes_source", "?")))
        return xs, ys, sources

    def cap_bytes(self) -> float | None:
        caps = [_number(r.get("memory_cap_bytes")) for r in self.records]
        caps = [c for c in caps if c is not None]
        return caps[-1] if caps else None


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def read_run(path: str | Path, label: str | None = None) -> Run:
    """The records of the metrics file at `path`, or one line (RatrainError) saying why
    there are none: a missing file, a line that is not a JSON object with a whole `step`,
    or no record at all. A last line cut short (a run killed as it wrote) is left out."""
    p = Path(path)
    if not p.exists():
        raise RatrainError(f"{path}: no such file")
    if p.is_dir():
        raise RatrainError(f"{path} is a folder; give a metrics file (ratrain train --metrics)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RatrainError(f"{path}: cannot read it ({e.__class__.__name__}: {e})") from None
    lines = text.split("\n")
    by_step: dict[int, dict] = {}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if i == len(lines):  # no newline after it: cut short as it was written
                continue
            raise RatrainError(
                f"{path}:{i}: not a JSON line; expected the metrics of ratrain train --metrics"
            ) from None
        step = rec.get("step") if isinstance(rec, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            raise RatrainError(
                f"{path}:{i}: not a metrics record (a JSON object with a whole 'step'); "
                "expected the metrics of ratrain train --metrics"
            )
        by_step.pop(step, None)  # a repeated step: the later record wins
        by_step[step] = rec
    if not by_step:
        raise RatrainError(f"{path}: no metrics records (is the run still starting?)")
    return Run(label or p.stem, [by_step[s] for s in sorted(by_step)])


def plot_curves(runs: list[Run], path: str | Path, *, cap_bytes: float | None = None, dpi=100):
    """Draw `runs` on one figure at `path` (its suffix picks the format); returns the axes
    by name: `loss_steps`, `loss_tokens`, `throughput` and `memory`. `cap_bytes`: the
    memory cap to draw (None: the runs' own `memory_cap_bytes`, if any)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import EngFormatter

    fig, grid = plt.subplots(2, 2, figsize=(12, 7.5))
    axes = {
        "loss_steps": grid[0][0],
        "loss_tokens": grid[0][1],
        "throughput": grid[1][0],
        "memory": grid[1][1],
    }
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    sources: set[str] = set()
    caps: list[tuple[float, str]] = []
    peaks: list[tuple[list[int], list[float], str]] = []
    has_eval = False
    for i, run in enumerate(runs):
        c = colours[i % len(colours)]
        for key, style in (("loss", "-"), ("eval_loss", "--")):
            xs, ys = run.series(key)
            if not xs:
                continue
            has_eval |= key == "eval_loss"
            marker = "o" if key == "eval_loss" else None
            kw = dict(color=c, linestyle=style, marker=marker, markersize=4, linewidth=1.2)
            axes["loss_steps"].plot(xs, ys, **kw)
            pts = [(run.tokens_at(r), _number(r.get(key))) for r in run.records]
            pts = [(t, y) for t, y in pts if t is not None and y is not None]
            if pts:
                axes["loss_tokens"].plot([t for t, _ in pts], [y for _, y in pts], **kw)
        xs, ys = run.series("tokens_per_s")
        if xs:
            axes["throughput"].plot(xs, ys, color=c, linewidth=1.2)
        xs, ys, src = run.peaks()
        if xs:
            sources |= src
            peaks.append((xs, ys, c))
        cap = cap_bytes if cap_bytes is not None else run.cap_bytes()
        if cap is not None:
            caps.append((cap, c))
    # Memory in MiB or GiB, whichever reads better; the axis from 0 to above the highest
    # line, so that neither a flat peak nor the cap hides on the frame.
    top = max([max(ys) for _, ys, _ in peaks] + [cap for cap, _ in caps] + [1.0])
    scale, unit = (_GIB, "GiB") if top >= _GIB else (2**20, "MiB")
    for xs, ys, c in peaks:
        axes["memory"].plot(xs, [y / scale for y in ys], color=c, linewidth=1.2)
    for cap in sorted({cap for cap, _ in caps}):  # a cap of one run only in its colour
        owners = {c for v, c in caps if v == cap}
        c = owners.pop() if len(owners) == 1 and len(runs) > 1 else "red"
        axes["memory"].axhline(cap / scale, color=c, linestyle=":", linewidth=1.5)
    axes["memory"].set_ylim(0, top / scale * 1.15)

    ax = axes["loss_steps"]
    ax.set(title="loss", xlabel="step", ylabel="loss")
    ax = axes["loss_tokens"]
    ax.set(title="loss against tokens", xlabel="tokens", ylabel="loss")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax = axes["throughput"]
    ax.set(title="throughput", xlabel="step", ylabel="tokens/s")
    ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_ylim(bottom=0)
    ax = axes["memory"]
    what = " / ".join(PEAK_LABELS.get(s, s) for s in sorted(sources)) or "peak memory"
    ax.set(
        title=_memory_title(caps, sources),
        xlabel="step",
        ylabel=f"{what}\nhighest rank, {unit}",
    )
    for a in axes.values():
        a.grid(True, alpha=0.3)

    handles = [
        Line2D([], [], color=colours[i % len(colours)], label=r.label) for i, r in enumerate(runs)
    ]
    if has_eval:
        handles.append(Line2D([], [], color="grey", linestyle="-", label="train loss"))
        handles.append(Line2D([], [], color="grey", linestyle="--", marker="o", label="eval loss"))
    if caps:
        handles.append(Line2D([], [], color="grey", linestyle=":", label="memory cap"))
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 6), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    try:
        fig.savefig(Path(path), dpi=dpi)
    except OSError as e:
        raise RatrainError(f"-o {str(path)!r}: cannot write it ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return axes


def _memory_title(caps: list, sources: set[str]) -> str:
    if not caps:
        return "peak memory (no cap recorded; --cap GIB draws one)"
    if "rss" in sources:  # the cap bounds the ledger's tensor bytes; RSS holds more
        return "peak memory against the cap (dotted; it bounds tensor bytes)"
    return "peak memory against the cap (dotted)"
