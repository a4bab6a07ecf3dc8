"""Why no plan fits, and the cheapest change that would make one fit.

When the search finds nothing feasible, the explanation names the candidate that came
closest (least overflow), the stage that overflows, by how many bytes, the state class that
dominates that stage at its peak, and then tries changes, cheapest first:

1. drop a pin that forbids a memory-saving setting (the job itself does not change);
2. more clusters (the smallest count, found by doubling then bisection, with a fitting plan);
3. a shorter sequence (the longest power-of-two fraction of it that fits).

Each change is checked with the ledger on a concrete plan, found by a feasibility scan that
tries, per structure, the family's most memory-saving knobs with the cheapest recompute
the memory bound allows, and confirms with the ledger. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ratrain.config import Plan
from ratrain.deadline import Budget, OutOfTime
from ratrain.gcpause import gc_paused
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.feasible import find_feasible
from ratrain.planner.fit import memory_bound
from ratrain.planner.result import Near
from ratrain.planner.space import (
    Request,
    pin_conflict,
)

__all__ = ["Change", "Explanation", "explain", "find_feasible", "saturation_clusters"]

_SAVING_PINS = (
    "recompute",
    "micro_batch",
    "shard_optimizer",
    "view_policy",
    "view_lookahead",
    "grad_dtype",
    "offload_activations",
    "pp",
    "dp",
    "layer_split",
    "schedule",
    "pipeline",
)
_MAX_CLUSTER_FACTOR = 1024
_SCAN_REPLAYS = 3
"""Ledger rejections after which a size scanned for a suggested change counts as not
fitting: the suggestion found is confirmed by the ledger, but may be a little larger than
the smallest that fits."""
_LINEAR_STEPS = 3
"""assumed: the ledger's smallest cluster count is usually within a few of the bound's."""
_MIN_SEQ = 128


@dataclass
class Change:
    """One change that makes a plan fit, with the plan that shows it."""

    what: str
    plan: Plan
    peak_bytes: tuple[int, ...]

    def to_json(self) -> dict:
        return {
            "change": self.what,
            "plan": self.plan.to_dict(),
            "peak_memory_bytes": list(self.peak_bytes),
        }


@dataclass
class Explanation:
    closest: Plan | None
    family: str | None
    stage: int | None
    peak_bytes: int
    limit_bytes: int
    breakdown: dict[str, int]
    changes: list[Change] = field(default_factory=list)
    note: str = ""
    unexamined: int | None = None
    """Set when the search stopped at its time budget before any plan fit: the structures
    it did not examine (so this is not a proof that none fits)."""
    bound: bool = False
    """`peak_bytes` and `breakdown` are the closest candidate's memory lower bound (its
    ledger peak is no smaller), not its ledger replay."""
    headroom_bytes: int = 0
    """Kept free below the cap besides the workspace (`Platform.headroom_bytes`)."""

    def _headroom_words(self) -> str:
        if not self.headroom_bytes:
            return ""
        return f" and the {self.headroom_bytes / 1e9:.2f} GB headroom kept free (--headroom)"

    @property
    def over_bytes(self) -> int:
        return self.peak_bytes - self.limit_bytes

    @property
    def largest_class(self) -> str | None:
        return max(self.breakdown, key=self.breakdown.__getitem__) if self.breakdown else None

    def lines(self) -> list[str]:
        gb = 1e9
        if self.unexamined is not None:
            head = (
                f"unknown whether a plan fits {self.limit_bytes / gb:.2f} GB per stage: none was "
                f"found within the time budget, and {self.unexamined} structures were not "
                "examined (this is not a proof that none fits); --time-budget 0 searches them "
                "all and settles it."
            )
            if self.closest is None:
                return [head]
        elif self.closest is None:
            return [f"no candidate plan exists for this request: {self.note}"]
        else:
            head = (
                f"no plan fits {self.limit_bytes / gb:.2f} GB per stage (usable: the cap less the "
                f"workspace reserved from it{self._headroom_words()})."
            )
        p = self.closest
        out = [
            head,
            f"closest{' examined' if self.unexamined is not None else ''}: {self.family} pp={p.pp} dp={p.dp} micro_batch={p.micro_batch} "
            f"split={list(p.layer_split or ())} recompute={_rec(p)} shard_optimizer={p.shard_optimizer} "
            f"views={p.view_policy} grad={p.grad_dtype} offload={p.offload_activations}",
            (
                f"stage {self.stage} needs at least {self.peak_bytes / gb:.2f} GB by the memory "
                f"bound, over by at least {self.over_bytes / gb:.2f} GB ({self.over_bytes:,} "
                "bytes; --time-budget 0 replays it with the ledger); at the bound's peak: "
                if self.bound
                else f"stage {self.stage} peaks at {self.peak_bytes / gb:.2f} GB, over by "
                f"{self.over_bytes / gb:.2f} GB ({self.over_bytes:,} bytes); at its peak: "
            )
            + ", ".join(f"{k} {v / gb:.2f} GB" for k, v in self.breakdown.items() if v)
            + (f"; {self.largest_class} is the largest class" if self.largest_class else ""),
        ]
        if self.changes:
            first = self.changes[0]
            out.append(
                f"cheapest change that fits: {first.what} (worst stage {max(first.peak_bytes) / gb:.2f} GB)"
            )
            out += [
                f"also fits: {c.what} (worst stage {max(c.peak_bytes) / gb:.2f} GB)"
                for c in self.changes[1:]
            ]
        if self.note:
            out.append(f"note: {self.note}")
        return out

    def to_json(self) -> dict:
        return {
            "closest_plan": self.closest.to_dict() if self.closest else None,
            "family": self.family,
            "stage": self.stage,
            "peak_bytes": self.peak_bytes,
            "limit_bytes": self.limit_bytes,
            "over_bytes": self.over_bytes,
            "breakdown_at_peak": self.breakdown,
            "largest_class": self.largest_class,
            "peak_is_lower_bound": self.bound,
            "changes": [c.to_json() for c in self.changes],
            "note": self.note,
            "unexamined_structures": self.unexamined,
            "text": self.lines(),
        }


def _rec(p: Plan) -> str:
    return p.recompute[0] if len(set(p.recompute)) == 1 else ",".join(p.recompute)


@gc_paused()  # see `ratrain.gcpause`
def explain(
    req: Request,
    near: Near | None,
    ev: Evaluator | None = None,
    budget_s: float | None = None,
    unexamined: int | None = None,
    *,
    budget: Budget | None = None,
) -> Explanation:
    """The explanation of an infeasible request (`near`: the search's closest miss). With
    `budget_s`, the changes it suggests are searched for that long, and what could not be
    confirmed in time is said so. `unexamined`: the search stopped at its time budget with
    that many structures left and none fitting; the closest miss examined is described and
    no change is suggested (the request may well fit). `budget`: the explanation's own
    `Budget` (its soft limit), instead of `budget_s` from now."""
    if budget is None:
        budget = Budget(budget_s)
    ev = ev or Evaluator(req)
    limit = usable_bytes(req)
    if near is None:
        note = "" if unexamined is not None else _no_candidate_note(req)
        return Explanation(
            None,
            None,
            None,
            0,
            limit,
            {},
            note=note,
            unexamined=unexamined,
            headroom_bytes=req.platform.headroom_bytes,
        )
    peaks, bounded = near.peak_bytes, not near.measured and budget.limited
    if bounded:
        # Under a time budget the closest miss is described by its memory lower bound: a
        # ledger replay of a deep pipeline costs as much as the rest of the answer.
        stage = near.worst_stage
        parts = memory_bound(req, near.plan).breakdown(stage, near.plan.recompute[stage])
    else:
        breakdown: tuple[dict[str, int], ...] = near.breakdown
        if not near.measured:
            rep = ev.memory(near.plan)
            peaks, breakdown = rep.peak_bytes, rep.breakdown
        stage = max(range(len(peaks)), key=lambda s: peaks[s])
        parts = dict(breakdown[stage])
    ex = Explanation(
        near.plan,
        near.family,
        stage,
        peaks[stage],
        limit,
        parts,
        bound=bounded,
        headroom_bytes=req.platform.headroom_bytes,
    )
    if unexamined is not None:
        ex.unexamined = unexamined
        return ex
    ex.changes, notes = _changes(req, ev, budget)
    states = sum(v for k, v in ex.breakdown.items() if k in ("master", "optimizer", "view", "grad"))
    if states > limit:
        notes.append(
            f"the model states alone (master, optimizer, view, gradient) take {states / 1e9:.2f} GB "
            f"of stage {stage}'s peak at the closest candidate: activations are not the problem"
        )
    ex.note = "; ".join(notes)
    return ex


def _no_candidate_note(req: Request) -> str:
    conflict = pin_conflict(req)
    if conflict is not None:
        return conflict
    pins = ", ".join(f"{k}={v}" for k, v in req.pins.items()) or "none"
    return (
        f"the pins ({pins}) leave no configuration of {req.clusters} clusters for a global batch of "
        f"{req.global_batch} sequences (pp x dp must fit the clusters and dp x micro-batch divide the batch)"
    )


_PIN_CHANGE = {
    "recompute": "allow more recomputation",
    "micro_batch": "allow a smaller micro-batch",
    "shard_optimizer": "allow sharded optimizer states",
    "view_policy": "allow transient views",
    "offload_activations": "allow activation offload",
    "grad_dtype": "allow 16-bit gradients",
    "pipeline": "allow the 1F1B pass order (and activation offload)",
}


_NOT_IN_TIME = "not checked within the time budget (--time-budget 0 checks all)"


def _changes(req: Request, ev: Evaluator, budget: Budget) -> tuple[list[Change], list[str]]:
    """Changes that fit, cheapest first, and notes on the ones that do not."""
    out: list[Change] = []
    notes: list[str] = []
    pinned = [k for k in _SAVING_PINS if k in req.pins]
    for k in pinned:  # one pin at a time: the smallest departure from the request
        try:
            hit = find_feasible(
                req.with_(pins={f: v for f, v in req.pins.items() if f != k}), budget=budget
            )
        except OutOfTime:
            notes.append(f"dropping --pin {k}: {_NOT_IN_TIME}")
            continue
        if hit is not None:
            what = _PIN_CHANGE.get(k, "allow other values")
            out.append(
                Change(
                    f"{what} (drop --pin {k}={_pin_text(req.pins[k])})", hit[0], hit[1].peak_bytes
                )
            )
    if len(pinned) > 1 and not out:
        free = req.with_(pins={k: v for k, v in req.pins.items() if k not in pinned})
        try:
            hit = find_feasible(free, budget=budget)
        except OutOfTime:
            hit = None
            notes.append(f"dropping the pins {', '.join(pinned)}: {_NOT_IN_TIME}")
        if hit is not None:
            out.append(Change(f"drop the pins {', '.join(pinned)}", hit[0], hit[1].peak_bytes))
    clusters = _more_clusters(req, budget)
    if isinstance(clusters, str):
        notes.append(clusters)
    elif clusters is not None:
        n, plan, rep, note = clusters
        out.append(Change(f"use {n} clusters instead of {req.clusters}", plan, rep.peak_bytes))
        if note:
            notes.append(note)
    else:
        notes.append(f"no cluster count up to {req.clusters * _MAX_CLUSTER_FACTOR} fits")
    try:
        seq = _shorter_seq(req, budget)
    except OutOfTime:
        notes.append(f"a shorter sequence: {_NOT_IN_TIME}")
        return out, notes
    if seq is not None:
        s, plan, rep = seq
        out.append(
            Change(f"use sequences of {s} tokens instead of {req.seq}", plan, rep.peak_bytes)
        )
    else:
        notes.append(
            f"no shorter sequence (down to {_MIN_SEQ} tokens) fits on {req.clusters} clusters"
        )
    return out, notes


def _pin_text(v) -> str:
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    return str(v).lower() if isinstance(v, bool) else str(v)


def _more_clusters(req: Request, budget: Budget):
    """The smallest cluster count with a plan the ledger confirms. Bisection runs on the
    memory bound alone (no ledger); the ledger then confirms upwards from the count found.
    Returns (count, plan, report, note), None when no count fits, or, out of time, a note:
    then the smallest count the ledger confirmed so far is returned with the bound's count
    in the note, or the note says the bound's count alone."""
    saturated = saturation_clusters(req)
    try:
        n = _smallest_clusters(
            req,
            lambda n: find_feasible(req.with_(clusters=n), confirm=False, budget=budget),
            saturated,
        )
    except OutOfTime:
        return f"more clusters: {_NOT_IN_TIME}"
    if n is None:
        if saturated <= req.clusters * _MAX_CLUSTER_FACTOR:
            return (
                f"no cluster count fits (from {saturated} on, every pipeline depth has as "
                "many replicas as the batch allows: more clusters change nothing)"
            )
        return None
    found: dict[int, tuple] = {}

    def fits(n: int) -> bool:
        if n not in found:
            found[n] = find_feasible(
                req.with_(clusters=n), max_replays=_SCAN_REPLAYS, budget=budget
            )
        return found[n] is not None

    try:
        return _confirm_clusters(req, n, fits, found)
    except OutOfTime:
        ok = sorted(k for k, v in found.items() if v is not None)
        bound = f"the memory bound needs at least {n} clusters"
        if not ok:
            return f"{bound}; no count confirmed by the ledger within the time budget"
        hit = found[ok[0]]
        return ok[0], hit[0], hit[1], f"{bound}; fewer than {ok[0]}: {_NOT_IN_TIME}"


def _confirm_clusters(req: Request, n: int, fits, found: dict):

    # No count below n fits (the bound says so). The bound is usually tight: step up one
    # count at a time for a few counts (each a replay or so), then gallop up from there
    # with the ledger and bisect.
    top, step, lo = req.clusters * _MAX_CLUSTER_FACTOR, 1, n - 1
    for _ in range(_LINEAR_STEPS):
        if n >= top or fits(n):
            break
        lo, n = n, n + 1
    while not fits(n):
        lo, n, step = n, min(top, n + step), step * 2
        if lo >= top:
            return None
    while n - lo > 1:
        mid = (lo + n) // 2
        lo, n = (lo, mid) if fits(mid) else (mid, n)
    hit = found[n]
    return n, hit[0], hit[1], ""


def saturation_clusters(req: Request) -> int:
    """A cluster count from which more clusters change no structure the explanation's scan
    reads: every pipeline depth pp <= n_layers then has dp = the largest divisor of the
    sequences per micro-batch (at most the global batch) within clusters // pp, and the
    memory-aware split reads min(pp, global batch // (clusters // pp)) = 1 (`structures`,
    `space._split`). So a request that does not fit there fits at no larger count."""
    return req.spec.n_layers * req.global_batch


def _smallest_clusters(req: Request, fits, saturated: int | None = None):
    """Doubling then bisection: the smallest count in (clusters, factor x clusters] that
    `fits`, or None; the doubling stops after the first count past `saturated`
    (`saturation_clusters`)."""
    lo, hi, hit = req.clusters, None, None
    n = req.clusters * 2
    while n <= req.clusters * _MAX_CLUSTER_FACTOR:
        hit = fits(n)
        if hit is not None:
            hi = n
            break
        if saturated is not None and n >= saturated:
            return None
        lo, n = n, n * 2
    if hi is None:
        return None
    while hi - lo > 1:  # the smallest count in (lo, hi] that fits
        mid = (lo + hi) // 2
        got = fits(mid)
        if got is not None:
            hi, hit = mid, got
        else:
            lo = mid
    return hi


def _shorter_seq(req: Request, budget: Budget):
    s = req.seq // 2
    while s >= _MIN_SEQ:
        # The bound rules most lengths out without the ledger.
        if find_feasible(req.with_(seq=s), confirm=False, budget=budget) is not None:
            hit = find_feasible(req.with_(seq=s), max_replays=_SCAN_REPLAYS, budget=budget)
            if hit is not None:
                return s, hit[0], hit[1]
        s //= 2
    return None
