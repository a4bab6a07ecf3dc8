"""Where each stage posts its receives, measured on the emulated cluster and predicted by
the simulator with its rendezvous and notice rules (`ratrain.schedule.rendezvous`).

    git worktree add /tmp/before <a commit with the order to compare against>
    python benchmarks/receive_order_check.py --platform base.yaml --before-src /tmp/before/src \\
        --before-order receives_first [--cases 0,1,7,5,12] [--repeats 2] [--json out.json]

The earlier order runs on the tree of `--before-src` (its `ratrain train`, through
PYTHONPATH), named by `--before-order`: `lowering` (each RECV where the lowering put it,
after the SENDs issued with it: before `post_receives_first`) or `receives_first`
(before `post_receives_ahead`). This tree's order is `one_ahead` (both). The cases are
`benchmarks/link_model_check.py`'s; each repeat runs, per case, the earlier order and this
tree's on the shaped links, then this tree's unshaped, back to back. All three orders are
predicted from this tree, each plan's lowering with none, the first or both of the two
moves applied. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import link_model_check as lmc  # noqa: E402

import ratrain.schedule.build as build  # noqa: E402
from ratrain.models.presets import get_preset  # noqa: E402
from ratrain.schedule.rendezvous import post_receives_ahead, post_receives_first  # noqa: E402
from ratrain.sim.simulate import simulate  # noqa: E402

ORDERS = {
    "lowering": lambda s: s,
    "receives_first": post_receives_first,
    "one_ahead": lambda s: post_receives_ahead(post_receives_first(s)),
}


def _predict(case, platform_path: str) -> dict:
    _, nodes, r, mbit, fields = case
    plan = lmc._plan(fields)
    shaped, unshaped = lmc._platforms(platform_path, nodes, r, mbit)
    spec = get_preset(lmc.MODEL)

    def lowered():
        return build._LOWERINGS[plan.schedule](spec, plan)

    out = {
        order: simulate(spec, plan, shaped, schedule=move(lowered()), memory_timeline=False)
        for order, move in ORDERS.items()
    }
    out = {k: v.step_time_s for k, v in out.items()}
    out["unshaped"] = simulate(spec, plan, unshaped, memory_timeline=False).step_time_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", required=True, help="this machine's calibrated platform")
    ap.add_argument("--before-src", required=True, help="src/ of the tree to compare against")
    ap.add_argument("--before-order", choices=("lowering", "receives_first"), required=True)
    ap.add_argument("--cases", default="0,1,7,5,12")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--port", type=int, default=29741)
    ap.add_argument("--json", help="write every figure here (after each run)")
    args = ap.parse_args()
    here = str(Path(build.__file__).parents[2])
    picked = [lmc.CASES[int(k)] for k in args.cases.split(",")]
    rows = {c[0]: {"predicted": _predict(c, args.platform), "measured": {}} for c in picked}
    runs = ((args.before_order, args.before_src), ("one_ahead", here), ("unshaped", here))
    for rep in range(args.repeats):
        for case in picked:
            plan = lmc._plan(case[4])
            for kind, src in runs:
                os.environ["PYTHONPATH"] = src
                mbit = lmc.UNSHAPED_MBIT if kind == "unshaped" else case[3]
                t = lmc._measure(case, plan, mbit, args.steps, args.warmup, args.port)
                rows[case[0]]["measured"].setdefault(kind, []).append(t)
                print(f"repeat {rep}: {case[0]} {kind}: {t:.3f} s", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
    print("| plan | order | measured s | predicted s | error | links add: measured / predicted |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for name, row in rows.items():
        m, p = row["measured"], row["predicted"]
        mu = statistics.median(m["unshaped"])
        for order in (args.before_order, "one_ahead"):
            ms = statistics.median(m[order])
            err = (p[order] - ms) / ms * 100
            add = f"{ms - mu:.3f} / {p[order] - p['unshaped']:.3f}"
            print(f"| {name} | {order} | {ms:.3f} | {p[order]:.3f} | {err:+.0f}% | {add} |")


if __name__ == "__main__":
    main()
