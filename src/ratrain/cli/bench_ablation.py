"""The ablation table of `ratrain bench paper`: RATrain's best plan against itself with
each lifecycle mechanism switched off in turn (`ratrain.planner.ablation`); and what the
zero-bubble pass order adds (`ratrain.planner.paper.zero_bubble`)."""

from __future__ import annotations

from ratrain.config import PLANNED_ZB_PIPELINES

__all__ = ["ablation_markdown", "ablation_json", "zb_markdown", "zb_json"]

_LABELS = {
    "ratrain-no-layer-sync": "per-layer sync + update",
    "ratrain-no-transient-views": "transient views",
    "ratrain-no-per-stage-recompute": "per-stage recompute",
    "ratrain-no-offload": "offload",
    "ratrain-no-uneven-split": "uneven splits",
    "ratrain-no-zb": "zero bubble",
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
    order only, with the pipeline searched, and its best plan with each zero-bubble
    pipeline pinned."""
    if not rows:
        return []
    pipes = list(PLANNED_ZB_PIPELINES)
    lines = [
        "",
        f"## What zero-bubble pass orders add ({platform}, 1024 clusters)",
        "",
        "RATrain re-planned under the same cap with the 1F1B pass order only, with the "
        f"pipeline searched (1f1b, {', '.join(pipes)}: `plan.pipeline`), and with each "
        "zero-bubble pipeline pinned. Both split each backward into its input-gradient and "
        "weight-gradient halves and defer the latter into the bubble; zb-h2 also doubles the "
        "warm-up (stage 0 holds up to 2pp - 1 microbatches). The planner tries them with "
        "every recompute policy and only with the knobs a split backward supports "
        "(`ratrain.schedule.zerobubble.refuse_unsupported`: no fsdp-pp).",
        "",
        "| model | ratrain (1f1b) tokens/s | ratrain (pipeline searched) tokens/s | gain "
        "| chosen pipeline | "
        + " | ".join(f"best {p} plan tokens/s | {p} vs 1f1b" for p in pipes)
        + " |",
        "| --- | ---: | ---: | ---: | --- | " + " | ".join("---: | ---:" for _ in pipes) + " |",
    ]
    for r in rows:
        pipe = "—" if r.best is None else r.best.plan.pipeline
        cells = " | ".join(f"{_tps(r.zb.get(p))} | {_ratio(r.zb_ratio(p))}" for p in pipes)
        lines.append(
            f"| {r.model} | {_tps(r.onef1b)} | {_tps(r.best)} | {_ratio(r.gain())} | {pipe} "
            f"| {cells} |"
        )
    for p in pipes:
        lines += ["", f"Best {p} plans (or, where none fits, the search's nearest miss):", ""]
        lines += [f"- {r.model}: {_zb_plan(r, p)}" for r in rows]
    return lines


def _zb_plan(r, pipeline: str) -> str:
    best, n = r.zb.get(pipeline), r.zb_near.get(pipeline)
    if best is not None or n is None:
        return f"`{_describe(best)}`"
    how = "by the ledger" if n.measured else "at least, by the memory bound"
    return (
        f"none fits; nearest miss found `{_describe(n)}`, stage {n.worst_stage} over the cap by "
        f"{n.over_bytes / 1e9:.2f} GB ({how})"
    )


def zb_json(rows) -> list[dict]:
    out = []
    for r in rows:
        row = {
            "model": r.model,
            "ratrain_1f1b_tokens_per_s": r.onef1b and r.onef1b.tokens_per_s,
            "ratrain_zb_tokens_per_s": r.best and r.best.tokens_per_s,
            "gain": r.gain(),
            "chosen_pipeline": r.best and r.best.plan.pipeline,
        }
        for p in PLANNED_ZB_PIPELINES:
            key, best, near = p.replace("-", "_"), r.zb.get(p), r.zb_near.get(p)
            row[f"best_{key}_tokens_per_s"] = best and best.tokens_per_s
            row[f"{key}_vs_1f1b"] = r.zb_ratio(p)
            row[f"best_{key}_plan"] = best and best.plan.to_dict()
            row[f"closest_{key}_miss"] = near and {
                "plan": near.plan.to_dict(),
                "over_bytes": near.over_bytes,
                "measured": near.measured,
            }
        out.append(row)
    return out


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
