"""The ablation table of `ratrain bench paper`: RATrain's best plan against itself with
each lifecycle mechanism switched off in turn (`ratrain.planner.ablation`)."""

from __future__ import annotations

__all__ = ["ablation_markdown", "ablation_json"]

_LABELS = {
    "ratrain-no-layer-sync": "per-layer sync + update",
    "ratrain-no-transient-views": "transient views",
    "ratrain-no-per-stage-recompute": "per-stage recompute",
    "ratrain-no-offload": "offload",
    "ratrain-no-uneven-split": "uneven splits",
}


def _cell(rel: float | None) -> str:
    return "none fits" if rel is None else f"{rel:.3f} ({(rel - 1) * 100:+.1f}%)"


def ablation_markdown(rows, platform: str) -> list[str]:
    """Markdown lines (none when `rows` is empty)."""
    if not rows:
        return []
    names = list(_LABELS)
    lines = [
        "",
        f"## Where RATrain's gain comes from ({platform}, 1024 clusters)",
        "",
        "RATrain's tokens/s with one mechanism switched off, re-planned under the same cap, "
        "relative to RATrain with all of them (1.000 = the mechanism is worth nothing here; "
        "lower = it is worth that much).",
        "",
        "| model | RATrain tokens/s | " + " | ".join(f"no {_LABELS[n]}" for n in names) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in names) + " |",
    ]
    for r in rows:
        full = "—" if r.full is None else f"{r.full.tokens_per_s:,.0f}"
        cells = " | ".join(_cell(r.relative(n)) for n in names)
        lines.append(f"| {r.model} | {full} | {cells} |")
    lines += [
        "",
        "Without per-layer sync and update the step uses the gpu-style lowering (bucketed "
        "syncs, one optimizer step per stage); transient views and offload exist only in "
        "the lifecycle lowering, so they are off in that column too.",
    ]
    return lines


def ablation_json(rows) -> list[dict]:
    return [
        {
            "model": r.model,
            "full_tokens_per_s": r.full and r.full.tokens_per_s,
            "relative": {n: r.relative(n) for n in _LABELS},
            "plans": {n: (c and c.plan.to_dict()) for n, c in r.off.items()},
        }
        for r in rows
    ]
