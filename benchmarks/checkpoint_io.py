"""Checkpoint cost: save and load time and bytes per rank, and the tokens/s cost of
`--save-every`, for a LLaMA-shaped model of 134M parameters (hidden 768, 12 layers,
12 heads, ffn 2048, vocab 32000).

    python benchmarks/checkpoint_io.py [--quick] [--pp 2] [--dp 1] [--json]

Part 1 spawns pp x dp ranks that build their stage and save / load it `--reps` times
(`ratrain.checkpoint.io`, DCP to a temporary directory); each rank reports its own wall
times and the bytes of its DCP files (fp32 masters and two AdamW moments: 12 bytes per
parameter of the stage). Part 2 trains `--steps` steps saving every `--save-every` and
reports the saves' share of the run: tokens/s with saves = tokens / (step time + save time).
Figures depend on the disk and on what else runs; medians over repetitions.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from ratrain.config import Plan, TrainConfig
from ratrain.models.counts import total_params
from ratrain.models.spec import ModelSpec

SPEC = ModelSpec("llama-134m", 12, 768, 12, 12, 2048, 32000, max_seq=2048, norm_eps=1e-5)


def _io_rank(rdzv, spec: ModelSpec, plan: Plan, root: str, reps: int) -> dict:
    import torch

    from ratrain.checkpoint.io import load_checkpoint, save_checkpoint
    from ratrain.checkpoint.state import StageIO
    from ratrain.launch.grid import ParallelGrid
    from ratrain.runtime.precision import LossScaler
    from ratrain.runtime.stage import StageModel

    grid = ParallelGrid.init(plan.pp, plan.dp, rdzv, device="cpu")
    try:
        cfg = TrainConfig(steps=1)
        model = StageModel(spec, plan, cfg, grid.stage, grid.replica, grid.device)
        ex = SimpleNamespace(updates=0, scaler=LossScaler.for_dtype(plan.compute_dtype))
        save_s, load_s, raw_save_s, raw_load_s, nbytes = [], [], [], [], 0
        for r in range(reps):
            t0 = time.perf_counter()
            d = save_checkpoint(
                Path(root) / f"rep{r}", next_step=1, grid=grid, model=model, executor=ex,
                spec=spec, plan=plan, cfg=cfg, data={},
            )  # fmt: skip
            save_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            load_checkpoint(d, grid=grid, model=model, spec=spec, plan=plan)
            load_s.append(time.perf_counter() - t0)
            nbytes = sum(f.stat().st_size for f in d.glob(f"__{grid.rank}_*.distcp"))
            # Side by side: the same tensors with a plain torch.save / torch.load.
            raw = Path(root) / f"raw{r}-rank{grid.rank}.pt"
            t0 = time.perf_counter()
            torch.save(StageIO(model, grid.dp_group).tensors(), raw)
            raw_save_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            torch.load(raw)
            raw_load_s.append(time.perf_counter() - t0)
            raw.unlink()
        params = sum(p.numel() for st in model.units.values() for p in st.params)
        return {"rank": grid.rank, "stage": grid.stage, "params": params, "bytes": nbytes,
                "save_s": statistics.median(save_s), "load_s": statistics.median(load_s),
                "torch_save_s": statistics.median(raw_save_s),
                "torch_load_s": statistics.median(raw_load_s)}  # fmt: skip
    finally:
        grid.destroy()


def io_table(plan: Plan, reps: int) -> list[dict]:
    from ratrain.launch.spawn import spawn

    with tempfile.TemporaryDirectory(prefix="ratrain-ckpt-bench-") as root:
        return spawn(_io_rank, plan.pp * plan.dp, SPEC, plan, root, reps)


def overhead(plan: Plan, steps: int, every: int) -> dict:
    from ratrain.data import make_source
    from ratrain.train.job import CheckpointOpts, Job, Launch, Outputs, run_job

    cfg = TrainConfig(steps=steps, warmup_steps=1)
    with tempfile.TemporaryDirectory(prefix="ratrain-ckpt-bench-") as root:
        job = Job(
            SPEC, plan, cfg, functools.partial(make_source, "synthetic", SPEC, plan.seq, 0),
            launch=Launch(device="cpu"), outputs=Outputs(progress=False),
            checkpoints=CheckpointOpts(save_dir=root, save_every=every, keep=1),
        )  # fmt: skip
        results = run_job(job)
    step_s = max(sum(r.runs[plan.schedule].step_times_s) for r in results)
    save_s = max(sum(r.runs[plan.schedule].save_times_s) for r in results)
    saves = len(results[0].runs[plan.schedule].save_times_s)
    tokens = steps * plan.tokens_per_step
    return {
        "steps": steps, "save_every": every, "saves": saves,
        "tokens_per_s_without_saves": tokens / step_s,
        "tokens_per_s_with_saves": tokens / (step_s + save_s),
        "overhead": save_s / step_s, "save_s_mean": save_s / max(saves, 1),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repetition, 4 steps saving every 2")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--shard-optimizer", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.steps, a.save_every = 1, 4, 2
    plan = Plan(
        pp=a.pp, dp=a.dp, micro_batch=1, global_batch=2 * a.dp, seq=a.seq,
        compute_dtype="fp32", shard_optimizer=a.shard_optimizer, model=SPEC.name,
    )  # fmt: skip
    rows = io_table(plan, a.reps)
    ov = overhead(plan, a.steps, a.save_every)
    out = {"model": SPEC.name, "params": total_params(SPEC), "plan": plan.to_dict(),
           "io": rows, "save_every": ov}  # fmt: skip
    if a.json:
        print(json.dumps(out))
        return
    print(f"{SPEC.name} ({total_params(SPEC) / 1e6:.0f}M params), pp={plan.pp} dp={plan.dp}"
          f"{' sharded' if plan.shard_optimizer else ''}, fp32 masters + AdamW moments")  # fmt: skip
    print("rank  stage  params(M)  bytes(MB)  save(s)  load(s)  save(MB/s)  "
          "torch.save(s)  torch.load(s)")  # fmt: skip
    for r in rows:
        print(f"{r['rank']:>4}  {r['stage']:>5}  {r['params'] / 1e6:>9.1f}  {r['bytes'] / 1e6:>9.1f}"
              f"  {r['save_s']:>7.2f}  {r['load_s']:>7.2f}  {r['bytes'] / 1e6 / r['save_s']:>10.0f}"
              f"  {r['torch_save_s']:>13.2f}  {r['torch_load_s']:>13.2f}")  # fmt: skip
    print(f"--save-every {ov['save_every']} over {ov['steps']} steps ({ov['saves']} saves, "
          f"{ov['save_s_mean']:.2f} s each): {ov['tokens_per_s_without_saves']:,.0f} -> "
          f"{ov['tokens_per_s_with_saves']:,.0f} tokens/s ({100 * ov['overhead']:.1f}% overhead)")  # fmt: skip


if __name__ == "__main__":
    main()
