"""The summary line a training run ends with, the same for the reference trainer and the
distributed runtime: the final loss (against the data's entropy floor when it has one) and
the throughput, with the peak memory per rank where the run measured it."""

from __future__ import annotations

__all__ = ["SUMMARY_WINDOW", "summary_line", "memory_note"]

SUMMARY_WINDOW = 10  # the final loss is the mean of the last steps (one batch is noisy)


def summary_line(
    losses: list[float], source, elapsed_s: float, tokens: int, memory: str = ""
) -> str:
    """One line: final loss, vs the source's `entropy_floor_nats` if it has one, then
    steps, time and tokens/s, then `memory` (e.g. `memory_note`) as is."""
    tail = losses[-SUMMARY_WINDOW:]
    final = sum(tail) / len(tail)
    rate = f"{len(losses)} steps in {elapsed_s:.1f} s ({tokens / elapsed_s:,.0f} tokens/s){memory}"
    head = f"final loss {final:.4f} (mean of the last {len(tail)} steps)"
    floor = getattr(source, "entropy_floor_nats", None)
    if floor is None:
        return f"{head}; {rate}"
    gap = 100 * (final - floor) / floor
    return f"{head} vs entropy floor {floor:.4f} nats: {gap:+.1f}%; {rate}"


def memory_note(record: dict) -> str:
    """ "; measured peak ... per rank ... MiB" from a step record, in the ledger's terms:
    tensor bytes where every rank measured them, else peak RSS (said to be more than the
    ledger counts); "" when the record has neither."""
    peaks = record.get("peak_bytes_per_rank")
    if peaks and None not in peaks:
        mib = ", ".join(f"{p / 2**20:.1f}" for p in peaks)
        return f"; measured peak tensor bytes per rank {mib} MiB"
    rss = record.get("max_rss_bytes_per_rank")
    if rss:
        mib = ", ".join(f"{p / 2**20:.0f}" for p in rss)
        return (
            f"; measured peak RSS per rank {mib} MiB (tensors, the runtime and its libraries; "
            f"the ledger and --memory-cap count tensor bytes: --measure-memory measures them)"
        )
    return ""
