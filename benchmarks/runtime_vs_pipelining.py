"""RATrain vs Baseline-1F1B vs torch.distributed.pipelining, side by side, measured.

    python benchmarks/runtime_vs_pipelining.py [--steps 20] [--model tiny] [--pp 2 --dp 2]
        [--micro-batch 2 --global-batch 16 --seq 64] [--json out.json]

Same model, same batch, same ranks (pp x dp local gloo ranks on the CPU, or NCCL with
--device cuda), three modes:

- ratrain:   ratrain's executor, the lifecycle schedule (per-unit syncs and updates);
- baseline:  ratrain's executor, Baseline-1F1B (stage-wide sync and update after the flush);
- torch-1f1b: `torch.distributed.pipelining.Schedule1F1B` on the same units, then one
  flat DP all-reduce of the stage's gradients and `torch.optim.AdamW` at the end of the step
  (`peers.torch_1f1b_rank`, the same step loop as `runtime_vs_peers.py`).

For each: tokens/s from the median step time over the steps after `--warmup` (the metrics
rank's clock: last stage, replica 0), and each rank's peak tensor bytes, measured in a
second, shorter run (counting live bytes slows the CPU path several times). Gradient
clipping is off in the three-way table (torch's schedule has no global-norm step); a
second table times ratrain's two modes with and without exact clipping, from their
measured traces: the global NORM reduction, the updates left after the last backward
(exposed), and the whole tail from the last backward to the end of the step.

Not a test: on a shared 2-core machine the figures mostly measure contention; run it on
real hardware for numbers that mean something.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics

from peers import torch_1f1b_rank

from ratrain.config import Plan, TrainConfig
from ratrain.data import make_source
from ratrain.launch.spawn import spawn
from ratrain.models.presets import get_preset
from ratrain.train.job import Job, Outputs, run_job


def _median_tail(xs: list[float], warmup: int) -> float:
    return statistics.median(xs[warmup:] if len(xs) > warmup else xs)


# -- torch.distributed.pipelining (the step loop of `peers.py`) ---------------------------------


def run_torch(spec, plan, cfg, source, measure: bool) -> list[dict]:
    return spawn(torch_1f1b_rank, plan.pp * plan.dp, spec, plan, cfg, source, False, measure)


# -- ratrain's executor ---------------------------------------------------------------------


def run_ratrain(spec, plan, cfg, source, variants, measure: bool, trace_steps=()) -> dict:
    job = Job(
        spec,
        plan,
        cfg,
        source,
        variants=tuple(variants),
        outputs=Outputs(progress=False, measure_memory=measure, trace_steps=tuple(trace_steps)),
    )
    out: dict[str, dict] = {}
    for r in run_job(job):
        for name, run in r.runs.items():
            d = out.setdefault(name, {"peak": {}, "times": None, "trace": []})
            d["peak"][r.rank] = run.peak_bytes
            if run.losses:  # the metrics rank
                d["times"] = run.step_times_s
                d["trace"] = run.trace
    return out


def tail_costs(trace: list[dict], warmup: int) -> dict[str, float]:
    """Medians over traced steps and stages: NORM time, update time after the last backward
    (exposed), and the tail from the last backward's end to the step's end."""
    by = {}
    for e in trace:
        by.setdefault((e["args"]["step"], e["stage"]), []).append(e)
    norm, exposed, tail = [], [], []
    for (step, _), evs in by.items():
        if step < warmup:
            continue
        last_b = max(e["end_s"] for e in evs if e["op"] == "B")
        end = max(e["end_s"] for e in evs)
        norm += [e["end_s"] - e["start_s"] for e in evs if e["op"] == "NORM"]
        exposed.append(
            sum(
                e["end_s"] - e["start_s"]
                for e in evs
                if e["op"] == "UPD" and e["start_s"] >= last_b
            )
        )
        tail.append(end - last_b)
    med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    return {"norm_s": med(norm), "exposed_update_s": med(exposed), "tail_s": med(tail)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--memory-steps", type=int, default=2)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    spec = get_preset(a.model)
    plan = Plan(
        pp=a.pp,
        dp=a.dp,
        micro_batch=a.micro_batch,
        global_batch=a.global_batch,
        seq=a.seq,
        compute_dtype="fp32",
        clip_grad=None,
        model=spec.name,
    )
    cfg = TrainConfig(steps=a.steps, warmup_steps=2)
    mem_cfg = TrainConfig(steps=a.memory_steps, warmup_steps=1)
    source = functools.partial(make_source, "synthetic", spec, plan.seq, cfg.seed)
    modes = [("ratrain", {"schedule": "ratrain"}), ("baseline", {"schedule": "baseline"})]

    speed = run_ratrain(spec, plan, cfg, source, modes, measure=False)
    memory = run_ratrain(spec, plan, mem_cfg, source, modes, measure=True)
    t_speed = run_torch(spec, plan, cfg, source, measure=False)
    t_mem = run_torch(spec, plan, mem_cfg, source, measure=True)
    metrics_rank = plan.pp - 1  # last stage of replica 0
    tokens = plan.tokens_per_step
    rows = {}
    for name, _ in modes:
        rows[name] = {
            "tokens_per_s": tokens / _median_tail(speed[name]["times"], a.warmup),
            "peak_bytes": [memory[name]["peak"][r] for r in sorted(memory[name]["peak"])],
        }
    rows["torch-1f1b"] = {
        "tokens_per_s": tokens / _median_tail(t_speed[metrics_rank]["times"], a.warmup),
        "peak_bytes": [r["peak"] for r in sorted(t_mem, key=lambda r: r["rank"])],
    }
    print(
        f"{spec.name}, pp={plan.pp} dp={plan.dp}, micro-batch {plan.micro_batch}, "
        f"{plan.microbatches} microbatches, seq {plan.seq}, fp32, no clipping; "
        f"median of steps {a.warmup}..{a.steps - 1}"
    )
    print(f"{'mode':<12} {'tokens/s':>10}  peak MiB per rank")
    for name, r in rows.items():
        peaks = " ".join(f"{p / 2**20:7.2f}" for p in r["peak_bytes"])
        print(f"{name:<12} {r['tokens_per_s']:>10,.0f}  {peaks}")
    ratios = {
        "ratrain/torch tokens_per_s": rows["ratrain"]["tokens_per_s"]
        / rows["torch-1f1b"]["tokens_per_s"],
        "baseline/torch tokens_per_s": rows["baseline"]["tokens_per_s"]
        / rows["torch-1f1b"]["tokens_per_s"],
        "ratrain/baseline tokens_per_s": rows["ratrain"]["tokens_per_s"]
        / rows["baseline"]["tokens_per_s"],
        "ratrain/torch peak (max rank)": max(rows["ratrain"]["peak_bytes"])
        / max(rows["torch-1f1b"]["peak_bytes"]),
        "ratrain/baseline peak (max rank)": max(rows["ratrain"]["peak_bytes"])
        / max(rows["baseline"]["peak_bytes"]),
    }
    for k, v in ratios.items():
        print(f"  {k:<34} {v:.3f}")

    # exact clipping: what the global norm costs each mode, from measured traces
    clip_modes = [
        (f"{k}-{c}", {"schedule": k, "clip_grad": 1.0 if c == "clip" else None})
        for k in ("ratrain", "baseline")
        for c in ("clip", "noclip")
    ]
    traced = run_ratrain(
        spec, plan, cfg, source, clip_modes, measure=False, trace_steps=range(cfg.steps)
    )
    print("tail after the last backward (median over steps and stages, ms):")
    print(f"{'mode':<18} {'tokens/s':>10} {'NORM':>8} {'exposed UPD':>12} {'tail':>8}")
    tails = {}
    for name, _ in clip_modes:
        c = tail_costs(traced[name]["trace"], a.warmup)
        c["tokens_per_s"] = tokens / _median_tail(traced[name]["times"], a.warmup)
        tails[name] = c
        print(
            f"{name:<18} {c['tokens_per_s']:>10,.0f} {1e3 * c['norm_s']:>8.2f} "
            f"{1e3 * c['exposed_update_s']:>12.2f} {1e3 * c['tail_s']:>8.2f}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"plan": plan.to_dict(), "rows": rows, "ratios": ratios, "clipping": tails},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
