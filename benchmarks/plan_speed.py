"""How long `ratrain plan` takes for the paper's four models on 1024 MT-3000 clusters.

    python benchmarks/plan_speed.py [--clusters 1024] [--platform mt3000] [--models a,b]

Each model is planned by a fresh `ratrain plan --json` process (the cold case a user sees:
imports, the tile model's first planning of each kernel shape, the search), reporting wall
time, CPU time (what the wall time would be on an idle core of a shared machine), the
search's own time, the candidates it evaluated and simulated, the predicted tokens/s and
the largest ledger peak over the stages against the 20 GB cap. Target: under 5 s each.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MODELS = ("llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b")


def _child_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def plan_once(model: str, clusters: int, platform: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "ratrain",
        "plan",
        "--model",
        model,
        "--clusters",
        str(clusters),
        "--platform",
        platform,
        "--top",
        "1",
        "--json",
        "--quiet",
    ]
    cpu0, t0 = _child_cpu_s(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _child_cpu_s() - cpu0
    if proc.returncode not in (0, 2):
        raise SystemExit(f"{model}: ratrain plan failed: {proc.stderr.strip()}")
    out = json.loads(proc.stdout)
    return {"model": model, "wall_s": wall, "cpu_s": cpu, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", type=int, default=1024)
    ap.add_argument("--platform", default="mt3000")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    print(
        f"{'model':14} {'wall s':>7} {'cpu s':>6} {'search s':>8} {'evaluated':>9} {'simulated':>9} "
        f"{'tokens/s':>10} {'max peak GB':>11}  plan"
    )
    for model in args.models.split(","):
        r = plan_once(model, args.clusters, args.platform)
        if not r["feasible"]:
            print(f"{model:14} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f}  no feasible plan")
            continue
        p, pred = r["plan"], r["predicted"]
        peak = max(pred["peak_memory_bytes"]) / 1e9
        print(
            f"{model:14} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} {r['search_time_s']:>8.2f} "
            f"{r['candidates_evaluated']:>9} {r['candidates_simulated']:>9} {pred['tokens_per_s']:>10,.0f} "
            f"{peak:>11.2f}  pp={p['pp']} dp={p['dp']} {p['schedule']}"
        )


if __name__ == "__main__":
    main()
