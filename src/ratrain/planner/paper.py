"""The paper's evaluation, by planning and simulation: RATrain against the baseline
families (gpu-style, zero1-pp, fsdp-pp) under the same memory cap, where RATrain's gain
comes from (an ablation of its lifecycle mechanisms), and the LLaMA-2-7B scaling curve.

Every figure here is a prediction of ratrain's cost model from platform constants that are
sourced or assumed (see the platform file); none is fitted to the paper's results, which
are listed beside ours in `PAPER`. Pure Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ratrain.config import PLANNED_ZB_PIPELINES
from ratrain.models.presets import get_preset
from ratrain.planner.families import COMPARED_FAMILIES
from ratrain.planner.search import Candidate, Near, search
from ratrain.planner.space import Request
from ratrain.platforms import Platform

__all__ = [
    "PAPER",
    "PAPER_MODELS",
    "SCALING_CLUSTERS",
    "AblationRow",
    "ModelRow",
    "ScalePoint",
    "ZbRow",
    "ablate",
    "compare_models",
    "scaling_curve",
    "zero_bubble",
]

PAPER = {
    "max_speedup": 1.35,
    "llama2_7b_1024_tokens_per_s": 112_790.55,
    "llama2_7b_1024_scaling_efficiency": 0.970,
    "memory_cap_bytes": 20e9,
}
"""RATrain (arXiv 2606.10415): up to 1.35x over MT-3000-adapted GPU-style strategies;
LLaMA-2-7B on 1024 compute clusters at 112,790.55 tokens/s, 97.0% scaling efficiency."""

PAPER_MODELS = ("llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b")
SCALING_CLUSTERS = (8, 16, 32, 64, 128, 256, 512, 1024)
SEQ = 4096
BATCH_TOKENS = 4 * 2**20
"""LLaMA 2's global batch (Touvron et al. 2023, §2.2): 4M tokens, 1024 sequences of 4096."""


@dataclass
class ModelRow:
    model: str
    ratrain: Candidate | None
    baselines: dict[str, Candidate | None]
    search_time_s: float

    def speedup(self, family: str | None = None) -> float | None:
        """Over one baseline family, or over the best baseline when `family` is None."""
        if self.ratrain is None:
            return None
        if family is None:
            found = [c for c in self.baselines.values() if c is not None]
            base = max(found, key=lambda c: c.tokens_per_s) if found else None
        else:
            base = self.baselines.get(family)
        return None if base is None else self.ratrain.tokens_per_s / base.tokens_per_s


@dataclass
class ScalePoint:
    clusters: int
    global_batch: int
    best: Candidate | None
    efficiency: float | None = None
    """(tokens/s at N / N) / (tokens/s at the first point / its clusters)."""


def _req(model: str, platform: Platform, clusters: int, global_batch: int, families) -> Request:
    return Request(get_preset(model), platform, clusters, global_batch, SEQ, families=families)


def compare_models(
    platform: Platform,
    models: tuple[str, ...] = PAPER_MODELS,
    clusters: int = 1024,
    progress: Callable[[str], None] | None = None,
    baselines: tuple[str, ...] = COMPARED_FAMILIES,
) -> list[ModelRow]:
    """Per model: the best RATrain plan and the best plan of each baseline family."""
    rows = []
    gb = BATCH_TOKENS // SEQ
    for model in models:
        t0 = time.perf_counter()
        best = search(_req(model, platform, clusters, gb, ("ratrain",)), top=1).best
        bases = {
            fam: search(_req(model, platform, clusters, gb, (fam,)), top=1).best
            for fam in baselines
        }
        rows.append(ModelRow(model, best, bases, time.perf_counter() - t0))
        if progress:
            progress(f"{model}: {rows[-1].search_time_s:.1f} s")
    return rows


@dataclass
class AblationRow:
    model: str
    full: Candidate | None
    """RATrain's best plan with every mechanism."""
    off: dict[str, Candidate | None]
    """Ablation family name -> its best plan, re-planned under the same cap."""

    def relative(self, name: str) -> float | None:
        """tokens/s with the mechanism off over tokens/s with everything on."""
        c = self.off.get(name)
        if c is None or self.full is None:
            return None
        return c.tokens_per_s / self.full.tokens_per_s


def ablate(
    platform: Platform,
    rows: list[ModelRow],
    clusters: int = 1024,
    progress: Callable[[str], None] | None = None,
) -> list[AblationRow]:
    """Per model of `rows` (from `compare_models`): RATrain re-planned with each lifecycle
    mechanism switched off in turn (`ratrain.planner.ablation`)."""
    from ratrain.planner.ablation import ABLATIONS

    out = []
    gb = BATCH_TOKENS // SEQ
    for r in rows:
        off = {
            name: search(_req(r.model, platform, clusters, gb, (name,)), top=1).best
            for name in ABLATIONS
        }
        out.append(AblationRow(r.model, r.ratrain, off))
        if progress:
            progress(f"{r.model}: ablations")
    return out


@dataclass
class ZbRow:
    """What the zero-bubble pass orders (ZB-H1, ZB-H2, `ratrain.schedule.zerobubble`) add to
    RATrain for one model under the same cap."""

    model: str
    onef1b: Candidate | None
    """RATrain's best plan with the 1F1B pass order only (`ratrain-no-zb`)."""
    best: Candidate | None
    """RATrain's best plan with the pipeline searched (1f1b, zb-h1 or zb-h2)."""
    zb: dict[str, Candidate | None] = field(default_factory=dict)
    """Per zero-bubble pipeline: RATrain's best plan with it pinned and a bubble (pp > 1: on
    one stage a zero-bubble order is 1F1B with the backward split), under every recompute
    policy and only the knobs a split backward supports, whether or not it wins."""
    zb_near: dict[str, Near | None] = field(default_factory=dict)
    """Per zero-bubble pipeline with no such plan: the one that came closest
    (`SearchResult.near`)."""

    def gain(self) -> float | None:
        """tokens/s with the pipeline searched over tokens/s with 1F1B only."""
        return _ratio(self.best, self.onef1b)

    def zb_ratio(self, pipeline: str) -> float | None:
        """tokens/s of the best `pipeline` plan over the best 1F1B plan."""
        return _ratio(self.zb.get(pipeline), self.onef1b)


def _ratio(a: Candidate | None, b: Candidate | None) -> float | None:
    return None if a is None or b is None else a.tokens_per_s / b.tokens_per_s


def zero_bubble(
    platform: Platform,
    rows: list[ModelRow],
    ablations: list[AblationRow] = (),
    clusters: int = 1024,
    progress: Callable[[str], None] | None = None,
) -> list[ZbRow]:
    """Per model of `rows` (from `compare_models`, whose RATrain search tries every
    pipeline): RATrain with 1F1B only (from `ablations` when they have it) and with each
    zero-bubble pipeline pinned."""
    out = []
    gb = BATCH_TOKENS // SEQ
    done = {a.model: a.off.get("ratrain-no-zb") for a in ablations if "ratrain-no-zb" in a.off}
    for r in rows:
        if r.model in done:
            onef1b = done[r.model]
        else:
            onef1b = search(_req(r.model, platform, clusters, gb, ("ratrain-no-zb",)), top=1).best
        row = ZbRow(r.model, onef1b, r.ratrain)
        for pipeline in PLANNED_ZB_PIPELINES:
            pinned = _req(r.model, platform, clusters, gb, ("ratrain",)).with_(
                pins={"pipeline": pipeline}
            )
            row.zb[pipeline], row.zb_near[pipeline] = _zb_with_bubble(pinned)
            if progress:
                progress(f"{r.model}: {pipeline}")
        out.append(row)
    return out


def _zb_with_bubble(pinned: Request) -> tuple[Candidate | None, Near | None]:
    """The best plan of `pinned` (a zero-bubble pipeline pinned) with pp > 1, or the nearest
    miss among those: one search, and where its best runs one stage, one more over the
    pipelines of two stages and more (`Request.min_pp`)."""
    res = search(pinned, top=1)
    if res.best is None or res.best.plan.pp > 1:
        return res.best, res.near
    deeper = search(pinned.with_(min_pp=2), top=1)
    return deeper.best, deeper.near


def scaling_curve(
    platform: Platform,
    model: str = "llama2-7b",
    clusters: tuple[int, ...] = SCALING_CLUSTERS,
    *,
    weak: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[ScalePoint]:
    """The best RATrain plan at each cluster count. Strong scaling (default): the global
    batch stays LLaMA 2's 4M tokens; weak: one 4096-token sequence per cluster per step
    (4M tokens at 1024 clusters)."""
    points = []
    for n in clusters:
        gb = max(1, n * BATCH_TOKENS // SEQ // 1024) if weak else BATCH_TOKENS // SEQ
        best = search(_req(model, platform, n, gb, ("ratrain",)), top=1).best
        points.append(ScalePoint(n, gb, best))
        if progress:
            progress(f"{model} on {n} clusters")
    base = points[0]
    for p in points:
        if p.best is not None and base.best is not None:
            per = p.best.tokens_per_s / p.clusters
            p.efficiency = per / (base.best.tokens_per_s / base.clusters)
    return points
