"""Validation grids: the plans `ratrain validate` runs, with the model each one trains.

A grid file (YAML or JSON) is a mapping with `models` (name -> `ModelSpec` fields) and
`plans` (a list of mappings: `name`, `model`, and `Plan` fields), e.g.

    models:
      small: {n_layers: 4, hidden: 384, n_heads: 6, n_kv_heads: 6, ffn: 1024, vocab: 4096}
    plans:
      - {name: s-pp2, model: small, pp: 2, micro_batch: 2, global_batch: 8, seq: 128}

Within one model, every plan of the default grid trains the same job (the same global
batch and sequence length), so their step times rank the ways to run that job, and the
planner's pick among them can be checked against the measured fastest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.yaml_io import read_yaml_file

__all__ = ["GridPlan", "default_grid", "load_grid", "load_grid_models", "DEFAULT_MODELS"]

DEFAULT_MODELS = {
    # Both models take >= 0.5 s a step on 2 cores (the floor: per-op dispatch and
    # the machine's jitter weigh less in a longer step).
    "small": dict(n_layers=4, hidden=384, n_heads=6, n_kv_heads=6, ffn=1024, vocab=4096),
    "medium": dict(n_layers=8, hidden=512, n_heads=8, n_kv_heads=8, ffn=1376, vocab=8192),
}

_COMMON = dict(seq=128, global_batch=8, clip_grad=1.0)
# (name, model, plan fields); pp x dp up to 4 ranks (up to 2 per core on 2 cores).
_DEFAULT = (
    ("s-pp1", "small", dict(micro_batch=2, compute_dtype="fp32")),
    ("s-pp2", "small", dict(pp=2, micro_batch=2, compute_dtype="fp32")),
    ("s-pp2-mb1-base", "small", dict(pp=2, micro_batch=1, schedule="baseline")),
    (
        "s-pp2-sel-gpu",
        "small",
        dict(pp=2, micro_batch=2, recompute="selective", schedule="gpu-style"),
    ),
    ("s-dp2-shard", "small", dict(dp=2, micro_batch=2, shard_optimizer=True)),
    ("s-pp2-full", "small", dict(pp=2, micro_batch=4, recompute="full")),
    (
        "s-pp2-bf16-tv",
        "small",
        dict(pp=2, micro_batch=2, compute_dtype="bf16", view_policy="transient"),
    ),
    ("s-pp2-zb", "small", dict(pp=2, micro_batch=2, compute_dtype="fp32", pipeline="zb-h1")),
    ("m-pp2", "medium", dict(pp=2, micro_batch=2)),
    ("m-pp2-zb", "medium", dict(pp=2, micro_batch=2, pipeline="zb-h1")),
    ("m-pp2-zb2", "medium", dict(pp=2, micro_batch=2, pipeline="zb-h2")),
    ("m-pp2-full-base", "medium", dict(pp=2, micro_batch=2, recompute="full", schedule="baseline")),
    (
        "m-pp2-mb4-sel-gpu",
        "medium",
        dict(pp=2, micro_batch=4, recompute="selective", schedule="gpu-style"),
    ),
    ("m-dp2", "medium", dict(dp=2, micro_batch=2)),
    ("m-pp1", "medium", dict(micro_batch=4)),
    (
        "m-pp2-dp2-shard-tv",
        "medium",
        dict(pp=2, dp=2, micro_batch=2, shard_optimizer=True, view_policy="transient"),
    ),
)


@dataclass(frozen=True)
class GridPlan:
    name: str
    model: str
    spec: ModelSpec
    plan: Plan


def _spec(name: str, fields: dict) -> ModelSpec:
    try:
        return ModelSpec(name=name, **fields)
    except TypeError as e:
        raise RatrainError(f"grid: model {name!r}: {e}") from None


def _plan(name: str, spec: ModelSpec, fields: dict) -> Plan:
    fields = {**fields}
    if isinstance(fields.get("recompute"), list):
        fields["recompute"] = tuple(fields["recompute"])
    fields.setdefault("compute_dtype", "fp32")
    try:
        plan = Plan(**fields)
    except TypeError as e:
        raise RatrainError(f"grid: plan {name!r}: {e}") from None
    plan.check_for(spec)
    return plan


def _build(models: dict, plans: list) -> list[GridPlan]:
    specs = {m: _spec(m, f) for m, f in models.items()}
    out = []
    for i, entry in enumerate(plans):
        if not isinstance(entry, dict) or "model" not in entry:
            raise RatrainError(f"grid: plans[{i}] must be a mapping with a model")
        entry = dict(entry)
        name, model = str(entry.pop("name", f"plan{i}")), entry.pop("model")
        if model not in specs:
            raise RatrainError(f"grid: plan {name!r} names unknown model {model!r}")
        out.append(GridPlan(name, model, specs[model], _plan(name, specs[model], entry)))
    if len({g.name for g in out}) != len(out):
        raise RatrainError("grid: plan names must be unique")
    return out


def default_grid(max_ranks: int = 4) -> list[GridPlan]:
    """The default grid (15 plans, two models), without plans of more than `max_ranks`."""
    plans = [
        {"name": n, "model": m, **_COMMON, **f}
        for n, m, f in _DEFAULT
        if f.get("pp", 1) * f.get("dp", 1) <= max_ranks
    ]
    return _build(DEFAULT_MODELS, plans)


def _read_grid(path: str | Path) -> dict:
    p = Path(path)
    data = read_yaml_file(p, "grid")
    if not isinstance(data, dict) or not isinstance(data.get("plans"), list):
        raise RatrainError(f"grid {p}: expected a mapping with models and plans")
    models = data.get("models") or {}
    if not isinstance(models, dict):
        raise RatrainError(f"grid {p}: models must be a mapping of name -> model fields")
    return data


def load_grid(path: str | Path) -> list[GridPlan]:
    data = _read_grid(path)
    return _build(data.get("models") or {}, data["plans"])


def load_grid_models(path: str | Path) -> dict[str, ModelSpec]:
    """A grid file's models by name (its plans are not read)."""
    return {m: _spec(m, f) for m, f in (_read_grid(path).get("models") or {}).items()}
