"""Frozen configuration dataclasses shared by every layer: the plan and the training run.

Pure Python (no torch). A `Plan` says *how* a model is trained on a machine: degrees of
parallelism, batch shape, the layer split, and the lifecycle policies. The schedule IR,
the memory ledger, the simulator, the planner and the runtime all read the same `Plan`.
Each field's `ratrain.schema.Knob` (its flag and help, pin, search part, memory rank) is
the one place a knob is described; the CLI, the pins and the planner's knobs are made
from it.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.ranks import RANK_LAYOUTS
from ratrain.schema import Knob, knob, knob_fields, knob_of

__all__ = [
    "SCHEDULES",
    "RECOMPUTE_POLICIES",
    "DTYPES",
    "PIPELINES",
    "SPLIT_PIPELINES",
    "V_PIPELINES",
    "PLANNED_ZB_PIPELINES",
    "Plan",
    "TrainConfig",
    "even_split",
    "load_plan",
    "save_plan",
    "MAX_STAGES",
    "MAX_RANKS",
    "MAX_MICROBATCHES",
    "RANK_LAYOUTS",
]

SCHEDULES = ("baseline", "gpu-style", "ratrain", "fsdp-pp")
RECOMPUTE_POLICIES = ("none", "selective", "full")  # plus "first:K" (full on the first K blocks)
DTYPES = ("fp32", "bf16", "fp16")
PIPELINES = ("1f1b", "zb-h1", "zb-h2", "zb-v", "1f1b-v")
SPLIT_PIPELINES = ("zb-h1", "zb-h2", "zb-v")
"""The pass orders that split each backward into B_IN and B_W (`ratrain.schedule.zerobubble`,
`ratrain.schedule.vshape`)."""
V_PIPELINES = ("zb-v", "1f1b-v")
"""The pass orders with a V-shaped placement: each stage holds two chunks of the model
(`ratrain.schedule.vshape`)."""
PLANNED_ZB_PIPELINES = ("zb-h1", "zb-h2")
"""The zero-bubble pass orders `ratrain plan` searches (one chunk per stage)."""
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DEFAULT_LOSS_CHUNK_TOKENS = 256
"""The fused chunked loss's tokens per chunk where none is given (`ratrain.nn.chunked_loss`,
`ratrain plan`'s search). assumed: large enough that each chunk's GEMMs run at full rate on
a CPU core, small enough that a chunk's fp32 logits (256 x V) are a fraction of a
microbatch's."""

MAX_STAGES = 2**16
"""assumed: more pipeline stages than any model has blocks (the largest have about 128); a
plan's per-stage tuples are built for pp, so a pp of 10**9 is refused here, not by a
MemoryError."""
MAX_RANKS = 2**20
"""assumed: pp x dp of a plan the simulator and the CLI take (1,048,576 compute units; a
simulation of dp=10**6 takes about 6 s, of 10**8 minutes and 14 GB)."""
MAX_MICROBATCHES = 2**16
"""assumed: microbatches per pipeline per step of a plan that is run or simulated: the
schedule holds every microbatch's actions (65,536 take about 30 s and 2 GB to simulate on a
4-stage pipeline; 10**12 would never finish)."""


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


_INF = float("inf")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def v_stage_of_chunk(pp: int, chunk: int) -> int:
    """The stage that holds chunk `chunk` of the 2·pp chunks of a V: chunk c < pp on stage
    c, chunk c >= pp on stage 2pp - 1 - c (so stage s holds s and 2pp - 1 - s)."""
    return chunk if chunk < pp else 2 * pp - 1 - chunk


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


def _saves_true(v: bool) -> int:
    return 0 if v else 1


def _grad_rank(dtype: str) -> int:
    return 0 if DTYPE_BYTES[dtype] < DTYPE_BYTES["fp32"] else 1


def _lookahead_rank(n: int) -> int:
    return n


def _view_policy_rank(policy: str) -> int:
    return 0 if policy == "transient" else 1


def _pipeline_rank(pipeline: str) -> int:
    return PIPELINES.index(pipeline)


@dataclass(frozen=True)
class Plan:
    """One training configuration of a model on a machine.

    Each field carries its `ratrain.schema.Knob`: its group, flag, pin, search part and
    memory rank. Everything that handles knobs is generated from them."""

    pp: int = knob(1, Knob(
        "structure", "--pp", "pipeline stages (default {default})", "positive_int", 10,
        search="structure", bound=True,
    ))  # fmt: skip
    """Pipeline stages."""
    dp: int = knob(1, Knob(
        "structure", "--dp", "data-parallel replicas (default {default})", "positive_int", 20,
        search="structure", bound=True,
    ))  # fmt: skip
    """Data-parallel replicas of the pipeline."""
    micro_batch: int = knob(1, Knob(
        "structure", "--micro-batch", "sequences per microbatch (default {default})",
        "positive_int", 30, search="structure", bound=True,
    ))  # fmt: skip
    """Sequences per microbatch."""
    global_batch: int = knob(1, Knob(
        "structure", "--global-batch", "sequences per step (default {default})", "positive_int",
        40, pin=None, search="request",
    ))  # fmt: skip
    """Sequences per optimizer step, over all replicas: micro_batch x microbatches x dp."""
    seq: int = knob(128, Knob(
        "structure", "--seq", "sequence length (default {default})", "positive_int", 50,
        pin=None, search="request", bound=True,
    ))  # fmt: skip
    """Tokens per sequence."""
    schedule: str = knob("ratrain", Knob(
        "communication", "--schedule", "default {default}", "choice", 60, choices=SCHEDULES,
        search="knob", views=True,
    ))  # fmt: skip
    """baseline | gpu-style | ratrain | fsdp-pp (needs shard_optimizer; see
    `ratrain.schedule.fsdp`): the lifecycle, where gradient sync, update and views go."""
    layer_split: tuple[int, ...] | None = knob(None, Knob(
        "structure", "--layer-split",
        "blocks per stage (per chunk under zb-v and 1f1b-v), comma-separated (default: even)",
        "int_list", 100, pin="int_list", search="structure",
    ))  # fmt: skip
    """Transformer blocks per stage (first and last may be smaller; under zb-v, per chunk:
    2 x pp counts, `Plan.chunk_units`); None: even split."""
    recompute: tuple[str, ...] | str = knob("none", Knob(
        "memory", "--recompute",
        "per stage, comma-separated, or one for all: none|selective|full|first:K", "nonempty",
        90, pin="policy_list", search="policy",
    ))  # fmt: skip
    """Per stage (or one for all): none | selective | full | first:K."""
    shard_optimizer: bool = knob(False, Knob(
        "memory", "--shard-optimizer", "shard optimizer states over DP (ZeRO-1)", "bool", 110,
        search="knob", saves=_saves_true, bound=True,
    ))  # fmt: skip
    """Shard optimizer states (and master weights) over DP: reduce-scatter + all-gather (ZeRO-1)."""
    view_policy: str = knob("persistent", Knob(
        "memory", "--view-policy", None, "choice", 120, choices=("persistent", "transient"),
        search="knob", saves=_view_policy_rank, views=True,
    ))  # fmt: skip
    """persistent | transient: keep the compute-dtype view between steps, or fetch it per use."""
    view_lookahead: int = knob(1, Knob(
        "memory", "--view-lookahead", None, "nonneg_int", 130, search="knob",
        saves=_lookahead_rank, views=True,
    ))  # fmt: skip
    """Transient views: how many layers ahead VIEW_FETCH runs."""
    compute_dtype: str = knob("bf16", Knob(
        "numerics", "--dtype", "compute dtype (default {default})", "choice", 140,
        choices=DTYPES, search="knob", bound=True,
    ))  # fmt: skip
    """fp32 | bf16 | fp16."""
    grad_dtype: str = knob("fp32", Knob(
        "numerics", "--grad-dtype", None, "choice", 150, choices=DTYPES, search="knob",
        saves=_grad_rank, bound=True,
    ))  # fmt: skip
    """Gradient accumulation dtype: fp32 | bf16 | fp16."""
    offload_activations: bool = knob(False, Knob(
        "memory", "--offload", "offload activation checkpoints to the host tier", "bool", 160,
        search="knob", saves=_saves_true, bound=True,
    ))  # fmt: skip
    """Offload layer-input checkpoints to the host tier between F and B."""
    bucket_bytes: int = knob(25 * 2**20, Knob("communication"))
    """gpu-style: gradient-sync bucket size (Megatron's default is 40M fp32 elements)."""
    clip_grad: float | None = knob(1.0, Knob(
        "numerics", "--clip-grad", "global grad-norm clip; 0 disables it", "nonneg_float", 170,
        pin="optional_float", bound=True,
    ))  # fmt: skip
    """Global gradient-norm clip; None disables it (and the global norm reduction)."""
    model: str | None = knob(None, Knob("identity", pin=None))
    """Name of the model the plan is for (checked by the runtime)."""
    loss_chunk_tokens: int | None = knob(None, Knob(
        "memory", "--loss-chunk-tokens",
        "fused chunked cross-entropy on the head, this many tokens at a time "
        "(default: the plain loss)", "positive_int", 180, pin="optional_int", search="knob",
        bound=True,
    ))  # fmt: skip
    """Head loss: fused chunked cross-entropy over this many tokens at a time (the logits
    of a whole microbatch never exist at once); None: the plain loss on full logits. Not
    ranked by memory: what it saves depends on the microbatch's tokens against the chunk."""
    sync_bucket_bytes: int = knob(0, Knob(
        "communication", "--sync-bucket-bytes",
        "coalesce gradient syncs into buckets of at least this many bytes, the same "
        "buckets in every schedule (default {default}: one per unit)", "nonneg_int", 190,
    ))  # fmt: skip
    """Gradient syncs: a stage's units, in backward order, are grouped into buckets of at
    least this many gradient bytes, one collective per bucket, the same buckets in every
    schedule (ratrain syncs and updates per bucket); 0: one bucket per unit. Unsharded
    optimizer only (sharded, each unit is reduce-scattered alone)."""
    pipeline: str = knob("1f1b", Knob(
        "structure", "--pipeline",
        "pass order: 1f1b, zb-h1 (zero bubble: each backward split into its input "
        "and weight gradients, the weight passes deferred, at 1F1B's memory), zb-h2 (the "
        "same with up to twice 1F1B's forwards in flight), zb-v or 1f1b-v (two chunks per "
        "stage in a V, stage 0 holding the embedding and the head; --layer-split then "
        "gives blocks per chunk, 2 x pp; default {default})", "choice", 70, choices=PIPELINES,
        search="knob", saves=_pipeline_rank, bound=True,
    ))  # fmt: skip
    """1f1b | zb-h1 | zb-h2 | zb-v | 1f1b-v: the per-stage pass order. The zero-bubble ones (Qi et al.
    2024, "Zero Bubble Pipeline Parallelism", H1, H2 and V) split each backward into B_in
    and a deferred B_w (`ratrain.schedule.zerobubble`; the runtime's split backward is
    `ratrain.runtime.split_backward`): zb-h1 at 1F1B's activation memory, zb-h2 with up to
    twice its forwards in flight, to fill the bubble before each stage's first backward;
    zb-v places two chunks of the model on each stage in a V (stage s holds chunks s and
    2pp-1-s, so stage 0 holds the embedding and the head; `ratrain.schedule.vshape`), and
    then layer_split gives 2 x pp counts, blocks per chunk; 1f1b-v is that placement with
    each backward whole. Ranked by memory 1f1b, zb-h1, zb-h2 (each holds what its deferred
    weight passes need, zb-h2 more microbatches in flight)."""
    rank_layout: str = knob("pp-inner", Knob(
        "communication", "--rank-layout",
        "how ranks fill nodes: pp-inner (a pipeline's stages on neighbouring ranks) or "
        "dp-inner (a stage's DP peers on neighbouring ranks; default {default})", "choice", 80,
        choices=RANK_LAYOUTS, search="knob",
    ))  # fmt: skip
    """pp-inner | dp-inner: which global rank holds (stage, replica), consecutive ranks
    filling a node (`ratrain.ranks`): a pipeline's stages are neighbours (pp-inner), or a
    stage's DP peers are (dp-inner). Decides which of the two crosses slow inter-node
    links; the runtime's grid, the cost model and the simulator all follow it. Moves
    communication only, never memory."""

    def __post_init__(self) -> None:
        self._check_numbers()
        self._check_choices()
        object.__setattr__(self, "recompute", self._checked_recompute())
        if self.layer_split is not None:
            object.__setattr__(self, "layer_split", self._checked_split())

    def _check_numbers(self) -> None:
        for f in ("pp", "dp", "micro_batch", "global_batch", "seq", "bucket_bytes"):
            v = getattr(self, f)
            if not _is_int(v) or v <= 0:
                raise RatrainError(f"plan: {f} must be a positive integer, got {v!r}")
        if self.pp > MAX_STAGES:
            raise RatrainError(
                f"plan: pp={self.pp} is more stages than any model has blocks (at most "
                f"{MAX_STAGES}); use pp <= the model's layers"
            )
        lct = self.loss_chunk_tokens
        if lct is not None and (not _is_int(lct) or lct <= 0):
            raise RatrainError(
                f"plan: loss_chunk_tokens must be a positive integer or None, got {lct!r}"
            )
        if not _is_int(self.sync_bucket_bytes) or self.sync_bucket_bytes < 0:
            raise RatrainError(
                f"plan: sync_bucket_bytes must be an integer >= 0, got {self.sync_bucket_bytes!r}"
            )
        if not _is_int(self.view_lookahead) or self.view_lookahead < 0:
            raise RatrainError(f"plan: view_lookahead must be >= 0, got {self.view_lookahead!r}")
        if self.global_batch % (self.micro_batch * self.dp):
            raise RatrainError(
                f"plan: global batch {self.global_batch} is not a multiple of micro_batch x dp "
                f"= {self.micro_batch * self.dp}; pick a global batch divisible by it"
            )
        clip = self.clip_grad
        if clip is not None and (
            not isinstance(clip, (int, float)) or isinstance(clip, bool) or not 0 < clip < _INF
        ):
            raise RatrainError(
                f"plan: clip_grad must be a positive finite number or None (no clipping), "
                f"got {clip!r}"
            )

    def _check_choices(self) -> None:
        if self.schedule not in SCHEDULES:
            raise RatrainError(
                f"plan: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.pipeline not in PIPELINES:
            raise RatrainError(
                f"plan: pipeline must be one of {', '.join(PIPELINES)}, got {self.pipeline!r}"
            )
        if self.rank_layout not in RANK_LAYOUTS:
            raise RatrainError(
                f"plan: rank_layout must be one of {', '.join(RANK_LAYOUTS)}, "
                f"got {self.rank_layout!r}"
            )
        for f in ("shard_optimizer", "offload_activations"):
            if not isinstance(getattr(self, f), bool):
                raise RatrainError(f"plan: {f} must be true or false, got {getattr(self, f)!r}")
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
        if self.model is not None and not isinstance(self.model, str):
            raise RatrainError(f"plan: model must be a model's name, got {self.model!r}")

    def _checked_recompute(self) -> tuple[str, ...]:
        """The recompute policy per stage (one given for all is repeated)."""
        rec = self.recompute
        if isinstance(rec, str):  # one for all: checked once (a planner builds thousands)
            _parse_recompute(rec)
            return (rec,) * self.pp
        if not isinstance(rec, (tuple, list)) or not all(isinstance(r, str) for r in rec):
            raise RatrainError(
                f"plan: recompute must be a policy or a list of one per stage, got {rec!r}"
            )
        if len(rec) != self.pp:
            raise RatrainError(
                f"plan: recompute has {len(rec)} entries for pp={self.pp}; give one per stage"
            )
        for r in dict.fromkeys(rec):  # each distinct policy once, in order
            _parse_recompute(r)
        return tuple(rec)

    def _checked_split(self) -> tuple[int, ...]:
        split = self.layer_split
        if not isinstance(split, (tuple, list)):
            raise RatrainError(
                f"plan: layer_split must be a list of blocks per stage, got {split!r}"
            )
        n_parts, what = self.pp * self.chunks, "stage" if self.chunks == 1 else "chunk"
        if len(split) != n_parts:
            raise RatrainError(
                f"plan: layer_split has {len(split)} counts for pp={self.pp}"
                + ("" if self.chunks == 1 else f" under pipeline {self.pipeline}")
                + f"; give one count per {what} ({n_parts})"
            )
        if set(map(type, split)) == {int} and (
            split[0] >= 1
            if n_parts == 1
            else min(split[0], split[-1]) >= 0 and min(split[1:-1], default=1) >= 1
        ):
            return tuple(split)  # the common case, at a planner's rate; else say what is wrong
        for s, n in enumerate(split):
            middle = 0 < s < n_parts - 1 or n_parts == 1
            if not _is_int(n) or n < (1 if middle else 0):
                raise RatrainError(
                    f"plan: layer_split[{s}]={n!r}; each {what} needs >= 1 block "
                    "(the first and last may hold 0 besides the embedding/head)"
                )
        return tuple(split)

    # -- derived quantities ---------------------------------------------------------------
    @property
    def microbatches(self) -> int:
        """Microbatches per step per pipeline (m)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def chunks(self) -> int:
        """Chunks of the model per stage: 2 under a V-shaped pipeline (zb-v, 1f1b-v), else 1."""
        return 2 if self.pipeline in V_PIPELINES else 1

    @property
    def split_backward(self) -> bool:
        """Whether the pass order splits each backward into B_IN and B_W (zb-h1, zb-h2, zb-v)."""
        return self.pipeline in SPLIT_PIPELINES

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq

    def blocks_per_chunk(self, spec: ModelSpec) -> tuple[int, ...]:
        """Blocks per chunk of the model, in model order (one chunk per stage but under a
        V-shaped pipeline: `chunks`)."""
        n = self.pp * self.chunks
        if self.layer_split is not None:
            split = self.layer_split
        elif n > spec.n_layers:
            raise RatrainError(
                f"plan: pipeline {self.pipeline} at pp={self.pp} cuts the model into {n} "
                f"chunks, more than {spec.name}'s {spec.n_layers} layers; use pp <= "
                f"{spec.n_layers // self.chunks}"
            )
        else:
            split = even_split(spec.n_layers, n)
        if sum(split) != spec.n_layers:
            raise RatrainError(
                f"plan: layer_split {list(split)} sums to {sum(split)}, but {spec.name} has "
                f"{spec.n_layers} layers"
            )
        return split

    def blocks_per_stage(self, spec: ModelSpec) -> tuple[int, ...]:
        """Blocks per stage (over its chunks)."""
        split = self.blocks_per_chunk(spec)
        if self.chunks == 1:
            return split
        out = [0] * self.pp
        for c, n in enumerate(split):
            out[self.stage_of_chunk(c)] += n
        return tuple(out)

    def stage_of_chunk(self, chunk: int) -> int:
        """The stage that holds a chunk: the chunk itself, or in a V `v_stage_of_chunk`."""
        return chunk if self.chunks == 1 else v_stage_of_chunk(self.pp, chunk)

    def stage_chunks(self, stage: int) -> tuple[int, ...]:
        """The chunks a stage holds, in model order."""
        return tuple(c for c in range(self.pp * self.chunks) if self.stage_of_chunk(c) == stage)

    def chunk_units(self, spec: ModelSpec, chunk: int) -> range:
        """The units (see `ratrain.models.counts`) of one chunk, in order: the first holds
        the embedding too, the last the head."""
        split = self.blocks_per_chunk(spec)
        start = 1 + sum(split[:chunk])
        end = start + split[chunk]
        if chunk == 0:
            start = 0
        if chunk == len(split) - 1:
            end = spec.n_layers + 2
        return range(start, end)

    def stage_units(self, spec: ModelSpec, stage: int) -> range | tuple[int, ...]:
        """The units that a stage owns, in order (a range: contiguous, but under a
        V-shaped pipeline, where a stage's two chunks leave a gap between them)."""
        if self.chunks == 1:
            return self.chunk_units(spec, stage)
        first, second = (self.chunk_units(spec, c) for c in self.stage_chunks(stage))
        if first.stop == second.start:
            return range(first.start, second.stop)
        return (*first, *second)

    def stage_of_unit(self, spec: ModelSpec) -> dict[int, int]:
        """Unit -> the stage that owns it."""
        return {u: s for s in range(self.pp) for u in self.stage_units(spec, s)}

    def head_stage(self) -> int:
        """The stage that holds the head (and so computes the loss): the last, or under a
        V-shaped pipeline the first."""
        return self.stage_of_chunk(self.pp * self.chunks - 1)

    def recompute_of(self, spec: ModelSpec, stage: int, unit: int) -> str:
        """The recompute policy that applies to one unit: none | selective | full
        ("first:K": full on the stage's first K blocks, in model order)."""
        kind, k = _parse_recompute(self.recompute[stage])
        if not 1 <= unit <= spec.n_layers:
            return "none"
        if kind == "first":
            units = self.stage_units(spec, stage)
            if isinstance(units, range):  # contiguous: the position is an offset
                return "full" if unit - (units[0] or 1) < k else "none"
            blocks = [u for u in units if 1 <= u <= spec.n_layers]
            return "full" if blocks.index(unit) < k else "none"
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

    def check_size(self) -> None:
        """Refuse a plan too large to simulate or run in any reasonable time: more than
        `MAX_RANKS` ranks or `MAX_MICROBATCHES` microbatches per step (one line saying
        which and what to change). Not part of `check_for`: the planner may consider such
        candidates on its way to a smaller one."""
        if self.pp * self.dp > MAX_RANKS:
            raise RatrainError(
                f"plan: pp x dp = {self.pp * self.dp:,} ranks, more than the {MAX_RANKS:,} "
                "ratrain simulates or runs; lower --dp or --pp"
            )
        if self.microbatches > MAX_MICROBATCHES:
            raise RatrainError(
                f"plan: {self.microbatches:,} microbatches per step (global batch "
                f"{self.global_batch:,} / (micro-batch {self.micro_batch:,} x dp {self.dp:,})), "
                f"more than the {MAX_MICROBATCHES:,} a schedule holds; raise --micro-batch or "
                "--dp, or lower --global-batch"
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


_FILE_NAMES = {f.name: knob_of(f).yaml for f in knob_fields(Plan) if knob_of(f).yaml}
"""Fields whose name in a plan file is not their own (`ratrain.schema.Knob.yaml`)."""
_FIELD_NAMES = {v: k for k, v in _FILE_NAMES.items()}


def save_plan(plan: Plan, path: str | Path, **extra) -> None:
    """Write a plan as YAML (or JSON by suffix). `extra` keys are stored beside it."""
    import json

    import yaml

    data = {"plan": {_FILE_NAMES.get(k, k): v for k, v in plan.to_dict().items()}, **extra}
    p = Path(path)
    text = (
        json.dumps(data, indent=2) if p.suffix == ".json" else yaml.safe_dump(data, sort_keys=False)
    )
    # Whole or not at all: a failed write leaves an existing file as it was (a file that is
    # not a regular one, such as /dev/null, or a link, is written in place).
    regular = p.is_file() and not p.is_symlink()
    tmp = p.with_name(f".{p.name}.tmp") if regular or not p.exists() else p
    try:
        tmp.write_text(text)
        if tmp != p:
            tmp.replace(p)
    except OSError as e:
        if tmp != p:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        raise RatrainError(f"cannot write plan file {str(p)!r}: {e.strerror or e}") from None


def load_plan(path: str | Path) -> tuple[Plan, dict]:
    """Read a plan file written by `save_plan` (or by hand). Returns the plan and the extras."""
    import yaml

    from ratrain.yaml_io import load_yaml

    p = Path(path)
    if p.is_dir():
        raise RatrainError(
            f"plan file {str(p)!r} is a folder; give the file `ratrain plan -o` wrote"
        )
    if not p.is_file():
        raise RatrainError(f"plan file {str(p)!r} not found")
    try:
        data = load_yaml(p.read_text())
    except yaml.YAMLError as e:
        raise RatrainError(f"{p}: not valid YAML/JSON ({str(e).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise RatrainError(
            f"plan file {str(p)!r} is not a text file (not UTF-8); give the file "
            "`ratrain plan -o` wrote"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
        raise RatrainError(f"{p}: expected a mapping with a 'plan' key")
    extras = {k: v for k, v in data.items() if k != "plan"}
    return Plan.from_dict({_FIELD_NAMES.get(k, k): v for k, v in data["plan"].items()}), extras
