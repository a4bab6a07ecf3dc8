"""Where a rank's resident set goes: RSS against live tensor bytes, action by action.

Runs ratrain on the issue-12 job (`runtime_vs_peers.BENCH_SPEC`, fp32, micro-batch 2,
8 microbatches, seq 256, one thread per rank) with `measure_memory` on, and samples after
every action of the last step, on every rank:

- the process's current RSS (/proc/self/statm) and its peak (ru_maxrss);
- live tensor bytes (`LiveBytes`, the runtime's own counter);
- glibc malloc's view (mallinfo2): bytes in use and free in its heaps (arena), and bytes
  in mmapped chunks;
- the host allocator's own free bytes it keeps resident (`--host-allocator`, preloaded into
  the ranks as `ratrain train` does it): glibc's free heap bytes, jemalloc's resident minus
  allocated (`mallctl` stats.resident, stats.allocated), tcmalloc's heap size minus
  allocated and unmapped (`MallocExtension_GetNumericProperty`).

It also takes the baseline: RSS after the fork (torch imported), after the process group
is up and after the stage's states are built. It prints, per rank: baseline, peak RSS,
peak live tensor bytes, and at the RSS peak the part that is neither (free malloc memory
kept by the process, the rest). The ledger's peak (`distributed_train.runtime_ledger`: eager kernels,
sends held) is printed next to it.

    python benchmarks/rss_breakdown.py [--pp 2] [--dp 1] [--split 5,3] [--steps 2]
        [--host-allocator auto|jemalloc|tcmalloc|malloc]
        [--malloc-mmap-threshold 0 | 131072] [--all-steps]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import resource

from runtime_vs_peers import BENCH_SPEC

from ratrain.config import Plan, TrainConfig
from ratrain.data import make_source
from ratrain.launch.host_memory import loaded_host_allocator, resolve_host_allocator
from ratrain.launch.spawn import spawn
from ratrain.observe import memory as rt_memory
from ratrain.observe import trace
from ratrain.train import rank as distributed_train
from ratrain.train.job import Job, Launch, Outputs, rank_main, runtime_ledger

_PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo() -> dict[str, int]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return {"heap": m.arena, "heap_free": m.fordblks, "mmapped": m.hblkhd}


def _size_out(fn, name: bytes) -> int:
    v, n = ctypes.c_size_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    fn(name, ctypes.byref(v), ctypes.byref(n), None, ctypes.c_size_t(0))
    return v.value


def _allocator_free() -> int:
    """Free bytes the process's allocator keeps resident (see the module's docstring)."""
    name, lib = loaded_host_allocator(), ctypes.CDLL(None)
    if name == "jemalloc":
        epoch = ctypes.c_uint64(1)  # refreshes the statistics
        lib.mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.c_size_t(8))
        return _size_out(lib.mallctl, b"stats.resident") - _size_out(
            lib.mallctl, b"stats.allocated"
        )
    if name == "tcmalloc":

        def prop(key: bytes) -> int:
            v = ctypes.c_size_t()
            lib.MallocExtension_GetNumericProperty(key, ctypes.byref(v))
            return v.value

        return (
            prop(b"generic.heap_size")
            - prop(b"generic.current_allocated_bytes")
            - prop(b"tcmalloc.pageheap_unmapped_bytes")
        )
    return _mallinfo()["heap_free"]


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _status_kib() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon", "RssFile", "RssShmem")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def _sample(label: str) -> dict:
    live = rt_memory._ACTIVE[-1].live_bytes if rt_memory._ACTIVE else None
    return {
        "at": label,
        "rss": _rss_now(),
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "live": live,
        "minflt": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
        **_mallinfo(),
        **_status_kib(),
        "alloc_free": _allocator_free(),
    }


def _probe_rank(rdzv, job: Job, first_step: int) -> dict:
    samples = [_sample("forked")]
    init = distributed_train.ParallelGrid.init

    def grid_init(*a, **k):
        g = init(*a, **k)
        samples.append(_sample("process group"))
        return g

    distributed_train.ParallelGrid.init = grid_init
    build = distributed_train.StageModel.__init__

    def model_init(self, *a, **k):
        build(self, *a, **k)
        samples.append(_sample("stage states"))

    distributed_train.StageModel.__init__ = model_init
    steps: list[dict] = []
    compute, issued = trace.Recorder.compute, trace.Recorder.issued

    def on_compute(self, a, t0, t1):
        compute(self, a, t0, t1)
        if self.step >= first_step:
            steps.append(_sample(f"{self.step}:{a}"))

    def on_issued(self, a, t0):
        issued(self, a, t0)
        if self.step >= first_step:
            steps.append(_sample(f"{self.step}:{a}"))

    trace.Recorder.compute, trace.Recorder.issued = on_compute, on_issued
    res = rank_main(rdzv, job)
    run = res.runs[job.plan.schedule]
    return {
        "rank": res.rank,
        "stage": res.stage,
        "baseline": samples,
        "step": steps,
        "peak_live": run.peak_bytes,
        "end": _sample("end"),
        "step_times_s": run.step_times_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--split", default="5,3", help="blocks per stage; 'even' for the default")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--schedule", default="ratrain")
    ap.add_argument("--loss-chunk-tokens", type=int, default=256)
    ap.add_argument("--json", help="every sample, per rank")
    ap.add_argument(
        "--host-allocator",
        default="auto",
        help="the ranks' malloc: auto (the runtime's default) | jemalloc | tcmalloc | malloc",
    )
    ap.add_argument(
        "--all-steps", action="store_true", help="sample every step (default: the last only)"
    )
    ap.add_argument(
        "--malloc-mmap-threshold",
        type=int,
        default=0,
        help="fix glibc's mmap threshold in the ranks (e.g. 131072); 0: glibc's own (default)",
    )
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    spec = BENCH_SPEC
    split = None if a.split == "even" else tuple(int(x) for x in a.split.split(","))
    plan = Plan(
        pp=a.pp,
        dp=a.dp,
        micro_batch=2,
        global_batch=2 * 8 * a.dp,
        seq=256,
        compute_dtype="fp32",
        clip_grad=None,
        model=spec.name,
        layer_split=split,
        schedule=a.schedule,
        loss_chunk_tokens=a.loss_chunk_tokens or None,
    )
    cfg = TrainConfig(steps=a.steps, warmup_steps=1)
    source = functools.partial(make_source, "synthetic", spec, plan.seq, cfg.seed)
    job = Job(
        spec,
        plan,
        cfg,
        source,
        launch=Launch(
            device="cpu",
            malloc_mmap_threshold_bytes=a.malloc_mmap_threshold,
            host_allocator=a.host_allocator,
        ),
        outputs=Outputs(progress=False, measure_memory=True),
    )
    ledger = runtime_ledger(spec, plan)
    allocator = resolve_host_allocator(a.host_allocator, a.malloc_mmap_threshold)
    print(f"host allocator: {allocator.describe()}")
    ranks = spawn(
        _probe_rank,
        a.pp * a.dp,
        job,
        0 if a.all_steps else a.steps - 1,
        deadline_s=1800.0,
        allocator_library=allocator.library,
    )
    mib = 2**20
    print(
        f"{'rank':>4} {'forked':>7} {'pg':>7} {'states':>7} {'ledger':>7} {'live pk':>8} "
        f"{'RSS pk':>7} | at the RSS peak: {'RSS':>6} {'live':>6} {'heap free':>9} "
        f"{'mmapped':>8} {'alloc free':>10} {'rest':>6}  (MiB)"
    )
    for r in sorted(ranks, key=lambda r: r["rank"]):
        b = {s["at"]: s for s in r["baseline"]}
        top = max(r["step"], key=lambda s: s["rss"])
        rest = top["rss"] - top["live"] - top["alloc_free"]
        print(
            f"{r['rank']:>4} {b['forked']['rss'] / mib:>7.0f} {b['process group']['rss'] / mib:>7.0f} "
            f"{b['stage states']['rss'] / mib:>7.0f} "
            f"{ledger.stages[r['stage']].peak_bytes / mib:>7.0f} {r['peak_live'] / mib:>8.0f} "
            f"{r['end']['max_rss'] / mib:>7.0f} | {top['at'][:16]:>16} {top['rss'] / mib:>6.0f} "
            f"{top['live'] / mib:>6.0f} {top['heap_free'] / mib:>9.0f} "
            f"{top['mmapped'] / mib:>8.0f} {top['alloc_free'] / mib:>10.0f} {rest / mib:>6.0f}"
        )
    for r in sorted(ranks, key=lambda r: r["rank"]):
        faults = r["step"][-1]["minflt"] - r["step"][0]["minflt"]
        heap = max(s["heap"] for s in r["step"]) / mib
        top = max(r["step"], key=lambda s: s["rss"])
        print(
            f"rank {r['rank']}: malloc heap up to {heap:,.0f} MiB; {faults:,} minor page faults "
            f"over the sampled steps; at the RSS peak {top['RssFile'] / mib:,.0f} MiB of it are "
            "file pages (libraries)"
        )
    times = [round(t, 2) for r in ranks if r["stage"] == a.pp - 1 for t in r["step_times_s"]]
    print("step times (s), last stage:", times)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(ranks, f, indent=1)


if __name__ == "__main__":
    main()
