"""Presenting search results: the ranked table, what made the winner win, JSON, and the
memory-breakdown plot. Pure Python (matplotlib only inside `plot_memory`)."""

from __future__ import annotations

from ratrain.config import Plan
from ratrain.planner.search import Candidate, SearchResult

__all__ = [
    "describe",
    "why",
    "ranked_table",
    "stage_table",
    "result_json",
    "plot_memory",
    "limit_words",
]

_GB = 1e9
_KNOBS = (
    ("schedule", "schedule"),
    ("pp", "pp"),
    ("dp", "dp"),
    ("micro_batch", "micro-batch"),
    ("layer_split", "split"),
    ("recompute", "recompute"),
    ("shard_optimizer", "sharded optimizer"),
    ("view_policy", "views"),
    ("view_lookahead", "view lookahead"),
    ("grad_dtype", "gradient dtype"),
    ("offload_activations", "offload"),
    ("pipeline", "pipeline"),
    ("loss_chunk_tokens", "fused loss chunk"),
)


def _runs(values) -> str:
    """Run-length text: none,selective*16,none*15."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return ",".join(f"{v}*{n}" if n > 1 else str(v) for v, n in out)


def _rec(p: Plan) -> str:
    rec = p.recompute
    return rec[0] if len(set(rec)) == 1 else _runs(rec)


def describe(p: Plan) -> str:
    """One line naming every knob of a plan."""
    views = p.view_policy + (f"/{p.view_lookahead}" if p.view_policy == "transient" else "")
    return (
        f"{p.schedule} pp={p.pp} dp={p.dp} mb={p.micro_batch} m={p.microbatches} "
        f"split={_runs(p.layer_split or ())} recompute={_rec(p)} "
        f"shard={'yes' if p.shard_optimizer else 'no'} views={views} grad={p.grad_dtype} "
        f"offload={'yes' if p.offload_activations else 'no'}"
        + (f" layout={p.rank_layout}" if p.rank_layout != "pp-inner" else "")
        + (f" pipeline={p.pipeline}" if p.pipeline != "1f1b" else "")
        + (f" loss=fused/{p.loss_chunk_tokens}" if p.loss_chunk_tokens else "")
        + (f" sync_buckets={p.sync_bucket_bytes}" if p.sync_bucket_bytes else "")
    )


def _value(p: Plan, f: str) -> str:
    v = getattr(p, f)
    if f == "recompute":
        return _rec(p)
    if isinstance(v, tuple):
        return _runs(v)
    return str(v)


def why(c: Candidate, other: Candidate | None, label: str = "next") -> str:
    """What sets `c` apart from `other`: the tokens/s margin and the knobs that differ."""
    parts = []
    if c.recompute_free:
        parts.append("no recomputation needed")
    if other is None:
        return "; ".join(parts) or "the only feasible plan"
    gain = c.tokens_per_s / other.tokens_per_s - 1 if other.tokens_per_s else 0.0
    diff = [
        f"{name} {_value(c.plan, f)} vs {_value(other.plan, f)}"
        for f, name in _KNOBS
        if _value(c.plan, f) != _value(other.plan, f)
    ]
    head = f"{gain:+.1%} over {label}"
    if diff:
        head += ": " + "; ".join(diff[:4]) + ("; ..." if len(diff) > 4 else "")
    return "; ".join([head, *parts])


def ranked_table(res: SearchResult) -> str:
    """The ranked plans, one per line."""
    req = res.request
    cap = req.platform.plan_limit_bytes
    lines = [
        f"{'#':>2}  {'family':9}  {'tokens/s':>11}  {'step s':>8}  {'bubble':>6}  "
        f"{'peak GB (max stage)':>19}  plan"
    ]
    for i, c in enumerate(res.ranked, 1):
        lines.append(
            f"{i:>2}  {c.family:9}  {c.tokens_per_s:>11,.1f}  {c.step_time_s:>8.4g}  "
            f"{c.bubble_fraction:>6.1%}  {max(c.peak_memory_bytes) / _GB:>8.2f} / {cap / _GB:<8.2f}  "
            f"{describe(c.plan)}"
        )
    return "\n".join(lines)


def stage_table(c: Candidate) -> str:
    """Per stage: blocks, recompute, peak against the cap, the largest state classes."""
    cap = c.limit_bytes
    p = c.plan
    lines = [
        f"{'stage':>5}  {'blocks':>6}  {'recompute':>9}  {'peak GB':>8}  {'of cap':>6}  largest classes at the peak"
    ]
    for s, peak in enumerate(c.peak_memory_bytes):
        parts = sorted(c.memory_breakdown[s].items(), key=lambda kv: -kv[1])[:3]
        top = ", ".join(f"{k} {v / _GB:.2f}" for k, v in parts if v)
        lines.append(
            f"{s:>5}  {(p.layer_split or ())[s]:>6}  {p.recompute[s]:>9}  {peak / _GB:>8.2f}  "
            f"{peak / cap:>6.1%}  {top}"
        )
    return "\n".join(lines)


def _candidate_json(c: Candidate) -> dict:
    return {"family": c.family, "plan": c.plan.to_dict(), "predicted": c.predicted()}


def result_json(res: SearchResult, explanation=None, baselines: dict | None = None) -> dict:
    """The `ratrain plan --json` object."""
    req = res.request
    d: dict = {
        "feasible": res.feasible,
        "model": req.spec.name,
        "platform": req.platform.name,
        "clusters": req.clusters,
        "global_batch": req.global_batch,
        "seq": req.seq,
        "limit_bytes": req.platform.plan_limit_bytes,
        "headroom_bytes": req.platform.headroom_bytes,
        "pins": {k: list(v) if isinstance(v, tuple) else v for k, v in req.pins.items()},
        "search_time_s": res.search_time_s,
        "first_fit_s": res.first_fit_s,
        "candidates_evaluated": res.candidates_evaluated,
        "candidates_simulated": res.candidates_simulated,
        "candidates_total": res.candidates_total,
        "memory_replays": res.memory_replays,
        "cut": res.cut,
        "unfinished": res.unfinished,
    }
    if res.cut and not res.unfinished:
        d.update(floor_step_s=res.floor_step_s, gap=res.gap)
    if res.found_apart:  # the plan looked for apart, not bettered by the search
        d["found_apart"] = True
    if res.v_untried:  # V-shaped plans not tried within the time budget
        d["v_untried"] = res.v_untried
    if res.untimed is not None:  # fits by the ledger; its step was not simulated in time
        d["untimed_fit"] = res.untimed.to_json()
    if res.best is not None:
        b = res.best
        d.update(
            family=b.family,
            plan=b.plan.to_dict(),
            predicted=b.predicted(),
            clusters_used=b.clusters_used,
            leftover_clusters=req.clusters - b.clusters_used,
            ranked=[_candidate_json(c) for c in res.ranked],
        )
    if explanation is not None:
        d["explanation"] = explanation.to_json()
    if baselines:
        # a family's search stopped with no plan found in time: "unfinished", not null
        d["baselines"] = {
            name: c
            if c is None or isinstance(c, str)
            else {**_candidate_json(c), "speedup": _speedup(res.best, c)}
            for name, c in baselines.items()
        }
    return d


def _speedup(best: Candidate | None, base: Candidate) -> float | None:
    return best.tokens_per_s / base.tokens_per_s if best is not None and base.tokens_per_s else None


def limit_words(platform) -> str:
    """What a plan's per-stage limit is, in words: the cap less the workspace, and less the
    headroom where the platform keeps one (`Platform.plan_limit_bytes`)."""
    if not platform.headroom_bytes:
        return "the cap - workspace"
    return (
        f"the cap - workspace - {platform.headroom_bytes / _GB:.2f} GB headroom "
        f"({platform.headroom_fraction:.0%} kept free for fragmentation)"
    )


def plot_memory(c: Candidate, path: str, title: str = "", headroom_bytes: int = 0) -> None:
    """A stacked bar per stage of the state classes at its peak, against the cap; the
    headroom above the limit as a band of its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ratrain.sizes.states import STATE_CLASSES

    pp = len(c.peak_memory_bytes)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * pp + 3), 4.5))
    bottom = [0.0] * pp
    for cls in STATE_CLASSES:
        vals = [c.memory_breakdown[s].get(cls, 0) / _GB for s in range(pp)]
        if any(vals):
            label = "kernel buffers" if cls == "workspace" else cls  # not the cap's workspace
            ax.bar(range(pp), vals, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    limit = c.limit_bytes / _GB
    ax.axhline(
        limit,
        color="red",
        linestyle="--",
        label="plan limit" if headroom_bytes else "usable (cap - workspace)",
    )
    if headroom_bytes:
        top = limit + headroom_bytes / _GB
        ax.axhspan(limit, top, color="red", alpha=0.12, label="headroom (kept free)")
    ax.set_xticks(range(0, pp, max(1, pp // 16)))
    ax.set_xlim(-0.6, pp - 0.4)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GB at the stage's peak")
    ax.set_title(title or describe(c.plan), fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
