"""The first run of ratrain's CUDA path: one command, one JSON report.

    python benchmarks/gpu_check.py --out report.json              # one CUDA device, <= 8 min
    python benchmarks/gpu_check.py --device cpu --tiny --out r.json   # dry run on a CPU

Stages, in this order, each in its own guard (a failure is recorded with its one-line error
and the next stage runs) and under its own time limit (subprocess timeouts, clipped to what
is left of the whole run's budget); progress lines go to stderr:

1. environment: torch, CUDA and NCCL versions, the device and its memory, the CPU count,
   and a bf16 GEMM's measured TFLOPS (the MFU denominator of stage 6);
2. train: the default `ratrain train` job on the device, fp32 and bf16: final loss,
   tokens/s, measured peak against the memory ledger's prediction;
3. verify: `ratrain verify` (RATrain vs Baseline-1F1B vs the reference), fp32 and bf16,
   offload off and on;
4. two_ranks: two ranks on the one GPU: NCCL (usually refused: recorded), else gloo with
   CUDA tensors, and ratrain's default two-stage job where NCCL took both ranks;
5. calibrate_validate: `ratrain calibrate --quick` on the device, then `ratrain validate`
   on a small grid with that platform file: predicted against measured;
6. big_model: a model near the device's memory (llama2-7b, full recompute, under
   --memory-cap): the ledger's peak against `torch.cuda.max_memory_allocated`, tokens/s
   against the GEMM peak (MFU).

`--device cpu --tiny` runs the same stages with tiny sizes on the CPU; the GPU-only parts
are skipped or adapted, and the report says which and why. `--stages` runs a subset and
`--inject-fail STAGE` replaces that stage's first command with one that fails (the
guard's test). Every constant says where it comes from.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = ("environment", "train", "verify", "two_ranks", "calibrate_validate", "big_model")

TOTAL_BUDGET_S = {"gpu": 480.0, "tiny": 300.0}
"""assumed: 8 minutes of the 15 a lent GPU gives (the rest: the machine's start, copying
the tree, and one rerun); the dry run takes ~70 s on an idle 2-core machine, and twice
that (measured: 112 s) while another test run shares it."""

STAGE_LIMIT_S = {
    # assumed: each stage's share of the budget, by its expected work on an H200 (gpu) and
    # measured on the 2-core CPU machine with margin (tiny); a stage never gets more than
    # what is left of TOTAL_BUDGET_S.
    "gpu": {
        "environment": 60,
        "train": 120,
        "verify": 120,
        "two_ranks": 60,
        "calibrate_validate": 150,
        "big_model": 180,
    },
    "tiny": {  # measured idle on 2 cores: 2, 17, 9, 2, 30, 9 s; assumed: 2-3x under load
        "environment": 30,
        "train": 60,
        "verify": 60,
        "two_ranks": 30,
        "calibrate_validate": 90,
        "big_model": 40,
    },
}

SIZES = {
    "gpu": dict(
        # assumed: 8192^3 bf16 GEMMs (1.1 TFLOP each) run near the device's dense peak on
        # H100/H200-class parts; 10 timed after 3 warm-ups.
        gemm_n=8192,
        gemm_reps=10,
        # the default train job (README: tiny model, micro-batch 8, global 32, seq 64) on
        # one device (pp 1: the default pp 2 needs two devices, stage 4 tries it); assumed:
        # 60 steps show the loss falling and a steady tokens/s.
        train=["--pp", "1", "--nproc", "1", "--steps", "60"],
        # verify's defaults (seq 32, global batch 8, micro-batch 1) on one rank; assumed:
        # 10 steps are enough to see a deviation (CPU verify runs 50).
        verify=["--pp", "1", "--dp", "1", "--steps", "10"],
        verify_combos=[("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)],
        two_rank_job=["--steps", "20"],
        # calibrate --quick's own sizes; one rank (one device: NCCL needs one per rank).
        calibrate=["--quick", "--nproc", "1"],
        validate=["--steps", "3", "--warmup", "1", "--passes", "1"],
        grid_model=dict(n_layers=4, hidden=1024, n_heads=8, n_kv_heads=8, ffn=2816, vocab=32000),
        grid_seq=512,
        # llama2-7b, one rank: states 6.74e9 x (2 view + 4 master + 8 Adam + 4 grad) bytes
        # = 113 GiB, near an H200's 139 GiB; full recompute and seq 512 keep activations
        # small; assumed: 3 steps (the first includes the allocator's warm-up).
        big=[
            "--model",
            "llama2-7b",
            "--pp",
            "1",
            "--nproc",
            "1",
            "--dtype",
            "bf16",
            "--recompute",
            "full",
            "--seq",
            "512",
            "--micro-batch",
            "1",
            "--global-batch",
            "2",
            "--steps",
            "3",
            "--lr",
            "1e-5",
        ],
        big_flops_per_token_factor=8,  # 6N for forward + backward, + 2N: full recompute
    ),
    "tiny": dict(
        gemm_n=256,  # assumed: a CPU GEMM that takes milliseconds on one core
        gemm_reps=5,
        train=["--pp", "1", "--nproc", "1", "--steps", "3"]
        + ["--micro-batch", "2", "--global-batch", "4", "--seq", "32"],
        verify=["--pp", "2", "--dp", "1", "--steps", "2"]
        + ["--micro-batch", "1", "--global-batch", "2", "--seq", "16"],
        # adapted: one of the four combinations (bf16 offloaded, the one with the most
        # moving parts), for time; on a CPU offload moves nothing (one memory tier), so it
        # checks the bookkeeping only.
        verify_combos=[("bf16", True)],
        two_rank_job=None,
        calibrate=[
            "--quick",
            "--nproc",
            "2",
            "--budget-s",
            "0.002",
            "--windows",
            "1",
            "--dtypes",
            "fp32",
        ],
        validate=["--steps", "1", "--warmup", "0", "--passes", "1"],
        grid_model=dict(n_layers=2, hidden=64, n_heads=2, n_kv_heads=2, ffn=128, vocab=256),
        grid_seq=16,
        big=["--model", "tiny", "--pp", "1", "--nproc", "1", "--dtype", "bf16"]
        + ["--recompute", "full", "--seq", "32", "--micro-batch", "1"]
        + ["--global-batch", "1", "--steps", "2"],
        big_flops_per_token_factor=8,
    ),
}

BAD_COMMAND = [sys.executable, "-c", "raise SystemExit('injected failure: this command fails')"]


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def one_line(text: str) -> str:
    """The last meaningful line of an error output (ratrain's errors are one line)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "error" in ln.lower() or "Error" in ln:
            return ln[:500]
    return lines[-1][:500] if lines else ""


class StageFailed(Exception):
    pass


class Runner:
    """Subprocesses under the stage's and the whole run's time limits."""

    def __init__(self, budget_s: float, env: dict[str, str], workdir: Path):
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.env = env
        self.workdir = workdir
        self.stage_deadline = math.inf
        self.inject = False

    def left(self) -> float:
        return min(
            self.budget_s - (time.monotonic() - self.t0), self.stage_deadline - time.monotonic()
        )

    def run(self, cmd: list[str], *, env: dict | None = None, check: bool = True) -> dict:
        if self.inject:
            cmd, self.inject = BAD_COMMAND, False
        limit = self.left()
        if limit <= 1:
            raise StageFailed("no time left in this stage's limit or the run's budget")
        shown = " ".join(c if c != sys.executable else "python" for c in cmd)
        log(f"  $ {shown}  (limit {limit:.0f} s)")
        t = time.monotonic()
        try:
            p = subprocess.run(
                cmd,
                cwd=self.workdir,
                env={**self.env, **(env or {})},
                capture_output=True,
                text=True,
                timeout=limit,
            )
        except subprocess.TimeoutExpired as e:
            out = {"cmd": shown, "rc": None, "wall_s": round(time.monotonic() - t, 2)}
            out["error"] = f"timed out after {limit:.0f} s"
            tail = (e.stderr or b"")[-2000:]
            out["stderr_tail"] = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            if check:
                raise StageFailed(f"{shown}: timed out after {limit:.0f} s") from None
            return out
        out = {"cmd": shown, "rc": p.returncode, "wall_s": round(time.monotonic() - t, 2)}
        out["stdout"], out["stderr"] = p.stdout, p.stderr
        if p.returncode != 0:
            out["error"] = one_line(p.stderr or p.stdout) or f"exit {p.returncode}"
            if check:
                raise StageFailed(f"{shown}: exit {p.returncode}: {out['error']}")
        return out


def ratrain(*args: str) -> list[str]:
    return [sys.executable, "-m", "ratrain", *args]


def probe(name: str, *args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--probe", name, *args]


def last_json(text: str):
    """The JSON object a command printed: its whole stdout (`validate --json` indents), else
    its last line that is one."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for ln in reversed(text.strip().splitlines()):
        ln = ln.strip()
        if ln.startswith("{"):
            return json.loads(ln)
    raise StageFailed("no JSON object in the output")


def clean(rec: dict) -> dict:
    """A command's record without its full output (kept to the report's size)."""
    return {k: v for k, v in rec.items() if k not in ("stdout", "stderr")}


# -- probes: run in their own process (`--probe NAME`), print one JSON line ----------------
def probe_env(device: str, gemm_n: int, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    out = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "nccl_available": dist.is_nccl_available(),
        "gloo_available": dist.is_gloo_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(device_name=props.name, total_memory_bytes=props.total_memory)
        out["capability"] = f"{props.major}.{props.minor}"
    if dist.is_nccl_available():
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    dev = torch.device(device)
    for dtype in ("bf16", "fp32"):
        dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        a = torch.randn(gemm_n, gemm_n, device=dev, dtype=dt)
        b = torch.randn(gemm_n, gemm_n, device=dev, dtype=dt)
        for _ in range(3):
            a @ b
        if dev.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                a @ b
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter()
            for _ in range(reps):
                a @ b
            seconds = time.perf_counter() - t
        out[f"gemm_{dtype}_tflops"] = round(2 * gemm_n**3 * reps / seconds / 1e12, 4)
    out["gemm_n"] = gemm_n
    return out


def _two_rank_worker(rank: int, backend: str, device: str, port: int, q) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    try:
        dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=2,
            timeout=datetime.timedelta(seconds=30),
        )
        t = torch.full((1024,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        buf = torch.zeros(1024, device=dev)
        if rank == 0:
            dist.send(torch.full((1024,), 7.0, device=dev), 1)
        else:
            dist.recv(buf, 0)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ok = float(t[0]) == 3.0 and (rank == 0 or float(buf[0]) == 7.0)
        dist.destroy_process_group()
        q.put((rank, "ok" if ok else "wrong values", None))
    except Exception as e:  # recorded, not raised: the probe reports what happened
        q.put((rank, "failed", f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"))


def probe_two_ranks(backend: str, device: str) -> dict:
    """Two processes, one device: all_reduce and send/recv under `backend`."""
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_two_rank_worker, args=(r, backend, device, port, q)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + 45  # assumed: init + two tiny ops take seconds
    for _ in procs:
        try:
            rank, status, err = q.get(timeout=max(1.0, deadline - time.monotonic()))
            results[rank] = {"status": status, "error": err}
        except Exception:
            break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    ok = len(results) == 2 and all(r["status"] == "ok" for r in results.values())
    return {"backend": backend, "device": device, "ok": ok, "ranks": results}


def probe_ledger(train_args: list[str]) -> dict:
    """The runtime ledger's peak per stage for the plan `ratrain train train_args` runs."""
    from ratrain.cli.common import plan_from_args
    from ratrain.cli.train_flags import add_arguments
    from ratrain.models.counts import total_params
    from ratrain.train.checks import runtime_ledger

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(train_args)
    spec, plan = plan_from_args(args, default_model="tiny")
    ledger = runtime_ledger(spec, plan, args.device or "cpu")
    return {
        "peak_bytes_per_stage": [m.peak_bytes for m in ledger.stages],
        "params": total_params(spec),
        "tokens_per_step": plan.global_batch * plan.seq,
    }


# -- stages ---------------------------------------------------------------------------------
def _metrics(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _train_summary(rows: list[dict], ledger: dict) -> dict:
    last = rows[-min(5, len(rows)) :]
    steady = rows[1:] or rows  # the first step carries the allocator's and caches' warm-up
    peak = max(max(r.get("peak_bytes_per_rank") or [0]) for r in rows)
    pred = max(ledger["peak_bytes_per_stage"])
    return {
        "steps": len(rows),
        "final_loss": sum(r["loss"] for r in last) / len(last),
        "tokens_per_s": sorted(r["tokens_per_s"] for r in steady)[len(steady) // 2],
        "peak_bytes_measured": peak,
        "peak_bytes_source": rows[-1].get("peak_bytes_source"),
        "peak_bytes_ledger": pred,
        "ledger_over_measured": round(pred / peak - 1, 4) if peak else None,
    }


def stage_environment(r: Runner, mode: str, device: str) -> dict:
    sz = SIZES[mode]
    rec = r.run(probe("env", device, str(sz["gemm_n"]), str(sz["gemm_reps"])))
    return {"env": last_json(rec["stdout"]), "commands": [clean(rec)]}


def stage_train(r: Runner, mode: str, device: str) -> dict:
    out, cmds = {}, []
    for dtype in ("fp32", "bf16"):
        metrics = r.workdir / f"train-{dtype}.jsonl"
        args = [*SIZES[mode]["train"], "--device", device, "--dtype", dtype]
        rec = r.run(
            ratrain("train", *args, "--quiet", "--measure-memory", "--metrics", str(metrics))
        )
        cmds.append(clean(rec))
        ledger = last_json(r.run(probe("ledger", *args))["stdout"])
        out[dtype] = _train_summary(_metrics(metrics), ledger)
        out[dtype]["summary_line"] = (
            one_line(rec["stderr"])
            if "final loss" not in rec["stderr"]
            else [ln for ln in rec["stderr"].splitlines() if "final loss" in ln][-1]
        )
    return {"results": out, "commands": cmds}


def stage_verify(r: Runner, mode: str, device: str) -> dict:
    out, cmds, ok = {}, [], True
    for dtype, offload in SIZES[mode]["verify_combos"]:
        flag = "--offload" if offload else "--no-offload"
        rec = r.run(
            ratrain("verify", *SIZES[mode]["verify"], "--device", device, "--dtype", dtype, flag)
            + ["--json", "--quiet"],
            check=False,
        )
        cmds.append(clean(rec))
        key = f"{dtype}-{'offload' if offload else 'no-offload'}"
        if rec["rc"] not in (0, 1) or not rec.get("stdout", "").strip():
            out[key] = {"error": rec.get("error")}
            ok = False
            continue
        v = last_json(rec["stdout"])
        dev = v["max_rel_dev"]
        # expected as on CPU: RATrain vs Baseline-1F1B 0 (bit-identical), vs the reference
        # <= 0.01% (1e-4) in bf16 (README: "Where it stands")
        passed = dev["ratrain_vs_baseline"] == 0 and (
            dev.get("ratrain_vs_reference") is None or dev["ratrain_vs_reference"] <= 1e-4
        )
        ok &= passed
        out[key] = {"max_rel_dev": dev, "bit_identical": v.get("bit_identical"), "passed": passed}
    if not ok:
        raise StageFailed(f"verify: a combination deviates or failed: {json.dumps(out)[:400]}")
    return {"results": out, "commands": cmds}


def stage_two_ranks(r: Runner, mode: str, device: str) -> dict:
    out, cmds, notes = {}, [], []
    if device == "cuda":
        for backend in ("nccl", "gloo"):
            rec = r.run(probe("two_ranks", backend, "cuda"), check=False)
            cmds.append(clean(rec))
            out[backend] = (
                last_json(rec["stdout"]) if rec["rc"] == 0 else {"error": rec.get("error")}
            )
        if out["nccl"].get("ok") and SIZES[mode]["two_rank_job"] is not None:
            # NCCL took two ranks on one device: ratrain's default two-stage job there
            rec = r.run(
                ratrain("train", "--device", "cuda", *SIZES[mode]["two_rank_job"], "--quiet"),
                env={"RATRAIN_SHARE_DEVICE": "1"},
                check=False,
            )
            cmds.append(clean(rec))
            out["ratrain_pp2_shared_device"] = {"rc": rec["rc"], "error": rec.get("error")}
        else:
            notes.append("NCCL refused two ranks on one device: ratrain's pp 2 job not run")
        # without the override, the default job must refuse in one line (more ranks than devices)
        rec = r.run(ratrain("train", "--device", "cuda", "--steps", "1", "--quiet"), check=False)
        cmds.append(clean(rec))
        out["refusal_without_share"] = {"rc": rec["rc"], "line": rec.get("error")}
    else:
        notes.append("adapted: no CUDA device; NCCL skipped, gloo's two ranks on the CPU checked")
        rec = r.run(probe("two_ranks", "gloo", "cpu"), check=False)
        cmds.append(clean(rec))
        out["gloo"] = last_json(rec["stdout"]) if rec["rc"] == 0 else {"error": rec.get("error")}
    if not any(v.get("ok") for v in out.values() if isinstance(v, dict)):
        raise StageFailed(f"neither NCCL nor gloo ran two ranks here: {json.dumps(out)[:400]}")
    return {"results": out, "notes": notes, "commands": cmds}


def stage_calibrate_validate(r: Runner, mode: str, device: str) -> dict:
    sz = SIZES[mode]
    platform = r.workdir / "platform.yaml"
    cmd = ratrain("calibrate", *sz["calibrate"], "--device", device, "-o", str(platform))
    rec = r.run(cmd + ["--allow-noisy", "--no-progress"])
    grid = r.workdir / "grid.json"
    common = dict(
        model="m", seq=sz["grid_seq"], global_batch=4, micro_batch=2, compute_dtype="fp32"
    )
    plans = [
        dict(name="pp1-fp32", **common),
        dict(name="pp1-full", **{**common, "recompute": "full"}),
        dict(name="pp1-bf16", **{**common, "compute_dtype": "bf16"}),
    ]
    grid.write_text(json.dumps({"models": {"m": sz["grid_model"]}, "plans": plans}))
    rec2 = r.run(
        ratrain("validate", "--platform", str(platform), "--grid", str(grid), *sz["validate"])
        + ["--no-plan-pick", "--json"]
    )
    v = last_json(rec2["stdout"])
    return {
        "platform_file": str(platform),
        "validate": _validate_summary(v),
        "commands": [clean(rec), clean(rec2)],
    }


def _validate_summary(v: dict) -> dict:
    """Predicted against measured per plan, whatever else the JSON holds."""
    rows = v.get("plans") or v.get("results") or []
    out = []
    for row in rows if isinstance(rows, list) else []:
        keep = {
            k: row[k] for k in row if any(s in k for s in ("name", "pred", "meas", "err", "peak"))
        }
        out.append(keep)
    return {"plans": out, "keys": sorted(v)[:30]}


def stage_big_model(r: Runner, mode: str, device: str, env: dict | None) -> dict:
    sz = SIZES[mode]
    notes = []
    if device == "cuda":
        total = (env or {}).get("total_memory_bytes")
        if not total:
            raise StageFailed("the environment stage gave no device memory")
        cap = ["--memory-cap", f"{total / 2**30:.1f}"]
    else:
        notes.append(
            "adapted: the tiny model on the CPU (no device memory to fill); peak from LiveBytes"
        )
        cap = ["--memory-cap", "1"]  # assumed: 1 GiB holds the tiny model many times over
    args = [*sz["big"], "--device", device, *cap]
    metrics = r.workdir / "big.jsonl"
    rec = r.run(ratrain("train", *args, "--quiet", "--measure-memory", "--metrics", str(metrics)))
    ledger = last_json(r.run(probe("ledger", *args))["stdout"])
    res = _train_summary(_metrics(metrics), ledger)
    peak_tflops = (env or {}).get("gemm_bf16_tflops")
    if ledger.get("params") and peak_tflops:
        achieved = sz["big_flops_per_token_factor"] * ledger["params"] * res["tokens_per_s"] / 1e12
        res["model_tflops"] = round(achieved, 4)
        res["mfu_vs_measured_gemm_peak"] = round(achieved / peak_tflops, 4)
    return {"results": res, "notes": notes, "commands": [clean(rec)]}


def run_check(device: str, mode: str, stages: list[str], inject: str | None, out: Path) -> dict:
    budget = TOTAL_BUDGET_S[mode]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # 2-core machines: ranks share the cores
    report: dict = {
        "what": "benchmarks/gpu_check.py",
        "device": device,
        "mode": mode,
        "budget_s": budget,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "stages": {},
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        r = Runner(budget, env, Path(tmp))
        envinfo: dict | None = None
        for name in STAGES:
            if name not in stages:
                report["stages"][name] = {"status": "skipped", "reason": "not in --stages"}
                continue
            limit = STAGE_LIMIT_S[mode][name]
            r.stage_deadline = time.monotonic() + limit
            r.inject = inject == name
            log(
                f"stage {name} (limit {limit} s, {r.budget_s - (time.monotonic() - r.t0):.0f} s of the budget left)"
            )
            t = time.monotonic()
            rec: dict = {"limit_s": limit}
            try:
                if r.left() <= 1:
                    raise StageFailed("no time left in the run's budget")
                if name == "environment":
                    got = stage_environment(r, mode, device)
                    envinfo = got["env"]
                    if device == "cuda" and not envinfo.get("cuda_available"):
                        raise StageFailed("--device cuda: no CUDA device is visible")
                elif name == "big_model":
                    got = stage_big_model(r, mode, device, envinfo)
                else:
                    got = globals()[f"stage_{name}"](r, mode, device)
                rec.update(status="ok", **got)
            except StageFailed as e:
                rec.update(status="failed", error=str(e).splitlines()[0][:600])
            except Exception as e:  # the guard: record it in one line, go on
                rec.update(status="failed", error=f"{type(e).__name__}: {str(e).strip()[:400]}")
                rec["traceback_tail"] = traceback.format_exc()[-1200:]
            rec["wall_s"] = round(time.monotonic() - t, 2)
            log(
                f"stage {name}: {rec['status']} in {rec['wall_s']} s"
                + (f": {rec['error']}" if "error" in rec else "")
            )
            report["stages"][name] = rec
            out.write_text(json.dumps(report, indent=2, default=str))  # partial report kept
        report["wall_s"] = round(time.monotonic() - r.t0, 2)
    report["summary"] = {n: s["status"] for n, s in report["stages"].items()}
    report["gpu_run"] = "not yet run on a GPU" if device == "cpu" else "this report"
    out.write_text(json.dumps(report, indent=2, default=str))
    return report


def _probe_main(name: str, args: list[str]) -> int:
    if name == "env":
        res = probe_env(args[0], int(args[1]), int(args[2]))
    elif name == "two_ranks":
        res = probe_two_ranks(*args)
    elif name == "ledger":
        res = probe_ledger(args)
    else:
        raise SystemExit(f"unknown probe {name}")
    print(json.dumps(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:  # a stage's probe, in its own process
        return _probe_main(argv[1], argv[2:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-check.json", help="the JSON report")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU dry run)")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset, in order")
    p.add_argument("--inject-fail", choices=STAGES, help="make this stage's first command fail")
    a = p.parse_args(argv)
    stages = [s for s in a.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        p.error(f"unknown stages {unknown}; choose from {', '.join(STAGES)}")
    mode = "tiny" if a.tiny or a.device == "cpu" else "gpu"
    report = run_check(a.device, mode, stages, a.inject_fail, Path(a.out))
    print(json.dumps({"summary": report["summary"], "wall_s": report["wall_s"]}))
    return 0 if all(v != "failed" for v in report["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
