"""Predicted against measured step times of a grid of plans on the emulated cluster, with
the links shaped and unshaped, interleaved; the prediction with the link model of
`ratrain.cost.links` ("links") and without it ("queues": no link held, each transfer on
its sender's queue alone). The grid (`CASES`): 1F1B, zb-h1, zb-h2 and a V order;
ratrain, gpu-style and fsdp-pp; pp-inner and dp-inner; 4x1 and 2x2; 50, 100 and 200
Mbit/s. Where every plan ran, it ends with the whole step's MAPE, max error and Kendall's
tau, and how far what the links add is predicted on each plan.

    python benchmarks/link_model_check.py --platform base.yaml [--repeats 2] [--steps 6]
        [--json out.json]

The base platform (`ratrain calibrate`, this machine) gives the compute; the links are
the nominal rate of the emulated links shared by a node's ranks (`link_platform`, assumed,
not fitted to anything here). Unshaped runs use links of `UNSHAPED_MBIT` and are predicted
with the base platform's loopback link between nodes. What the links add is shaped minus
unshaped, measured against predicted; the compute drift between runs shows in the
unshaped column. Needs root (network namespaces). `ratrain validate --cluster` runs the
same grid (`ratrain.bench.validate_cluster`) with the link model alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ratrain.bench.validate_cluster import (
    DEFAULT_CASES,
    UNSHAPED_MBIT,
    measure,
    plan_of,
    platforms,
)
from ratrain.models.presets import get_preset
from ratrain.sim.simulate import simulate

sim_mod = sys.modules["ratrain.sim.simulate"]  # the module (the package exports the function)

CASES = DEFAULT_CASES
"""The grid of `ratrain validate --cluster` (`ratrain.bench.validate_cluster`)."""


def _predict(case, platform, links: bool) -> float:
    """The simulated step time, with the link model or without it (every transfer on its
    sender's queue alone)."""
    keep = sim_mod._links
    if not links:
        sim_mod._links = lambda *a: None
    try:
        return simulate(
            get_preset(case.model), plan_of(case), platform, memory_timeline=False
        ).step_time_s
    finally:
        sim_mod._links = keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", required=True, help="this machine's calibrated platform")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--port", type=int, default=29741)
    ap.add_argument("--cases", default="", help="comma-separated case numbers (default all)")
    ap.add_argument("--json", help="write every figure here (after each run)")
    ap.add_argument("--measured", help="predict only, beside the runs of this --json file")
    args = ap.parse_args()
    picked = [CASES[int(k)] for k in args.cases.split(",")] if args.cases else CASES
    rows = [
        {"case": c.name, "mbit": c.link_mbit, "measured": {"shaped": [], "unshaped": []}}
        for c in picked
    ]
    if args.measured:
        old = {r["case"]: r["measured"] for r in json.loads(Path(args.measured).read_text())}
        for row in rows:
            row["measured"] = old.get(row["case"], row["measured"])
    _predict_all(rows, picked, args.platform)
    for rep in range(0 if args.measured else args.repeats):
        for row, case in zip(rows, picked, strict=True):
            for kind, mbit in (("shaped", case.link_mbit), ("unshaped", UNSHAPED_MBIT)):
                t = measure(case, mbit, args.steps - args.warmup, args.warmup, args.port, 900.0)
                row["measured"][kind].append(t)
                print(f"repeat {rep}: {row['case']} {kind}: {t:.3f} s", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
    done = [r for r in rows if r["measured"]["shaped"] and r["measured"]["unshaped"]]
    _report(done)
    if len(done) >= 2:
        _summary(done)
    if args.json and not args.measured:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _predict_all(rows, picked, platform: str) -> None:
    for row, case in zip(rows, picked, strict=True):
        shaped, unshaped = platforms(platform, case)
        row["predicted"] = {
            model: {
                "shaped": _predict(case, shaped, model == "links"),
                "unshaped": _predict(case, unshaped, model == "links"),
            }
            for model in ("queues", "links")
        }


def _summary(rows) -> None:
    """Whole step: MAPE, max error and Kendall's tau over the plans; what the links add:
    the error of each plan's (shaped - unshaped), measured against predicted."""
    from ratrain.validate.stats import kendall_tau, mape, max_error

    meas = [statistics.median(r["measured"]["shaped"]) for r in rows]
    pred = [r["predicted"]["links"]["shaped"] for r in rows]
    adds = []
    for r in rows:
        ms, mu = (statistics.median(r["measured"][k]) for k in ("shaped", "unshaped"))
        p = r["predicted"]["links"]
        adds.append(((p["shaped"] - p["unshaped"]) - (ms - mu)) / (ms - mu) * 100)
    print(
        f"whole step over {len(rows)} plans: MAPE {mape(pred, meas) * 100:.1f}%, max "
        f"{max_error(pred, meas) * 100:.1f}%, Kendall tau {kendall_tau(pred, meas):.2f}; "
        f"what the links add: within {max(map(abs, adds)):.0f}% on every plan, "
        f"{sum(abs(a) <= 15 for a in adds)} of {len(adds)} within 15%"
    )


def _report(rows) -> None:
    print(
        "| plan | link | measured shaped s | unshaped s | links add s | predicted (queues) "
        "step / links add | predicted (links) step / links add |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        ms = statistics.median(row["measured"]["shaped"])
        mu = statistics.median(row["measured"]["unshaped"])
        cells = []
        for model in ("queues", "links"):
            p = row["predicted"][model]
            add = p["shaped"] - p["unshaped"]
            err = (p["shaped"] - ms) / ms * 100
            add_err = (add - (ms - mu)) / (ms - mu) * 100 if ms != mu else float("nan")
            cells.append(f"{p['shaped']:.3f} ({err:+.0f}%) / {add:.3f} ({add_err:+.0f}%)")
        print(
            f"| {row['case']} | {row['mbit']} Mbit/s | {ms:.3f} | {mu:.3f} | {ms - mu:.3f} | "
            + " | ".join(cells)
            + " |"
        )


if __name__ == "__main__":
    main()
