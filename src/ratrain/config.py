"""Frozen configuration dataclasses shared by every layer: the plan and the training run.

Pure Python (no torch). A `Plan` says *how* a model is trained on a machine: degrees of
parallelism, batch shape, the layer split, and the lifecycle policies. The schedule IR,
the memory ledger, the simulator, the planner and the runtime all read the same `Plan`.
Field docstrings double as CLI help.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec

__all__ = [
    "SCHEDULES",
    "RECOMPUTE_POLICIES",
    "DTYPES",
    "Plan",
    "TrainConfig",
    "even_split",
    "load_plan",
    "save_plan",
]

SCHEDULES = ("baseline", "gpu-style", "ratrain", "fsdp-pp")
RECOMPUTE_POLICIES = ("none", "selective", "full")  # plus "first:K" (full on the first K blocks)
DTYPES = ("fp32", "bf16", "fp16")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def _parse_recompute(policy: str) -> tuple[str, int | None]:
    if policy in RECOMPUTE_POLICIES:
        return policy, None
    if policy.startswith("first:"):
        try:
            k = int(policy.split(":", 1)[1])
        except ValueError:
            k = -1
        if k >= 0:
            return "first", k
    raise RatrainError(
        f"recompute policy {policy!r} is not one of none, selective, full, first:K (K >= 0)"
    )


def even_split(n_layers: int, pp: int) -> tuple[int, ...]:
    """Blocks per stage, as even as possible, remainder to the middle stages first.

    The first and last stages also hold the embedding and the head, so they are the ones
    to get fewer blocks when the split cannot be even.
    """
    if pp > n_layers:
        raise RatrainError(f"pp={pp} exceeds the model's {n_layers} layers; use pp <= {n_layers}")
    base, rem = divmod(n_layers, pp)
    split = [base] * pp
    order = sorted(range(pp), key=lambda s: (s in (0, pp - 1), s))
    for s in order[:rem]:
        split[s] += 1
    return tuple(split)


@dataclass(frozen=True)
class Plan:
    """One training configuration of a model on a machine."""

    pp: int = 1
    """Pipeline stages."""
    dp: int = 1
    """Data-parallel replicas of the pipeline."""
    micro_batch: int = 1
    """Sequences per microbatch."""
    global_batch: int = 1
    """Sequences per optimizer step, over all replicas: micro_batch x microbatches x dp."""
    seq: int = 128
    """Tokens per sequence."""
    schedule: str = "ratrain"
    """baseline | gpu-style | ratrain | fsdp-pp (needs shard_optimizer; see
    `ratrain.schedule.fsdp`)."""
    layer_split: tuple[int, ...] | None = None
    """Transformer blocks per stage (first and last may be smaller); None: even split."""
    recompute: tuple[str, ...] | str = "none"
    """Per stage (or one for all): none | selective | full | first:K."""
    shard_optimizer: bool = False
    """Shard optimizer states (and master weights) over DP: reduce-scatter + all-gather (ZeRO-1)."""
    view_policy: str = "persistent"
    """persistent | transient: keep the compute-dtype view between steps, or fetch it per use."""
    view_lookahead: int = 1
    """Transient views: how many layers ahead VIEW_FETCH runs."""
    compute_dtype: str = "bf16"
    """fp32 | bf16 | fp16."""
    grad_dtype: str = "fp32"
    """Gradient accumulation dtype: fp32 | bf16 | fp16."""
    offload_activations: bool = False
    """Offload layer-input checkpoints to the host tier between F and B."""
    bucket_bytes: int = 25 * 2**20
    """gpu-style: gradient-sync bucket size (Megatron's default is 40M fp32 elements)."""
    clip_grad: float | None = 1.0
    """Global gradient-norm clip; None disables it (and the global norm reduction)."""
    model: str | None = None
    """Name of the model the plan is for (checked by the runtime)."""
    loss_chunk_tokens: int | None = None
    """Head loss: fused chunked cross-entropy over this many tokens at a time (the logits
    of a whole microbatch never exist at once); None: the plain loss on full logits."""
    sync_bucket_bytes: int = 0
    """Gradient syncs: a stage's units, in backward order, are grouped into buckets of at
    least this many gradient bytes, one collective per bucket, the same buckets in every
    schedule (ratrain syncs and updates per bucket); 0: one bucket per unit. Unsharded
    optimizer only (sharded, each unit is reduce-scattered alone)."""

    def __post_init__(self) -> None:
        for f in ("pp", "dp", "micro_batch", "global_batch", "seq", "bucket_bytes"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise RatrainError(f"plan: {f} must be a positive integer, got {v!r}")
        if self.loss_chunk_tokens is not None and (
            not isinstance(self.loss_chunk_tokens, int)
            or isinstance(self.loss_chunk_tokens, bool)
            or self.loss_chunk_tokens <= 0
        ):
            raise RatrainError(
                f"plan: loss_chunk_tokens must be a positive integer or None, "
                f"got {self.loss_chunk_tokens!r}"
            )
        if (
            not isinstance(self.sync_bucket_bytes, int)
            or isinstance(self.sync_bucket_bytes, bool)
            or self.sync_bucket_bytes < 0
        ):
            raise RatrainError(
                f"plan: sync_bucket_bytes must be an integer >= 0, got {self.sync_bucket_bytes!r}"
            )
        if not isinstance(self.view_lookahead, int) or self.view_lookahead < 0:
            raise RatrainError(f"plan: view_lookahead must be >= 0, got {self.view_lookahead!r}")
        if self.global_batch % (self.micro_batch * self.dp):
            raise RatrainError(
                f"plan: global batch {self.global_batch} is not a multiple of micro_batch x dp "
                f"= {self.micro_batch * self.dp}; pick a global batch divisible by it"
            )
        if self.schedule not in SCHEDULES:
            raise RatrainError(
                f"plan: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.schedule == "fsdp-pp" and not self.shard_optimizer:
            raise RatrainError(
                "plan: schedule fsdp-pp shards the parameters over dp; set shard_optimizer"
            )
        for f in ("compute_dtype", "grad_dtype"):
            if getattr(self, f) not in DTYPES:
                raise RatrainError(
                    f"plan: {f} must be one of {', '.join(DTYPES)}, got {getattr(self, f)!r}"
                )
        if self.view_policy not in ("persistent", "transient"):
            raise RatrainError(
                f"plan: view_policy must be persistent or transient, got {self.view_policy!r}"
            )
        if self.clip_grad is not None and not self.clip_grad > 0:
            raise RatrainError(f"plan: clip_grad must be positive or None, got {self.clip_grad!r}")
        rec = (
            (self.recompute,) * self.pp
            if isinstance(self.recompute, str)
            else tuple(self.recompute)
        )
        if len(rec) != self.pp:
            raise RatrainError(
                f"plan: recompute has {len(rec)} entries for pp={self.pp}; give one per stage"
            )
        for r in rec:
            _parse_recompute(r)
        object.__setattr__(self, "recompute", rec)
        if self.layer_split is not None:
            split = tuple(self.layer_split)
            if len(split) != self.pp:
                raise RatrainError(
                    f"plan: layer_split has {len(split)} stages for pp={self.pp}; give one count per stage"
                )
            for s, n in enumerate(split):
                middle = 0 < s < self.pp - 1 or self.pp == 1
                if not isinstance(n, int) or n < (1 if middle else 0):
                    raise RatrainError(
                        f"plan: layer_split[{s}]={n!r}; each stage needs >= 1 block "
                        "(the first and last may hold 0 besides the embedding/head)"
                    )
            object.__setattr__(self, "layer_split", split)

    # -- derived quantities ---------------------------------------------------------------
    @property
    def microbatches(self) -> int:
        """Microbatches per step per pipeline (m)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq

    def blocks_per_stage(self, spec: ModelSpec) -> tuple[int, ...]:
        split = (
            self.layer_split if self.layer_split is not None else even_split(spec.n_layers, self.pp)
        )
        if sum(split) != spec.n_layers:
            raise RatrainError(
                f"plan: layer_split {list(split)} sums to {sum(split)}, but {spec.name} has "
                f"{spec.n_layers} layers"
            )
        return split

    def stage_units(self, spec: ModelSpec, stage: int) -> range:
        """The units (see `ratrain.models.counts`) that a stage owns, in order."""
        split = self.blocks_per_stage(spec)
        start = 1 + sum(split[:stage])
        end = start + split[stage]
        if stage == 0:
            start = 0
        if stage == self.pp - 1:
            end = spec.n_layers + 2
        return range(start, end)

    def recompute_of(self, spec: ModelSpec, stage: int, unit: int) -> str:
        """The recompute policy that applies to one unit: none | selective | full."""
        kind, k = _parse_recompute(self.recompute[stage])
        if not 1 <= unit <= spec.n_layers:
            return "none"
        if kind == "first":
            first_block = self.stage_units(spec, stage)[0] or 1
            return "full" if unit - first_block < k else "none"
        return kind

    def check_for(self, spec: ModelSpec) -> None:
        """Validate the plan against a model: a clear error instead of a failure later."""
        if self.pp > spec.n_layers:
            raise RatrainError(f"plan: pp={self.pp} exceeds {spec.name}'s {spec.n_layers} layers")
        self.blocks_per_stage(spec)
        if self.seq > spec.max_seq:
            raise RatrainError(f"plan: seq={self.seq} exceeds {spec.name}'s max_seq={spec.max_seq}")
        if self.model is not None and self.model != spec.name:
            raise RatrainError(
                f"plan is for model {self.model!r}, not {spec.name!r}; re-plan for this model"
            )

    def replace(self, **kw) -> Plan:
        return replace(self, **kw)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["recompute"] = list(self.recompute)
        if self.layer_split is not None:
            d["layer_split"] = list(self.layer_split)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise RatrainError(f"plan: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        for k in ("recompute", "layer_split"):
            if isinstance(d.get(k), list):
                d[k] = tuple(d[k])
        return cls(**d)


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer, schedule of the learning rate, precision and data of a training run."""

    steps: int = 100
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    seed: int = 0
    loss_scale_init: float = 2.0**16
    """fp16 only: initial dynamic loss scale."""
    loss_scale_window: int = 1000
    """fp16 only: steps without overflow before the loss scale doubles."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps <= 0:
            raise RatrainError(f"train: steps must be a positive integer, got {self.steps!r}")
        if not self.lr > 0 or self.min_lr < 0:
            raise RatrainError("train: lr must be positive and min_lr non-negative")
        if self.warmup_steps < 0:
            raise RatrainError("train: warmup_steps must be >= 0")


def save_plan(plan: Plan, path: str | Path, **extra) -> None:
    """Write a plan as YAML (or JSON by suffix). `extra` keys are stored beside it."""
    import json

    import yaml

    data = {"plan": plan.to_dict(), **extra}
    p = Path(path)
    p.write_text(
        json.dumps(data, indent=2) if p.suffix == ".json" else yaml.safe_dump(data, sort_keys=False)
    )


def load_plan(path: str | Path) -> tuple[Plan, dict]:
    """Read a plan file written by `save_plan` (or by hand). Returns the plan and the extras."""
    import yaml

    from ratrain.yaml_io import load_yaml

    p = Path(path)
    if not p.is_file():
        raise RatrainError(f"plan file {str(p)!r} not found")
    try:
        data = load_yaml(p.read_text())
    except yaml.YAMLError as e:
        raise RatrainError(f"{p}: not valid YAML/JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
        raise RatrainError(f"{p}: expected a mapping with a 'plan' key")
    extras = {k: v for k, v in data.items() if k != "plan"}
    return Plan.from_dict(data["plan"]), extras
