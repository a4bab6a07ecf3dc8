"""The stage executor: one training step of one stage, by walking its action list.

The walk implements the execution semantics of `ratrain.schedule.ir` with one issuing
thread per rank:

- compute actions (F, B, RECOMPUTE, UPDATE) run on the walk, one at a time, after the
  walk has waited for the same-stage asynchronous actions they depend on;
- every other action is issued when the walk reaches it (isend/irecv, an async
  collective, a copy) and left in flight; the walk waits on it only where a later action
  depends on it. Cross-stage dependencies (a RECV on its SEND, a global reduction on the
  other stages) are enforced by the communication itself.
- An asynchronous action whose own same-stage dependencies are still in flight (a NORM on
  the syncs it reduces) is issued after waiting for them: the walk blocks there. The
  lowerings place such actions where nothing else is left to issue before the actions
  that need their result, so the wait costs no overlap.

Autograd is per unit: F(u, mb) runs unit u on a detached view of its input made a leaf
(`requires_grad`, no copy) and keeps (input, output); B(u, mb) calls `torch.autograd.backward(output, grad)` with
the gradient of the next unit's input (or the received one, or none for the head's
loss), then adds the parameters' gradients to the unit's flat gradient exactly as the
reference trainer does. GRAD_SYNC reduces whole sync buckets (`StageModel.sync_buckets`,
the schedule's `meta["sync_buckets"]`), one collective on each bucket's shared buffer. So the arithmetic of every F and B, of every gradient sum and of
every update is the same whatever the order the schedule gives them, and Baseline-1F1B
and RATrain agree bit for bit.

Exact semantics with per-unit updates (see docs/runtime.md): UPDATE(u) uses the clip
coefficient from the global NORM and the skip decision from the global OVF, so with
clipping or fp16 the per-unit updates follow those reductions; every stage gathers every
unit's squared-norm contribution and sums them exactly (`math.fsum`), so the norm, the
coefficient and the skip are identical on every rank and in the reference trainer.

Evaluation (`StageExecutor.evaluate`): the same walk over a forward-only schedule
(`ratrain.schedule.eval`) under no_grad, each F keeping nothing for a backward; the last
stage's per-microbatch losses are reduced over the replicas by one world all-gather, so
every rank gets the same held-out loss, summed in the reference trainer's order.

Recompute: "full" runs F under no_grad keeping only the unit input, and RECOMPUTE
re-runs it with autograd just before B. "selective" checkpoints the attention core inside
the block (`torch.utils.checkpoint`): its recomputation happens inside B, so the
RECOMPUTE action itself has nothing left to do. Offload: OFFLOAD(u, mb) moves what
(u, mb) keeps for its backward (the checkpoint under "full", else the tensors autograd
saved, parameters excepted; under a split backward, B_IN's holder before B_IN) to the
host tier, RELOAD brings it back; OFFLOAD and RELOAD #1 (`WEIGHT_VISIT`) move what B_IN
left for a deferred B_W (`WeightWork.move`). On a CPU device the host tier is the same
memory, so nothing moves.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ratrain.config import Plan, TrainConfig
from ratrain.data.base import Batches
from ratrain.errors import RatrainError
from ratrain.launch.grid import ParallelGrid
from ratrain.models.spec import ModelSpec
from ratrain.observe.trace import Recorder
from ratrain.runtime.comm import Comm, Handle, join, p2p_tag
from ratrain.runtime.lifecycle import CheckpointedAttention, Stash
from ratrain.runtime.lr import lr_at
from ratrain.runtime.optim import clip_coefficient
from ratrain.runtime.precision import LossScaler
from ratrain.runtime.split_backward import (
    SavedActivations,
    WeightWork,
    backward_input,
    backward_weight,
)
from ratrain.runtime.stage import StageModel
from ratrain.schedule.ir import WEIGHT_VISIT, Action, Op, Resource, Schedule, boundary_units

__all__ = ["StageExecutor", "StepResult"]


@dataclass
class StepResult:
    step: int
    losses: list[float]
    """Per microbatch of this replica, microbatch order (the stage that holds the head
    only; else empty)."""
    lr: float
    loss_scale: float
    grad_norm: float | None
    """Global norm before clipping (None when the schedule has no NORM)."""
    skipped: bool
    time_s: float
    """Wall time of this stage's walk of the step (the trainer may replace it with the
    period between step ends)."""
    eval_loss: float | None = None
    """The held-out loss after this step (`StageExecutor.evaluate`), when one was run."""


class _Pending:
    """An issued asynchronous action: its handle, what to run once it has landed, and the
    tensors that must stay alive until then."""

    __slots__ = ("handle", "then", "keep")

    def __init__(self, handle: Handle, then: Callable[[], None] | None = None, keep=None):
        self.handle, self.then, self.keep = handle, then, keep

    def finish(self) -> None:
        self.handle.wait()
        if self.then is not None:
            self.then()
        self.then = self.keep = None


@dataclass
class _StepState:
    step: int
    lr: float
    scale: float
    pending: dict[Action, _Pending] = field(default_factory=dict)
    fwd_out: dict = field(default_factory=dict)  # (u, mb) -> output handed to the next consumer
    graph: dict = field(default_factory=dict)  # (u, mb) -> (input leaf, output)
    ckpt: dict = field(default_factory=dict)  # (u, mb) -> unit input (full recompute)
    grad_in: dict = field(default_factory=dict)  # (u, mb) -> gradient of u's input
    weight_work: dict = field(default_factory=dict)  # (u, mb) -> what B_IN left for B_W
    saved: dict = field(default_factory=dict)  # (u, mb) -> SavedActivations (split backward)
    recv: dict = field(default_factory=dict)  # (op, unit, mb) -> received buffer
    stash: dict = field(default_factory=dict)  # (u, mb) -> Stash (offload)
    losses: dict = field(default_factory=dict)  # mb -> loss tensor (detached)
    tokens: dict = field(default_factory=dict)  # mb -> (inputs, targets)
    unit_sq: list[float] | None = None  # per unit, this step (NORM)
    overflow_flag: torch.Tensor | None = None
    decision: tuple[float | None, float, bool] | None = None  # (grad_norm, coef, skip)


class StageExecutor:
    """Runs one stage's list of a `Schedule`, step after step."""

    def __init__(
        self,
        grid: ParallelGrid,
        comm: Comm,
        model: StageModel,
        schedule: Schedule,
        batches: Batches,
        spec: ModelSpec,
        plan: Plan,
        cfg: TrainConfig,
        recorder: Recorder | None = None,
    ):
        if schedule.meta.get("pipeline", "1f1b") != plan.pipeline:
            raise RatrainError(
                f"the schedule's pipeline {schedule.meta.get('pipeline', '1f1b')} differs from "
                f"the plan's {plan.pipeline}; build both from the same plan"
            )
        self.grid, self.comm, self.model, self.batches = grid, comm, model, batches
        self.spec, self.plan, self.cfg = spec, plan, cfg
        self.acts = schedule.stages[grid.stage]
        self.schedule = schedule
        planned = schedule.meta.get("sync_buckets")
        if planned is not None and [tuple(b) for b in planned[grid.stage]] != model.sync_buckets:
            raise RatrainError(
                f"stage {grid.stage}: the schedule's sync buckets {planned[grid.stage]} differ "
                f"from the stage model's {model.sync_buckets}; build both from the same plan"
            )
        self.rec = recorder or Recorder(grid.stage, grid.replica, time.perf_counter(), set())
        self.units = model.unit_ids
        self.head = spec.n_layers + 1
        self.n_micro = plan.dp * plan.microbatches
        self.scaler = LossScaler.for_dtype(
            plan.compute_dtype, cfg.loss_scale_init, cfg.loss_scale_window
        )
        self.updates = 0
        self.wait_s = 0.0
        """Time the last step's walk spent blocked on in-flight asynchronous actions."""
        self.owner_stage = {u: s for s, us in enumerate(schedule.meta["stage_units"]) for u in us}
        self.recv_units, self.send_units = boundary_units(self.units, self.head)
        self.checks = set(schedule.meta.get("global_checks", ()))
        self.recompute = {u: plan.recompute_of(spec, grid.stage, u) for u in self.units}
        self.offloaded = {
            (a.unit, a.mb) for a in self.acts if a.op is Op.OFFLOAD and a.visit != WEIGHT_VISIT
        }
        self.split = any(a.op is Op.B_IN for a in self.acts)
        self.host = torch.device("cpu")
        self.copy_stream = torch.cuda.Stream(grid.device) if grid.device.type == "cuda" else None
        self.boundary_shape = (plan.micro_batch, plan.seq, spec.hidden)  # (B, T, H)
        if schedule.meta.get("view_policy") == "transient":
            for u in self.units:  # fetched ahead of each use from the first step on
                model.drop_view(u)
        for u, policy in self.recompute.items():
            if policy == "selective":
                attn = model.units[u].module.self_attn
                attn.backend = CheckpointedAttention(attn.backend)
        self._handlers: dict[Op, Callable[[Action], _Pending | None]] = {
            Op.F: self._forward,
            Op.B: self._backward,
            Op.B_IN: self._backward_input,
            Op.B_W: self._backward_weight,
            Op.RECOMPUTE: self._recompute,
            Op.UPDATE: self._update,
            Op.SEND_F: self._send_f,
            Op.SEND_B: self._send_b,
            Op.RECV_F: self._recv,
            Op.RECV_B: self._recv,
            Op.GRAD_SYNC: self._grad_sync,
            Op.GRAD_NORM: self._grad_norm,
            Op.OVERFLOW: self._overflow,
            Op.VIEW_FETCH: self._view_fetch,
            Op.VIEW_DROP: self._view_drop,
            Op.OFFLOAD: self._offload,
            Op.RELOAD: self._reload,
        }

    # -- the walk -------------------------------------------------------------------------
    def step(self, k: int) -> StepResult:
        self.rec.begin_step(k)
        self.s = s = _StepState(k, lr_at(k, self.cfg), self.scaler.scale)
        self.wait_s = 0.0
        t_start = time.perf_counter()
        self._walk(self._handlers)
        grad_norm, _, skipped = s.decision if s.decision else (None, 1.0, False)
        self.scaler.update(skipped)
        losses = [s.losses[mb].item() for mb in sorted(s.losses)]
        self.s = None
        return StepResult(
            k, losses, s.lr, s.scale, grad_norm, skipped, time.perf_counter() - t_start
        )

    def _walk(self, handlers: dict[Op, Callable[[Action], _Pending | None]]) -> None:
        """Walk `self.acts` in the semantics of the IR, then wait for what is in flight."""
        s = self.s
        for a in self.acts:
            self._wait_deps(a)
            t0 = self.rec.now()
            pend = handlers[a.op](a)
            if pend is None:  # ran to completion on the walk (compute, or a local copy)
                self.rec.compute(a, t0, self.rec.now())
                if a.resource is Resource.COMPUTE:
                    self._poll()
            else:
                s.pending[a] = pend
                self.rec.issued(a, t0)
        for a in list(s.pending):
            self._finish(a)

    def _finish(self, a: Action) -> None:
        pend = self.s.pending.pop(a)
        t0 = time.perf_counter()
        pend.finish()
        self.wait_s += time.perf_counter() - t0
        self.rec.completed(a, self.rec.now())

    def _wait_deps(self, a: Action) -> None:
        for d in self.schedule.deps_of(a):
            if d in self.s.pending:
                self._finish(d)

    def _poll(self) -> None:
        for a, pend in list(self.s.pending.items()):
            if pend.handle.is_completed():
                self._finish(a)

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, schedule: Schedule, batches: Batches) -> float:
        """The loss on the held-out set `batches` (its step 0: every replica's microbatches)
        walked through the forward-only `schedule` (`ratrain.schedule.build_eval_schedule`);
        collective: every rank calls it and gets the same value (`_eval_loss`). No gradients
        (`torch.no_grad`) and no state change: no optimizer step, loss scale or update count
        touched, the RNG state restored, the training schedule and data kept."""
        assert schedule.meta.get("forward_only"), f"{schedule.kind}: not forward-only"
        saved = self.acts, self.schedule, self.batches, self.rec.active
        self.acts, self.schedule = schedule.stages[self.grid.stage], schedule
        self.batches, self.rec.active = batches, False  # the trace holds training steps only
        self.s = _StepState(0, 0.0, 1.0)
        handlers = {op: self._handlers[op] for op in (Op.SEND_F, Op.RECV_F)}
        handlers.update({Op.VIEW_FETCH: self._view_fetch, Op.VIEW_DROP: self._view_drop})
        handlers[Op.F] = self._eval_forward
        devices = [self.grid.device] if self.grid.device.type == "cuda" else []
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                self._walk(handlers)
                return self._eval_loss(batches.microbatches)
        finally:
            self.acts, self.schedule, self.batches, self.rec.active = saved
            self.s = None

    def _eval_forward(self, a: Action) -> None:
        """F under no_grad: the unit's output for the next consumer, or the head's loss."""
        u, mb, s = a.unit, a.mb, self.s
        x = self._unit_input(u, mb)
        module = self.model.units[u].module
        if u == self.head:
            targets = self._tokens(mb)[1]
            loss = module.loss(x, targets, self.plan.loss_chunk_tokens)
            s.losses[mb] = (loss, targets.numel())
        else:
            s.fwd_out[(u, mb)] = module(x)

    def _eval_loss(self, m: int) -> float:
        """Sum of token losses over tokens, from one world all-gather of every head stage's
        per-microbatch (mean loss, tokens), summed replica-major in microbatch order (the
        reference trainer's order), in fp64: the same on every rank, whatever pp and dp."""
        vec = torch.zeros(2 * m, dtype=torch.float64)
        for mb, (loss, n) in self.s.losses.items():
            vec[2 * mb], vec[2 * mb + 1] = loss.item(), n
        table, handle = self.comm.world_all_gather(vec.to(self.grid.device))  # (world, 2m)
        handle.wait()
        table = table.cpu()
        total, tokens = 0.0, 0
        for r in range(self.plan.dp):
            row = table[self.grid.rank_of(self.plan.head_stage(), r)].tolist()
            for mb in range(m):
                total += row[2 * mb] * row[2 * mb + 1]
                tokens += int(row[2 * mb + 1])
        return total / tokens

    # -- compute --------------------------------------------------------------------------
    def _tokens(self, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        if mb not in self.s.tokens:
            x, y = self.batches.batch(self.s.step, mb, self.grid.replica)
            self.s.tokens[mb] = (x.to(self.grid.device), y.to(self.grid.device))
        return self.s.tokens[mb]

    def _unit_input(self, u: int, mb: int) -> torch.Tensor:
        if u == 0:
            return self._tokens(mb)[0]
        if u in self.recv_units:
            x = self.s.recv.pop((Op.RECV_F, u - 1, mb))
        else:
            x = self.s.fwd_out.pop((u - 1, mb)).detach()
        return x.requires_grad_()

    def _forward(self, a: Action) -> None:
        u, mb, s = a.unit, a.mb, self.s
        x = self._unit_input(u, mb)
        module = self.model.units[u].module
        if self.recompute[u] == "full":
            with torch.no_grad():
                s.fwd_out[(u, mb)] = module(x)
            s.ckpt[(u, mb)] = x
            return
        with self._saving(u, mb):
            if u == self.head:
                loss = module.loss(x, self._tokens(mb)[1], self.plan.loss_chunk_tokens)
                s.losses[mb] = loss.detach()
                # As the reference trainer: the gradient of the global-batch mean, times S.
                y = loss * (s.scale / self.n_micro)
            else:
                y = s.fwd_out[(u, mb)] = module(x)
        s.graph[(u, mb)] = (x, y)

    def _saving(self, u: int, mb: int):
        """Where autograd keeps what (u, mb) saves: a movable stash if it is offloaded;
        under a split backward, a holder B_IN can release what B_W does not read (movable
        too: OFFLOAD and RELOAD move it whole, before B_IN)."""
        if self.split:
            held = self.s.saved[(u, mb)] = SavedActivations(self.model.units[u].module_params)
            return held.hooks()
        if (u, mb) not in self.offloaded:
            return contextlib.nullcontext()
        stash = self.s.stash[(u, mb)] = Stash(self.model.units[u].module.parameters())
        return torch.autograd.graph.saved_tensors_hooks(stash.pack, stash.unpack)

    def _recompute(self, a: Action) -> None:
        u, mb = a.unit, a.mb
        if self.recompute[u] != "full":
            return  # selective: the checkpointed attention core recomputes inside B
        x = self.s.ckpt.pop((u, mb))
        if isinstance(x, Stash):  # offloaded and reloaded
            x = x.unpack((True, 0))
        x = x.detach().requires_grad_()
        with self._saving(u, mb) if self.split else contextlib.nullcontext():
            y = self.model.units[u].module(x)
        self.s.graph[(u, mb)] = (x, y)

    def _output_grad(self, u: int, mb: int) -> torch.Tensor | None:
        """The gradient of (u, mb)'s output: the next unit's input gradient, the received
        one, or none for the head's loss."""
        s = self.s
        if u == self.head:
            return None
        if u in self.send_units:
            return s.recv.pop((Op.RECV_B, u + 1, mb))
        return s.grad_in.pop((u + 1, mb))

    def _backward(self, a: Action) -> None:
        u, mb, s = a.unit, a.mb, self.s
        x, y = s.graph.pop((u, mb))
        grad = self._output_grad(u, mb)
        self.model.prepare_grads(u)
        torch.autograd.backward(y, grad)
        s.stash.pop((u, mb), None)
        if u > 0:
            s.grad_in[(u, mb)] = x.grad

    def _backward_input(self, a: Action) -> None:
        """B_IN: the input gradient now (`ratrain.runtime.split_backward`); the weights'
        gradients are left for B_W. A unit that cannot be split runs its whole backward
        here, into the flat gradient as B does."""
        u, mb, s = a.unit, a.mb, self.s
        x, y = s.graph.pop((u, mb))
        grad = self._output_grad(u, mb)
        params = self.model.units[u].module_params
        held = s.saved.pop((u, mb), None)
        dx, work = backward_input(y, grad, x, params, lambda: self.model.prepare_grads(u), held)
        if work is not None:
            s.weight_work[(u, mb)] = work
        if u > 0:
            s.grad_in[(u, mb)] = dx

    def _weight_state(self, key: tuple[int, int]) -> WeightWork:
        """What B_IN(key) left for B_W; an empty one where B_IN ran the unit whole (a custom
        autograd Function, a compiled block: nothing is kept, nothing moves)."""
        return self.s.weight_work.get(key) or WeightWork()

    def _backward_weight(self, a: Action) -> None:
        work = self.s.weight_work.pop((a.unit, a.mb), None)
        if work is None:  # unsplit: B_IN accumulated the weights' gradients
            return
        self.model.prepare_grads(a.unit)
        backward_weight(work)

    # -- gradients, global checks, update --------------------------------------------------
    def _grad_sync(self, a: Action) -> _Pending:
        """One collective per sync bucket the action covers (a unit's bucket is the unit
        alone when sharded), on the bucket's own buffer: the same buffers whatever the
        schedule, so the same sums."""
        handles, keep = [], []
        covered = set(a.units)
        for bucket in self.model.sync_buckets:
            if not covered.intersection(bucket):
                continue
            assert covered.issuperset(bucket), f"{a} splits the sync bucket {bucket}"
            if self.model.sharded:
                (u,) = bucket
                full = self.model.units[u].grad
                assert full is not None, f"unit {u} synced before any backward"
                shard = self.model.new_grad_shard(u)
                handles.append(self.comm.dp_reduce_scatter(shard, full))
                keep.append(full)
            else:
                handles.append(self.comm.dp_all_reduce(self.model.bucket_grad(bucket)))
        units = a.units

        def landed() -> None:
            for u in units:
                self.model.release_full_grad(u)

        return _Pending(join(handles), landed, keep)

    def _grad_norm(self, a: Action) -> _Pending:
        vec = torch.zeros(self.spec.n_layers + 2, dtype=torch.float64, device=self.grid.device)
        for u in self.units:
            vec[u] = self.model.sq_norm(u)
        table, handle = self.comm.world_all_gather(vec)  # (world, n_units)

        def landed() -> None:
            self.s.unit_sq = self._unit_sq_norms(table.cpu())

        return _Pending(handle, landed, vec)

    def _unit_sq_norms(self, table: torch.Tensor) -> list[float]:
        """Every unit's squared norm from the gathered table: its owner stage's entry (any
        replica holds the same synced gradient: replica 0's is taken) or, sharded, the
        exact sum of the replicas' shard entries."""
        out = []
        for u in range(self.spec.n_layers + 2):
            st = self.owner_stage[u]
            replicas = range(self.grid.dp) if self.model.sharded else (0,)
            out.append(math.fsum(float(table[self.grid.rank_of(st, r), u]) for r in replicas))
        return out

    def _overflow(self, a: Action) -> _Pending:
        bad = any(self.model.has_nonfinite(u) for u in self.units)
        flag = torch.tensor([1.0 if bad else 0.0], device=self.grid.device)
        self.s.overflow_flag = flag
        return _Pending(self.comm.world_all_reduce_max(flag), None, flag)

    def _decide(self) -> tuple[float | None, float, bool]:
        """(grad_norm, clip coefficient, skip), once per step, identical on every rank."""
        s = self.s
        grad_norm, coef = None, 1.0
        if s.unit_sq is not None:
            # S is a power of two, so dividing the squared norms by S^2 is exact.
            grad_norm, coef = clip_coefficient(
                [q / s.scale**2 for q in s.unit_sq], self.plan.clip_grad
            )
        overflow = s.overflow_flag is not None and s.overflow_flag.item() > 0
        overflow = overflow or (grad_norm is not None and not math.isfinite(grad_norm))
        if overflow and not self.scaler.enabled:
            raise RatrainError(
                f"non-finite gradients at step {s.step}: training diverged; lower --lr or use --dtype fp32"
            )
        if not overflow:
            self.updates += 1
        return grad_norm, coef, overflow

    def _update(self, a: Action) -> None:
        s = self.s
        if s.decision is None:
            s.decision = self._decide()
        _, coef, skip = s.decision
        for u in a.units:
            if not skip:
                self.model.update(u, step=self.updates, lr=s.lr, grad_scale=coef / s.scale)
            self.model.release_grads(u)

    # -- views ----------------------------------------------------------------------------
    def _view_fetch(self, a: Action) -> _Pending | None:
        if not self.model.sharded:
            for u in a.units:
                self.model.cast_view(u)
            return None
        handles, keep = [], []
        for u in a.units:
            shard = self.model.shard_view(u)
            handles.append(self.comm.dp_all_gather(self.model.gather_target(u), shard))
            keep.append(shard)
        return _Pending(join(handles), None, keep)

    def _view_drop(self, a: Action) -> None:
        for u in a.units:
            self.model.drop_view(u)

    # -- stage-to-stage -------------------------------------------------------------------
    # A transfer is named by the same unit on both sides (`ratrain.schedule.ir`): unit u's
    # output goes to the owner of u + 1, unit u's input gradient to the owner of u - 1.
    def _send_f(self, a: Action) -> _Pending:
        y = self.s.fwd_out.pop((a.unit, a.mb)).detach()
        to = self.owner_stage[a.unit + 1]
        return _Pending(self.comm.send_to(y, to, p2p_tag(False, a.unit, a.mb)), None, y)

    def _send_b(self, a: Action) -> _Pending:
        g = self.s.grad_in.pop((a.unit, a.mb))
        to = self.owner_stage[a.unit - 1]
        return _Pending(self.comm.send_to(g, to, p2p_tag(True, a.unit, a.mb)), None, g)

    def _recv(self, a: Action) -> _Pending:
        buf = torch.empty(self.boundary_shape, dtype=self.model.dtype, device=self.grid.device)
        self.s.recv[(a.op, a.unit, a.mb)] = buf
        tag = p2p_tag(a.op is Op.RECV_B, a.unit, a.mb)
        return _Pending(self.comm.recv_from(buf, self.owner_stage[a.unit], tag), None, buf)

    # -- offload --------------------------------------------------------------------------
    def _offload(self, a: Action) -> None:
        self._moved(a).move(self.host, self.copy_stream)

    def _reload(self, a: Action) -> None:
        self._moved(a).move(self.grid.device, self.copy_stream)

    def _moved(self, a: Action) -> Stash | SavedActivations | WeightWork:
        """What an OFFLOAD / RELOAD of (u, mb) moves: #1, what B_IN left for B_W; else the
        checkpoint under full recompute (wrapped in a stash at its OFFLOAD), or what
        autograd saved (a stash, or under a split backward B_IN's holder)."""
        key = (a.unit, a.mb)
        if a.visit == WEIGHT_VISIT:  # after B_IN: what B_W reads
            return self._weight_state(key)
        held = self.s.ckpt.get(key)
        if held is not None:  # full recompute: the checkpoint is all (u, mb) keeps
            if not isinstance(held, Stash):
                stash = self.s.ckpt[key] = Stash(())
                stash.tensors = [held]
                return stash
            return held
        return self.s.saved[key] if self.split else self.s.stash[key]
