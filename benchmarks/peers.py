"""The peer systems and the matmul probe of `runtime_vs_peers.py`, one function per rank.

Each `*_rank(rdzv, ...)` runs in a rank process started by `ratrain.launch.spawn.spawn`
and returns {"rank", "stage", "times", "rss"}: the period between step ends (s) on that
rank, and the process's peak resident set (bytes).

- torch-1f1b: `torch.distributed.pipelining.Schedule1F1B` on ratrain's own units, then one
  flat DP all-reduce of the stage's gradients and `torch.optim.AdamW` (the GPU-style
  end-of-step sync).
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

from ratrain.config import Plan, TrainConfig
from ratrain.data.base import Batches
from ratrain.launch.grid import ParallelGrid
from ratrain.nn.llama import Block, Embedding, Head, build_unit, cross_entropy
from ratrain.observe.memory import PeakMemory
from ratrain.observe.profile import StepProfile

__all__ = ["torch_1f1b_rank", "deepspeed_rank", "matmul_probe_rank", "deepspeed_available"]


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


def torch_1f1b_rank(
    rdzv, spec, plan: Plan, cfg: TrainConfig, source, profile=False, measure=False
) -> dict:
    """`measure`: also count the rank's peak tensor bytes (`ratrain.observe.memory`, the
    executor's own counter; slower on CPU) as "peak". On CUDA when one is available."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    grid = ParallelGrid.init(
        plan.pp, plan.dp, rdzv, device=None if torch.cuda.is_available() else "cpu"
    )
    try:
        with PeakMemory(grid.device, measure) as mem:
            module = nn.Sequential(
                *(build_unit(spec, u, seed=cfg.seed) for u in plan.stage_units(spec, grid.stage))
            ).to(grid.device)
            mem.track(module.parameters())
            stage = PipelineStage(module, grid.stage, plan.pp, grid.device, group=grid.pp_group)
            sched = Schedule1F1B(stage, plan.microbatches, loss_fn=cross_entropy)
            opt = _adamw(module.parameters(), cfg)
            batches = Batches.from_plan(source(), plan)

            def step(k: int) -> None:
                parts = [batches.batch(k, mb, grid.replica) for mb in range(plan.microbatches)]
                x = torch.cat([p[0] for p in parts]).to(grid.device)  # (m * micro_batch, seq)
                y = torch.cat([p[1] for p in parts]).to(grid.device)
                if grid.is_first_stage:
                    sched.step(x, target=y if grid.is_last_stage else None)
                elif grid.is_last_stage:
                    sched.step(target=y, losses=[])
                else:
                    sched.step()
                dp_mean_grads(grid, list(module.parameters()))
                opt.step()
                opt.zero_grad(set_to_none=True)

            out = _timed(step, cfg.steps, profile)
        return out | {"rank": grid.rank, "stage": grid.stage, "peak": mem.peak_bytes()}
    finally:
        grid.destroy()


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
