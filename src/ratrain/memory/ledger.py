"""The memory ledger: replay each stage's action list and track bytes per state class.

Pure Python (no torch). `replay` walks one step of a schedule, stage by stage, in program
order and keeps the bytes of each class (`STATE_CLASSES`):

    master       fp32 master weights, 4 B/param (/dp with shard_optimizer), all step
    optimizer    Adam m and v, 8 B/param (/dp with shard_optimizer), all step
    view         compute-dtype weights (`view_bytes_per_param`): persistent views all
                 step; transient ones from VIEW_FETCH to VIEW_DROP. A sharded fetch is an
                 in-place all-gather (each replica casts its master shard into its slot
                 of the view, as Megatron's distributed optimizer does): no staging
    grad         grad_dtype bytes/param of a unit from its first B (or B_W) in the step to the end
                 of its UPDATE; with shard_optimizer full size until the reduce-scatter
                 lands, then 1/dp
    activation   per (unit, mb) from F to the end of B (`activation_bytes` under the
                 unit's recompute policy); a RECOMPUTE adds what the policy dropped until
                 the B ends; OFFLOAD takes the bytes off the device, RELOAD brings them back.
                 In a forward-only schedule (an evaluation, `ratrain.schedule.eval`) only
                 while the F runs: under no_grad nothing is kept. A split backward
                 (zb-h1, zb-h2, zb-v): B_IN adds the linear layers' output gradients when it starts and
                 at its end frees all but the linear layers' inputs; both (what B_W needs,
                 `weight_grad_bytes`: per block c·s·b·(3h + ffn) + c·s·b·(3h + 2kv + 2ffn))
                 live until the end of B_W
    comm_buffer  stage-boundary buffers: a received activation (RECV_F until the first
                 unit's F takes it as its input) or gradient (RECV_B until the last unit's
                 B ends), an outgoing one from the F/B producing it until its SEND lands
    workspace    transient bytes of the running compute action
                 (`forward_workspace_bytes`, `backward_workspace_bytes`; for UPDATE 0,
                 assumed: a per-tensor fused optimizer step, or with `eager_kernels` the
                 eager step's temporaries, `update_workspace_bytes`); with
                 `eager_kernels` also the global checks' temporaries while they are
                 computed on the walk (GRAD_NORM's fp64 copy and square of the stage's
                 largest gradient tensor, OVERFLOW's bool mask of a unit's gradient:
                 `ratrain.sizes.workspace`)

Asynchronous actions in program order (the ledger has no clock): what an action
allocates counts from its issue. What it frees counts from the first later action on
the stage that depends on it (directly, or through another asynchronous action): the
compute thread cannot run that action before it has landed. A SEND or OFFLOAD, which no
later action of the stage waits for, frees after the next compute action ends (assumed:
the copy overlaps one compute action), or with `sends_held` (a backend whose sends report
completion only when waited, like gloo's isend: the runtime's poll never frees them) at the
end of the step.

Each trace entry is the state *while* the action runs: its allocations counted, what it
frees at its end not yet freed (so the peak is the largest entry). The state after an
action is the next entry's minus what the next action allocates.

Mapping onto ZeRO (Rajbhandari et al. 2020, §5.1), Ψ parameters, d replicas, fp16 view
and gradients (grad_dtype fp16): no sharding gives 2Ψ + 2Ψ + 12Ψ = 16Ψ; shard_optimizer
gives ZeRO stage 1, (2 + 2)Ψ + 12Ψ/d, while the full gradients exist (from the first B
until the reduce-scatter lands); once the reduce-scatter has landed the state is ZeRO
stage 2's 2Ψ + (2 + 12)Ψ/d. ZeRO-2 reduces each bucket as soon as the backward fills it,
so its full gradient never exists at once; with 1F1B's gradient accumulation over m
microbatches the full gradient of a stage lives through the steady phase, so the stage-1
figure is the peak here. The default fp32 gradients (grad_dtype fp32) add 2Ψ (full) or
2Ψ/d (after the reduce-scatter) to each figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ratrain.config import SPLIT_PIPELINES, Plan
from ratrain.gcpause import gc_paused
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Action, Op, Resource, Schedule, boundary_units
from ratrain.sizes.activations import (
    activation_bytes,
    backward_workspace_bytes,
    boundary_bytes,
    forward_workspace_bytes,
    update_workspace_bytes,
    weight_grad_bytes,
    weight_workspace_bytes,
)
from ratrain.sizes.states import (
    ADAM_BYTES_PER_PARAM,
    MASTER_BYTES_PER_PARAM,
    STATE_CLASSES,
    grad_bytes_per_param,
    shard_bytes,
    stored_params,
    view_bytes_per_param,
)
from ratrain.sizes.workspace import (
    bookkeeping_bytes,
    held_token_bytes,
    norm_workspace_bytes,
    overflow_workspace_bytes,
)

__all__ = ["StageMemory", "Ledger", "replay"]

_MASTER, _OPT, _VIEW, _GRAD, _ACT, _COMM, _WS = range(len(STATE_CLASSES))
_COMPUTE_OPS = (Op.F, Op.B, Op.B_IN, Op.B_W, Op.RECOMPUTE, Op.UPDATE)
_LAND_BY_DEPENDENT = (Op.GRAD_SYNC,)
_LAND_AFTER_COMPUTE = (Op.SEND_F, Op.SEND_B, Op.OFFLOAD)
_WAITED_ON = (Op.GRAD_SYNC, Op.GRAD_NORM, Op.OVERFLOW)
# Op members as module constants: the per-action code below reads no enum class attribute.
_B = Op.B
_B_IN = Op.B_IN
_B_W = Op.B_W
_F = Op.F
_GRAD_NORM = Op.GRAD_NORM
_GRAD_SYNC = Op.GRAD_SYNC
_OFFLOAD = Op.OFFLOAD
_OVERFLOW = Op.OVERFLOW
_RECOMPUTE = Op.RECOMPUTE
_RECV_B = Op.RECV_B
_RECV_F = Op.RECV_F
_RELOAD = Op.RELOAD
_SEND_B = Op.SEND_B
_SEND_F = Op.SEND_F
_UPDATE = Op.UPDATE
_VIEW_DROP = Op.VIEW_DROP
_VIEW_FETCH = Op.VIEW_FETCH


@dataclass
class StageMemory:
    stage: int
    peak_bytes: int
    peak_action_index: int
    """Index in the stage's action list of the action during which the peak occurs."""
    breakdown_at_peak: dict[str, int]
    static_bytes: int = 0
    """Bytes held before the step starts (master, optimizer, persistent views)."""
    rows: list[tuple[int, tuple[int, ...]]] = field(default_factory=list, repr=False)
    """The trace, compactly: (action index, bytes per class in `STATE_CLASSES` order)."""

    @property
    def trace(self) -> list[tuple[int, dict[str, int]]]:
        """(index of the action in the stage list, bytes per class while it runs)."""
        return [(i, dict(zip(STATE_CLASSES, row, strict=True))) for i, row in self.rows]


@dataclass
class Ledger:
    stages: list[StageMemory]

    @property
    def peak_bytes(self) -> int:
        """The largest peak over the stages (the one that must fit the memory cap)."""
        return max(m.peak_bytes for m in self.stages)

    @property
    def worst_stage(self) -> int:
        return max(self.stages, key=lambda m: m.peak_bytes).stage


@gc_paused()
def replay(
    schedule: Schedule,
    spec: ModelSpec,
    plan: Plan,
    *,
    flash: bool = True,
    keep_trace: bool = True,
    eager_kernels: bool = False,
    sends_held: bool = False,
    offload_frees: bool = True,
) -> Ledger:
    """Replay one step of `schedule` and return per-stage peaks, breakdowns and traces.

    `flash`: activations under fused attention (no s² tensors); `keep_trace`: False
    skips the per-action trace (faster, for searches that only need the peaks);
    `eager_kernels`: the norms keep what the runtime's eager fp32 RMSNorm keeps
    (`ratrain.sizes.activations`), rather than what a fused norm keeps; `sends_held`:
    SEND buffers live to the end of the step (`Platform.sends_held_until_waited`);
    `offload_frees`: False where the host tier is the device's own memory (a CPU:
    `Platform.host_is_main_memory`), so an OFFLOAD moves nothing and frees nothing.
    """
    landings = _landings(schedule)
    stages = [
        _StageReplay(schedule, spec, plan, s, flash, eager_kernels, offload_frees).run(
            landings[s], keep_trace, sends_held
        )
        for s in range(schedule.pp)
    ]
    return Ledger(stages)


def _landings(schedule: Schedule) -> list[dict[int, int]]:
    """Per stage: index of a GRAD_SYNC or global check -> index of the first later
    same-stage action that needs it to have landed (directly, or through a global check
    that waits for it)."""
    waits: list[dict[Action, list[Action]]] = [{} for _ in schedule.stages]  # d -> dependents
    for b, deps in schedule.deps.items():  # one scan, no lookups for most actions
        for d in deps:
            if d.op in _WAITED_ON and d.stage == b.stage:
                waits[b.stage].setdefault(d, []).append(b)
    out = []
    for s, acts in enumerate(schedule.stages):
        wanted = {x for d, bs in waits[s].items() for x in (d, *bs)}
        # An action equal to one wanted has its op: test that before hashing the action.
        wanted_ops = {x.op for x in wanted}
        pos = {
            a: i
            for i, a in enumerate(acts)
            if (op := a.op) in _WAITED_ON or (op in wanted_ops and a in wanted)
        }
        dependents = {
            pos[d]: [pos[b] for b in bs if b in pos and pos[b] > pos[d]]
            for d, bs in waits[s].items()
            if d in pos
        }
        land: dict[int, int] = {}
        for i in sorted(dependents, reverse=True):
            at = [j if acts[j].resource is Resource.COMPUTE else land.get(j) for j in dependents[i]]
            at = [j for j in at if j is not None]
            if at:
                land[i] = min(at)
        out.append(land)
    return out


class _StageReplay:
    """One stage's walk. Per-unit sizes are computed once; each action is O(1)."""

    def __init__(
        self,
        sch: Schedule,
        spec: ModelSpec,
        plan: Plan,
        s: int,
        flash: bool,
        eager: bool = False,
        offload_frees: bool = True,
    ):
        self.offload_frees = offload_frees
        self.sch, self.s, self.acts = sch, s, sch.stages[s]
        self.forward_only = bool(sch.meta.get("forward_only"))
        units = sch.meta["stage_units"][s]
        self.recv_units, self.send_units = boundary_units(units, spec.n_layers + 1)
        self.boundary = boundary_bytes(spec, plan)
        self.sharded = plan.shard_optimizer
        params = stored_params(spec, units)
        vbp, gbp = view_bytes_per_param(plan), grad_bytes_per_param(plan)
        self.view = {u: params[u] * vbp for u in units}
        self.grad_full = {u: params[u] * gbp for u in units}
        self.grad_shard = {u: shard_bytes(self.grad_full[u], plan) for u in units}
        # A sync bucket's gradients are one buffer, allocated at its first backward.
        buckets = sch.meta.get("sync_buckets", [[(u,) for u in units]] * (s + 1))[s]
        self.bucket_of = {u: b for b in buckets for u in b}
        policy = {u: plan.recompute_of(spec, s, u) for u in units}
        kw = dict(flash=flash, eager_kernels=eager)
        self.keep = {u: activation_bytes(spec, plan, u, policy[u], **kw) for u in units}
        full = {u: activation_bytes(spec, plan, u, "none", **kw) for u in units}
        self.recomputed = {u: full[u] - self.keep[u] for u in units}
        self.fws = {u: forward_workspace_bytes(spec, plan, u, policy[u], **kw) for u in units}
        self.bws = {u: backward_workspace_bytes(spec, plan, u, **kw) for u in units}
        if sch.meta.get("pipeline") in SPLIT_PIPELINES:  # a split backward: what B_W needs
            self.w_in, self.w_out = {}, {}
            for u in units:
                self.w_in[u], self.w_out[u] = weight_grad_bytes(spec, plan, u, **kw)
            self.wws = {
                u: weight_workspace_bytes(spec, plan, u, eager_kernels=eager) for u in units
            }
        # The fused chunked loss is one autograd Function: the head's B_IN is its whole
        # backward, gradient included (`ratrain.runtime.split_backward`).
        self.unsplit = {spec.n_layers + 1} & set(units) if plan.loss_chunk_tokens else set()
        self.uws = {u: update_workspace_bytes(spec, plan, u) if eager else 0 for u in units}
        # The global checks run over every unit of the stage, one tensor/unit at a time.
        self.nws = max(norm_workspace_bytes(spec, plan, u) for u in units) if eager else 0
        self.ows = max(overflow_workspace_bytes(spec, plan, u) for u in units) if eager else 0
        # The runtime's step-long holdings (token ids, reduction bookkeeping): eager counts.
        self.token_units = {0, spec.n_layers + 1} & set(units) if eager else set()
        self.token_bytes = held_token_bytes(plan)
        self.token_mbs: set[int] = set()
        self.state = [0] * len(STATE_CLASSES)
        self.state[_MASTER] = sum(
            shard_bytes(params[u] * MASTER_BYTES_PER_PARAM, plan) for u in units
        )
        self.state[_OPT] = sum(shard_bytes(params[u] * ADAM_BYTES_PER_PARAM, plan) for u in units)
        persistent = sch.meta.get("view_policy", "persistent") == "persistent"
        self.live_views = set(units) if persistent and vbp else set()
        self.state[_VIEW] = sum(self.view[u] for u in self.live_views)
        self.state[_COMM] = bookkeeping_bytes(spec, plan) if eager else 0
        self.grad: dict[int, int] = {}
        self.act: dict[tuple[int, int], int] = {}
        self.host: dict[tuple[int, int], int] = {}

    # -- effects ----------------------------------------------------------------------------
    def _start(self, a: Action) -> list[tuple[int, int]]:
        """Apply what `a` allocates; return the (class, bytes) it frees when it ends."""
        st, op = self.state, a.op
        if op is _F:
            u = a.units[0]
            st[_ACT] += self.keep[u]
            self.act[(u, a.mb)] = self.keep[u]
            if u in self.token_units and a.mb not in self.token_mbs:
                self.token_mbs.add(a.mb)  # held to the step's end
                st[_ACT] += self.token_bytes
            if u in self.recv_units:
                st[_COMM] -= self.boundary  # the received buffer becomes the unit's input
            if u in self.send_units:
                st[_COMM] += self.boundary  # the output, held until its SEND lands
            st[_WS] += self.fws[u]
            if self.forward_only:  # no_grad: nothing is kept for a backward
                return [(_WS, self.fws[u]), (_ACT, self.act.pop((u, a.mb)))]
            return [(_WS, self.fws[u])]
        if op is _B:
            u = a.units[0]
            if u not in self.grad:
                for v in self.bucket_of.get(u, (u,)):
                    self.grad[v] = self.grad_full[v]
                    st[_GRAD] += self.grad_full[v]
            if u in self.recv_units:
                st[_COMM] += self.boundary  # the input gradient, held until its SEND lands
            st[_WS] += self.bws[u]
            ends = [(_WS, self.bws[u]), (_ACT, self.act.pop((u, a.mb)))]
            if u in self.send_units:
                ends.append((_COMM, self.boundary))  # the received gradient is consumed
            return ends
        if op is _B_IN or op is _B_W:
            return self._split_backward(a)
        if op is _VIEW_FETCH:
            for u in a.units:
                if u not in self.live_views:
                    self.live_views.add(u)
                    st[_VIEW] += self.view[u]
        elif op is _VIEW_DROP:
            for u in a.units:
                self.live_views.discard(u)
            return [(_VIEW, sum(self.view[u] for u in a.units))]
        elif op is _RECOMPUTE:
            u = a.units[0]
            st[_ACT] += self.recomputed[u]
            self.act[(u, a.mb)] += self.recomputed[u]
        elif op is _UPDATE:
            ws = max(self.uws[u] for u in a.units)
            st[_WS] += ws
            return [(_GRAD, self.grad.pop(u)) for u in a.units] + [(_WS, ws)]
        elif op is _GRAD_NORM or op is _OVERFLOW:
            ws = self.nws if op is _GRAD_NORM else self.ows
            st[_WS] += ws
            return [(_WS, ws)]
        elif op is _RECV_F or op is _RECV_B:
            st[_COMM] += self.boundary
        elif op is _RELOAD:
            key = (a.units[0], a.mb)
            back = self.host.pop(key)
            st[_ACT] += back
            self.act[key] += back
        return []

    def _split_backward(self, a: Action) -> list[tuple[int, int]]:
        """B_IN: B's boundary buffers and workspace, the linear layers' output gradients
        from its start (and, of a unit it runs whole, the gradient buffer at its first); at
        its end all but what B_W needs is freed. B_W: the gradient buffer at the unit's
        first, its workspace; at its end what B_IN kept is freed."""
        st, u, key = self.state, a.units[0], (a.units[0], a.mb)
        if (a.op is _B_W or u in self.unsplit) and u not in self.grad:
            for v in self.bucket_of.get(u, (u,)):
                self.grad[v] = self.grad_full[v]
                st[_GRAD] += self.grad_full[v]
        if a.op is _B_W:
            st[_WS] += self.wws[u]
            return [(_WS, self.wws[u]), (_ACT, self.act.pop(key))]
        if u in self.recv_units:
            st[_COMM] += self.boundary  # the input gradient, held until its SEND lands
        st[_WS] += self.bws[u]
        st[_ACT] += self.w_out[u]
        act = self.act[key]
        self.act[key] = self.w_in[u] + self.w_out[u]
        ends = [(_WS, self.bws[u]), (_ACT, act - self.w_in[u])]
        if u in self.send_units:
            ends.append((_COMM, self.boundary))  # the received gradient is consumed
        return ends

    def _land(self, a: Action) -> None:
        """What an async action frees once it has landed."""
        st = self.state
        if a.op is _GRAD_SYNC and self.sharded:
            for u in a.units:
                st[_GRAD] -= self.grad[u] - self.grad_shard[u]
                self.grad[u] = self.grad_shard[u]
        elif a.op in (_SEND_F, _SEND_B):
            st[_COMM] -= self.boundary
        elif a.op is _OFFLOAD:
            key = (a.units[0], a.mb)
            moved = self.act[key] if self.offload_frees else 0  # one memory: nothing moves
            self.host[key] = moved
            st[_ACT] -= moved
            self.act[key] -= moved

    # -- the walk ---------------------------------------------------------------------------
    def run(self, land: dict[int, int], keep_trace: bool, sends_held: bool) -> StageMemory:
        acts, st = self.acts, self.state
        land_before: dict[int, list[Action]] = {}
        for i, j in land.items():
            if acts[i].op in _LAND_BY_DEPENDENT:
                land_before.setdefault(j, []).append(acts[i])
        static = sum(st)
        pending: list[Action] = []  # land when the next compute action ends
        rows: list[tuple[int, tuple[int, ...]]] = []
        peak, peak_i, peak_state = -1, 0, list(st)
        for i, a in enumerate(acts):
            for b in land_before.get(i, ()):
                self._land(b)
            ends = self._start(a)
            total = sum(st)
            if total > peak:
                peak, peak_i, peak_state = total, i, list(st)
            if keep_trace:
                rows.append((i, tuple(st)))
            for c, n in ends:
                st[c] -= n
            if a.op in _COMPUTE_OPS:
                for b in pending:
                    self._land(b)
                pending = []
            elif sends_held and a.op in (_SEND_F, _SEND_B):
                pass  # lands at the step's end, after the last entry
            elif a.op in _LAND_AFTER_COMPUTE or (a.op in _LAND_BY_DEPENDENT and i not in land):
                pending.append(a)
        return StageMemory(
            stage=self.s,
            peak_bytes=peak,
            peak_action_index=peak_i,
            breakdown_at_peak=dict(zip(STATE_CLASSES, peak_state, strict=True)),
            static_bytes=static,
            rows=rows,
        )
