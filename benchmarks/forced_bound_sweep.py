"""A structure's first refinement (`structure.forced_bound_s`) against its knob queue's
least bound (`structure.bound_knobs`), which it must never exceed: with the offloading
stages' walks as the search takes them (`FORCED_WALKS` stages), with every stage walked,
and with none, and what each costs per structure (warm caches, CPU time).

    PYTHONPATH=src python benchmarks/forced_bound_sweep.py
    PYTHONPATH=src python benchmarks/forced_bound_sweep.py --per 20 --jobs h100-80g:qwen2.5-32b:24:32:8192

Per job (platform:model:clusters:global_batch:seq), the first `--per` structures by their
first bound and `--per` more at random, each after its memory pass (the search refines
them all; those whose queue is empty are timed, not compared). Prints per variant the
bound over the queue's least at the 10th percentile and the least, the milliseconds per
structure (the least of `REPEATS` runs), and any bound over the queue's (a bound over it could prune the optimum).
Pure Python (no torch).
"""

from __future__ import annotations

import argparse
import importlib
import random
import time

from ratrain.deadline import Budget
from ratrain.models.presets import get_preset
from ratrain.planner import Request
from ratrain.platforms.load import load

S = importlib.import_module("ratrain.planner.search")  # the name is shadowed by the function
ST = importlib.import_module("ratrain.planner.structure")
TB = importlib.import_module("ratrain.planner.time_bound")

REPEATS = 5
"""The least of this many timings of each variant (the machine is noisy)."""

JOBS = (
    "h100-80g:qwen2.5-32b:24:32:8192",
    "a100-80g:llama2-70b:96:64:4096",
    "h100-80g:qwen2.5-32b:1000:2048:8192",
    "a100-80g:llama2-70b:1000:4096:4096",
    "mt3000:llama2-70b:96:4096:4096",
    "h100-80g:llama3-405b:1000:4096:4096",
)


def _structures(req: Request, per: int, rnd: random.Random) -> list:
    tasks, _ = S._tasks(req, req.families, ST.State(Budget()))
    tasks.sort()
    pick = tasks[:per] + rnd.sample(tasks[per:], min(per, max(0, len(tasks) - per)))
    out = []
    for e in pick:
        kns = ST.memory_pass(req, e.st, e.fam, e.kns, ST.State(Budget()))
        if kns:
            out.append((e.st, e.fam, kns))
    return out


def _bounds(req: Request, items: list, walks, walked: bool = True) -> tuple[list, float]:
    real = ST.time_bound_s

    def unwalked(*args, **kwargs):
        kwargs["walked"] = False
        return real(*args, **kwargs)

    saved, ST.FORCED_WALKS = ST.FORCED_WALKS, walks
    if not walked:
        ST.time_bound_s = unwalked
    try:
        for st, fam, kns in items:  # warm the memos
            ST.forced_bound_s(req, st, fam, kns)
        times = []
        for _ in range(REPEATS):
            t0 = time.process_time()
            out = [ST.forced_bound_s(req, st, fam, kns) for st, fam, kns in items]
            times.append(time.process_time() - t0)
        return out, min(times) / max(1, len(items))
    finally:
        ST.FORCED_WALKS, ST.time_bound_s = saved, real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", nargs="*", default=list(JOBS))
    ap.add_argument("--per", type=int, default=75)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    over = checked = 0
    for job in args.jobs:
        platform, model, clusters, gb, seq = job.split(":")
        req = Request(get_preset(model), load(platform), int(clusters), int(gb), int(seq))
        items = _structures(req, args.per, rnd)
        queues = [ST.bound_knobs(req, st, fam, kns, ST.State(Budget())) for st, fam, kns in items]
        keep = [i for i, q in enumerate(queues) if q]  # a bound over none is no claim
        least = [queues[i][0].lb for i in keep]
        checked += len(keep)
        print(f"{job}: {len(items)} structures past their memory pass, {len(keep)} queued")
        for name, walks, walked in (
            (f"{ST.FORCED_WALKS} walks", ST.FORCED_WALKS, True),
            ("every walk", None, True),
            ("no walk", None, False),
        ):
            lbs, per_s = _bounds(req, items, walks, walked)
            ratios = sorted(lbs[i] / q for i, q in zip(keep, least, strict=True))
            bad = sum(r > 1 + 1e-12 for r in ratios)
            over += bad
            print(
                f"  {name:12s} {1000 * per_s:6.2f} ms a structure; bound / queue's least: "
                f"10th percentile {ratios[len(ratios) // 10]:.3f}, least {ratios[0]:.3f}"
                + (f"; OVER on {bad}" if bad else "")
            )
    print(f"{checked} structures: {over} bounds over their queue's least")


if __name__ == "__main__":
    main()
