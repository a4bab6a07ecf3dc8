"""A unit's time against its kernels at more shapes than calibrate measures: one factor, or
a factor and a fixed time.

`ratrain calibrate` times the model's Block at 3 shapes (`ratrain.calibrate.shapes`:
hidden 320 at 128 and 512 tokens, hidden 448 at 256) and fits time = factor x kernels +
fixed over them (`ratrain.calibrate.platform_file.fit_unit_time`); before, it kept the
median factor alone. This times the Block the same way (`ratrain.calibrate.units`: one
thread, copies cycled past the caches, the tiny shape's time taken off) at those 3 shapes
and at held-out ones (hidden 256 and 512, 64-512 tokens per microbatch), fits both models
on the calibration shapes only, and prints each model's error at every shape, for the
forward, the backward and a split backward's halves. The kernels are costed on the
platform given (its kernel curves: use a calibration of this machine).

    python benchmarks/unit_fixed_time.py --platform my-machine.yaml [--rounds 3] [--json]

Rounds are interleaved over the shapes; each figure is the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from ratrain.calibrate.platform_file import _KERNEL_GROUP as _GROUP
from ratrain.calibrate.platform_file import fit_unit_time
from ratrain.calibrate.shapes import TINY_SHAPE, UNIT_SHAPES
from ratrain.calibrate.timing import Timer
from ratrain.calibrate.units import _time_split, _time_unit
from ratrain.cost.compute import kernels_time_s, unit_kernels
from ratrain.models.spec import ModelSpec
from ratrain.platforms import load


def _spec(hidden: int, ffn: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=f"h{hidden}",
        n_layers=1,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=heads,
        ffn=ffn,
        vocab=8192,
    )


HELD_OUT = [
    (_spec(256, 688, 4), 1, 64),
    (_spec(256, 688, 4), 1, 128),
    (_spec(256, 688, 4), 2, 128),
    (_spec(256, 688, 4), 4, 128),
    (_spec(512, 1376, 8), 1, 128),
    (_spec(512, 1376, 8), 2, 128),
    (_spec(512, 1376, 8), 4, 128),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", required=True, help="a calibration of this machine")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    plat = load(a.platform)
    torch.set_num_threads(1)
    dev, dt = torch.device("cpu"), torch.float32
    timer = Timer(dev, 0.25, statistic="mean")
    shapes = [(s, mb, seq, True) for s, mb, seq in UNIT_SHAPES]
    shapes += [(s, mb, seq, False) for s, mb, seq in HELD_OUT]
    tiny, tmb, tseq = TINY_SHAPE

    def kernels_s(spec, d, mb, seq):
        ks = unit_kernels(spec, 1, mb, seq, _GROUP[d], dtype="fp32")
        return kernels_time_s(ks, "fp32", plat)[0]

    times: dict[tuple, list[dict]] = {}
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
        f0, b0 = _time_unit(timer, dev, dt, tiny, "block", tmb, tseq)
        i0, w0, _ = _time_split(timer, dev, dt, tiny, "block", tmb, tseq)
        for spec, mb, seq, _ in shapes:
            f, b = _time_unit(timer, dev, dt, spec, "block", mb, seq)
            i, w, _ = _time_split(timer, dev, dt, spec, "block", mb, seq)
            got = {"fwd": f - f0, "bwd": b - b0, "bin": i - i0, "bw": w - w0}
            times.setdefault((spec.hidden, mb, seq), []).append(got)
    rows = []
    for d in _GROUP:
        k0 = kernels_s(tiny, d, tmb, tseq)
        pts = []
        for spec, mb, seq, cal in shapes:
            t = statistics.median(x[d] for x in times[(spec.hidden, mb, seq)])
            pts.append((spec.hidden, mb * seq, kernels_s(spec, d, mb, seq) - k0, t, cal))
        cal_pts = [(k, t) for _, _, k, t, cal in pts if cal]
        f, c = fit_unit_time(cal_pts)
        median = statistics.median(t / k for k, t in cal_pts)
        for h, tokens, k, t, cal in pts:
            rows.append(
                {
                    "direction": d,
                    "hidden": h,
                    "tokens": tokens,
                    "calibration_shape": cal,
                    "measured_s": t,
                    "factor_and_fixed_error": (f * k + c - t) / t,
                    "median_factor_error": (median * k - t) / t,
                    "fit": [f, c],
                    "median_factor": median,
                }
            )
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    for d in _GROUP:
        mine = [r for r in rows if r["direction"] == d]
        f, c = mine[0]["fit"]
        print(
            f"{d}: factor {f:.3f} + fixed {c * 1e3:.3f} ms  |  median factor "
            f"{mine[0]['median_factor']:.3f}"
        )
        for r in mine:
            tag = "calibration" if r["calibration_shape"] else "held out"
            print(
                f"  h{r['hidden']} {r['tokens']:4d} tokens ({tag:11s}) "
                f"{r['measured_s'] * 1e3:7.2f} ms  factor+fixed "
                f"{r['factor_and_fixed_error']:+6.1%}  median factor {r['median_factor_error']:+6.1%}"
            )
        held = [r for r in mine if not r["calibration_shape"]]
        for key in ("factor_and_fixed_error", "median_factor_error"):
            errs = [abs(r[key]) for r in held]
            print(f"  held out, {key}: mean {statistics.mean(errs):.1%}, max {max(errs):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
