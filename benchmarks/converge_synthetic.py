"""How close the default `ratrain train` job gets to the synthetic source's entropy floor.

    python benchmarks/converge_synthetic.py [--seeds 0,1,2] [--steps 300] [-- extra train flags]

Runs the job `ratrain train` runs with no arguments (tiny model, synthetic Markov chain,
reference trainer, the command's default flags), once per seed, then measures the loss on
held-out sequences (a step index never trained on, 256 sequences) against the chain's
entropy rate, the best loss any model can reach. Reports wall and CPU time: on a shared
machine the CPU time is what the wall time would be on idle cores.
"""

from __future__ import annotations

import argparse
import time

import torch

from ratrain.cli import train as train_cli
from ratrain.cli.common import plan_from_args
from ratrain.data import Batches, make_source
from ratrain.nn.llama import cross_entropy
from ratrain.train.reference import ReferenceTrainer

HELD_OUT_STEP = 10**6  # sequences of this step index are never seen in training
HELD_OUT_SEQS = 256


def run_one(seed: int, steps: int, extra: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--seed", str(seed), "--steps", str(steps), *extra])
    spec, plan = plan_from_args(args, default_model="tiny")
    cfg = train_cli.train_config_from_args(args)
    source = make_source(args.data, spec, plan.seq, seed)
    torch.set_num_threads(train_cli.cpu_threads(args, spec))
    c0, t0 = time.process_time(), time.perf_counter()
    trainer = ReferenceTrainer(spec, plan, cfg, source)
    losses = trainer.train()
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    x, y = Batches(source, HELD_OUT_SEQS, 1).batch(HELD_OUT_STEP, 0)
    with torch.no_grad():
        held_out = cross_entropy(trainer.model(x), y).item()
    floor = source.entropy_floor_nats
    return {
        "seed": seed,
        "train_loss": sum(losses[-10:]) / len(losses[-10:]),
        "held_out": held_out,
        "floor": floor,
        "gap_pct": 100 * (held_out - floor) / floor,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=train_cli.DEFAULT_STEPS)
    p.add_argument("extra", nargs="*", help="more `ratrain train` flags, after --")
    a = p.parse_args()
    print(
        f"{'seed':>4} {'train':>7} {'held-out':>8} {'floor':>7} {'gap':>7} {'wall_s':>7} {'cpu_s':>7}"
    )
    for seed in (int(s) for s in a.seeds.split(",")):
        r = run_one(seed, a.steps, a.extra)
        print(
            f"{r['seed']:>4} {r['train_loss']:7.4f} {r['held_out']:8.4f} {r['floor']:7.4f} "
            f"{r['gap_pct']:+6.1f}% {r['wall_s']:7.1f} {r['cpu_s']:7.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
