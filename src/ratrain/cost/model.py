"""The cost of every schedule action of a plan on a platform.

`CostModel.action(a)` says how long one IR action occupies its resource, from the kernel
model (`ratrain.cost.compute`), the α–β communication model (`ratrain.cost.comm`) and the
platform's memory tiers:

- F / B / RECOMPUTE: the sum of the unit's kernels (GEMMs, attention, memory passes).
- B_IN / B_W (a split backward, ``pipeline: zb-h1`` or ``zb-h2``): B's kernels split in two
  (`ratrain.cost.compute.unit_kernels` "BI"/"BW"). derived: each linear layer's backward
  is two GEMMs of its forward's size, dX (B_IN) and dW (B_W), each about the forward's
  FLOPs; the attention core's backward, the elementwise backward and the loss are B_IN's;
  the gradient accumulation and the embedding's scatter-add are B_W's. A block's B_W is
  thus about its forward's GEMM time, its B_IN the rest of B. Each half pays the
  platform's fixed cost per action of its op ("BI"/"BW", else the "default").
- UPDATE: memory-bound. Adam with fp32 master weights and states touches 24 + g bytes per
  parameter (reads weight, gradient, m, v: 12 + g; writes weight, m, v: 12; g the gradient
  dtype's size), as PyTorch's foreach/fused Adam does, at main-memory bandwidth; with
  `shard_optimizer` each replica updates its 1/dp shard. (The often quoted 16–20 B/param
  counts the states held, not the bytes moved by a step.)
- GRAD_SYNC: all-reduce of the gradients over the stage's DP group (reduce-scatter when
  the optimizer is sharded).
- VIEW_FETCH: a cast fp32 -> compute dtype over main memory (reads 4, writes c bytes per
  parameter); with a sharded optimizer, the cast of the replica's shard then an
  all-gather of the view over DP, which runs on the DP network (`resource`).
- SEND_F / SEND_B: one boundary activation (or its gradient) over the link between the
  two stages; a RECV costs nothing itself: it completes when its send has.
- OFFLOAD / RELOAD: what (unit, mb) keeps under its recompute policy, over the host link.
- NORM / OVF: a scalar all-reduce over every rank. On a platform that measured it
  (`memory_bound_bytes_per_s` "grad_norm.fwd.<grad dtype>"), NORM first pays each stage's
  local sum of squares over its gradients (its shard, sharded), the runtime's eager fp64
  pass, on the walk; the reduction completes when the slowest stage's pass has, so every
  stage's NORM is charged the largest.
- A DP collective's own CPU work, on a platform that measured it
  (`collective_compute_s_per_byte`), also slows the compute beside it: the simulator adds
  `stolen_compute_s` to the next compute action its stage runs after issuing it.

On a platform that measured them (`ratrain calibrate`): every action also pays the
runtime's fixed cost per action of its op (`Platform.overhead_s`), the kernels of
compute actions, UPDATE and casts run at the speed the node's shared cores leave each
rank (`ratrain.cost.measured.compute_speed`), and a block's or the head's kernels take
the measured factor a whole unit takes over their sum timed apart
(`Platform.unit_time_factor`, `ratrain.cost.measured.unit_factor`; a recomputation is
a forward), plus the fixed time the unit's action was measured to take beyond that
whatever its size (`Platform.unit_fixed_s`; a full recomputation pays the forward's, a
selective one none), both at the rank's speed. A split backward's B_IN and B_W take the factors measured for them through
the runtime's own split backward ("bin", "bw"), or where the platform has none (older
files, units the runtime ran unsplit when calibrated), the whole backward's ("bwd").

Bytes come from `ratrain.schedule.action_bytes`, the sizes the memory ledger also uses.

The rank layout (`ratrain.cost.comm.RANK_LAYOUTS`) decides which links a DP group and a
stage boundary use; the default is the plan's `rank_layout`, the one the runtime runs.

`scale` multiplies the cost of whole categories (see `COST_CATEGORIES`), for what-if
studies and analytical checks: ``scale={"p2p": 0, "collective": 0}`` removes
communication, ``scale={"edge": 0}`` makes the embedding and head free so that every
stage is uniform. Pure Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ratrain.config import Plan
from ratrain.cost import comm
from ratrain.cost.compute import Kernel, kernels_time_s, memory_pass_time_s, unit_kernels
from ratrain.cost.measured import (
    UNIT_DIRECTIONS,
    compute_speed,
    memory_bound_time_s,
    unit_factor,
    unit_fixed_s,
)
from ratrain.cost.sharing import peak_speed
from ratrain.errors import RatrainError
from ratrain.models import counts
from ratrain.models.spec import ModelSpec
from ratrain.platforms import Platform
from ratrain.schedule.ir import WEIGHT_VISIT, Action, Op, Resource
from ratrain.schedule.lowering import action_bytes

__all__ = ["COST_CATEGORIES", "SPEEDS", "ActionCost", "CostModel", "cost_key", "only"]

SPEEDS = ("busy", "peak")
"""`CostModel(speed=...)`: the rank speed compute times are charged at."""

COST_CATEGORIES = {
    "compute": "F and B of transformer blocks",
    "edge": "F and B of the embedding and the head",
    "recompute": "RECOMPUTE",
    "update": "UPDATE (optimizer step)",
    "p2p": "SEND/RECV between stages",
    "collective": "GRAD_SYNC, and VIEW_FETCH when it is an all-gather",
    "global": "NORM and OVF (global scalar reductions)",
    "copy": "OFFLOAD, RELOAD, and VIEW_FETCH when it is a cast",
}


def only(*categories: str) -> dict[str, float]:
    """A `scale` that keeps the named categories and zeroes every other one."""
    for c in categories:
        if c not in COST_CATEGORIES:
            raise RatrainError(
                f"unknown cost category {c!r}; choose from {', '.join(COST_CATEGORIES)}"
            )
    return {c: (1.0 if c in categories else 0.0) for c in COST_CATEGORIES}


_UNIT_COMPUTE = (Op.F, Op.B, Op.B_IN, Op.B_W)
"""Compute actions scaled per unit (blocks and edge units apart)."""

_COMPUTE = frozenset((*_UNIT_COMPUTE, Op.RECOMPUTE))
"""Ops whose cost reads, of the plan, only the micro-batch's tokens, the compute dtype, the
loss chunking and (RECOMPUTE) the unit's policy, not the stage: shared by every plan alike
in those (`CostModel.action`)."""

_RING_TRAFFIC = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5}
"""derived: what a rank sends, receives and reduces in a ring reduce-scatter or all-gather
is half of a ring all-reduce's (which is the two one after the other); the measured
per-byte compute is an all-reduce's."""


@dataclass(frozen=True)
class ActionCost:
    time_s: float
    category: str
    bound: str | None = None
    """Kernels: flat | compute | dma | memory (what limits the largest part)."""
    algorithm: str | None = None
    """Collectives and transfers: the algorithm and link they were costed on."""
    nbytes: int = 0
    flops: int = 0
    fixed_s: float = 0.0
    """The part of `time_s` that does not follow the rank's speed (the runtime's fixed cost
    per action); the rest of a compute action's time does (`ratrain.sim.sharing`)."""


_MOVES = (Op.OFFLOAD, Op.RELOAD)

_PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(Plan) if f.name != "recompute")

_SHARED: dict[tuple, tuple] = {}
"""Action costs shared by cost models, each value (platform, costs by action key) so that
a platform id now another object's is not read; cleared whole past `_SHARED_LIMIT` keys.
A search costs thousands of plans, each with a model of its own, and most of their actions
cost the same: compute actions by what they read (`_COMPUTE`: on the 2-core machine an
exact search of llama3.2-1b on 1000 h100-80g clusters at 64 x 4096 costed 91,934 actions
one by one), the others among plans alike but for their recompute field (the planner tries
a structure's knobs under one policy per stage after another), by platform id, model, the
plan's other fields, rank layout, speed and scale (`CostModel.action`'s keys)."""

_SHARED_LIMIT = 512
"""assumed: models alike held at once; a search works one structure's knobs at a time, so
a few hundred cover its policies and its bounds' `speed="peak"` models."""


def _shared(key: tuple, platform: Platform) -> dict[tuple, ActionCost]:
    """The costs `_SHARED` holds for `key`, whose first item is `platform`'s id (made empty
    where none are, or where that id is now another object's)."""
    hit = _SHARED.get(key)
    if hit is not None and hit[0] is platform:
        return hit[1]
    if len(_SHARED) >= _SHARED_LIMIT:
        _SHARED.clear()
    costs: dict[tuple, ActionCost] = {}
    _SHARED[key] = (platform, costs)
    return costs


def cost_key(a: Action) -> tuple:
    """What an action's cost depends on: its op, stage and units, and for an OFFLOAD or
    RELOAD whether it moves what B_IN keeps for B_W (`WEIGHT_VISIT`) or the activations:
    they move different bytes. Not the microbatch, nor a view fetch's visit."""
    if a.visit == WEIGHT_VISIT and a.op in _MOVES:
        return (a.op, a.stage, a.units, WEIGHT_VISIT)
    return (a.op, a.stage, a.units)


class CostModel:
    """Costs the actions of one (model, plan, platform); results are cached per action shape."""

    def __init__(
        self,
        spec: ModelSpec,
        plan: Plan,
        platform: Platform,
        *,
        scale: dict[str, float] | None = None,
        rank_layout: str | None = None,
        speed: str = "busy",
    ) -> None:
        self.spec, self.plan, self.platform = spec, plan, platform
        if rank_layout is None:
            rank_layout = plan.rank_layout
        if rank_layout not in comm.RANK_LAYOUTS:
            raise RatrainError(
                f"unknown rank layout {rank_layout!r}; choose one of {', '.join(comm.RANK_LAYOUTS)}"
            )
        self.rank_layout = rank_layout
        scale = dict(scale or {})
        for c, v in scale.items():
            if c not in COST_CATEGORIES:
                raise RatrainError(
                    f"unknown cost category {c!r}; choose from {', '.join(COST_CATEGORIES)}"
                )
            if not v >= 0:
                raise RatrainError(f"cost scale for {c!r} must be >= 0, got {v!r}")
        self.scale = {c: float(scale.get(c, 1.0)) for c in COST_CATEGORIES}
        if speed not in SPEEDS:
            raise RatrainError(f"unknown speed {speed!r}; choose one of {', '.join(SPEEDS)}")
        self.ranks_on_node = min(plan.pp * plan.dp, platform.sharing_units)
        tokens = plan.micro_batch * plan.seq
        self.speed = (
            peak_speed(platform, self.ranks_on_node, tokens)
            if speed == "peak"
            else compute_speed(platform, self.ranks_on_node, tokens)
        )
        """Kernel speed of one rank against one thread on a core of its own: every rank of
        the node busy ("busy", what the simulator's rates are relative to), or the fastest
        any rank runs while others wait ("peak": lower bounds, `ratrain.cost.sharing`)."""
        self._cache, self._compute_costs = self._shared_costs()
        self._stolen: dict[tuple, float] = {}

    def _shared_costs(self) -> tuple[dict[tuple, ActionCost], dict[tuple, ActionCost]]:
        """This model's cost caches (`_SHARED`): that of the models alike but for the
        plan's recompute field, whose keys (`action`) carry the policy where the cost reads
        it, and that of every model whose compute actions cost alike."""
        plan = self.plan
        fields = tuple(
            tuple(v) if isinstance(v, list) else v for v in (getattr(plan, f) for f in _PLAN_FIELDS)
        )
        key = (
            id(self.platform),
            self.spec,
            fields,
            self.rank_layout,
            self.speed,
            tuple(self.scale.items()),  # every category, in `COST_CATEGORIES`' order
        )
        compute = (
            id(self.platform),
            self.spec,
            plan.micro_batch,
            plan.seq,
            plan.compute_dtype,
            plan.loss_chunk_tokens,
            self.speed,
            key[-1],
        )
        return _shared(key, self.platform), _shared(compute, self.platform)

    # -- sizes ------------------------------------------------------------------------------
    def params(self, units: tuple[int, ...]) -> int:
        return sum(counts.unit_params(self.spec, u) for u in units)

    def nbytes(self, a: Action) -> int:
        return action_bytes(a, self.spec, self.plan)

    def view_all_gather(self) -> bool:
        """With a sharded optimizer a view is gathered over DP (the lowering's choice)."""
        return self.plan.shard_optimizer

    def resource(self, a: Action) -> Resource:
        """Where the action runs: its IR resource, except that an all-gather VIEW_FETCH
        occupies the DP network rather than the copy engine."""
        if a.op is Op.VIEW_FETCH and self.view_all_gather():
            return Resource.DP_NET
        return a.resource

    def kernels(self, a: Action) -> list[Kernel]:
        """The kernels of a compute action (F, B, RECOMPUTE), one microbatch."""
        kind = a.op.value
        if a.op is Op.RECOMPUTE:
            # The lowerings emit RECOMPUTE only under selective or full; any other is
            # charged as a full forward from the block input.
            policy = self.plan.recompute_of(self.spec, a.stage, a.units[0])
            kind = f"RC:{'full' if policy == 'none' else policy}"
        p = self.plan
        return [
            k
            for u in a.units
            for k in unit_kernels(
                self.spec,
                u,
                p.micro_batch,
                p.seq,
                kind,
                dtype=p.compute_dtype,
                loss_chunk_tokens=p.loss_chunk_tokens,
            )
        ]

    # -- costs ------------------------------------------------------------------------------
    def action(self, a: Action) -> ActionCost:
        op = a.op
        if op in _COMPUTE:
            # Not the stage: the units' kernels, and a RECOMPUTE's policy.
            key = (op, a.units)
            if op is Op.RECOMPUTE:
                key = (*key, self.plan.recompute_of(self.spec, a.stage, a.units[0]))
            costs = self._compute_costs
        else:
            key = cost_key(a)
            if op in _MOVES:  # it moves what its unit keeps under the unit's policy
                key = (*key, self.plan.recompute_of(self.spec, a.stage, a.units[0]))
            costs = self._cache
        cost = costs.get(key)
        if cost is None:
            cost = costs[key] = self._cost(a)
        return cost

    def time_s(self, a: Action) -> float:
        return self.action(a).time_s

    def stolen_compute_s(self, a: Action) -> float:
        """Compute time a DP collective's own CPU work takes from its rank's kernels while
        it runs beside them (`Platform.collective_compute_s_per_byte`, measured by `ratrain
        calibrate` for an all-reduce where the library's threads share the ranks' cores,
        gloo on CPUs; 0 where not measured). `ratrain.sim.simulate` charges it to the next
        compute action the stage's walk runs after issuing the collective."""
        per_byte = self.platform.collective_compute_s_per_byte
        kind = self._dp_collective(a) if per_byte else None
        if kind is None:
            return 0.0
        key = (a.op, a.stage, a.units)
        t = self._stolen.get(key)
        if t is None:
            t = 0.0
            if self._dp(a).n > 1:
                t = per_byte * _RING_TRAFFIC[kind] * self.nbytes(a) * self.scale["collective"]
            self._stolen[key] = t
        return t

    def _dp_collective(self, a: Action) -> str | None:
        """The DP collective an action is, if any: a GRAD_SYNC's all-reduce (reduce-scatter
        with a sharded optimizer), a VIEW_FETCH's all-gather when views are gathered."""
        if a.op is Op.GRAD_SYNC:
            return "reduce_scatter" if self.plan.shard_optimizer else "all_reduce"
        if a.op is Op.VIEW_FETCH and self.view_all_gather():
            return "all_gather"
        return None

    def _cost(self, a: Action) -> ActionCost:
        c = self._raw_cost(a)
        over_s = self.platform.overhead_s(a.op.value) if a.op is not Op.VIEW_DROP else 0.0
        if a.op in _UNIT_COMPUTE:
            # Kernels scaled per unit (blocks and edge units apart); overhead per action.
            if over_s:
                over_s *= self.scale[c.category]
                c = ActionCost(
                    c.time_s + over_s, c.category, c.bound, c.algorithm, c.nbytes, c.flops, over_s
                )
            return c
        return ActionCost(
            (c.time_s + over_s) * self.scale[c.category],
            c.category,
            c.bound,
            c.algorithm,
            c.nbytes,
            c.flops,
            over_s * self.scale[c.category],
        )

    def _raw_cost(self, a: Action) -> ActionCost:
        op = a.op
        if op in _UNIT_COMPUTE or op is Op.RECOMPUTE:
            return self._compute(a)
        if op is Op.UPDATE:
            return self._update(a)
        if op is Op.GRAD_SYNC:
            return self._grad_sync(a)
        if op is Op.VIEW_FETCH:
            return self._view_fetch(a)
        if op in (Op.SEND_F, Op.SEND_B):
            return self._send(a)
        if op in (Op.RECV_F, Op.RECV_B):
            return ActionCost(0.0, "p2p", nbytes=self.nbytes(a))
        if op in (Op.OFFLOAD, Op.RELOAD):
            nbytes = self.nbytes(a)
            host = self.platform.host
            return ActionCost(
                comm.message_time_s(nbytes, host), "copy", algorithm="host", nbytes=nbytes
            )
        if op in (Op.GRAD_NORM, Op.OVERFLOW):
            p = self.plan
            group = comm.world_group(p.pp, p.dp, self.platform.units_per_node)
            t, algo = comm.scalar_allreduce_s(group, self.platform)
            if op is Op.GRAD_NORM:
                t += self._norm_pass_s()
            return ActionCost(t, "global", algorithm=algo, nbytes=self.nbytes(a))
        if op is Op.VIEW_DROP:
            return ActionCost(0.0, "copy")
        raise AssertionError(f"no cost for {a}")

    def _compute(self, a: Action) -> ActionCost:
        """F and B are scaled here, per unit (blocks and edge units apart); RECOMPUTE later."""
        dt = self.plan.compute_dtype
        if a.op is Op.RECOMPUTE:
            ks = self.kernels(a)
            t, bound = kernels_time_s(ks, dt, self.platform)
            t *= unit_factor(self.platform, self.spec, a.units[0], "fwd", dt)
            if self.plan.recompute_of(self.spec, a.stage, a.units[0]) != "selective":
                # a whole forward again: each unit's fixed time too (selective: one kernel)
                t += sum(unit_fixed_s(self.platform, self.spec, u, "fwd", dt) for u in a.units)
            t /= self.speed
            return ActionCost(t, "recompute", bound, flops=sum(k.flops for k in ks))
        total, flops, bound, best = 0.0, 0, None, -1.0
        fused = bool(self.plan.loss_chunk_tokens)
        for u in a.units:
            ks = self.kernels(Action(a.op, a.stage, (u,), a.mb))
            t, b = kernels_time_s(ks, dt, self.platform)
            direction = UNIT_DIRECTIONS[a.op.value]
            t *= unit_factor(self.platform, self.spec, u, direction, dt, fused)
            t += unit_fixed_s(self.platform, self.spec, u, direction, dt, fused)
            t /= self.speed
            total += t * self.scale["compute" if counts.is_block(self.spec, u) else "edge"]
            flops += sum(k.flops for k in ks)
            if t > best:
                bound, best = b, t
        blocks = any(counts.is_block(self.spec, u) for u in a.units)
        return ActionCost(total, "compute" if blocks else "edge", bound, flops=flops)

    def _norm_pass_s(self) -> float:
        """The slowest stage's local sum of squares over its gradients (0 if not measured)."""
        p = self.plan
        worst = 0.0
        for s in range(p.pp):
            n = self.params(tuple(p.stage_units(self.spec, s)))
            n = -(-n // p.dp) if p.shard_optimizer else n
            t = memory_bound_time_s("grad_norm", n, p.grad_dtype, False, self.platform)
            worst = max(worst, (t or 0.0) / self.speed)
        return worst

    def _update(self, a: Action) -> ActionCost:
        nbytes = self.nbytes(a)
        t, bound = memory_pass_time_s(nbytes, self.platform)
        return ActionCost(t / self.speed, "update", bound, nbytes=nbytes)

    def _dp(self, a: Action) -> comm.Group:
        p = self.plan
        return comm.dp_group(a.stage, p.pp, p.dp, self.platform.units_per_node, self.rank_layout)

    def _grad_sync(self, a: Action) -> ActionCost:
        nbytes = self.nbytes(a)
        kind = self._dp_collective(a)
        t, algo = comm.collective_time_s(kind, nbytes, self._dp(a), self.platform)
        return ActionCost(t, "collective", algorithm=f"{kind}:{algo}", nbytes=nbytes)

    def _view_fetch(self, a: Action) -> ActionCost:
        n, nbytes = self.params(a.units), self.nbytes(a)
        if self.view_all_gather():
            shard = -(-n // self.plan.dp)  # cast this replica's shard, then gather the views
            cast_s, _ = memory_pass_time_s(shard * (4 + nbytes // max(n, 1)), self.platform)
            cast_s /= self.speed
            t, algo = comm.collective_time_s("all_gather", nbytes, self._dp(a), self.platform)
            return ActionCost(
                cast_s + t, "collective", algorithm=f"all_gather:{algo}", nbytes=nbytes
            )
        t, bound = memory_pass_time_s(n * 4 + nbytes, self.platform)
        return ActionCost(t / self.speed, "copy", bound, algorithm="cast", nbytes=nbytes)

    def _send(self, a: Action) -> ActionCost:
        peer = a.stage + 1 if a.op is Op.SEND_F else a.stage - 1
        link = comm.p2p_link(
            a.stage, peer, self.plan.pp, self.plan.dp, self.platform, self.rank_layout
        )
        where = "intra" if link is self.platform.intra_node else "inter"
        nbytes = self.nbytes(a)
        return ActionCost(
            comm.p2p_time_s(nbytes, link), "p2p", algorithm=f"p2p:{where}", nbytes=nbytes
        )
