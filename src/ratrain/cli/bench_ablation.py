"""The ablation table of `ratrain bench paper`: RATrain's best plan against itself with
each lifecycle mechanism switched off in turn (`ratrain.planner.ablation`); and what the
zero-bubble pass order adds (`ratrain.planner.paper.zero_bubble`)."""

from __future__ import annotations

__all__ = ["ablation_markdown", "ablation_json", "zb_markdown", "zb_json"]

_LABELS = {
    "ratrain-no-layer-sync": "per-layer sync + update",
    "ratrain-no-transient-views": "transient views",
    "ratrain-no-per-stage-recompute": "per-stage recompute",
    "ratrain-no-offload": "offload",
    "ratrain-no-uneven-split": "uneven splits",
    "ratrain-no-zb-h1": "zb-h1",
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


def _tps(c) -> str:
    return "none fits" if c is None else f"{c.tokens_per_s:,.0f}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}x"


def _describe(c) -> str:
    from ratrain.planner.report import describe

    return "none fits" if c is None else describe(c.plan)


def zb_markdown(rows, platform: str) -> list[str]:
    """Markdown lines (none when `rows` is empty): per model, RATrain with the 1F1B pass
    order only, with the pipeline searched (1f1b or zb-h1), and its best zb-h1 plan."""
    if not rows:
        return []
    lines = [
        "",
        f"## What zero-bubble ZB-H1 adds ({platform}, 1024 clusters)",
        "",
        "RATrain re-planned under the same cap with the 1F1B pass order only, with the "
        "pipeline searched (1f1b or zb-h1, `plan.pipeline`), and with zb-h1 pinned. ZB-H1 "
        "splits each backward into its input-gradient and weight-gradient halves and defers "
        "the latter into the bubble; the planner tries it with every recompute policy and "
        "only with the knobs ZB-H1 supports (`ratrain.schedule.zerobubble.refuse_unsupported`: "
        "no offload, no fsdp-pp).",
        "",
        "| model | ratrain (1f1b) tokens/s | ratrain + zb-h1 tokens/s | gain | chosen pipeline "
        "| best zb-h1 plan tokens/s | zb-h1 vs 1f1b |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        pipe = "—" if r.best is None else r.best.plan.pipeline
        lines.append(
            f"| {r.model} | {_tps(r.onef1b)} | {_tps(r.best)} | {_ratio(r.gain())} | {pipe} "
            f"| {_tps(r.zb)} | {_ratio(r.zb_ratio())} |"
        )
    lines += ["", "Best zb-h1 plans (or, where none fits, the search's nearest miss):", ""]
    lines += [f"- {r.model}: {_zb_plan(r)}" for r in rows]
    return lines


def _zb_plan(r) -> str:
    if r.zb is not None or r.zb_near is None:
        return f"`{_describe(r.zb)}`"
    n = r.zb_near
    how = "by the ledger" if n.measured else "at least, by the memory bound"
    return (
        f"none fits; nearest miss found `{_describe(n)}`, stage {n.worst_stage} over the cap by "
        f"{n.over_bytes / 1e9:.2f} GB ({how})"
    )


def zb_json(rows) -> list[dict]:
    return [
        {
            "model": r.model,
            "ratrain_1f1b_tokens_per_s": r.onef1b and r.onef1b.tokens_per_s,
            "ratrain_zb_tokens_per_s": r.best and r.best.tokens_per_s,
            "gain": r.gain(),
            "chosen_pipeline": r.best and r.best.plan.pipeline,
            "best_zb_h1_tokens_per_s": r.zb and r.zb.tokens_per_s,
            "zb_h1_vs_1f1b": r.zb_ratio(),
            "best_zb_h1_plan": r.zb and r.zb.plan.to_dict(),
            "closest_zb_h1_miss": r.zb_near
            and {
                "plan": r.zb_near.plan.to_dict(),
                "over_bytes": r.zb_near.over_bytes,
                "measured": r.zb_near.measured,
            },
        }
        for r in rows
    ]


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
