"""The peer systems and the matmul probe of `runtime_vs_peers.py`, one function per rank.

Each `*_rank(rdzv, ...)` runs in a rank process started by `ratrain.launch.spawn.spawn`
and returns {"rank", "stage", "times", "rss"}: the period between step ends (s) on that
rank, and the process's peak resident set (bytes).

- torch-1f1b: `torch.distributed.pipelining.Schedule1F1B` on ratrain's own units, then one
  flat DP all-reduce of the stage's gradients and `torch.optim.AdamW` (the GPU-style
  end-of-step sync).
- torch-interleaved-1f1b, torch-izb, torch-zbv, torch-dualpipev: torch's multi-stage
  schedules (`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`,
  `ScheduleZBVZeroBubble`, `ScheduleDualPipeV`) on the same units cut into 2·pp chunks, two
  per rank (interleaved: rank r holds chunks r and r+pp; V-shaped: r and 2pp-1-r; see
  `chunk_split`), with the same DP sync and optimizer as torch-1f1b.

The torch ranks also return "loss": the first step's mean microbatch loss on the rank that
holds the last chunk (None elsewhere), so a mis-split model shows.
- deepspeed: DeepSpeed's `PipelineEngine` on the same units (`deepspeed.pipe.LayerSpec`, so
  each rank builds only its own), gloo, `DS_ACCELERATOR=cpu`, a `torch.optim.AdamW`
  instance (DeepSpeed's compiled Adam needs a C++ extension build). Benchmark-only: never a
  dependency of ratrain.
"""

from __future__ import annotations

import os
import resource
import time

import torch
from torch import nn

from ratrain.config import Plan, TrainConfig, even_split
from ratrain.data.base import Batches
from ratrain.launch.grid import ParallelGrid
from ratrain.nn.llama import Block, Embedding, Head, build_unit, cross_entropy
from ratrain.observe.memory import PeakMemory
from ratrain.observe.profile import StepProfile

__all__ = [
    "TORCH_SCHEDULES",
    "chunk_split",
    "chunk_units",
    "rank_chunks",
    "torch_pipelining_rank",
    "torch_1f1b_rank",
    "deepspeed_rank",
    "matmul_probe_rank",
    "deepspeed_available",
]

TORCH_SCHEDULES = {
    "torch-1f1b": ("Schedule1F1B", None),
    "torch-interleaved-1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "torch-izb": ("ScheduleInterleavedZeroBubble", "loop"),
    "torch-zbv": ("ScheduleZBVZeroBubble", "v"),
    "torch-dualpipev": ("ScheduleDualPipeV", "v"),
}
"""system -> (torch.distributed.pipelining class, chunk placement): None, one stage per
rank; "loop", rank r holds chunks r and r+pp; "v", rank r holds chunks r and 2pp-1-r."""


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
    """The chunks (pipeline stages of torch's schedule) a pipeline rank holds, in order."""
    if style is None:
        return (rank,)
    return (rank, rank + pp) if style == "loop" else (rank, 2 * pp - 1 - rank)


def chunk_split(spec, plan: Plan, style: str) -> tuple[int, ...]:
    """Blocks per chunk of the 2·pp chunks a multi-stage schedule runs (`style` "loop" or
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
) -> dict:
    """One rank of a `TORCH_SCHEDULES` system. `measure`: also count the rank's peak tensor
    bytes (`ratrain.observe.memory`, the executor's own counter; slower on CPU) as "peak".
    On CUDA when one is available."""
    import torch.distributed.pipelining as pipelining

    cls_name, style = TORCH_SCHEDULES[system]
    grid = ParallelGrid.init(
        plan.pp, plan.dp, rdzv, device=None if torch.cuda.is_available() else "cpu"
    )
    try:
        if style is None:
            units = [plan.stage_units(spec, st) for st in range(plan.pp)]
        else:
            units = chunk_units(spec, chunk_split(spec, plan, style))
        n_chunks = len(units)
        mine = rank_chunks(plan.pp, grid.stage, style)
        has_first, has_last = 0 in mine, n_chunks - 1 in mine
        with PeakMemory(grid.device, measure) as mem:
            modules = [
                nn.Sequential(*(build_unit(spec, u, seed=cfg.seed) for u in units[c])).to(
                    grid.device
                )
                for c in mine
            ]
            params = [p for m in modules for p in m.parameters()]
            mem.track(params)
            stages = [
                pipelining.PipelineStage(m, c, n_chunks, grid.device, group=grid.pp_group)
                for m, c in zip(modules, mine, strict=True)
            ]
            cls = getattr(pipelining, cls_name)
            sched = cls(
                stages[0] if style is None else stages, plan.microbatches, loss_fn=cross_entropy
            )
            opt = _adamw(params, cfg)
            batches = Batches.from_plan(source(), plan)
            first_loss = []

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
                if k == 0 and has_last:
                    first_loss.append(sum(v.detach().item() for v in losses) / len(losses))
                dp_mean_grads(grid, params)
                opt.step()
                opt.zero_grad(set_to_none=True)

            out = _timed(step, cfg.steps, profile)
        return out | {
            "rank": grid.rank,
            "stage": grid.stage,
            "replica": grid.replica,
            "peak": mem.peak_bytes(),
            "loss": first_loss[0] if first_loss else None,
        }
    finally:
        grid.destroy()


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


def _ds_layers(spec):
    from deepspeed.pipe import LayerSpec

    layers = [LayerSpec(Embedding, spec, "torch", seed=0)]
    layers += [LayerSpec(Block, spec, "torch", i, seed=0) for i in range(spec.n_layers)]
    return layers + [LayerSpec(Head, spec, "torch", seed=0)]


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


def deepspeed_rank(rdzv, spec, plan: Plan, cfg: TrainConfig, source, profile=False) -> dict:
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
        assert cfg.seed == 0, "the layer specs build seed-0 units"
        # The same units per stage as ratrain's plan (checked below).
        model = _fixed_split_module(PipelineModule)(
            _ds_layers(spec),
            num_stages=plan.pp,
            loss_fn=cross_entropy,
            parts=[min(plan.stage_units(spec, st)) for st in range(plan.pp)] + [spec.n_layers + 2],
        )
        stage = model.stage_id
        mine = list(range(model._local_start, model._local_stop))
        assert mine == list(plan.stage_units(spec, stage)), (mine, stage)
        ds_cfg = {
            "train_batch_size": plan.global_batch,
            "train_micro_batch_size_per_gpu": plan.micro_batch,
            "gradient_accumulation_steps": plan.microbatches,
            "steps_per_print": 10**9,
            "gradient_clipping": 0.0,
        }
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=_adamw(model.parameters(), cfg), config=ds_cfg
        )
        dp_rank = engine.grid.get_data_parallel_rank()
        batches = Batches.from_plan(source(), plan)

        def step(k: int) -> None:
            it = iter([batches.batch(k, mb, dp_rank) for mb in range(plan.microbatches)])
            engine.train_batch(data_iter=it)

        return _timed(step, cfg.steps, profile) | {"rank": rdzv.rank, "stage": stage}
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
