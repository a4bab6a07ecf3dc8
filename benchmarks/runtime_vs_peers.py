"""ratrain vs torch.distributed.pipelining's pipelines vs DeepSpeed's PipelineEngine, interleaved.

    python benchmarks/runtime_vs_peers.py [--quick] [--json out.json] [--layouts 2x1,2x2]
        [--repeats 3] [--steps 6] [--warmup 2]
        [--systems ratrain,ratrain-plan,ratrain-zb,ratrain-zb2,ratrain-zbv,ratrain-1f1bv,torch-1f1b,
                   torch-interleaved-1f1b,torch-izb,
                   torch-zbv,torch-dualpipev,deepspeed (the default); ceiling]
        [--compile | --no-compile] [--loss-chunk-tokens 256] [--platform FILE]
        [--malloc-mmap-threshold 131072 (ratrain-lowrss's)]
        [--model bench-512] [--ratrain-split planner|same|even|balanced|5,3] [--v-split 2,2,2,2]
        [--layer-split even|balanced|4,4] [--no-peers-on-ratrain-split]

The job (issue 12): a LLaMA with 8 layers, hidden 512, 8 heads, ffn 1376, vocab 8192;
seq 256; fp32; micro-batch 2; 8 microbatches per pipeline; one thread per rank; no
gradient clipping (the peers' pipelines have no global-norm step). Layouts are pp x dp.

Systems: `ratrain` (the runtime with `--compile` and `--loss-chunk-tokens` as given),
`ratrain-plan` (ratrain as a user runs it: `ratrain plan` for the job on `--split-platform`,
pp and dp pinned to the layout, fp32 and no clipping pinned, its default time budget; then
that plan as `ratrain train --plan` runs it, compile off; reported with the plan's
predicted tokens/s),
`ratrain-eager` (no compile, plain loss: the runtime before these two),
`ratrain-compiled` (`ratrain` with compile forced on, to measure compile),
`ratrain-zb`, `ratrain-zb2`, `ratrain-zbv` and `ratrain-1f1bv` (`ratrain` with another
pass order, `--pipeline zb-h1`, `zb-h2`, `zb-v` and `1f1b-v`, each on the split the
planner picks for it (the V's: blocks per chunk, two chunks per rank in a V); when the
runtime refuses it, reported as "skipped: <its one-line refusal>"),
`ratrain-tcmalloc`, `ratrain-jemalloc`, `ratrain-malloc` (`ratrain` with its ranks on that
host allocator, `--host-allocator`; skipped when it is not installed: `ratrain` itself
runs on `auto`, the first of tcmalloc, jemalloc found, else glibc's malloc),
`ratrain-lowrss` (`ratrain` on glibc's malloc with its mmap threshold fixed at
`--malloc-mmap-threshold`: less RSS, more page faults), `ceiling` (not a system and not a
peer: the layout's ranks each run an even share of the step's microbatches through the
whole model, and of the AdamW update, with no pipeline and no communication but a barrier
per step, `peers.ceiling_rank`; with a core per rank, what no pipeline on these ranks can
beat; with ranks sharing cores, no bound; reported as each system's share of it); the peers, see `peers.py`:
torch.distributed.pipelining's `torch-1f1b` (Schedule1F1B), `torch-interleaved-1f1b`
(ScheduleInterleaved1F1B), `torch-izb` (ScheduleInterleavedZeroBubble), `torch-zbv`
(ScheduleZBVZeroBubble), `torch-dualpipev` (ScheduleDualPipeV), all with the same
end-of-step DP all-reduce for dp > 1, and `deepspeed` (skipped when not importable). The
peers' ranks run on glibc's malloc, their default. (Figures in docs/runtime.md taken before the host allocator call
`ratrain-caching` the runtime on its former home-made caching allocator and
`ratrain-malloc` the runtime on glibc's malloc.)

Splits: ratrain (all its variants) runs the split `ratrain plan` picks for the job on
`--split-platform` (cpu-local); the peers run `--layer-split` (their own default, even) and,
when ratrain's differs, once more on ratrain's (`torch-1f1b@5,3`, `deepspeed@5,3`): "the
better peer" is the fastest of all of them (torch's pipelines and DeepSpeed), named in the
report. torch's multi-stage pipelines run 2 chunks per rank (2·pp pipeline stages;
interleaved: rank r holds chunks r and r+pp, V-shaped: r and 2pp-1-r): with the even split,
the layers split evenly into 2·pp chunks; with a given split (blocks per rank), each rank's
blocks halved between its two chunks (`peers.chunk_split`); a split that cannot be cut so
skips that peer, in one line.

Correctness (the first step of the first repeat, cheap): every torch peer's first-step
loss (same model, weights and data) must equal torch-1f1b's within 1e-5 relative, else it
is reported as wrong and excluded (a mis-split model).

Per layout, the systems run one after the other, A B C C B A A B C ..., `--repeats`
times (the order reversed every other repeat, so a drifting load favours none), each on
fresh local gloo ranks (`ratrain.launch.spawn.spawn`). Reported per system:

- tokens/s: global-batch tokens / the median step period on the last pipeline rank of
  the first replica, over the steps after `--warmup` (warm-up and compilation excluded);
  the median over repeats, and the range;
- ratios against the better peer, per repeat (interleaved pairs) and of the medians;
- MFU: model FLOPs (`ratrain.models.counts.model_flops_per_token`: 6 x parameters +
  attention) per second against the machine's measured fp32 matmul peak for the same
  ranks and threads: every rank runs a 1024^3 matmul loop at once and the rates are summed
  (or, with `--platform`, its fp32 peak per compute unit x the ranks, capped by the cores);
  the probe runs once per repeat, interleaved with the systems, and its median is used;
- peak RSS per rank (ru_maxrss), the largest rank's compared;
- ratrain's compile time (`--compile`), reported apart and not in tokens/s;
- a per-rank profile of one ratrain step (`ratrain.observe.profile`): GEMM, attention,
  elementwise, loss, copies, communication issue and wait, autograd engine, compiled
  graphs, and the rest (executor Python). The profiled step is an extra step, not timed.
  The peers' steps are profiled the same way, except that their waits on communication
  are not measured apart (they fall in "comm" or the rest).

Figures from a shared machine measure contention too: compare the interleaved ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import statistics
import subprocess
import tempfile

from peers import (
    TORCH_PIPELINES,
    ceiling_rank,
    chunk_split,
    deepspeed_available,
    deepspeed_rank,
    matmul_probe_rank,
    torch_pipelining_rank,
)

from ratrain.config import V_PIPELINES, Plan, TrainConfig
from ratrain.data import make_source
from ratrain.errors import RatrainError
from ratrain.launch.host_memory import (
    DEBIAN_PACKAGES,
    LOW_RSS_MMAP_THRESHOLD_BYTES,
    find_allocator_library,
)
from ratrain.launch.spawn import spawn
from ratrain.models.counts import model_flops_per_token, unit_fwd_flops
from ratrain.models.presets import get_preset
from ratrain.models.spec import ModelSpec
from ratrain.observe.profile import BUCKETS
from ratrain.planner.report import describe
from ratrain.planner.splits import v_splits
from ratrain.train.job import Job, Launch, Outputs, run_job

BENCH_SPEC = ModelSpec("bench-512", 8, 512, 8, 8, 1376, 8192, max_seq=256)
"""The issue's job model (LLaMA-style, MHA)."""

_DEADLINE_S = 3600.0

HOST_SYSTEMS = {f"ratrain-{a}": a for a in ("tcmalloc", "jemalloc", "malloc")}
"""`ratrain` on each host allocator (`--host-allocator`)."""

ZB_SYSTEMS = {
    "ratrain-zb": "zb-h1",
    "ratrain-zb2": "zb-h2",
    "ratrain-zbv": "zb-v",
    "ratrain-1f1bv": "1f1b-v",
}
"""`ratrain` with a zero-bubble pass order (`--pipeline`), on the split the planner picks
for it."""

CEILING = "ceiling"
"""Not a system: the layout's bubble-free ceiling (`peers.ceiling_rank`), what no pipeline on
these ranks can beat when each has a core of its own; reported as every system's share of it."""

PLANNED = "ratrain-plan"
"""ratrain as a user runs it: `ratrain plan` for the job, then that plan (`user_plan`)."""

KNOWN_SYSTEMS = (
    "ratrain",
    PLANNED,
    *ZB_SYSTEMS,
    "ratrain-eager",
    "ratrain-compiled",
    "ratrain-lowrss",
    *HOST_SYSTEMS,
    *TORCH_PIPELINES,
    "deepspeed",
    CEILING,
)

DEFAULT_SYSTEMS = ",".join(["ratrain", PLANNED, *ZB_SYSTEMS, *TORCH_PIPELINES, "deepspeed"])

LOSS_RTOL = 1e-5
"""A torch peer whose first-step loss differs from torch-1f1b's by more (relative) is
wrong (a mis-split model) and excluded."""


def _spec(name: str) -> ModelSpec:
    return BENCH_SPEC if name == BENCH_SPEC.name else get_preset(name)


def _split(arg: str, spec: ModelSpec, pp: int, seq: int) -> tuple[int, ...] | None:
    """--layer-split: "even" (the plan's default), "balanced" (blocks placed so the
    stages' forward FLOPs, embedding and head included, are as equal as they can be), or
    blocks per stage. Every system runs the same split."""
    if arg == "even":
        return None
    if arg != "balanced":
        return tuple(int(x) for x in arg.split(","))
    best = None
    for cut in itertools.combinations(range(spec.n_layers + 1), pp - 1):
        bounds = (0, *cut, spec.n_layers)
        split = tuple(bounds[i + 1] - bounds[i] for i in range(pp))
        if any(n < 1 for n in split[1:-1]):
            continue
        loads = []
        for st in range(pp):
            units = range(bounds[st] + 1, bounds[st + 1] + 1)
            f = sum(unit_fwd_flops(spec, u, 1, seq) for u in units)
            f += unit_fwd_flops(spec, 0, 1, seq) if st == 0 else 0
            f += unit_fwd_flops(spec, spec.n_layers + 1, 1, seq) if st == pp - 1 else 0
            loads.append(f)
        if best is None or max(loads) < best[0]:
            best = (max(loads), split)
    return best[1]


def planner_split(
    spec: ModelSpec, plan: Plan, platform: str, pipeline: str = "1f1b"
) -> tuple[int, ...]:
    """The layer split ratrain's planner picks for this job (its pp, dp, micro-batch, seq,
    dtype, schedule, pipeline and no recompute pinned) on `platform`: uneven splits are one
    of the planner's mechanisms, so the benchmark's ratrain runs what `ratrain plan` would
    hand it."""
    from ratrain.planner import search
    from ratrain.planner.space import Request
    from ratrain.platforms import load

    pins = {
        "pp": plan.pp,
        "dp": plan.dp,
        "micro_batch": plan.micro_batch,
        "compute_dtype": plan.compute_dtype,
        "schedule": "ratrain",
        "clip_grad": plan.clip_grad,
        "recompute": "none",
        "shard_optimizer": False,
        "view_policy": "persistent",
        "pipeline": pipeline,
    }
    req = Request(
        spec,
        load(platform),
        plan.pp * plan.dp,
        plan.global_batch,
        plan.seq,
        pins=pins,
        families=("ratrain",),
    )
    best = search(req, top=1).best
    if best is None:
        raise SystemExit(f"the planner found no feasible plan for {spec.name} on {platform}")
    return tuple(best.plan.layer_split or plan.blocks_per_stage(spec))


def user_plan(spec: ModelSpec, plan: Plan, platform: str, workdir: str) -> tuple[Plan, float]:
    """The plan `ratrain plan` writes for the job, run as a user runs it (a subprocess, its
    default time budget), and its predicted tokens/s. The job fixes the model, the ranks'
    layout (pp and dp pinned: the peers run that layout), the global batch, seq, fp32 and no
    clipping; the planner picks the rest: micro-batch, layer split, pass order, loss,
    recompute, offload, sharding, views. (It does not pick `--compile`, which is not a plan
    field.) A spec that is not a preset goes as a Hugging Face config.json."""
    from ratrain.config import load_plan
    from ratrain.models.presets import PRESETS

    model = spec.name
    if model not in PRESETS:
        from ratrain.models.hf_config import to_hf_config

        model = os.path.join(workdir, "config.json")
        with open(model, "w") as f:
            json.dump(to_hf_config(spec), f)
    out = os.path.join(workdir, f"plan-{plan.pp}x{plan.dp}.yaml")
    cmd = [
        *("ratrain", "plan", "--model", model, "--platform", platform),
        *("--clusters", str(plan.pp * plan.dp), "--global-batch", str(plan.global_batch)),
        *("--seq", str(plan.seq), "--pin", f"pp={plan.pp}", "--pin", f"dp={plan.dp}"),
        *("--pin", "compute_dtype=fp32", "--pin", "clip_grad=none", "--quiet", "-o", out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {done.stderr.strip() or done.stdout.strip()}")
    print("  " + done.stdout.splitlines()[0], flush=True)
    planned, meta = load_plan(out)
    return planned, float(meta["predicted"]["tokens_per_s"])


def _ratrain_split(a, spec: ModelSpec, plan: Plan) -> tuple[int, ...] | None:
    if a.ratrain_split == "same":
        return plan.layer_split
    if a.ratrain_split == "planner":
        return planner_split(spec, plan, a.split_platform)
    return _split(a.ratrain_split, spec, plan.pp, plan.seq)


def _median_tail(times: list[float], warmup: int) -> float:
    return statistics.median(times[warmup:] if len(times) > warmup else times)


def run_ratrain(
    spec,
    plan,
    cfg,
    source,
    compile_units: bool,
    profile: bool,
    mmap_threshold: int,
    host_allocator: str = "auto",
) -> dict:
    """ratrain's runtime; the profiled step is an extra step after the timed ones."""
    steps = cfg.steps + (1 if profile else 0)  # the profiled step is extra, not timed
    job = Job(
        spec,
        plan,
        dataclasses.replace(cfg, steps=steps),
        source,
        launch=Launch(
            device="cpu",
            compile_units=compile_units,
            deadline_s=_DEADLINE_S,
            host_allocator=host_allocator,
            malloc_mmap_threshold_bytes=mmap_threshold,
        ),
        outputs=Outputs(progress=False, profile_step=cfg.steps if profile else None),
    )
    out = {"rss": {}, "profile": {}, "times": None, "compile_s": {}}
    for r in run_job(job):
        run = r.runs[plan.schedule]
        if run.records:
            out["times"] = run.step_times_s[: cfg.steps]
            # at the last timed step: the profiler's own buffers are not the runtime's
            rec = run.records[cfg.steps - 1]
            out["rss"] = dict(enumerate(rec["max_rss_bytes_per_rank"]))
        if run.profile is not None:
            out["profile"][r.rank] = run.profile
        out["compile_s"][r.rank] = run.compile_s
    return out


def run_peer(system: str, spec, plan, cfg, source, profile: bool) -> dict:
    """A peer (`system` without its "@split" suffix), timed on the last pipeline rank of
    the first replica."""
    args = (spec, plan, cfg, source, profile)
    if system in TORCH_PIPELINES:
        fn = functools.partial(torch_pipelining_rank, system=system)
    elif system == CEILING:
        fn = ceiling_rank
    else:
        fn = deepspeed_rank
    res = spawn(fn, plan.pp * plan.dp, *args, deadline_s=_DEADLINE_S)
    last = min((r for r in res if r["stage"] == plan.pp - 1), key=lambda r: r["rank"])
    losses = [r["loss"] for r in res if r.get("loss") is not None]
    return {
        "times": last["times"],
        "rss": {r["rank"]: r["rss"] for r in res},
        "profile": {r["rank"]: r["profile"] for r in res if r["profile"]},
        "compile_s": {},
        # the first step's loss, the mean over replicas (torch peers only)
        "loss": statistics.fmean(losses) if losses else None,
    }


def _base(system: str) -> str:
    return system.split("@")[0]


def check_losses(runs: dict[str, list[dict]]) -> dict[str, str]:
    """The torch peers whose first-step loss is not torch-1f1b's (within `LOSS_RTOL`): a
    one-line reason each. Same model, weights and data: only a mis-split model differs."""
    ref = next((rs[0]["loss"] for s, rs in runs.items() if _base(s) == "torch-1f1b"), None)
    torch_peers = [s for s in runs if _base(s) in TORCH_PIPELINES and _base(s) != "torch-1f1b"]
    if ref is None:
        if torch_peers:
            print("  no torch-1f1b run: the torch peers' first-step losses are not checked")
        return {}
    wrong = {}
    for s in torch_peers:
        loss = runs[s][0]["loss"]
        if loss is None or abs(loss - ref) > LOSS_RTOL * abs(ref):
            wrong[s] = f"first-step loss {loss} != torch-1f1b's {ref}"
    return wrong


def probe_peak_flops(world: int, platform: str | None, seconds: float) -> tuple[float, str]:
    if platform:
        from ratrain.platforms import load

        p = load(platform)
        units = min(world, os.cpu_count() or world)
        return p.peak_flops["fp32"] * units, f"{platform}: fp32 peak x {units} units"
    rates = spawn(matmul_probe_rank, world, 1024, seconds)
    return sum(rates), f"measured: 1024^3 fp32 matmul on {world} ranks at once, summed"


def bench_layout(a, spec: ModelSpec, pp: int, dp: int) -> dict:
    plan = Plan(
        pp=pp,
        dp=dp,
        micro_batch=a.micro_batch,
        global_batch=a.micro_batch * a.microbatches * dp,
        seq=a.seq,
        compute_dtype="fp32",
        clip_grad=None,
        model=spec.name,
        layer_split=_split(a.layer_split, spec, pp, a.seq),
    )
    cfg = TrainConfig(steps=a.steps, warmup_steps=1)
    source = functools.partial(make_source, "synthetic", spec, plan.seq, cfg.seed)
    systems = [s for s in a.systems.split(",") if s]
    unknown = [s for s in systems if s not in KNOWN_SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s): {', '.join(unknown)}")
    if "deepspeed" in systems and not deepspeed_available():
        print("  deepspeed is not importable: skipped (pip install deepspeed torch==<yours>)")
        systems.remove("deepspeed")
    for name, package in DEBIAN_PACKAGES.items():
        if f"ratrain-{name}" in systems and find_allocator_library(name) is None:
            print(f"  {name} is not installed: ratrain-{name} skipped (apt-get install {package})")
            systems.remove(f"ratrain-{name}")
    # ratrain (all its variants) on its split; the peers on theirs and, when it differs,
    # on ratrain's too ("<peer>@<split>"), so neither side gets a split the other lacks.
    peer_split = plan.blocks_per_stage(spec)
    own = plan.replace(layer_split=_ratrain_split(a, spec, plan))
    own_split = own.blocks_per_stage(spec)
    zb_split = {}
    for s, pipe in ZB_SYSTEMS.items():
        if s not in systems:
            continue
        v = pipe in V_PIPELINES  # blocks per chunk, two chunks per rank
        if v and a.v_split:
            zb_split[s] = tuple(int(x) for x in a.v_split.split(","))
        elif a.ratrain_split == "planner":  # its own planned split
            zb_split[s] = planner_split(spec, plan, a.split_platform, pipe)
        else:
            zb_split[s] = v_splits(spec, plan.pp)[0] if v else own.layer_split
    zb_note = "".join(f", {s} {_fmt(x)}" for s, x in zb_split.items() if x != own.layer_split)
    print(f"  split: ratrain {_fmt(own_split)}{zb_note}, peers {_fmt(peer_split)}", flush=True)
    plans = {s: own if s.startswith("ratrain") else plan for s in systems}  # ceiling: no split
    predicted = None
    if PLANNED in systems:
        with tempfile.TemporaryDirectory() as tmp:
            plans[PLANNED], predicted = user_plan(spec, plan, a.split_platform, tmp)
        print(f"  {PLANNED}: {describe(plans[PLANNED])}", flush=True)
    if own_split != peer_split and a.peers_on_ratrain_split:
        for s in [s for s in systems if not s.startswith("ratrain") and s != CEILING]:
            name = f"{s}@{_fmt(own_split)}"
            systems.append(name)
            plans[name] = own
    # torch's multi-stage pipelines: two chunks per rank (`peers.chunk_split`)
    skipped: dict[str, str] = {}
    chunks: dict[str, tuple[int, ...]] = {}
    for s in list(systems):
        style = TORCH_PIPELINES.get(_base(s), (None, None))[1]
        if style is not None:
            try:
                chunks[s] = chunk_split(spec, plans[s], style)
            except ValueError as e:
                skipped[s] = str(e)
                systems.remove(s)
                print(f"  {s}: skipped: {e}", flush=True)
    if chunks:
        print(
            "  chunks (blocks, 2 per rank): "
            + "; ".join(f"{s} {_fmt(c)}" for s, c in chunks.items()),
            flush=True,
        )
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    wrong: dict[str, str] = {}
    fast = own.replace(loss_chunk_tokens=a.loss_chunk_tokens or None)
    probes = []
    for rep in range(a.repeats):
        # the probe is interleaved too: its median is the peak, taken under the same load
        peak, peak_src = probe_peak_flops(pp * dp, a.platform, a.probe_seconds)
        probes.append(peak)
        # A B C, then C B A: a load that drifts during a repeat favours no system
        for s in list(systems) if rep % 2 == 0 else systems[::-1]:
            prof = rep == 0 and a.profile
            if s in ZB_SYSTEMS:  # `ratrain` with a zero-bubble pass order (--pipeline)
                try:
                    zb = fast.replace(pipeline=ZB_SYSTEMS[s], layer_split=zb_split[s])
                    r = run_ratrain(spec, zb, cfg, source, a.compile, prof, 0)
                except RatrainError as e:  # the runtime refuses it: one line
                    skipped[s] = str(e).splitlines()[0]
                    systems.remove(s)
                    del runs[s]
                    print(f"  repeat {rep}: {s:<26} skipped: {skipped[s]}", flush=True)
                    continue
            elif s == "ratrain":
                r = run_ratrain(spec, fast, cfg, source, a.compile, prof, 0)
            elif s == PLANNED:  # `ratrain train --plan`: compile off, its default
                r = run_ratrain(spec, plans[s], cfg, source, False, prof, 0)
            elif s == "ratrain-compiled":  # ratrain with --compile whatever the flag says
                r = run_ratrain(spec, fast, cfg, source, True, prof, 0)
            elif s == "ratrain-eager":  # the runtime without compile or the chunked loss
                r = run_ratrain(spec, own, cfg, source, False, prof, 0)
            elif s == "ratrain-lowrss":  # ratrain with glibc's mmap threshold fixed
                mmap = a.malloc_mmap_threshold
                r = run_ratrain(
                    spec, fast, cfg, source, a.compile, prof, mmap, host_allocator="malloc"
                )
            elif s in HOST_SYSTEMS:  # ratrain with its ranks on this host allocator
                alloc = HOST_SYSTEMS[s]
                r = run_ratrain(spec, fast, cfg, source, a.compile, prof, 0, host_allocator=alloc)
            else:
                r = run_peer(_base(s), spec, plans[s], cfg, source, profile=prof)
            r["tokens_per_s"] = plan.tokens_per_step / _median_tail(r["times"], a.warmup)
            runs[s].append(r)
            loss = f"  (first-step loss {r['loss']:.6f})" if r.get("loss") is not None else ""
            print(f"  repeat {rep}: {s:<26} {r['tokens_per_s']:>9,.0f} tokens/s{loss}", flush=True)
        if rep == 0:  # the first step of the first repeat: a mis-split torch peer is excluded
            for s, why in check_losses(runs).items():
                wrong[s] = why
                systems.remove(s)
                del runs[s]
                print(f"  {s}: wrong: {why}; excluded", flush=True)
    flops_tok = model_flops_per_token(spec, plan.seq)
    peak = statistics.median(probes)
    rows = {}
    for s, rs in runs.items():
        tps = [r["tokens_per_s"] for r in rs]
        med = statistics.median(tps)
        rss = [max(r["rss"].values()) for r in rs]
        rows[s] = {
            "layer_split": list(plans[s].blocks_per_stage(spec)),
            **({"chunk_split": list(chunks[s])} if s in chunks else {}),
            "first_step_loss": rs[0].get("loss"),
            "tokens_per_s": med,
            "tokens_per_s_runs": tps,
            "mfu": med * flops_tok / peak,
            "peak_rss_bytes_per_rank": [rs[-1]["rss"][k] for k in sorted(rs[-1]["rss"])],
            "peak_rss_bytes_per_rank_runs": [[r["rss"][k] for k in sorted(r["rss"])] for r in rs],
            "peak_rss_bytes_max": max(rss),
        }
        rows[s]["compile_s"] = max(rs[0]["compile_s"].values() or [0.0])
        rows[s]["profile_s"] = {str(k): v for k, v in sorted(rs[0]["profile"].items())}
    peers = [s for s in rows if not s.startswith("ratrain") and s != CEILING]
    ratios = {}
    if "ratrain" in rows and peers:
        best_speed = max(peers, key=lambda s: rows[s]["tokens_per_s"])
        best_rss = min(peers, key=lambda s: rows[s]["peak_rss_bytes_max"])
        per_rep = [
            runs["ratrain"][i]["tokens_per_s"] / max(runs[p][i]["tokens_per_s"] for p in peers)
            for i in range(a.repeats)
        ]
        ratios = {
            "peers": peers,
            "better_peer_speed": best_speed,
            "speed_vs_better_peer": rows["ratrain"]["tokens_per_s"]
            / rows[best_speed]["tokens_per_s"],
            "speed_vs_better_peer_per_repeat": per_rep,
            "better_peer_rss": best_rss,
            "rss_vs_better_peer": rows["ratrain"]["peak_rss_bytes_max"]
            / rows[best_rss]["peak_rss_bytes_max"],
        }
        for s in (PLANNED, *ZB_SYSTEMS):
            if s in rows:
                ratios[_vs_peer_key(s)] = rows[s]["tokens_per_s"] / rows[best_speed]["tokens_per_s"]
        if PLANNED in rows:
            ratios["planned_vs_better_peer_per_repeat"] = [
                runs[PLANNED][i]["tokens_per_s"] / max(runs[p][i]["tokens_per_s"] for p in peers)
                for i in range(len(runs[PLANNED]))
            ]
    if CEILING in rows:  # every system's share of the bubble-free ceiling, repeat by repeat
        ratios["share_of_ceiling_per_repeat"] = {
            s: [
                x["tokens_per_s"] / c["tokens_per_s"]
                for x, c in zip(rs, runs[CEILING], strict=True)
            ]
            for s, rs in runs.items()
            if s != CEILING
        }
        ratios["share_of_ceiling"] = {
            s: statistics.median(xs) for s, xs in ratios["share_of_ceiling_per_repeat"].items()
        }
    if PLANNED in rows:
        rows[PLANNED]["plan"] = plans[PLANNED].to_dict()
        rows[PLANNED]["predicted_tokens_per_s"] = predicted
        ratios["planned_measured_over_predicted"] = rows[PLANNED]["tokens_per_s"] / predicted
    if "ratrain" in rows:  # interleaved pairs: ratrain / system, repeat by repeat
        ratios["ratrain_over_system_per_repeat"] = {
            s: [
                x["tokens_per_s"] / y["tokens_per_s"]
                for x, y in zip(runs["ratrain"], rs, strict=True)
            ]
            for s, rs in runs.items()
            if s != "ratrain"
        }
    return {
        "plan": plan.to_dict(),
        "ratrain_plan": fast.to_dict(),
        "peak_flops": peak,
        "peak_source": peak_src,
        "peak_flops_per_repeat": probes,
        "model_flops_per_token": flops_tok,
        "rows": rows,
        "ratios": ratios,
        "skipped": skipped,
        "wrong": wrong,
    }


def _vs_peer_key(system: str) -> str:
    """The ratio key of a zero-bubble system against the better peer, e.g.
    ``ratrain_zb_speed_vs_better_peer``."""
    return f"{system.replace('-', '_')}_speed_vs_better_peer"


def _fmt(split) -> str:
    return ",".join(str(n) for n in split)


def print_layout(name: str, res: dict, warmup: int) -> None:
    print(
        f"\n{name}: peak {res['peak_flops'] / 1e9:,.0f} GFLOP/s ({res['peak_source']}); "
        f"{res['model_flops_per_token'] / 1e6:.0f} MFLOP/token; median of steps {warmup}.."
    )
    print(
        f"{'system':<26} {'tokens/s':>9} {'range':>15} {'MFU':>6}  "
        "peak RSS MiB per rank (median of repeats)"
    )
    for s, r in res["rows"].items():
        lo, hi = min(r["tokens_per_s_runs"]), max(r["tokens_per_s_runs"])
        per_rank = zip(*r["peak_rss_bytes_per_rank_runs"], strict=True)
        rss = " ".join(f"{statistics.median(b) / 2**20:,.0f}" for b in per_rank)
        extra = f"  (compile {r['compile_s']:.1f} s)" if r.get("compile_s") else ""
        print(
            f"{s:<26} {r['tokens_per_s']:>9,.0f} {lo:>7,.0f}-{hi:<7,.0f} "
            f"{100 * r['mfu']:>5.1f}%  {rss}{extra}"
        )
    for s, why in res.get("skipped", {}).items():
        print(f"{s:<26} skipped: {why}")
    for s, why in res.get("wrong", {}).items():
        print(f"{s:<26} wrong, excluded: {why}")
    q = res["ratios"]
    if "speed_vs_better_peer" in q:
        reps = " ".join(f"{x:.2f}" for x in q["speed_vs_better_peer_per_repeat"])
        print(
            f"better peer: {q['better_peer_speed']} (the fastest of {len(q['peers'])}: "
            f"{', '.join(q['peers'])})"
        )
        print(
            f"ratrain / {q['better_peer_speed']} tokens/s: {q['speed_vs_better_peer']:.3f} "
            f"(per repeat, against the fastest peer of each: {reps}); "
            f"ratrain / {q['better_peer_rss']} peak RSS: {q['rss_vs_better_peer']:.3f}"
        )
        for s in (PLANNED, *ZB_SYSTEMS):
            if _vs_peer_key(s) in q:
                print(f"{s} / {q['better_peer_speed']} tokens/s: {q[_vs_peer_key(s)]:.3f}")
        if "planned_vs_better_peer_per_repeat" in q:
            reps = " ".join(f"{x:.3f}" for x in q["planned_vs_better_peer_per_repeat"])
            print(f"{PLANNED} / the fastest peer of each repeat: {reps}")
    if "planned_measured_over_predicted" in q:
        row = res["rows"][PLANNED]
        print(
            f"{PLANNED}: measured {row['tokens_per_s']:,.0f} tokens/s, `ratrain plan` predicted "
            f"{row['predicted_tokens_per_s']:,.0f}: measured / predicted "
            f"{q['planned_measured_over_predicted']:.3f}"
        )
    if "share_of_ceiling" in q:
        print("share of the bubble-free ceiling, median over repeats (per repeat):")
        for s, x in q["share_of_ceiling"].items():
            reps = " ".join(f"{y:.3f}" for y in q["share_of_ceiling_per_repeat"][s])
            print(f"  {s:<26} {x:.3f} ({reps})")
    for other, xs in q.get("ratrain_over_system_per_repeat", {}).items():
        print(f"ratrain / {other} tokens/s per repeat: " + " ".join(f"{x:.3f}" for x in xs))
    for name, row in res["rows"].items():
        print_profile(name, row.get("profile_s"))


def print_profile(name: str, prof: dict | None) -> None:
    if prof:
        print(f"{name}, one step per rank (s, share of the step):")
        ranks = sorted(prof, key=int)
        print(f"  {'bucket':<12}" + "".join(f" {'rank ' + k:>14}" for k in ranks))
        for b in BUCKETS:
            cells = []
            for k in ranks:
                tot = sum(prof[k].values()) or 1.0
                cells.append(f"{prof[k][b]:>7.2f} {100 * prof[k][b] / tot:>5.1f}%")
            print(f"  {b:<12}" + "".join(f" {c:>14}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=BENCH_SPEC.name)
    ap.add_argument("--layouts", default="2x1,2x2", help="pp x dp, comma separated")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8, help="per pipeline")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument(
        "--layer-split",
        default="even",
        help="the peers' split: even (their own default: DeepSpeed's parameter-balanced "
        "partition is the even one for this model) | balanced (by FLOPs) | blocks per stage",
    )
    ap.add_argument(
        "--ratrain-split",
        default="planner",
        help="ratrain's split: planner (what `ratrain plan` picks on --split-platform) | same "
        "(the peers') | even | balanced | blocks per stage, e.g. 5,3",
    )
    ap.add_argument(
        "--v-split",
        default=None,
        help="the V systems' (ratrain-zbv, ratrain-1f1bv) blocks per chunk, 2 x pp counts "
        "(e.g. 2,2,2,2); default: as --ratrain-split says (planner: the planner's V split)",
    )
    ap.add_argument("--split-platform", default="cpu-local", help="the planner's platform")
    ap.add_argument(
        "--peers-on-ratrain-split",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run every peer on ratrain's split when it differs from theirs",
    )
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="per rank")
    ap.add_argument("--systems", default=DEFAULT_SYSTEMS)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument(
        "--loss-chunk-tokens", type=int, default=256, help="ratrain's chunked loss; 0: plain"
    )
    ap.add_argument(
        "--malloc-mmap-threshold",
        type=int,
        default=LOW_RSS_MMAP_THRESHOLD_BYTES,
        help="the fixed glibc mmap threshold ratrain-lowrss runs with",
    )
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--platform", help="take the matmul peak from this platform file")
    ap.add_argument("--probe-seconds", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 4 steps (2 timed)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    if a.quick:
        a.repeats, a.steps, a.warmup, a.probe_seconds = 1, 4, 2, 1.5
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # the spawned ranks read it
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spec = _spec(a.model)
    out = {}
    for lay in a.layouts.split(","):
        pp, dp = (int(x) for x in lay.split("x"))
        name = f"pp={pp}" + (f" x dp={dp}" if dp > 1 else "")
        print(
            f"{name}: {spec.name}, micro-batch {a.micro_batch}, {a.microbatches} microbatches, "
            f"seq {a.seq}, fp32, {a.threads} thread(s) per rank",
            flush=True,
        )
        out[name] = bench_layout(a, spec, pp, dp)
        print_layout(name, out[name], a.warmup)
        if a.json:  # after every layout, so a long run leaves what it has measured
            with open(a.json, "w") as f:
                json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
