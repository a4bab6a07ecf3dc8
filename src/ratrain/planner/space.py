"""The search space: what the planner may choose, what the user pinned, and the families
(`ratrain.planner.families`, with their ablations) by name.

A *request* fixes the model, the platform, the cluster count, the global batch and the
sequence length. A *family* says which knobs a system has: RATrain's lifecycle schedule
(per-stage recompute, transient views, offload), a Megatron-like GPU-style 1F1B (uniform
recompute, bucketed overlapped sync, end-of-step optimizer) and a DeepSpeed-like ZeRO-1 +
PP (Baseline-1F1B with sharded optimizer states). Each baseline is searched over its own
knobs under the same memory cap, so a speedup compares best against best.

A candidate is built in two layers: a *structure* (pp, dp, micro-batch, layer split), which
fixes the compute per stage and the pipeline shape, and *knobs* (schedule, sharding, views,
gradient dtype, offload, bucket size), over which the recompute policy per stage is then
the cheapest one that fits (see `ratrain.planner.fit`). Pure Python.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, make_dataclass, replace

from ratrain.config import (
    DEFAULT_LOSS_CHUNK_TOKENS,
    SPLIT_PIPELINES,
    V_PIPELINES,
    Plan,
)
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec
from ratrain.planner.ablation import ABLATIONS
from ratrain.planner.cache import Memo
from ratrain.planner.families import ALL_FAMILIES, FAMILIES, Family
from ratrain.planner.splits import splits
from ratrain.platforms import Platform
from ratrain.ranks import RANK_LAYOUTS, layouts_differ
from ratrain.schema import normalize_pins as _normalize_pins
from ratrain.schema import parse_pin, pinnable, search_fields

__all__ = [
    "FIXED_FIELDS",
    "Knobs",
    "Request",
    "Structure",
    "family_of",
    "knob_combos",
    "knobs_key",
    "parse_pins",
    "pick_compute_dtype",
    "pin_conflict",
    "pipelines",
    "rank_layouts",
    "structures",
]

MICRO_BATCHES = (1, 2, 4, 8)
"""Micro-batch sizes tried (sequences); larger ones only lengthen the pipeline fill."""

_PINNABLE = pinnable(Plan)
"""Fields a pin may set (`ratrain.schema.Knob.pin`): not the request itself (global_batch,
seq) nor the model."""


def family_of(name: str) -> Family:
    """A family by name: one of `FAMILIES`, or an ablation (`ratrain.planner.ablation`)."""
    if name in FAMILIES:
        return FAMILIES[name]
    if name in ABLATIONS:
        return ABLATIONS[name]
    raise RatrainError(f"unknown family {name!r}; choose from {', '.join(FAMILIES)}")


@dataclass(frozen=True)
class Request:
    """What the user asks for: a model on `clusters` compute units of a platform."""

    spec: ModelSpec
    platform: Platform
    clusters: int
    global_batch: int
    """Sequences per optimizer step (Plan.global_batch)."""
    seq: int
    pins: Mapping[str, object] = field(default_factory=dict)
    families: tuple[str, ...] = ALL_FAMILIES
    min_pp: int = 1
    """The shallowest pipeline searched (2: only plans with a bubble)."""

    def __post_init__(self) -> None:
        for f in ("clusters", "global_batch", "seq", "min_pp"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise RatrainError(f"plan request: {f} must be a positive integer, got {v!r}")
        if self.seq > self.spec.max_seq:
            raise RatrainError(
                f"seq={self.seq} exceeds {self.spec.name}'s max_seq={self.spec.max_seq}; "
                "pass a shorter --seq"
            )
        for name in self.families:
            family_of(name)  # a RatrainError for an unknown name
        object.__setattr__(self, "pins", normalize_pins(self.pins))

    def with_(self, **kw) -> Request:
        from dataclasses import replace

        return replace(self, **kw)

    @property
    def compute_dtype(self) -> str:
        return str(self.pins.get("compute_dtype") or pick_compute_dtype(self.platform))


def pick_compute_dtype(platform: Platform) -> str:
    """The fastest 16-bit dtype of the platform (bf16 on a tie: no loss scaling needed)."""
    return max(("bf16", "fp16"), key=lambda d: (platform.peak_flops[d], d == "bf16"))


# -- pins ------------------------------------------------------------------------------------


def parse_pins(items: list[str] | None) -> dict[str, object]:
    """`["pp=8", "recompute=full", "layer_split=7,9,9,7"]` -> a dict of Plan field values."""
    pins: dict[str, object] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not value.strip():
            raise RatrainError(f"pin {item!r}: expected FIELD=VALUE, e.g. pp=8")
        if name not in _PINNABLE:
            raise RatrainError(
                f"pin {item!r}: unknown field {name!r}; pinnable: {', '.join(_PINNABLE)}"
            )
        pins[name] = parse_pin(Plan, name, value)
    return normalize_pins(pins)


def normalize_pins(pins: Mapping[str, object]) -> dict[str, object]:
    """`ratrain.schema.normalize_pins` for a `Plan`."""
    return _normalize_pins(Plan, pins)


# -- structures ------------------------------------------------------------------------------


def _microbatches(self, global_batch: int) -> int:
    return global_batch // (self.micro_batch * self.dp)


Structure = make_dataclass(
    "Structure",
    [(f.name, f.type) for f in search_fields(Plan, "structure")],
    frozen=True,
    order=True,
    namespace={"microbatches": _microbatches},
)
Structure.__module__ = __name__
Structure.__doc__ = """The pipeline shape of a candidate, the plan's fields of `ratrain.schema.
Knob.search` "structure" (pp, dp, micro_batch, layer_split): fixes the compute of every
stage."""


def _largest_dp(limit: int, per_replica: int) -> int:
    """Largest dp <= limit that divides per_replica (the global batch over the micro-batch)."""
    for dp in range(min(limit, per_replica), 0, -1):
        if per_replica % dp == 0:
            return dp
    return 1


def structures(req: Request, family: Family) -> Iterator[Structure]:
    """Every (pp, dp, micro_batch, layer_split) the family may use under the pins.

    dp is the largest replica count that fits the clusters left by pp and divides the
    global batch: fewer replicas only add microbatches to the same pipeline (a longer step
    for the same tokens), so they never win; the clusters left over are reported.
    """
    pins, L, N, gb = req.pins, req.spec.n_layers, req.clusters, req.global_batch
    pps = [pins["pp"]] if "pp" in pins else range(1, min(L, N) + 1)
    pps = [pp for pp in pps if pp >= req.min_pp]
    mbs = [pins["micro_batch"]] if "micro_batch" in pins else MICRO_BATCHES
    for pp in pps:
        if pp > L or pp > N:
            continue
        if "layer_split" in pins:
            cands = [tuple(pins["layer_split"])] if len(pins["layer_split"]) == pp else []
        else:
            cands = splits(req, pp, family.split_modes)
        for mb in mbs:
            if gb % mb:
                continue
            if "dp" in pins:
                dp = pins["dp"]
                if pp * dp > N or gb % (mb * dp):
                    continue
            else:
                dp = _largest_dp(N // pp, gb // mb)
            for split in cands:
                yield Structure(pp, dp, mb, split)


# -- knobs -----------------------------------------------------------------------------------


Knobs = make_dataclass(
    "Knobs",
    [("family", str)]
    + [(f.name, f.type, field(default=f.default)) for f in search_fields(Plan, "knob")],
    frozen=True,
)
Knobs.__module__ = __name__
Knobs.__doc__ = """Everything but the structure and the recompute policy: the family and the
plan's fields the search varies per structure (`ratrain.schema.Knob.search` "knob"), in the
plan's field order. Among them rank_layout is searched only where the layouts differ
(`rank_layouts`; it moves communication only, never memory); pipeline, the pass order, is
zb-h1 or zb-h2 only with pp > 1 and the knobs they support (`pipelines`, `zb_supported`);
loss_chunk_tokens, the plain loss (None) or the fused chunked one (`loss_chunks`)."""


def loss_chunks(req: Request) -> tuple[int | None, ...]:
    """The losses to try: the pin; else the plain loss and the fused chunked one (at
    `DEFAULT_LOSS_CHUNK_TOKENS`, `ratrain.nn.chunked_loss`) where the
    platform measured the loss's passes over the logits at the compute dtype (the
    "cross_entropy" memory-bound kernel, part of which the fused loss saves: `ratrain.cost.
    compute._fused_head`); else the plain loss alone. Without that measurement the cost
    model times the two alike, and the plain loss is the one the reference trainer computes
    bit for bit (`ratrain verify`)."""
    if "loss_chunk_tokens" in req.pins:
        return (req.pins["loss_chunk_tokens"],)
    from ratrain.cost.measured import memory_bound_key

    key = memory_bound_key("cross_entropy", True, req.compute_dtype)
    if key in req.platform.memory_bound_bytes_per_s:
        return (None, DEFAULT_LOSS_CHUNK_TOKENS)
    return (None,)


def rank_layouts(req: Request, st: Structure) -> tuple[str, ...]:
    """The rank layouts to try for a structure: both where they place it differently on
    the platform's nodes (more ranks than a node holds, with pp > 1 and dp > 1), else
    pp-inner alone (on one node they cost the same); a pin decides."""
    if "rank_layout" in req.pins:
        return (str(req.pins["rank_layout"]),)
    if layouts_differ(st.pp, st.dp, req.platform.units_per_node):
        return RANK_LAYOUTS
    return RANK_LAYOUTS[:1]


def _offload_matters(pp: int, microbatches: int) -> bool:
    """Offload only moves microbatches with another forward pass between their F and B."""
    return pp > 1 and microbatches > 1


def knobs_key(req: Request, st: Structure) -> tuple:
    """All that `knob_combos` reads of a structure: equal keys, equal combinations (for
    one request and family)."""
    return (
        st.dp == 1,
        _offload_matters(st.pp, st.microbatches(req.global_batch)),
        rank_layouts(req, st),
        st.pp > 1,  # `pipelines`
    )


def knob_combos(req: Request, family: Family, st: Structure) -> list[Knobs]:
    """The family's knob combinations under the pins (no sharding over one replica, no
    offload where no microbatch waits for another's forward)."""
    dp, pp, microbatches = st.dp, st.pp, st.microbatches(req.global_batch)
    pins = req.pins
    if "schedule" in pins and pins["schedule"] != family.schedule:
        return []
    cdt = req.compute_dtype
    shard = [pins["shard_optimizer"]] if "shard_optimizer" in pins else list(family.shard)
    if family.schedule == "fsdp-pp":
        shard = [sh for sh in shard if sh]  # its parameters are sharded by definition
        if not shard:
            return []
    if dp == 1 and "shard_optimizer" not in pins:
        shard = [s for s in shard if not s] or [shard[0]]  # sharding over 1 replica changes nothing
    views = list(family.views)
    if "view_policy" in pins:
        views = [(p, la) for p, la in views if p == pins["view_policy"]] or [
            (pins["view_policy"], 1)
        ]
    if "view_lookahead" in pins:
        views = sorted({(p, pins["view_lookahead"]) for p, _ in views})
    grads = (
        [pins["grad_dtype"]]
        if "grad_dtype" in pins
        else sorted({"fp32", cdt}, key=lambda d: d != "fp32")
    )
    offload = (
        [pins["offload_activations"]] if "offload_activations" in pins else list(family.offload)
    )
    if "offload_activations" not in pins and (
        not _offload_matters(pp, microbatches) or req.platform.host_is_main_memory
    ):
        offload = [False]  # nothing waits, or the host tier is this memory: frees nothing
    out = []
    layouts = rank_layouts(req, st)
    losses = loss_chunks(req)
    for sh, (vp, la), gd, off, rl, loss in itertools.product(
        shard, views, grads, offload, layouts, losses
    ):
        out.append(
            Knobs(
                family=family.name,
                schedule=family.schedule,
                shard_optimizer=sh,
                view_policy=vp,
                view_lookahead=la,
                compute_dtype=cdt,
                grad_dtype=gd,
                offload_activations=off,
                rank_layout=rl,
                loss_chunk_tokens=loss,
            )
        )
    return _with_pipelines(req, family, st, out)


def pipelines(req: Request, family: Family, st: Structure) -> tuple[str, ...]:
    """The pass orders to try for a structure: the family's (`Family.pipelines`) where the
    pipeline has a bubble (pp > 1; on one stage a zero-bubble order is 1F1B's with each
    backward split in two: nothing to gain); a pin decides."""
    if "pipeline" in req.pins and req.pins["pipeline"] not in V_PIPELINES:
        return (str(req.pins["pipeline"]),)
    # The V orders are not searched here: they are tried on the best plans' structures
    # (`ratrain.planner.vpass.v_pass`), a pinned V among them alone.
    pipes = tuple(p for p in family.pipelines if p not in V_PIPELINES)
    return pipes if st.pp > 1 else ("1f1b",)


def zb_supported(req: Request, kn: Knobs) -> bool:
    """Whether the search tries the zero-bubble orders (zb-h1, zb-h2) with a knob
    combination: where
    `ratrain.schedule.zerobubble.refuse_unsupported` allows the knobs, under every
    recompute policy (its bounds, `MemoryBound` and `step_time_lower_bound_s`, are the
    split backward's with RECOMPUTE before each B_IN)."""
    return (
        _zb_refusal(
            schedule=kn.schedule,
            shard_optimizer=kn.shard_optimizer,
            view_policy=kn.view_policy,
            view_lookahead=kn.view_lookahead,
            offload_activations=kn.offload_activations,
        )
        is None
    )


def _zb_refusal(pipeline: str = "zb-h1", **knobs) -> str | None:
    """Why `ratrain.schedule.zerobubble.refuse_unsupported` refuses a `pipeline` plan with
    these fields (its reason, without its advice), or None. zb-h1 and zb-h2 refuse alike."""
    from ratrain.schedule.zerobubble import refuse_unsupported

    try:
        refuse_unsupported(Plan(**knobs, pipeline=pipeline))
    except RatrainError as e:
        return str(e).removeprefix("plan: ").split(";")[0]
    return None


def pin_conflict(req: Request) -> str | None:
    """One line naming what a zero-bubble `pipeline` pin conflicts with where that leaves the
    request no candidate (`ratrain.schedule.zerobubble.refuse_unsupported`): a pinned
    fsdp-pp schedule, or families that are all fsdp-pp; None otherwise."""
    pinned = req.pins.get("pipeline")
    if pinned not in SPLIT_PIPELINES:
        return None
    conflicts = []
    schedules = [family_of(n).schedule for n in req.families]
    if "schedule" in req.pins:
        sch = str(req.pins["schedule"])
        conflicts.append((f"--pin schedule={sch}", {"schedule": sch, "shard_optimizer": True}))
    elif schedules and all(sch == "fsdp-pp" for sch in schedules):
        fams = ",".join(req.families)
        conflicts.append((f"--family {fams}", {"schedule": "fsdp-pp", "shard_optimizer": True}))
    for what, knobs in conflicts:
        why = _zb_refusal(pinned, **knobs)
        if why is not None:
            return f"--pin pipeline={pinned} conflicts with {what}: {why}; drop one of the two"
    return None


def _with_pipelines(req: Request, family: Family, st: Structure, kns: list[Knobs]) -> list[Knobs]:
    """`kns` under each pass order of `pipelines` (the zero-bubble ones where
    `zb_supported`)."""
    pipes = pipelines(req, family, st)
    out = list(kns) if "1f1b" in pipes else []
    split = [p for p in pipes if p in SPLIT_PIPELINES]
    if split:
        ok = [kn for kn in kns if zb_supported(req, kn)]
        out += [replace(kn, pipeline=p) for p in split for kn in ok]
    return out


_PLANS: Memo[Plan] = Memo(200_000)
"""Candidate plans by request, structure, knobs and recompute (`make_plan`)."""


def make_plan(req: Request, st: Structure, kn: Knobs, recompute: tuple[str, ...]) -> Plan:
    """The Plan of one candidate; pins of fields the search does not vary are applied here.
    (Memoised: the search builds the same candidate's plan several times.)"""
    extra = {k: v for k, v in req.pins.items() if k in FIXED_FIELDS}
    key = (req.spec.name, req.global_batch, req.seq, st, kn, recompute, tuple(extra.items()))
    return _PLANS.get_or(key, _make_plan, req, st, kn, recompute, extra)


_KNOB_FIELDS = tuple(f.name for f in search_fields(Plan, "knob"))
_STRUCTURE_FIELDS = tuple(f.name for f in search_fields(Plan, "structure"))
FIXED_FIELDS = tuple(f.name for f in search_fields(Plan, None) if f.name in _PINNABLE)
"""Pinnable fields the search does not vary (bucket sizes, the clip): set from the pins."""


def _make_plan(req: Request, st: Structure, kn: Knobs, recompute, extra) -> Plan:
    rec: tuple[str, ...] | str = recompute[0] if len(set(recompute)) == 1 else recompute
    return Plan(
        global_batch=req.global_batch,
        seq=req.seq,
        recompute=rec,
        model=req.spec.name,
        **{f: getattr(st, f) for f in _STRUCTURE_FIELDS},
        **{f: getattr(kn, f) for f in _KNOB_FIELDS},
        **extra,
    )
