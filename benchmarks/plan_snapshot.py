"""A snapshot of `ratrain plan --json` over a fixed set of jobs, to hold the planner's
answers still through a change that should not move them (a refactor).

Each job runs the exhaustive search (`--time-budget 0`), whose answer does not depend on
the machine's speed; the one field that does, `search_time_s`, is dropped. The rest must
match byte for byte.

    PYTHONPATH=src python benchmarks/plan_snapshot.py write out/plans-before   # before
    PYTHONPATH=src python benchmarks/plan_snapshot.py check out/plans-before   # after
    PYTHONPATH=src python benchmarks/plan_snapshot.py list

The jobs: the paper's four models on mt3000, `benchmarks/plan_grid.py --quick`'s grid
(but llama2-70b on a100-80g, whose exhaustive searches take minutes), and cpu-local jobs
(small models, pins, families, an infeasible request).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DROPPED = ("search_time_s",)
"""Fields that measure the machine, not the answer."""


def jobs() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for model in ("llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b"):
        out[f"paper-{model}-256"] = ["--model", model, "--platform", "mt3000", "--clusters", "256"]
    for plat, model, n, gb in itertools.product(
        ("mt3000", "a100-80g"), ("llama2-7b", "llama2-70b"), (64, 1024), (256, 1024)
    ):
        if (plat, model) == ("a100-80g", "llama2-70b"):
            continue  # its exhaustive search takes over 5 minutes a job
        out[f"grid-{plat}-{model}-{n}-{gb}"] = [
            "--model", model, "--platform", plat, "--clusters", str(n),
            "--global-batch", str(gb), "--seq", "4096",
        ]  # fmt: skip
    cpu = ["--platform", "cpu-local"]
    out |= {
        "cpu-tiny-1": ["--model", "tiny", *cpu, "--clusters", "1"],
        "cpu-tiny-4": ["--model", "tiny", *cpu, "--clusters", "4", "--global-batch", "16"],
        "cpu-tinyqwen-4": ["--model", "tiny-qwen", *cpu, "--clusters", "4", "--seq", "128"],
        "cpu-bench512-2": ["--model", "bench-512", *cpu, "--clusters", "2", "--seq", "128"],
        "cpu-bench256-4-cap": [
            "--model",
            "bench-256",
            *cpu,
            "--clusters",
            "4",
            "--seq",
            "128",
            "--memory-cap",
            "0.12",
        ],  # fmt: skip
        "cpu-tiny-4-pins": [
            "--model",
            "tiny",
            *cpu,
            "--clusters",
            "4",
            "--global-batch",
            "16",
            "--pin",
            "pp=2",
            "--pin",
            "recompute=full",
            "--pin",
            "schedule=ratrain",
        ],  # fmt: skip
        "cpu-tiny-4-zb": [
            "--model",
            "tiny",
            *cpu,
            "--clusters",
            "4",
            "--global-batch",
            "16",
            "--pin",
            "pipeline=zb-h2",
        ],  # fmt: skip
        "cpu-tiny-4-v": [
            "--model",
            "tiny",
            *cpu,
            "--clusters",
            "4",
            "--global-batch",
            "16",
            "--pin",
            "pipeline=zb-v",
        ],  # fmt: skip
        "cpu-tinyqwen-2-gpu-style": [
            "--model",
            "tiny-qwen",
            *cpu,
            "--clusters",
            "2",
            "--seq",
            "128",
            "--family",
            "gpu-style",
        ],  # fmt: skip
        "cpu-tinyqwen-4-baselines": [
            "--model",
            "tiny-qwen",
            *cpu,
            "--clusters",
            "4",
            "--seq",
            "128",
            "--baselines",
        ],  # fmt: skip
        "a100-13b-64-baselines": [
            "--model",
            "llama2-13b",
            "--platform",
            "a100-80g",
            "--clusters",
            "64",
            "--baselines",
        ],  # fmt: skip
        "a100-13b-64-256": [
            "--model",
            "llama2-13b",
            "--platform",
            "a100-80g",
            "--clusters",
            "64",
            "--global-batch",
            "256",
        ],  # fmt: skip
        "mt3000-7b-8-infeasible": [
            "--model",
            "llama2-70b",
            "--platform",
            "mt3000",
            "--clusters",
            "8",
        ],  # fmt: skip
        "mt3000-7b-8-cap": [
            "--model",
            "llama2-7b",
            "--platform",
            "mt3000",
            "--clusters",
            "8",
            "--memory-cap",
            "12",
        ],  # fmt: skip
        "mt3000-7b-16-shard-pin": [
            "--model",
            "llama2-7b",
            "--platform",
            "mt3000",
            "--clusters",
            "16",
            "--pin",
            "shard_optimizer=true",
            "--pin",
            "view_policy=transient",
        ],  # fmt: skip
    }
    return out


def run(name: str, args: list[str], timeout_s: float) -> tuple[str, str, float]:
    cmd = [sys.executable, "-m", "ratrain", "plan", *args, "--json", "--quiet"]
    cmd += ["--time-budget", "0"]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return name, f"TIMEOUT after {timeout_s:g} s\n", time.perf_counter() - t0
    text = p.stdout
    try:
        data = json.loads(text)
        for k in DROPPED:
            data.pop(k, None)
        text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    except json.JSONDecodeError:
        pass
    return name, f"exit {p.returncode}\n{text}{p.stderr}", time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("write", "check", "list"))
    ap.add_argument("folder", nargs="?", default="out/plan-snapshot")
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    ap.add_argument("--only", help="comma-separated job names")
    a = ap.parse_args()
    todo = jobs()
    if a.only:
        todo = {k: v for k, v in todo.items() if k in a.only.split(",")}
    if a.action == "list":
        for k, v in todo.items():
            print(k, " ".join(v))
        return 0
    folder = Path(a.folder)
    folder.mkdir(parents=True, exist_ok=True)
    bad = 0
    with ThreadPoolExecutor(a.jobs) as pool:
        for name, text, wall in pool.map(lambda kv: run(*kv, a.timeout), todo.items()):
            path = folder / f"{name}.txt"
            if a.action == "write":
                path.write_text(text)
                print(f"{name:40s} {wall:7.1f} s  {text.splitlines()[0]}", flush=True)
                continue
            same = path.is_file() and path.read_text() == text
            bad += not same
            print(f"{name:40s} {wall:7.1f} s  {'same' if same else 'DIFFERS'}", flush=True)
            if not same:
                (folder / f"{name}.new.txt").write_text(text)
    if a.action == "check":
        print(f"{len(todo) - bad} same, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
