"""The simulator's answer to where ratrain would lead on an emulated network: for each model,
link rate and memory cap, the best plan of every family (`ratrain plan --family F`, the
pins of `ratrain.bench.cluster`) on a platform of this machine with that link, their
predicted tokens/s, ratrain's predicted speedup over the best other family, and where each
plan's step goes (compute, recompute, exposed communication, bubble).

The links are not measured here: a link of R Mbit/s between nodes of `ranks_per_node`
ranks is taken as R / ranks_per_node Mbit/s per rank pair, all pairs at once, with the
latency of the base platform's inter-node link, as the shaped links of this machine
measured (`ratrain.bench.link_probe`: 26.4 and 101.8 Mbit/s per pair for 2 pairs at 50 and
200 Mbit/s).

Pure: no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ratrain.bench.platform import link_platform

__all__ = ["breakdown", "predict_point", "sim_breakdown", "trace_breakdown", "whatif_grid"]


def _pins() -> dict:
    """`ratrain.bench.cluster.PINS` (the peers' maths), read as `ratrain plan --pin` reads them."""
    from ratrain.bench.cluster import PINS
    from ratrain.planner import parse_pins

    return parse_pins(list(PINS))


def breakdown(records, step_s: float) -> dict[str, float]:
    """Where a step goes, in seconds, averaged over stages: `compute` (F, B, B_IN, B_W,
    UPDATE on the compute resource, recompute excluded), `recompute`, `exposed_comm` (time
    a transfer, collective or copy of the stage is on the wire while its compute is
    idle), `bubble` (the rest: compute idle, nothing of its own in flight), `waiting`
    (their sum: compute idle) and `step`.
    `records`: (stage, resource, op, start_s, end_s) per action, simulated or measured (a
    measured asynchronous action spans its issue to the walk seeing it complete)."""
    from ratrain.sim.result import _minus, busy_s

    stages = sorted({r[0] for r in records})
    per: list[dict[str, float]] = []
    for s in stages:
        mine = [r for r in records if r[0] == s]
        comp = [(a, b) for _, res, _, a, b in mine if res == "compute"]
        comm = [(a, b) for _, res, _, a, b in mine if res in ("dp_net", "p2p", "copy")]
        rc = sum(b - a for _, res, op, a, b in mine if res == "compute" and op == "RC")
        busy = busy_s(comp, 0.0, step_s)
        exposed = _minus(comm, comp, 0.0, step_s)
        per.append(
            {
                "compute": busy - rc,
                "recompute": rc,
                "exposed_comm": exposed,
                "bubble": max(step_s - busy - exposed, 0.0),
            }
        )
    out = {k: sum(p[k] for p in per) / len(per) for k in per[0]}
    out["waiting"] = out["exposed_comm"] + out["bubble"]
    out["step"] = step_s
    return out


def sim_breakdown(sim) -> dict[str, float]:
    """`breakdown` of a simulated step (`SimResult`)."""
    recs = [(e.stage, e.resource, e.op, e.start_s, e.end_s) for e in sim.events]
    return breakdown(recs, sim.step_time_s)


def trace_breakdown(path) -> dict[str, float]:
    """`breakdown` of a trace file, measured (`ratrain train --trace`) or simulated
    (`ratrain simulate --trace`): its complete events, the step from the first start to
    the last end. A measured trace says when each asynchronous action was issued and when
    the walk saw it complete, not when its bytes were on the wire, so for it only
    `waiting` is given (`exposed_comm` and `bubble` are None)."""
    import json
    from pathlib import Path

    from ratrain.sim.trace import RESOURCE_TIDS

    by_tid = {t: r for r, t in RESOURCE_TIDS.items()}
    doc = json.loads(Path(path).read_text())
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in ev)
    recs = [
        (
            e["pid"],
            by_tid[e["tid"]],
            e.get("cat", ""),
            (e["ts"] - t0) / 1e6,
            (e["ts"] + e["dur"] - t0) / 1e6,
        )
        for e in ev
    ]
    doc_measured = bool(doc.get("otherData", {}).get("measured"))
    out = breakdown(recs, max(r[4] for r in recs))
    if doc_measured:
        out["exposed_comm"] = out["bubble"] = None
    return out


def predict_point(
    model: str,
    platform,
    cap_gib: float,
    clusters: int,
    seq: int,
    global_batch: int,
    families: tuple[str, ...],
    budget_s: float | None = 20.0,
) -> dict:
    """{family: {"plan", "tokens_per_s", "peak_bytes", "breakdown"} or None (nothing fits)}
    for one point: `platform` (a `Platform`) capped at `cap_gib` per rank."""
    from ratrain.models.presets import resolve_model
    from ratrain.planner import Request, search
    from ratrain.planner.report import describe
    from ratrain.sim import simulate

    spec = resolve_model(model)
    capped = dataclasses.replace(platform, usable_memory_bytes=int(cap_gib * 2**30))
    pins = _pins()
    out: dict = {}
    for fam in families:
        req = Request(spec, capped, clusters, global_batch, seq, pins=pins, families=(fam,))
        res = search(
            req,
            top=1,
            time_budget_s=budget_s,
            hard_budget_s=None if budget_s is None else 3 * budget_s,
        )
        if not res.feasible:
            out[fam] = None
            continue
        best = res.best
        sim = simulate(spec, best.plan, capped)  # in full, with its events: the breakdown
        out[fam] = {
            "plan": describe(best.plan),
            "tokens_per_s": sim.tokens_per_s,
            "peak_bytes": max(sim.peak_memory_bytes),
            "breakdown": sim_breakdown(sim),
        }
    return out


def speedup_over_others(systems: dict) -> float | None:
    """ratrain's predicted tokens/s over the best other family's, or None."""
    r = systems.get("ratrain")
    others = [v["tokens_per_s"] for k, v in systems.items() if k != "ratrain" and v]
    if not r or not others:
        return None
    return r["tokens_per_s"] / max(others)


def whatif_grid(
    base: dict,
    models: tuple[str, ...],
    link_mbits: tuple[float, ...],
    caps_gib: tuple[float, ...],
    nodes: int,
    ranks_per_node: int,
    seq: int,
    global_batch: int,
    families: tuple[str, ...],
    say: Callable[[str], None] = lambda _: None,
    budget_s: float | None = 20.0,
) -> list[dict]:
    """One entry per (model, link rate, cap): {"model", "link_mbit", "cap_gib", "systems",
    "speedup"} (`speedup`: ratrain over the best other family, predicted)."""
    from ratrain.platforms import from_dict

    rows = []
    for mbit in link_mbits:
        plat = from_dict(link_platform(base, nodes, ranks_per_node, mbit))
        for model in models:
            for cap in caps_gib:
                systems = predict_point(
                    model,
                    plat,
                    cap,
                    nodes * ranks_per_node,
                    seq,
                    global_batch,
                    families,
                    budget_s,
                )
                sp = speedup_over_others(systems)
                say(
                    f"{model} {mbit:g} Mbit/s {cap:g} GiB: ratrain / best other "
                    + ("-" if sp is None else f"{sp:.3f}")
                )
                rows.append(
                    {
                        "model": model,
                        "link_mbit": mbit,
                        "cap_gib": cap,
                        "systems": systems,
                        "speedup": sp,
                    }
                )
    return rows


def markdown(rows: list[dict], families: tuple[str, ...]) -> str:
    """A table of the grid: predicted tokens/s per family and ratrain's speedup, then where
    each family's step goes."""
    head = "| model | link Mbit/s | cap MiB | " + " | ".join(families) + " | ratrain / best other |"
    lines = [head, "| --- | ---: | ---: | " + " | ".join("---:" for _ in families) + " | ---: |"]
    for r in rows:
        cells = [
            f"{r['systems'][f]['tokens_per_s']:,.0f}" if r["systems"].get(f) else "none fits"
            for f in families
        ]
        sp = "—" if r["speedup"] is None else f"{r['speedup']:.3f}"
        lines.append(
            f"| {r['model']} | {r['link_mbit']:g} | {r['cap_gib'] * 1024:.0f} | "
            + " | ".join(cells)
            + f" | {sp} |"
        )
    lines += [
        "",
        "Where each plan's step goes (simulated seconds, averaged over stages):",
        "",
        "| model | link Mbit/s | cap MiB | family | step | compute | recompute | exposed comm "
        "| bubble | plan |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        for f in families:
            v = r["systems"].get(f)
            if not v:
                continue
            b = v["breakdown"]
            lines.append(
                f"| {r['model']} | {r['link_mbit']:g} | {r['cap_gib'] * 1024:.0f} | {f} | "
                f"{b['step']:.3f} | {b['compute']:.3f} | {b['recompute']:.3f} | "
                f"{b['exposed_comm']:.3f} | {b['bubble']:.3f} | `{v['plan']}` |"
            )
    return "\n".join(lines) + "\n"
