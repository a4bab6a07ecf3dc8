"""Turn raw measurements into a platform file (`ratrain.platforms` schema), every value
with its provenance note: `measured: <what, how, when, on what>` where measured,
`derived:` where computed from measurements, `assumed:` where one machine cannot measure
it (the network between nodes)."""

from __future__ import annotations

import math
import statistics

from ratrain.calibrate.fit import fit_alpha_beta
from ratrain.calibrate.shapes import FUSED, PROBE_WHAT, TINY_SHAPE
from ratrain.calibrate.windows import CALIBRATE_STATISTIC, TIMED_AS
from ratrain.config import DEFAULT_LOSS_CHUNK_TOKENS, DTYPE_BYTES
from ratrain.cost.compute import kernels_time_s, unit_kernels
from ratrain.models.spec import ModelSpec
from ratrain.platforms.host import host_fingerprint
from ratrain.platforms.load import parse_platform

__all__ = ["build_platform"]

_ASYNC_P2P = ("SEND_F", "SEND_B", "RECV_F", "RECV_B")
_ASYNC_COLL = ("SYNC", "NORM", "OVF")
_DTYPES = ("fp32", "bf16", "fp16")


def _v(value, note: str) -> dict:
    return {"value": value, "note": note}


def _win(ctx: dict, prefix: str, split: bool | None = None) -> str:
    """What the windows of the measurements whose label starts with `prefix` say: '' when
    the caller did not window them (`ratrain.calibrate.windows`). `split` (unit labels):
    only those of the split backward (True), or only the others (False)."""
    ws = [
        w
        for lab, w in (ctx.get("windows") or {}).items()
        if lab.startswith(prefix) and (split is None or lab.endswith(" split") == split)
    ]
    if not ws:
        return ""
    if len(ws) == 1:
        return f"; {ws[0].note()}"
    worst = max(ws, key=lambda w: w.spread)
    again = sum(w.rounds > 1 for w in ws)
    counts = sorted({len(w.samples) for w in ws})
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} or {counts[-1]}"
    redone = f" ({again} of {len(ws)} re-measured)" if again else ""
    return (
        f"; each the median of {n} interleaved windows, largest spread {worst.spread:.0%}{redone}"
    )


def _rate_rows(gemm: list, attention: list) -> dict[str, list[tuple[float, float]]]:
    """(FLOPs of one kernel, achieved FLOP/s) per curve kind."""
    rows = {
        "gemm": [(f, f / t_f) for f, t_f, _ in gemm],
        # A linear's backward is two GEMMs (dX, dW) of the forward's FLOPs each.
        "gemm_bwd": [(f, 2 * f / t_b) for f, _, t_b in gemm],
        "attention_fwd": [(f, f / t_f) for f, t_f, _ in attention],
        "attention_bwd": [(2 * f, 2 * f / t_b) for f, _, t_b in attention],
    }
    return {k: v for k, v in rows.items() if v}


def build_platform(name: str, raw: dict, ctx: dict) -> dict:
    """The platform file's data. `raw`: {"kernels", "comm", "overhead", "units", "sharing"}
    measurements; `ctx`: {"when", "machine", "device", "nproc", "cores", "memory_bytes",
    "quick", "windows", "others_share", "probes_s"}."""
    on = f"{ctx['when']}, on {ctx['machine']}"
    cpu = ctx["device"] == "cpu"
    te = raw["kernels"].get("thread_efficiency", 1.0)
    speedup = 1 + (ctx["cores"] - 1) * te if cpu else 1.0
    timer = _timer_words(ctx)
    usable_bytes = int(ctx["memory_bytes"] // max(ctx["nproc"], 1))
    data = {"name": name, "description": _description(ctx), **_memory(usable_bytes, ctx, on)}
    data["compute"] = _compute(raw["kernels"], speedup, timer, ctx, on)
    opt_bytes_per_s = raw["kernels"]["optimizer_bytes_per_s"]
    data["tiers"] = [_tier(usable_bytes, opt_bytes_per_s, timer, ctx, on)]
    data["host"] = _host(opt_bytes_per_s, cpu)
    data["network"] = _network(raw["comm"], ctx, on)
    data["runtime"] = _runtime(raw, ctx, on)
    data["measured_on"] = _measured_on(ctx, on)
    if cpu:
        data["compute"]["cores_per_node"] = _v(
            ctx["cores"], f"measured: CPUs this process may run on (sched_getaffinity), {on}"
        )
    data["compute"].update(_sharing(raw.get("sharing") or {}, on))
    if raw.get("units"):
        factors, fixed = _unit_factors(data, raw["units"], timer, on, ctx)
        data["compute"]["unit_time_factor"] = factors
        if fixed:
            data["compute"]["unit_fixed_s"] = fixed
    _raise_peaks(data["compute"], speedup)
    return data


def _timer_words(ctx: dict) -> str:
    """How a kernel window was timed, as the notes say it (`--merge` reads it back)."""
    timed = TIMED_AS[CALIBRATE_STATISTIC]
    cpu = ctx["device"] == "cpu"
    timer = f"{timed} repeated wall-clock runs" if cpu else f"{timed} CUDA-event timings"
    return timer + (" per window" if ctx.get("windows") else "")


def _description(ctx: dict) -> str:
    quick = " (--quick)" if ctx["quick"] else ""
    return f"Measured by ratrain calibrate{quick} on {ctx['machine']}, {ctx['when']}" + (
        f"; other processes used {ctx['others_share']:.0%} of the CPU time meanwhile"
        if ctx.get("others_share") is not None
        else ""
    )


def _memory(usable_bytes: int, ctx: dict, on: str) -> dict:
    return {
        "usable_memory_bytes": _v(
            usable_bytes, f"measured: total memory / {ctx['nproc']} ranks, {on}"
        ),
        "workspace_bytes": _v(
            int(min(0.25e9, usable_bytes // 8)), "assumed: allocator and Python overheads"
        ),
    }


def _compute(k: dict, speedup: float, timer: str, ctx: dict, on: str) -> dict:
    """The kernel figures: peaks, curves, memory-bound bandwidths, thread scaling."""
    peaks, curves = _peaks_and_curves(k, speedup, timer, ctx, on)
    return {
        "peak_flops": peaks,
        "efficiency": _v(
            float(f"{1 / speedup:.4g}"),
            "derived: one thread's best over the peak (kernels without a curve)",
        ),
        "efficiency_curves": curves,
        "memory_bound_bytes_per_s": _memory_bound(k["memory"], timer, ctx, on),
        "thread_efficiency": _v(
            float(f"{max(k.get('thread_efficiency', 1.0), 0.05):.4g}"),
            f"measured: speed-up per extra thread of an fp32 512x2048x1024 GEMM, {on}"
            + _win(ctx, "threads"),
        ),
    }


def _peaks_and_curves(k: dict, speedup: float, timer: str, ctx: dict, on: str):
    """Per dtype, the peak (the fastest kernel x the thread scaling) and the curves as
    fractions of it; a dtype not measured takes fp32's peak."""
    peaks, curves = {}, {}
    for dt in _DTYPES:
        rows = _rate_rows(k["gemm"].get(dt, []), k["attention"].get(dt, []))
        if not rows:
            continue
        best = max(r for pts in rows.values() for _, r in pts)
        peak = best * speedup
        peaks[dt] = peak_entry(dt, best, speedup, "measured")
        for kind, pts in rows.items():
            how = "forward" if kind in ("gemm", "attention_fwd") else "autograd backward"
            family = "gemm" if kind.startswith("gemm") else "attention"
            curves[f"{kind}.{dt}"] = _v(
                [[float(f), float(f"{r / peak:.4g}")] for f, r in sorted(pts)],
                f"measured: {kind} {dt} via the torch backend ({how}), "
                f"one thread, {timer}, [FLOPs, achieved / peak], {on}"
                + _win(ctx, f"{family} {dt} "),
            )
    for dt in [dt for dt in _DTYPES if dt not in peaks]:
        peaks[dt] = _v(peaks["fp32"]["value"], f"assumed: {dt} not measured; fp32's peak")
    return peaks, curves


def _memory_bound(memory: dict, timer: str, ctx: dict, on: str) -> dict:
    """Bytes per second of the model's memory-bound ops, forward and backward."""
    mem_bw = {}
    for dt, ops in memory.items():
        for op, (elements, t_f, t_b) in ops.items():
            nbytes = elements * DTYPE_BYTES[dt]
            for d, t in (("fwd", t_f), ("bwd", t_b)):
                mem_bw[f"{op}.{d}.{dt}"] = _v(
                    float(f"{nbytes / t:.4g}"),
                    f"measured: the model's {op} {d} ({elements} elements, nominal bytes = "
                    f"elements x {DTYPE_BYTES[dt]}) / {timer}, one thread, {on}"
                    + _win(ctx, f"memory {dt} {op}"),
                )
    return mem_bw


def _tier(usable_bytes: int, opt_bytes_per_s: float, timer: str, ctx: dict, on: str) -> dict:
    return {
        "name": "dram" if ctx["device"] == "cpu" else "hbm",
        "capacity_bytes": _v(usable_bytes, "derived: usable_memory_bytes"),
        "bandwidth_bytes_per_s": _v(
            float(f"{opt_bytes_per_s:.4g}"),
            f"measured: the runtime's adamw_step_ over 4M fp32 parameters, 28 bytes "
            f"moved per parameter / {timer}, one thread, {on}" + _win(ctx, "optimizer"),
        ),
        "latency_s": _v(1e-6, "assumed: 1 us per memory-bound pass"),
        "copies": _v(1, "assumed: one memory space per rank"),
    }


def _host(opt_bytes_per_s: float, cpu: bool) -> dict:
    same = {"same_memory": _v(True, "derived: a CPU's host tier is its own main memory")}
    return {
        "bandwidth_bytes_per_s": _v(
            float(f"{opt_bytes_per_s:.4g}"),
            "derived: the tier's measured bandwidth (CPU: one memory)",
        )
        if cpu
        else _v(25e9, "assumed: PCIe 4 x16 pinned copies"),
        "latency_s": _v(5e-6, "assumed: 5 us per copy"),
        **(same if cpu else {}),
    }


def _network(c: dict, ctx: dict, on: str) -> dict:
    """Within the node, α and β fitted to the measured p2p and collective times; between
    nodes, assumed (one machine cannot measure it)."""
    alpha, beta = fit_alpha_beta(c["p2p"]) if c.get("p2p") else (50e-6, 1e9)
    p2p_note = (
        f"measured: ping-pong of send_activation/recv_grad, {len(c.get('p2p', []))} sizes, "
        f"least-squares α + S/β, all pipelines at once, {ctx['nproc']} ranks, {on}"
    )
    cpu = ctx["device"] == "cpu"
    return {
        "units_per_node": _v(
            max(ctx["nproc"], ctx["cores"]) if cpu else ctx["nproc"],
            "assumed: the ranks this machine runs (all of a plan's ranks on one node)",
        ),
        "intra_node": {
            "bandwidth_bytes_per_s": _v(float(f"{beta:.4g}"), p2p_note),
            "latency_s": _v(float(f"{max(alpha, 1e-7):.4g}"), p2p_note),
            "efficiency": _v(1.0, "derived: the bandwidth above is an achieved figure"),
        },
        "inter_node": {
            "bandwidth_bytes_per_s": _v(0.1e9, "assumed: not measured (one machine); 1 Gb/s"),
            "latency_s": _v(100e-6, "assumed: not measured (one machine)"),
            "efficiency": _v(0.9, "assumed: TCP reaches about 90% of nominal"),
        },
        "algorithm": _v("ring", "assumed: gloo's and NCCL's ring for large messages"),
        "collectives": _collectives(c, ctx, on),
    }


def _collectives(c: dict, ctx: dict, on: str) -> dict:
    coll = {}
    for kind, groups in c.get("collectives", {}).items():
        rows = []
        for n, pts in groups:
            a, b = fit_alpha_beta(pts)
            rows.append([n, float(f"{a:.4g}"), float(f"{b:.4g}")])
        coll[kind] = _v(
            rows,
            f"measured: runtime Comm.dp_{kind} wall time (slowest rank, median), every DP group "
            f"at once, least-squares [n, α s, bytes/s], {ctx['nproc']} ranks, {on}",
        )
    return coll


def _runtime(raw: dict, ctx: dict, on: str) -> dict:
    """The runtime's fixed costs and its behaviours as measured (or assumed)."""
    c = raw["comm"]
    out = {
        "action_overhead_s": _action_overheads(raw["overhead"], c.get("issue_s", {}), on),
        "eager_kernels": _v(
            True,
            "derived: the torch model measured here (ratrain.nn.llama) runs RMSNorm "
            "eagerly in fp32",
        ),
    }
    if "send_polls_complete" in c:
        held = not c["send_polls_complete"]
        out["sends_held_until_waited"] = _v(
            held,
            "measured: an isend polled (is_completed) after its receiver had the data "
            f"reported {'not ' if held else ''}complete, {ctx['nproc']} ranks, {on}",
        )
    if ctx.get("device") == "cpu":
        shared_rows = (raw.get("sharing") or {}).get("shared_rank_speed") or []
        out["waiting_ranks_lend_cores"] = _lend_cores(bool(shared_rows), on)
    return out


def _action_overheads(overhead: dict, issue: dict, on: str) -> dict:
    """Each compute op's measured time on the walk; the async ops' issue time."""
    over = {}
    for op, t in overhead.items():
        over[op] = _v(
            float(f"{t:.4g}"),
            f"measured: median {op} duration on the runtime's walk, tiny model (hidden 32), "
            f"one rank, {on}",
        )
    for ops, key, what in (
        (_ASYNC_P2P, "p2p", "an isend/irecv"),
        (_ASYNC_COLL, "collective", "an async all-reduce"),
    ):
        if key in issue:
            for op in ops:
                over[op] = _v(
                    float(f"{issue[key]:.4g}"), f"measured: median time to issue {what}, {on}"
                )
    return over


def _lend_cores(measured: bool, on: str) -> dict:
    if measured:
        return _v(
            True,
            "measured: ranks computing while others of the node wait in a blocked receive "
            "run at compute.shared_rank_speed (processor sharing, docs/validation.md), "
            f"{on}",
        )
    return _v(
        True,
        "assumed: a rank waiting on a receive or a collective lends its cores to the "
        "node's computing ranks (processor sharing, docs/validation.md); not measured",
    )


def _measured_on(ctx: dict, on: str) -> dict:
    """The host the file was measured on, and the speed probe's time there."""
    here = host_fingerprint()
    out = {
        "cpu": _v(here["cpu"], f"measured: /proc/cpuinfo model name, {on}"),
        "cores": _v(here["cores"], f"measured: sched_getaffinity, {on}"),
    }
    probes = ctx.get("probes_s") or []
    if probes:
        out["speed_probe_s"] = _v(
            float(f"{math.prod(probes) ** (1 / len(probes)):.4g}"),
            f"measured: {PROBE_WHAT}, median of 3 windows, geometric mean of the probes at "
            f"calibration's start and end ({', '.join(f'{p:.4g}' for p in probes)} s); "
            f"`ratrain validate` times it again to report how far the machine moved, {on}",
        )
    return out


def _sharing(sharing: dict, on: str) -> dict:
    """The compute entries of ranks sharing the node (`ratrain.calibrate.sharing`), those
    measured."""
    out = {}
    if sharing.get("rank_speed"):
        out["rank_speed"] = _rank_speed(sharing, on)
    if sharing.get("rank_speed_tokens"):
        rows = sharing["rank_speed_tokens"]
        out["rank_speed_tokens"] = _v(
            [[k, n, float(f"{v:.4g}")] for k, n, v in rows],
            "measured: as rank_speed, for the rank counts whose ranks run several threads, "
            "at " + ", ".join(sorted({f"{n}" for _, n, _ in rows}, key=int)) + " tokens per "
            f"microbatch; [k, tokens, one thread alone's time / a rank's], {on}",
        )
    if sharing.get("shared_rank_speed"):
        out["shared_rank_speed"] = _shared_rank_speed(sharing["shared_rank_speed"], on)
    if sharing.get("collective_compute_s_per_byte") is not None:
        out["collective_compute_s_per_byte"] = _v(
            float(f"{sharing['collective_compute_s_per_byte']:.4g}"),
            "measured: 2 ranks' Block forward+backward with vs without an async "
            "Comm.dp_all_reduce of 16 MB overlapping each iteration; extra seconds per "
            f"iteration / bytes, {on}",
        )
    return out


def _rank_speed(sharing: dict, on: str) -> dict:
    rows = sharing["rank_speed"]
    return _v(
        [[k, float(f"{v:.4g}")] for k, v, _ in rows],
        "measured: k ranks at once (the launcher's threads: "
        + ", ".join(f"{k} x {t}" for k, _, t in rows)
        + " threads), each running the model's Block forward+backward (hidden 384, "
        f"256 tokens) for the same window; [k, one thread alone's time / a rank's], {on}"
        + (
            "; median of consecutive windows, spread "
            + ", ".join(f"k={k}: {v:.0%}" for k, v in sharing["spreads"].items())
            if sharing.get("spreads")
            else ""
        ),
    )


def _shared_rank_speed(rows: list, on: str) -> dict:
    return _v(
        [[w, b, float(f"{v:.4g}"), float(f"{x:.4g}")] for w, b, v, x, _ in rows],
        "measured: w ranks (the launcher's threads) pass b tokens round a ring; a rank "
        "holding one runs the model's Block forward (short burst) or forward+backward "
        "(long burst), passes it on and waits in a blocked gloo receive (irecv().wait(), "
        "the executor's wait), so b compute at any moment and the busy set moves on after "
        "every burst, as in a pipeline; [w, b, one thread alone's time / a busy rank's, "
        "one thread's seconds per burst], median of consecutive windows, spread "
        + ", ".join(f"{w}/{b}@{x * 1e3:.0f}ms: {sp:.0%}" for w, b, _, x, sp in rows)
        + f", {on}",
    )


def peak_entry(dt: str, best: float, speedup: float, which: str) -> dict:
    """A dtype's derived peak: its fastest one-thread kernel (`which`: measured, merged)
    times the thread scaling, so that no rank's kernels beat it."""
    return _v(
        float(f"{best * speedup:.4g}"),
        f"derived: the fastest {which} {dt} kernel ({best:.3g} FLOP/s on one thread) "
        f"x (1 + (cores - 1) x thread_efficiency) = x{speedup:.3g}: no rank's kernels beat it",
    )


def _raise_peaks(compute: dict, speedup: float) -> None:
    """Keep the peaks above anything the cost model can charge: a measured rank speed above
    the thread formula's, or a unit factor below 1, would let a unit run faster than its
    FLOPs at the peak (the planner's lower bounds assume it cannot). Raises the peaks by
    that much and rescales the efficiencies (achieved / peak), so that every time the
    cost model computes is unchanged."""
    speeds = [v for _, v in compute.get("rank_speed", {}).get("value", [])]
    speeds += [row[2] for row in compute.get("shared_rank_speed", {}).get("value", [])]
    speeds += [row[2] for row in compute.get("rank_speed_tokens", {}).get("value", [])]
    factors = [e["value"] for e in compute.get("unit_time_factor", {}).values()]
    scale = max([speedup, *speeds]) / speedup / min([1.0, *factors])
    if scale <= 1.0:
        return
    for entry in compute["peak_flops"].values():
        entry["value"] = float(f"{entry['value'] * scale:.4g}")
        entry["note"] += f"; x{scale:.3g}: above the measured rank speeds and unit factors"
    compute["efficiency"]["value"] = float(f"{compute['efficiency']['value'] / scale:.4g}")
    for entry in compute.get("efficiency_curves", {}).values():
        entry["value"] = [[f, float(f"{e / scale:.4g}")] for f, e in entry["value"]]


_KERNEL_GROUP = {"fwd": "F", "bwd": "B", "bin": "BI", "bw": "BW"}
"""A `unit_time_factor` direction -> the cost model's kernels it scales
(`ratrain.cost.compute.unit_kernels`): forward, backward, and a split backward's B_IN and
B_W."""

_HOW = {
    "fwd": "autograd",
    "bwd": "autograd",
    "bin": "B_IN: the runtime's backward_input after a forward under SavedActivations",
    "bw": "B_W: the runtime's backward_weight after that B_IN",
}
"""How each direction was timed, as its note says."""


def _unit_factors(data: dict, units: dict, timer: str, on: str, ctx: dict) -> tuple[dict, dict]:
    """`compute.unit_time_factor` and `compute.unit_fixed_s` from the whole-unit timings
    (`ratrain.calibrate.units`): per kind, direction and dtype, the measured time beyond the
    tiny shape's against the cost model's kernel sum beyond the tiny shape's (on the
    platform built from this calibration's own kernel measurements), fitted over the shapes
    as factor x kernels + fixed (`fit_unit_time`). Directions "fwd" and "bwd" from
    the forward and the unsplit backward; "bin" and "bw" from the split backward's B_IN and
    B_W, over the cost model's B_IN and B_W kernels, where the rows carry them (older raw
    measurements do not) and the runtime split the unit (where it did not, B_IN ran the
    whole backward and B_W nothing: no factor, and the cost model charges both halves the
    "bwd" factor, `ratrain.cost.measured.unit_factor`)."""
    plat = parse_platform(data, "calibration")
    tiny_spec, tiny_mb, tiny_seq = TINY_SHAPE

    def kernel_s(spec, kind, direction, mb, seq, dt):
        unit = 1 if kind == "block" else spec.n_layers + 1
        chunk = DEFAULT_LOSS_CHUNK_TOKENS if kind == FUSED else None
        group = _KERNEL_GROUP[direction]
        ks = unit_kernels(spec, unit, mb, seq, group, dtype=dt, loss_chunk_tokens=chunk)
        return kernels_time_s(ks, dt, plat)[0]

    points: dict[str, list[tuple[float, float]]] = {}
    shapes: dict[str, list[str]] = {}
    for dt, rows in units.items():
        for fields, mb, seq, kind, t_f, t_b, tiny_f, tiny_b, *halves in rows:
            spec = ModelSpec.from_dict(fields)
            timed = [("fwd", t_f, tiny_f), ("bwd", t_b, tiny_b)]
            # halves: (t_bin, t_bw, tiny_bin, tiny_bw, split), split the windows' median of
            # 1.0 (the runtime split the unit) or 0.0 (it ran B_IN whole)
            if halves and halves[4] > 0.5:
                t_in, t_w, tiny_in, tiny_w, _ = halves
                timed += [("bin", t_in, tiny_in), ("bw", t_w, tiny_w)]
            for direction, t, t0 in timed:
                k = kernel_s(spec, kind, direction, mb, seq, dt)
                k0 = kernel_s(tiny_spec, kind, direction, tiny_mb, tiny_seq, dt)
                if k > k0 and t > t0:
                    key = f"{kind}.{direction}.{dt}"
                    points.setdefault(key, []).append((k - k0, t - t0))
                    shapes[key] = shapes.get(key, []) + [f"h{spec.hidden} b{mb} s{seq}"]
    factors, fixed = {}, {}
    for key, pts in sorted(points.items()):
        kind, direction, dt = key.split(".")
        f, c = fit_unit_time(pts)
        how = (
            f"fitted as factor x kernels + fixed over {len(pts)} shapes "
            f"({', '.join(shapes[key])}), least relative squares"
            if c > 0
            else f"median of {len(pts)} shapes ({', '.join(shapes[key])})"
        )
        measured = (
            f"measured: the model's {kind} unit {direction} ({_HOW[direction]}), one thread, "
            f"{timer}, minus the tiny shape's, over the cost model's kernel sum for it minus "
            f"the tiny shape's; {how}, {on}"
            + _win(ctx, f"units {dt} ", split=direction in ("bin", "bw"))
        )
        factors[key] = _v(float(f"{f:.4g}"), measured)
        if c > 0:
            fixed[key] = _v(
                float(f"{c:.4g}"),
                f"{measured}; the unit's seconds beyond factor x kernels at any size (one thread)",
            )
    return factors, fixed


def fit_unit_time(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(factor, fixed seconds) with time = factor x kernels + fixed over `points`
    [(kernel seconds, measured seconds), ...], each shape weighted by its own time (least
    squares of the relative error: a 128-token shape counts as much as a 512-token one).
    Falls back to the median of time / kernels with no fixed time where the points cannot
    separate the two (fewer than two, or one kernel time), where the fit's factor is not
    positive, or where its fixed time is under 1% of the fastest shape's time (no more
    than the windows' own noise; a time proportional to the kernels' fits ~0): one
    factor, as before the fixed time was fitted."""
    median = (statistics.median(t / k for k, t in points), 0.0)
    if len(points) < 2:
        return median
    # minimise sum((f k + c - t) / t)^2: rows (k / t, 1 / t) against 1
    saa = sum((k / t) ** 2 for k, t in points)
    sab = sum(k / t**2 for k, t in points)
    sbb = sum(1 / t**2 for k, t in points)
    sa = sum(k / t for k, t in points)
    sb = sum(1 / t for k, t in points)
    det = saa * sbb - sab * sab
    if det <= 1e-12 * saa * sbb:
        return median
    f = (sa * sbb - sb * sab) / det
    c = (saa * sb - sab * sa) / det
    return (f, c) if f > 0 and c > 0.01 * min(t for _, t in points) else median
