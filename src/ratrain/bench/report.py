"""The report of `ratrain bench cluster`: a Markdown table per link rate and a plot of
tokens/s against the cap, one line per system. Pure: reads `result_json` dicts only."""

from __future__ import annotations

from pathlib import Path

__all__ = ["markdown", "plot", "SYSTEMS", "prediction_errors"]

SYSTEMS = ("ratrain", "gpu-style", "zero1-pp", "fsdp-pp", "torch-pp", "deepspeed")


def _f(x, spec=",.0f") -> str:
    return "—" if x is None else format(x, spec)


def _mib(b) -> str:
    return "—" if b is None else f"{b / 2**20:.1f}"


def _what(name: str, s: dict) -> str:
    return s.get("plan") or s.get("config") or name


def prediction_errors(res: dict) -> list[float]:
    """|predicted / measured - 1| of every planned system's distinct plan at one rate."""
    seen, out = set(), []
    for cap in res["caps"]:
        for s in cap["systems"].values():
            if not s or not s.get("predicted_tokens_per_s") or not s.get("tokens_per_s"):
                continue
            if s["plan"] in seen:
                continue
            seen.add(s["plan"])
            out.append(abs(s["predicted_tokens_per_s"] / s["tokens_per_s"] - 1))
    return out


def markdown(results: list[dict]) -> str:
    lines = []
    for res in results:
        rate = res["link_bits_per_s"] / 1e6
        lines += [
            f"### {res['nodes']} nodes x {res['ranks_per_node']} ranks, links {rate:g} Mbit/s",
            "",
            f"{res['model']}, global batch {res['global_batch']} x {res['seq']} tokens, fp32; "
            f"{res['steps']} steps per run, the first {res['warmup']} not timed; median of "
            f"{res['repeats']} interleaved repeats. Peak: live tensor bytes per rank (max over "
            "ranks), measured.",
            "",
            "| cap MiB | system | tokens/s measured | predicted | peak MiB | ratrain speedup "
            "measured | predicted | configuration |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for cap in res["caps"]:
            cap_mib = cap["cap_bytes"] / 2**20
            for name in SYSTEMS:
                s = cap["systems"].get(name)
                sp = cap["speedups"].get(name, {})
                if s is None:
                    if name in cap["systems"]:  # asked for, and nothing fits
                        lines.append(f"| {cap_mib:.0f} | {name} | none fits | | | | | |")
                    continue
                lines.append(
                    f"| {cap_mib:.0f} | {name} | {_f(s.get('tokens_per_s'))} "
                    f"| {_f(s.get('predicted_tokens_per_s'))} | {_mib(s.get('peak_bytes'))} "
                    f"| {_f(sp.get('measured'), '.3f')} | {_f(sp.get('predicted'), '.3f')} "
                    f"| `{_what(name, s)}` |"
                )
        lines.append("")
        errs = prediction_errors(res)
        if errs:
            lines += [
                f"Planned systems, predicted against measured tokens/s: mean absolute error "
                f"{100 * sum(errs) / len(errs):.1f}%, max {100 * max(errs):.1f}% "
                f"({len(errs)} runs).",
                "",
            ]
        tried = res.get("peers_tried", {})
        if tried:
            lines += [
                "Peer configurations tried (peak MiB per rank, max; tokens/s per repeat):",
                "",
            ]
            for n, t in tried.items():
                if "skipped" in t:
                    lines.append(f"- `{n}`: does not run here: {t['skipped']}")
                else:
                    tps = ", ".join(f"{x:,.0f}" for x in t.get("tokens_per_s_repeats", []))
                    lines.append(
                        f"- `{n}`: {_mib(max(t['peak_bytes_per_rank']))} MiB; {tps or '—'}"
                    )
            lines.append("")
        for k, e in res.get("errors", {}).items():
            lines.append(f"- failed: `{k}`: {e}")
        lines.append("")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> bool:
    """tokens/s against the cap, one line per system, one panel per link rate; False when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        for name in SYSTEMS:
            xs, ys = [], []
            for cap in res["caps"]:
                s = cap["systems"].get(name)
                if s and s.get("tokens_per_s"):
                    xs.append(cap["cap_bytes"] / 2**20)
                    ys.append(s["tokens_per_s"])
            if xs:
                ax.plot(xs, ys, marker="o", label=name)
        ax.set_xlabel("memory cap per rank (MiB of live tensors)")
        ax.set_ylabel("tokens/s (measured)")
        ax.set_title(f"{res['link_bits_per_s'] / 1e6:g} Mbit/s links")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
