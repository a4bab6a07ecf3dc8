"""The head unit under the plain and the fused chunked loss: measured against the cost model.

    python benchmarks/loss_head.py [--model bench-512] [--seq 256] [--micro-batches 1,2,4]
        [--repeats 7] [--platform cpu-local] [--chunk 256]

What `ratrain plan` weighs when it chooses `Plan.loss_chunk_tokens`: the head's forward
and backward for one microbatch, fp32, one thread, the plain loss (log-softmax over the
logits, its backward) and the fused one (`ratrain.nn.chunked_loss`: dL/dh and dL/dw in the
forward, chunk by chunk; the backward only scales them), timed interleaved (plain, fused,
plain, ...) through the runtime's own `Head.loss`, the backward seeded with a gradient of
1/8 as a pipeline's loss scaling gives it; medians over `--repeats` after one warm-up
pair. Printed beside each: the cost model's time for the same actions on `--platform`
(`ratrain.cost.CostModel`, F and B of the head unit), and measured / predicted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ratrain.config import DEFAULT_LOSS_CHUNK_TOKENS, Plan
from ratrain.cost import CostModel
from ratrain.models import counts
from ratrain.models.presets import get_preset
from ratrain.nn.llama import build_unit
from ratrain.platforms import load
from ratrain.schedule.ir import Action, Op


def measure(spec, mb: int, seq: int, chunk: int, repeats: int) -> dict:
    head = build_unit(spec, counts.head_unit(spec), dtype=torch.float32)
    x = torch.randn(mb, seq, spec.hidden, requires_grad=True)
    targets = torch.randint(0, spec.vocab, (mb, seq))
    grad = torch.tensor(0.125)
    out: dict = {None: [], chunk: []}
    for rep in range(repeats + 1):
        for c in (None, chunk) if rep % 2 == 0 else (chunk, None):
            for p in head.parameters():
                p.grad = None
            x.grad = None
            t0 = time.perf_counter()
            y = head.loss(x, targets, c)
            t1 = time.perf_counter()
            y.backward(grad)
            t2 = time.perf_counter()
            if rep:  # the first pair warms up
                out[c].append((t1 - t0, t2 - t1))
    return {c: tuple(statistics.median(v[i] for v in vs) for i in (0, 1)) for c, vs in out.items()}


def predict(spec, platform, mb: int, seq: int, chunk: int | None) -> tuple[float, float]:
    plan = Plan(micro_batch=mb, global_batch=mb, seq=seq, compute_dtype="fp32")
    cm = CostModel(spec, plan.replace(loss_chunk_tokens=chunk), platform)
    head = (counts.head_unit(spec),)
    return cm.time_s(Action(Op.F, 0, head, 0)), cm.time_s(Action(Op.B, 0, head, 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bench-512")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batches", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--platform", default="cpu-local")
    ap.add_argument("--chunk", type=int, default=DEFAULT_LOSS_CHUNK_TOKENS)
    a = ap.parse_args()
    torch.set_num_threads(1)
    spec, platform = get_preset(a.model), load(a.platform)
    print(f"{spec.name} head, seq {a.seq}, fp32, one thread; model: {platform.name}")
    print(
        f"{'mb':>3} {'loss':<10} {'F ms':>8} {'B ms':>8} {'F+B ms':>8} "
        f"{'model F+B':>10} {'meas/model':>10}"
    )
    for mb in (int(x) for x in a.micro_batches.split(",")):
        got = measure(spec, mb, a.seq, a.chunk, a.repeats)
        for c in (None, a.chunk):
            f, b = got[c]
            pf, pb = predict(spec, platform, mb, a.seq, c)
            name = f"fused/{c}" if c else "plain"
            print(
                f"{mb:>3} {name:<10} {1e3 * f:>8.1f} {1e3 * b:>8.1f} {1e3 * (f + b):>8.1f} "
                f"{1e3 * (pf + pb):>10.1f} {(f + b) / (pf + pb):>10.3f}"
            )
        plain, fused = sum(got[None]), sum(got[a.chunk])
        print(
            f"{mb:>3} plain / fused F+B: measured {plain / fused:.3f}, "
            f"model {sum(predict(spec, platform, mb, a.seq, None)) / sum(predict(spec, platform, mb, a.seq, a.chunk)):.3f}"
        )


if __name__ == "__main__":
    main()
