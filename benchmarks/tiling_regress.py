"""Regression set of the tile planner: the plans it chooses for a fixed set of kernel shapes.

    python benchmarks/tiling_regress.py --record [--out benchmarks/tiling_plans.json]
    python benchmarks/tiling_regress.py --check  [--out benchmarks/tiling_plans.json]

The set: every kernel of a block and of the LM head (forward and backward) of llama2-7b,
llama2-70b, qwen2.5-32b and baichuan2-13b at micro-batch 1, 2 and 4, seq 4096, bf16 on
mt3000 (what `ratrain simulate` plans), the same GEMMs of llama2-7b in fp16 and with a fixed
staging tier, and every plan that tests/cost/test_tiling.py and tests/nn/test_tiled.py ask for
(recorded by running them with the planner's entry points wrapped). `--record` writes the
cases and their plans; `--check` plans the cases again from cold caches and compares every
field of every plan (tiles, grid, staged step, buffers, bytes, moves, FLOPs, times, bound).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

from ratrain.cost import compute, tiling, tiling_attention
from ratrain.models import counts
from ratrain.models.presets import get_preset
from ratrain.platforms import Link, Platform, Tier, load

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "tiling_plans.json"
MODELS = ("llama2-7b", "llama2-70b", "qwen2.5-32b", "baichuan2-13b")
MICRO_BATCHES = (1, 2, 4)
SEQ = 4096


def _case(op, args, dtype, flag, tiers, peak, stage) -> dict:
    """One planner call, as its cache key: op, shape, dtype, bias/causal, tiers, peak, stage."""
    return {
        "op": op,
        "args": list(args),
        "dtype": dtype,
        "flag": bool(flag),
        "tiers": [dataclasses.asdict(t) for t in tiers],
        "peak": peak,
        "stage": stage,
    }


def model_cases_of(spec, micro_batch: int, dtype: str = "bf16", stage="auto") -> list[dict]:
    """The GEMM and attention kernels of a block and of the LM head, forward and backward,
    at seq 4096 on mt3000."""
    mt, out = load("mt3000"), []
    for unit in (1, counts.head_unit(spec)):
        for kind in ("F", "B"):
            for k in compute.unit_kernels(spec, unit, micro_batch, SEQ, kind, dtype=dtype):
                out.append(_kernel_case(k, dtype, mt, stage))
    return [c for c in out if c is not None]


def model_cases() -> list[dict]:
    """Kernels of `ratrain simulate` for the paper models on mt3000 (bf16), plus llama2-7b's
    in fp16 and staged through gsm or unstaged."""
    out = []
    for name in MODELS:
        for mb in MICRO_BATCHES:
            out += model_cases_of(get_preset(name), mb)
    for dtype, stage in (("fp16", "auto"), ("bf16", "gsm"), ("bf16", None)):
        out += model_cases_of(get_preset("llama2-7b"), 1, dtype, stage)
    return out


def _kernel_case(k, dtype, platform, stage):
    tiers, peak, st = tiling.platform_key(platform, dtype, stage)
    if k.kind == "gemm":
        return _case("gemm", k.args, dtype, False, tiers, peak, st)
    if k.kind == "attention":
        b, h, kv, s, d, causal, backward = k.args
        op = "attention_backward" if backward else "attention"
        return _case(op, (b, h, kv, s, d), dtype, causal, tiers, peak, st)
    return None


def test_cases() -> list[dict]:
    """The planner calls of tests/cost/test_tiling.py and tests/nn/test_tiled.py."""
    import pytest

    seen = []
    gemm, attn = tiling._plan_gemm, tiling_attention._plan

    def rec_gemm(m, n, k, dtype, bias, tiers, peak, stage):
        seen.append(_case("gemm", (m, n, k), dtype, bias, tiers, peak, stage))
        return gemm(m, n, k, dtype, bias, tiers, peak, stage)

    def rec_attn(op, b, h, kvh, s, d, dtype, causal, tiers, peak, stage):
        seen.append(_case(op, (b, h, kvh, s, d), dtype, causal, tiers, peak, stage))
        return attn(op, b, h, kvh, s, d, dtype, causal, tiers, peak, stage)

    tiling._plan_gemm, tiling_attention._plan = rec_gemm, rec_attn
    try:
        tests = [str(ROOT / "tests" / f) for f in ("test_tiling.py", "test_tiled.py")]
        rc = pytest.main([*tests, "-q", "-x", "-p", "no:cacheprovider"])
    finally:
        tiling._plan_gemm, tiling_attention._plan = gemm, attn
    if rc != 0:
        sys.exit(f"the tests failed (exit {rc}); fix them before recording")
    return seen


def _unique(cases: list[dict]) -> list[dict]:
    out, keys = [], set()
    for c in cases:
        key = json.dumps(c, sort_keys=True)
        if key not in keys:
            keys.add(key)
            out.append(c)
    return out


def _platform(case: dict) -> Platform:
    link = Link(1e9, 1e-6)
    return Platform(
        name="regress",
        usable_memory_bytes=10**12,
        workspace_bytes=0,
        peak_flops={case["dtype"]: case["peak"]},
        efficiency=0.5,
        tiers=tuple(Tier(**t) for t in case["tiers"]),
        host=link,
        intra_node=link,
        inter_node=link,
        units_per_node=1,
    )


def plan(case: dict):
    """Plan one case through the public API; a RatrainError is recorded as its message."""
    from ratrain.errors import RatrainError

    p = _platform(case)
    st = case["stage"]
    stage = st if st in ("auto", None) else case["tiers"][st]["name"]
    try:
        if case["op"] == "gemm":
            return tiling.plan_gemm(*case["args"], case["dtype"], p, bias=case["flag"], stage=stage)
        fn = tiling.plan_attention if case["op"] == "attention" else tiling.plan_attention_backward
        return fn(*case["args"], case["dtype"], p, causal=case["flag"], stage=stage)
    except RatrainError as err:
        return str(err)


def record_of(p) -> dict | str:
    if isinstance(p, str):
        return {"error": p}
    d = dataclasses.asdict(p)
    d["grid"] = list(d["grid"])
    return d


def clear_caches() -> None:
    tiling._plan_gemm.cache_clear()
    tiling_attention._plan.cache_clear()
    for fn in (getattr(tiling, "_grids", None),):
        if fn is not None and hasattr(fn, "cache_clear"):
            fn.cache_clear()


def _rel(a, b) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def compare(want: dict, got: dict) -> tuple[bool, float, float]:
    """(identical, relative difference of time_s, of main-memory bytes)."""
    if want == got:
        return True, 0.0, 0.0
    if "error" in want or "error" in got:
        return False, float("inf"), float("inf")
    ddr = [
        sum(v for k, v in r["bytes_moved"].items() if r["main"] in k.split("->"))
        for r in (want, got)
    ]
    return False, _rel(want["time_s"], got["time_s"]), _rel(*ddr)


def save_cases(path: pathlib.Path, cases: list[dict]) -> None:
    """One case a line; the tier lists in a table of their own (they repeat)."""
    tables: list = []
    lines = []
    for c in cases:
        if c["tiers"] not in tables:
            tables.append(c["tiers"])
        lines.append(json.dumps(dict(c, tiers=tables.index(c["tiers"])), separators=(",", ":")))
    tiers = ",\n".join(json.dumps(t, separators=(",", ":")) for t in tables)
    path.write_text(f'{{"tiers": [\n{tiers}\n],\n"cases": [\n' + ",\n".join(lines) + "\n]}\n")


def load_cases(path: pathlib.Path) -> list[dict]:
    data = json.loads(path.read_text())
    return [dict(c, tiers=data["tiers"][c["tiers"]]) for c in data["cases"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true")
    mode.add_argument("--check", action="store_true")
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--only", choices=("models", "tests"), help="check one part of the set")
    args = ap.parse_args()
    if args.record:
        cases = _unique(test_cases() + [dict(c, part="models") for c in model_cases()])
        clear_caches()
    else:
        cases = load_cases(args.out)
        if args.only:
            cases = [c for c in cases if c.get("part", "tests") == args.only]
    results, diffs, t0 = [], 0, time.process_time()
    worst_t = worst_b = 0.0
    for case in cases:
        key = {k: v for k, v in case.items() if k not in ("plan", "part")}
        got = record_of(plan(key))
        if args.record:
            results.append(dict(case, plan=got))
            continue
        same, dt, db = compare(case["plan"], got)
        if not same:
            diffs += 1
            worst_t, worst_b = max(worst_t, dt), max(worst_b, db)
            print(f"DIFF {case['op']} {case['args']} {case['dtype']} stage={case['stage']}")
            for f in sorted(set(case["plan"]) | set(got)):
                if case["plan"].get(f) != got.get(f):
                    print(f"  {f}: {case['plan'].get(f)} -> {got.get(f)}")
    cpu_s = time.process_time() - t0
    if args.record:
        save_cases(args.out, results)
        print(f"recorded {len(results)} plans in {cpu_s:.1f} s CPU to {args.out}")
        return
    print(
        f"{len(cases)} plans, {diffs} differ (worst: time {worst_t:.2e}, DDR bytes {worst_b:.2e})"
    )
    print(f"planning took {cpu_s:.2f} s CPU")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
