"""Plots of a validation: predicted vs measured step time (scatter), and one plan's
measured and simulated timelines side by side (the simulator's drawing of a step)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

__all__ = ["scatter", "traces_side_by_side"]


def scatter(results, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    meas = [r.measured_step_s for r in results]
    pred = [r.predicted_step_s for r in results]
    for model, marker in zip(dict.fromkeys(r.model for r in results), "os^Dv", strict=False):
        pts = [(r.measured_step_s, r.predicted_step_s) for r in results if r.model == model]
        ax.scatter(*zip(*pts, strict=True), marker=marker, label=model)
    for r in results:
        ax.annotate(r.name, (r.measured_step_s, r.predicted_step_s), fontsize=6)
    lo, hi = min(meas + pred) * 0.8, max(meas + pred) * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], alpha=0.15, label="±10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.legend(fontsize=8)
    ax.set_title("ratrain validate: predicted vs measured")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _measured_events(records: list[dict]):
    """Measured records of one step as simulator-like events, times from the step's start."""
    t0 = min((r["start_s"] for r in records), default=0.0)
    return [
        SimpleNamespace(
            stage=r["stage"],
            resource=r["resource"],
            op=r["op"],
            start_s=r["start_s"] - t0,
            end_s=r["end_s"] - t0,
        )
        for r in records
    ]


def traces_side_by_side(sim_result, records: list[dict], title: str, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ratrain.sim.plot import _timeline

    events = _measured_events(records)
    step_s = max((e.end_s for e in events), default=0.0)
    pp = sim_result.pp
    busy = sum(e.end_s - e.start_s for e in events if e.resource == "compute")
    measured = SimpleNamespace(
        events=events,
        pp=pp,
        model=sim_result.model,
        platform="this machine",
        schedule=sim_result.schedule,
        plan=sim_result.plan,
        step_time_s=step_s,
        bubble_fraction=1 - busy / (pp * step_s) if step_s else 0.0,
    )
    end = max(step_s, sim_result.step_time_s)
    fig, axes = plt.subplots(2, 1, figsize=(12, 5), sharex=True)
    for ax, res, label in ((axes[0], measured, "measured"), (axes[1], sim_result, "simulated")):
        _timeline(ax, res, 1.0)
        ax.set_title(f"{title}: {label}", fontsize=9)
        ax.set_xlim(0, end * 1.02)
    axes[1].set_xlabel("time (s)")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p
