"""The peer systems and the matmul probe of `runtime_vs_peers.py` and `ratrain bench
cluster`, one function per rank.

Each `*_rank(rdzv, ...)` runs in a rank process (started by `ratrain.launch.spawn.spawn`,
or by torchrun through `ratrain.bench.peer_rank`) and returns {"rank", "stage", "times",
"rss", ...}: the period between step ends (s) on that rank, and the process's peak resident
set (bytes).

- torch-1f1b: `torch.distributed.pipelining.Schedule1F1B` on ratrain's own units.
- torch-interleaved-1f1b, torch-izb, torch-zbv, torch-dualpipev: torch's multi-stage
  pipelines (`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`,
  `ScheduleZBVZeroBubble`, `ScheduleDualPipeV`) on the same units cut into 2·pp chunks, two
  per rank (interleaved: rank r holds chunks r and r+pp; V-shaped: r and 2pp-1-r; see
  `chunk_split`).
- ceiling (not a peer): the job's work with no pipeline at all, what no pipeline of the
  layout can beat (`ceiling_rank`).
- deepspeed: DeepSpeed's `PipelineEngine` on the same units (`deepspeed.pipe.LayerSpec`, so
  each rank builds only its own), gloo, `DS_ACCELERATOR=cpu`, a `torch.optim.AdamW`
  instance (DeepSpeed's compiled Adam needs a C++ extension build). Benchmark-only: never a
  dependency of ratrain.

Each system has its own knobs. The torch ones (`torch_pipelining_rank`): the DP wrapping of
each chunk (`DP_WRAPS`: one flat end-of-step all-reduce, the GPU-style default;
DistributedDataParallel; or FSDP2's `fully_shard`, composed with the pipeline as torchtitan
composes them), full activation checkpointing of every block (torchtitan's full AC), and
the rank layout; their optimizer is `torch.optim.AdamW`. DeepSpeed's (`deepspeed_rank`):
the ZeRO stage (0 or 1, all its pipeline engine runs) and the activation checkpoint
interval; its ranks are placed data-parallel innermost (dp-inner), as its topology does.

Every rank also returns "losses", every step's mean microbatch loss on the ranks that hold
the last chunk (None elsewhere; DeepSpeed's is also the mean over the DP replicas), and
"loss", the first of them, so a mis-split model shows.

Memory (`measure`): the rank's peak tensor bytes ("peak"), counted as ratrain's executor
counts its own (`ratrain.observe.memory.PeakMemory`), entered before the modules are built,
so weights, gradients, optimizer states, communication buffers and activations all count.
On a CPU device two things the counter does not see by itself are told to it: FSDP2's
sharded tensors (DTensors) count by their local shards, not by their global size, and
FSDP2's frees and re-allocations of the unsharded parameters (storage resizes, which bypass
the dispatcher) are reported to it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time

import torch
from torch import nn

from ratrain.config import Plan, TrainConfig, even_split
from ratrain.data.base import Batches
from ratrain.errors import RatrainError
from ratrain.launch.grid import ParallelGrid
from ratrain.nn.llama import Block, Embedding, Head, build_unit, cross_entropy
from ratrain.observe.memory import LiveBytes, PeakMemory
from ratrain.observe.profile import StepProfile

__all__ = [
    "TORCH_PIPELINES",
    "DP_WRAPS",
    "SPLIT_BACKWARD",
    "check_dp_wrap",
    "DS_ZERO_STAGES",
    "chunk_split",
    "chunk_units",
    "rank_chunks",
    "torch_pipelining_rank",
    "torch_1f1b_rank",
    "deepspeed_rank",
    "ceiling_rank",
    "matmul_probe_rank",
    "deepspeed_available",
]

TORCH_PIPELINES = {
    "torch-1f1b": ("Schedule1F1B", None),
    "torch-interleaved-1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "torch-izb": ("ScheduleInterleavedZeroBubble", "loop"),
    "torch-zbv": ("ScheduleZBVZeroBubble", "v"),
    "torch-dualpipev": ("ScheduleDualPipeV", "v"),
}
"""system -> (torch.distributed.pipelining class, chunk placement): None, one stage per
rank; "loop", rank r holds chunks r and r+pp; "v", rank r holds chunks r and 2pp-1-r."""

DP_WRAPS = ("allreduce", "ddp", "fsdp2")
"""How a torch peer keeps a stage's DP replicas in step (dp > 1; with dp = 1 there is
nothing to sync and every choice runs the plain stage):

- allreduce: the GPU-style end-of-step sync, one flat all-reduce of the whole stage's
  gradients after the pipeline flush (`dp_mean_grads`);
- ddp: each chunk in `torch.nn.parallel.DistributedDataParallel` over the stage's DP group;
  the gradients are all-reduced once per step, bucket by bucket, during the last
  microbatch's backward (torch's stage arms DDP's reducer for that backward only). Not
  with the zero-bubble pipelines (`SPLIT_BACKWARD`);
- fsdp2: `torch.distributed.fsdp.fully_shard` on each unit of the chunk (embedding, every
  block, head), then on the chunk, over a 1-D mesh of the stage's DP ranks, parameters
  kept unsharded from the first forward to the end of the step
  (`reshard_after_forward=False`, torchtitan's default with pipeline parallelism): the
  weights, gradients and AdamW states between steps are 1/dp per rank, the gradients
  reduce-scattered once per step (torch's stage runs the FSDP post-backward after the
  last microbatch)."""

SPLIT_BACKWARD = ("torch-izb", "torch-zbv", "torch-dualpipev")
"""The zero-bubble pipelines: their weight-gradient pass (`stage_backward_weight`) adds
`torch.autograd.grad`'s results into `.grad` by hand, which DDP's autograd hooks never see,
so DDP would leave those gradients unsynced; they run with allreduce or fsdp2 only."""


def check_dp_wrap(system: str, dp_wrap: str) -> None:
    """RatrainError (one line) unless `system` can run with `dp_wrap`."""
    if dp_wrap not in DP_WRAPS:
        raise RatrainError(f"dp_wrap must be one of {', '.join(DP_WRAPS)}, got {dp_wrap!r}")
    if dp_wrap == "ddp" and system in SPLIT_BACKWARD:
        raise RatrainError(
            f"dp_wrap ddp cannot run {system}: its weight-gradient pass adds into .grad "
            "outside autograd's hooks, so DDP would never all-reduce those gradients; use "
            "allreduce or fsdp2"
        )


DS_ZERO_STAGES = (0, 1)
"""The ZeRO stages DeepSpeed's pipeline engine runs (it refuses 2 and 3)."""


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def deepspeed_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("deepspeed") is not None
    except (ImportError, ValueError):
        return False


def _adamw(params, cfg: TrainConfig) -> torch.optim.AdamW:
    params = list(params)
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
    )


def _timed(step, steps: int, profile: bool) -> dict:
    """Run `steps` timed steps (periods between step ends), the RSS after them, then one
    profiled extra step when asked (`ratrain.observe.profile`; its waits on communication
    fall in "comm" or "python": the peers' waits are not measured apart)."""
    times, t_last = [], time.perf_counter()
    for k in range(steps):
        step(k)
        now = time.perf_counter()
        times.append(now - t_last)
        t_last = now
    out = {"times": times, "rss": _rss_bytes(), "profile": None}
    if profile:
        with StepProfile() as prof:
            step(steps)
        out["profile"] = prof.finish(0.0)
    return out


def rank_chunks(pp: int, rank: int, style: str | None) -> tuple[int, ...]:
    """The chunks (the stages of torch's pipeline) a pipeline rank holds, in order."""
    if style is None:
        return (rank,)
    return (rank, rank + pp) if style == "loop" else (rank, 2 * pp - 1 - rank)


def chunk_split(spec, plan: Plan, style: str) -> tuple[int, ...]:
    """Blocks per chunk of the 2·pp chunks a multi-stage pipeline runs (`style` "loop" or
    "v", `rank_chunks`). With no split in the plan (even), the even split into 2·pp chunks
    (`ratrain.config.even_split`, as the one-stage peers' into pp); with one (blocks per
    rank), every rank keeps its blocks, halved between its two chunks (the one holding the
    embedding or the head gets the smaller half; otherwise the earlier chunk the larger).
    Raises ValueError (one line) when the chunks cannot be made: a chunk that holds neither
    the embedding nor the head needs a block."""
    n = 2 * plan.pp
    if plan.layer_split is None:
        if n > spec.n_layers:
            raise ValueError(f"{spec.n_layers} layers cannot be split into {n} chunks")
        return even_split(spec.n_layers, n)
    split = [0] * n
    ends = (0, n - 1)
    for rank, blocks in enumerate(plan.blocks_per_stage(spec)):
        a, b = sorted(rank_chunks(plan.pp, rank, style))  # a gets the larger half...
        if a in ends and b not in ends:  # ...unless only a holds the embedding or head
            a, b = b, a
        split[a], split[b] = (blocks + 1) // 2, blocks // 2
    empty = [c for c in range(1, n - 1) if split[c] < 1]
    if empty:
        raise ValueError(
            f"split {_fmt(plan.blocks_per_stage(spec))} cannot be cut into {n} chunks of "
            f">= 1 block (chunk {empty[0]} would have none)"
        )
    return tuple(split)


def _fmt(split) -> str:
    return ",".join(str(x) for x in split)


def chunk_units(spec, split: tuple[int, ...]) -> list[range]:
    """The units (`ratrain.models.counts`) of each chunk of a split in blocks per chunk:
    the embedding (unit 0) with the first, the head (unit n_layers + 1) with the last."""
    out, start = [], 1
    for c, blocks in enumerate(split):
        end = start + blocks
        out.append(range(0 if c == 0 else start, spec.n_layers + 2 if c == len(split) - 1 else end))
        start = end
    return out


def torch_pipelining_rank(
    rdzv,
    spec,
    plan: Plan,
    cfg: TrainConfig,
    source,
    profile=False,
    measure=False,
    system: str = "torch-1f1b",
    *,
    dp_wrap: str = "allreduce",
    activation_checkpoint: bool = False,
    layout: str = "pp-inner",
) -> dict:
    """One rank of a `TORCH_PIPELINES` system. `measure`: also count the rank's peak tensor
    bytes (`ratrain.observe.memory`, the executor's own counter; slower on CPU) as "peak".
    `dp_wrap`: one of `DP_WRAPS` (not ddp with a `SPLIT_BACKWARD` pipeline).
    `activation_checkpoint`: every block recomputed in its backward (`checkpoint_wrapper`,
    non-reentrant: torchtitan's full AC). `layout`: the rank layout (`ratrain.ranks`). On
    CUDA when one is available."""
    import torch.distributed.pipelining as pipelining

    cls_name, style = TORCH_PIPELINES[system]
    check_dp_wrap(system, dp_wrap)
    grid = ParallelGrid.init(
        plan.pp,
        plan.dp,
        rdzv,
        device=None if torch.cuda.is_available() else "cpu",
        layout=layout,
    )
    try:
        if style is None:
            units = [plan.stage_units(spec, st) for st in range(plan.pp)]
        else:
            units = chunk_units(spec, chunk_split(spec, plan, style))
        n_chunks = len(units)
        mine = rank_chunks(plan.pp, grid.stage, style)
        has_first, has_last = 0 in mine, n_chunks - 1 in mine
        wrap = dp_wrap if grid.dp > 1 else "allreduce"  # dp = 1: nothing to sync
        with (
            _peak_memory(grid.device, measure) as mem,
            _fsdp_resizes_told(mem.tracker if wrap == "fsdp2" else None),
        ):
            modules = [
                _chunk_module(spec, units[c], cfg.seed, activation_checkpoint).to(grid.device)
                for c in mine
            ]
            modules = [_dp_wrapped(m, grid, wrap, plan.pp > 1) for m in modules]
            params = [p for m in modules for p in m.parameters()]
            mem.track(params)
            pp_group = grid.pp_group if grid.pp > 1 else _own_group(grid)
            stages = [
                pipelining.PipelineStage(m, c, n_chunks, grid.device, group=pp_group)
                for m, c in zip(modules, mine, strict=True)
            ]
            cls = getattr(pipelining, cls_name)
            sched = cls(
                stages[0] if style is None else stages, plan.microbatches, loss_fn=cross_entropy
            )
            opt = _adamw(params, cfg)
            batches = Batches.from_plan(source(), plan)
            step_losses: list[float] = []

            def step(k: int) -> None:
                parts = [batches.batch(k, mb, grid.replica) for mb in range(plan.microbatches)]
                x = torch.cat([p[0] for p in parts]).to(grid.device)  # (m * micro_batch, seq)
                y = torch.cat([p[1] for p in parts]).to(grid.device)
                losses = [] if has_last else None
                if has_first:
                    sched.step(x, target=y if has_last else None, losses=losses)
                elif has_last:
                    sched.step(target=y, losses=losses)
                else:
                    sched.step()
                if has_last and k < cfg.steps:
                    step_losses.append(sum(v.detach().item() for v in losses) / len(losses))
                if wrap == "allreduce":
                    dp_mean_grads(grid, params)
                opt.step()
                opt.zero_grad(set_to_none=True)

            out = _timed(step, cfg.steps, profile)
        return out | {
            "rank": grid.rank,
            "stage": grid.stage,
            "replica": grid.replica,
            "peak": mem.peak_bytes(),
            "loss": step_losses[0] if step_losses else None,
            "losses": step_losses if has_last else None,
        }
    finally:
        grid.destroy()


def _own_group(grid: ParallelGrid):
    """A group of this rank alone: the pipeline of a one-stage run (the grid has none, and
    torch's stage refuses the default group, larger than its one stage)."""
    groups = [torch.distributed.new_group([r]) for r in range(grid.world_size)]  # all, in order
    return groups[grid.rank]


def _chunk_module(spec, units: range, seed: int, activation_checkpoint: bool) -> nn.Sequential:
    """A chunk's units in order; with `activation_checkpoint`, every block wrapped in
    torch's non-reentrant `checkpoint_wrapper` (its activations recomputed in backward)."""
    mods = [build_unit(spec, u, seed=seed) for u in units]
    if activation_checkpoint:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        mods = [checkpoint_wrapper(m) if isinstance(m, Block) else m for m in mods]
    return nn.Sequential(*mods)


def _dp_wrapped(module: nn.Sequential, grid: ParallelGrid, wrap: str, pp_enabled: bool):
    """A chunk as `wrap` (`DP_WRAPS`) runs it over the stage's DP group."""
    if wrap == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(module, process_group=grid.dp_group)
        # Armed only by torch's stage, on the last microbatch's backward (it calls the
        # reducer's prepare_for_backward itself). Otherwise the forward its shape inference
        # runs at the first step, outside no_sync, arms the reducer too: the first
        # microbatch's backward all-reduces once more, and with two chunks per rank DDP's
        # bucket rebuild then fails (an internal assert) at the second step.
        ddp.require_backward_grad_sync = False
        return ddp
    if wrap == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        # The stage's DP group already exists (`ParallelGrid`): a mesh over it creates no
        # group, which a mesh built from the ranks would (on every rank, for every stage).
        mesh = DeviceMesh.from_group(
            grid.dp_group, grid.device.type, mesh=grid.dp_ranks, mesh_dim_names=("dp",)
        )
        # torchtitan: no reshard after forward under pipeline parallelism, else every
        # microbatch's backward would all-gather the weights again.
        reshard = not pp_enabled
        for unit in module:
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        return fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    return module


class _LocalBytes(LiveBytes):
    """`LiveBytes` that counts a tensor subclass (a DTensor: FSDP2's sharded parameters,
    their gradients and optimizer states) by the storages of its inner tensors (the local
    shard); the wrapper's own storage has the global size and holds no memory."""

    def _add(self, t) -> None:
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        if is_traceable_wrapper_subclass(t):
            attrs, _ = t.__tensor_flatten__()
            for a in attrs:
                self._add(getattr(t, a))
            return
        super()._add(t)


def _peak_memory(device: torch.device, measure: bool) -> PeakMemory:
    mem = PeakMemory(device, measure)
    if mem.tracker is not None:
        mem.tracker = _LocalBytes(device.type)
    return mem


@contextlib.contextmanager
def _fsdp_resizes_told(tracker: LiveBytes | None):
    """While active, FSDP2's frees and re-allocations of its unsharded parameters (storage
    resizes in `torch.distributed.fsdp._fully_shard._fsdp_param`, which the dispatcher does
    not see) are reported to `tracker` (None: nothing to do)."""
    if tracker is None:
        yield
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    patched = []
    for mod in (_fsdp_param, _fsdp_param_group):
        for name in ("alloc_storage", "free_storage"):
            orig = getattr(mod, name, None)
            if orig is None:
                continue

            def told(tensor, _orig=orig):
                _orig(tensor)
                tracker.resized(tensor)

            setattr(mod, name, told)
            patched.append((mod, name, orig))
    try:
        yield
    finally:
        for mod, name, orig in patched:
            setattr(mod, name, orig)


def torch_1f1b_rank(
    rdzv, spec, plan: Plan, cfg: TrainConfig, source, profile=False, measure=False
) -> dict:
    """One rank of torch-1f1b (`torch_pipelining_rank`)."""
    return torch_pipelining_rank(rdzv, spec, plan, cfg, source, profile, measure, "torch-1f1b")


def dp_mean_grads(grid: ParallelGrid, params: list[nn.Parameter]) -> None:
    """The end-of-step DP sync, GPU style: one flat all-reduce of the whole stage."""
    if grid.dp == 1:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    torch.distributed.all_reduce(flat, group=grid.dp_group)
    flat /= grid.dp
    off = 0
    for p in params:
        p.grad.copy_(flat[off : off + p.numel()].view_as(p.grad))
        off += p.numel()


def ceiling_rank(rdzv, spec, plan: Plan, cfg: TrainConfig, source, profile=False) -> dict:
    """One rank of the bubble-free ceiling of a layout: the step's work spread evenly over
    the ranks with no pipeline, no bubble and no communication inside the step.

    Every rank holds the whole model (the same units and weights as the peers). The step's
    m·dp microbatches (m per replica, every replica's) are dealt round robin over the pp·dp
    ranks, and each rank runs the forward and backward of its own, one after another, as one
    process on one core would. The optimizer update is dealt the same way: each rank runs
    AdamW on its share of the parameter tensors (a greedy even split by size), so the
    update is done once over the ranks, as in the pipeline. A barrier ends every step, so a
    step's time is its slowest rank's.

    Each rank so does 1/(pp·dp) of the job's forward, backward and update work, and waits
    for nothing but the barrier: a pipeline on the same ranks does the same work plus its
    bubble, its transfers and its DP sync. Where every rank has a core of its own, its
    tokens/s bound every pipeline's from above, up to what the shapes change (each rank runs
    whole microbatches through every unit; a pipeline's stages hold fewer weights each, so
    their caches hold more of them). Where ranks share cores it is no bound: whole-model
    ranks time-sliced on a core ran slower than pipeline ranks that wait and lend theirs."""
    grid = ParallelGrid.init(plan.pp, plan.dp, rdzv, device="cpu")
    try:
        n_units = spec.n_layers + 2
        model = _chunk_module(spec, range(n_units), cfg.seed, False)
        params = list(model.parameters())
        world, rank = grid.world_size, grid.rank
        load = [0] * world  # the update, dealt by size: the largest tensor first
        owner = {}
        for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
            owner[i] = min(range(world), key=lambda r: (load[r], r))
            load[owner[i]] += params[i].numel()
        opt = _adamw([p for i, p in enumerate(params) if owner[i] == rank], cfg)
        batches = Batches.from_plan(source(), plan)
        work = [(r, mb) for r in range(plan.dp) for mb in range(plan.microbatches)]
        work = work[rank::world]
        step_losses: list[float] = []

        def step(k: int) -> None:
            total = 0.0
            for replica, mb in work:
                x, y = batches.batch(k, mb, replica)
                loss = cross_entropy(model(x), y) / len(work)
                loss.backward()
                total += loss.detach().item()
            if k < cfg.steps:
                step_losses.append(total)
            opt.step()
            model.zero_grad(set_to_none=True)  # the others' too: another rank updates them
            torch.distributed.barrier()

        torch.distributed.barrier()  # every rank starts its first step together
        out = _timed(step, cfg.steps, profile)
        return out | {
            "rank": grid.rank,
            "stage": grid.stage,
            "replica": grid.replica,
            "loss": None,
            "losses": step_losses,
        }
    finally:
        grid.destroy()


def _ds_layers(spec, seed: int):
    from deepspeed.pipe import LayerSpec

    layers = [LayerSpec(Embedding, spec, "torch", seed=seed)]
    layers += [LayerSpec(Block, spec, "torch", i, seed=seed) for i in range(spec.n_layers)]
    return layers + [LayerSpec(Head, spec, "torch", seed=seed)]


def _fixed_split_module(base):
    """A PipelineModule whose stage boundaries are given (`parts`: first unit of each stage,
    then the unit count), so every system runs the same units on each stage."""

    class FixedSplit(base):
        def __init__(self, *args, parts: list[int], **kw):
            self._fixed_parts = parts
            super().__init__(*args, **kw)

        def _partition_layers(self, method="uniform"):
            self.parts = list(self._fixed_parts)
            st = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[st], stop=self.parts[st + 1])

    return FixedSplit


def deepspeed_rank(
    rdzv,
    spec,
    plan: Plan,
    cfg: TrainConfig,
    source,
    profile=False,
    *,
    zero_stage: int = 0,
    ac_interval: int = 0,
    measure: bool = False,
) -> dict:
    """One rank of DeepSpeed's `PipelineEngine`. `zero_stage`: one of `DS_ZERO_STAGES` (1:
    the optimizer states sharded over DP; its reduce and all-gather buckets sized to the
    stage's parameters). `ac_interval`: the PipelineModule's
    `activation_checkpoint_interval` (0: none; k: the stage's layers in segments of k, each
    segment of blocks only recomputed in backward, DeepSpeed's own checkpointing). `measure`: peak tensor bytes as "peak", as the torch
    peers count them. Ranks are placed as DeepSpeed's topology places them: data-parallel
    innermost (`dp-inner`). "losses": every step's loss as `train_batch` returns it (the
    mean over microbatches and DP replicas) on the last stage's ranks, None elsewhere."""
    if zero_stage not in DS_ZERO_STAGES:
        raise RatrainError(
            f"zero_stage must be one of {', '.join(map(str, DS_ZERO_STAGES))} (DeepSpeed's "
            f"pipeline engine runs no other), got {zero_stage!r}"
        )
    os.environ.update(
        DS_ACCELERATOR="cpu",
        RANK=str(rdzv.rank),
        LOCAL_RANK=str(rdzv.local_rank),
        WORLD_SIZE=str(rdzv.world_size),
        MASTER_ADDR=rdzv.master_addr,
        MASTER_PORT=str(rdzv.master_port),
    )
    import deepspeed
    from deepspeed.pipe import PipelineModule

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    try:
        with _peak_memory(torch.device("cpu"), measure) as mem:
            # The same units per stage as ratrain's plan (checked below).
            model = _fixed_split_module(PipelineModule)(
                _ds_layers(spec, cfg.seed),
                num_stages=plan.pp,
                loss_fn=cross_entropy,
                parts=[min(plan.stage_units(spec, st)) for st in range(plan.pp)]
                + [spec.n_layers + 2],
                activation_checkpoint_interval=ac_interval,
                # segments of blocks only: a segment that starts at the embedding has no
                # input that requires grad, and DeepSpeed's (reentrant) checkpoint would
                # cut the graph there
                checkpointable_layers=["Block"],
            )
            stage = model.stage_id
            mine = list(range(model._local_start, model._local_stop))
            assert mine == list(plan.stage_units(spec, stage)), (mine, stage)
            mem.track(model.parameters())
            ds_cfg = {
                "train_batch_size": plan.global_batch,
                "train_micro_batch_size_per_gpu": plan.micro_batch,
                "gradient_accumulation_steps": plan.microbatches,
                "steps_per_print": 10**9,
                "gradient_clipping": 0.0,
                "zero_optimization": {"stage": zero_stage},
            }
            if zero_stage:
                # DeepSpeed's default buckets (5e8 elements) would be allocated whole with
                # pipeline parallelism, two fp32 buffers (4 GB) whatever the model: one
                # bucket of the stage's gradients instead.
                numel = sum(p.numel() for p in model.parameters())
                ds_cfg["zero_optimization"] |= {
                    "reduce_bucket_size": numel,
                    "allgather_bucket_size": numel,
                }
                ds_cfg["zero_allow_untested_optimizer"] = True  # torch's AdamW
            engine, _, _, _ = deepspeed.initialize(
                model=model, optimizer=_adamw(model.parameters(), cfg), config=ds_cfg
            )
            dp_rank = engine.grid.get_data_parallel_rank()
            batches = Batches.from_plan(source(), plan)
            is_last = stage == plan.pp - 1
            step_losses: list[float] = []

            def step(k: int) -> None:
                it = iter([batches.batch(k, mb, dp_rank) for mb in range(plan.microbatches)])
                loss = engine.train_batch(data_iter=it)
                if is_last and k < cfg.steps:
                    step_losses.append(float(loss))

            out = _timed(step, cfg.steps, profile)
        return out | {
            "rank": rdzv.rank,
            "stage": stage,
            "replica": dp_rank,
            "peak": mem.peak_bytes(),
            "loss": step_losses[0] if step_losses else None,
            "losses": step_losses if is_last else None,
        }
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def matmul_probe_rank(rdzv, n: int, seconds: float) -> float:
    """FLOP/s of an n x n x n fp32 matmul on this rank's threads, all ranks at once."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ b
        k += 1
    return 2 * n**3 * k / (time.perf_counter() - t0)
