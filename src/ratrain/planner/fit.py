"""The recompute policy of each stage: the cheapest one under which the stage fits.

A stage's memory depends on its own recompute policy only (its action list and its ledger
replay read no other stage's policy), and more recomputation only adds compute to the
stage that does it. So, for a fixed structure and knobs, the fastest plan gives every
stage the cheapest policy that fits it (per-stage families), or every stage one policy
that fits them all (uniform families). Policies, cheapest first by the stage's recompute
time: none, selective (the attention core), first:K (full recompute of the stage's first
K blocks), full.

Finding them is exact and cheap: a closed-form lower bound on each stage's peak
(`MemoryBound`) rules policies out without the ledger (`options`); the search replays the
policies it leaves and finds, per stage, the cheapest one the ledger fits (`StageFit`). A
policy is skipped only when its bound or its replay overflows, or the replay of a first:K
with a larger K overflows (the ledger, like the bound, keeps no more as K grows: more
blocks recompute, and each keeps less): on the first:K it bisects, one replay serving every
stage, where a walk one policy at a time took up to a replay per block. Pure Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

from ratrain.config import Plan
from ratrain.planner.cache import Memo
from ratrain.planner.evaluate import usable_bytes
from ratrain.planner.families import Family
from ratrain.planner.memory_bound import MemoryBound
from ratrain.planner.space import FIXED_FIELDS, Knobs, Request, Structure, make_plan
from ratrain.planner.time_bound import UnitTimes, recompute_time_s, step_time_lower_bound_s
from ratrain.schedule.zerobubble import warmup
from ratrain.schema import bound_fields, search_fields

__all__ = [
    "Options",
    "first_overflow_bytes",
    "least_bounds",
    "stage_options",
    "structure_bound",
    "options",
    "time_bound_s",
    "StageFit",
    "beaten_by",
]


def stage_options(n_blocks: int) -> list[str]:
    """The distinct policies of a stage of `n_blocks` blocks (first:K for K >= n is full)."""
    return ["none", "selective", *(f"first:{k}" for k in range(1, n_blocks)), "full"]


def _rank(opt: str) -> int:
    """Tie-break between equally fast policies: the one that recomputes less by name."""
    if opt == "none":
        return 0
    if opt == "selective":
        return 1
    return 10**9 if opt == "full" else 1 + int(opt.split(":")[1])


@dataclass
class Options:
    """The policies a (structure, knobs) may still use, by the memory bound alone."""

    per_stage: list[list[str]]
    """Per stage: policies whose bound fits, cheapest first (per-stage families)."""
    uniform: list[str]
    """Policies whose bound fits on every stage, cheapest bottleneck first (uniform)."""
    bound_bytes: tuple[int, ...]
    """Per stage: the smallest bound over its policies (to rank near misses)."""
    most_saving: tuple[str, ...]
    """Per stage: the policy with that smallest bound."""

    def feasible(self, per_stage: bool) -> bool:
        return all(self.per_stage) if per_stage else bool(self.uniform)


_BOUNDS: Memo[MemoryBound] = Memo(4096)
"""`memory_bound` by what the bound reads of the request and the plan."""

_ANY_POLICY = ("full",)
"""The bound does not read the plan's recompute: the one the search's model-state check
builds its plan with, so that the two share one Plan."""


def memory_bound(req: Request, plan) -> MemoryBound:
    """The memory bound of `plan`, shared by plans that differ only in split and recompute."""
    held, eager = req.platform.sends_held_until_waited, req.platform.eager_kernels
    key = (req.spec, held, eager, MemoryBound.key(plan))
    mb = _BOUNDS.get_or(key, MemoryBound, req.spec, plan, held, eager)
    mb.plan = plan  # the split is read per stage; the rest is the key
    return mb


_STRUCTURE_FIELDS = tuple(f.name for f in search_fields(Plan, "structure"))
_KNOB_FIELDS = tuple(f.name for f in search_fields(Plan, "knob"))
_FIXED_BOUND = {
    f.name: f.default
    for f in dataclasses.fields(Plan)
    if f.name in FIXED_FIELDS and f.name in bound_fields(Plan)
}
"""Fields the memory bound reads that the search does not vary (the clip: whether the
syncs wait for a global check), as the plan gets them: a pin, else the default."""


def structure_bound(req: Request, st: Structure, kn: Knobs) -> MemoryBound:
    """`memory_bound` of the plan `make_plan(req, st, kn, ...)` builds, found by its key
    without building the plan (built the first time the key is met). Only for the stage
    values by key (`MemoryBound.stage_at`): its `plan` may be another plan of the key."""
    held, eager = req.platform.sends_held_until_waited, req.platform.eager_kernels
    fields = SimpleNamespace(
        **{f: getattr(st, f) for f in _STRUCTURE_FIELDS},
        **{f: getattr(kn, f) for f in _KNOB_FIELDS},
        **{f: req.pins.get(f, default) for f, default in _FIXED_BOUND.items()},
        seq=req.seq,
        microbatches=st.microbatches(req.global_batch),
    )
    key = (req.spec, held, eager, MemoryBound.key(fields))
    mb = _BOUNDS.get(key)
    if mb is None:
        mb = memory_bound(req, make_plan(req, st, kn, _ANY_POLICY * st.pp))
    return mb


def first_overflow_bytes(req: Request, st: Structure, kn: Knobs) -> int | None:
    """A quick infeasibility test: by how much the bound of some stage exceeds the cap
    under every policy, or None when each stage has a policy whose bound fits (then
    `options` is feasible for per-stage families). A stage fits under some policy iff it
    fits under none, selective or full (`_fitting`: first:K is no smaller than full).
    Stages are tried deepest warmup first, where the most microbatches are in flight."""
    mb = structure_bound(req, st, kn)
    limit = usable_bytes(req)
    pp, split, m = st.pp, st.layer_split, mb.m
    policies = ("full", "selective", "none")  # the likeliest to fit first
    for s in dict.fromkeys((0, pp - 1, *range(1, pp - 1))):
        least = None
        key = (split[s], s == 0, s == pp - 1, warmup(pp, m, s, kn.pipeline))  # `stage_key`
        for o in policies:
            b = mb.stage_at(key, o)
            if b <= limit:
                break
            least = b if least is None else min(least, b)
        else:
            return least - limit
    return None


def options(req: Request, st: Structure, kn: Knobs, ut: UnitTimes | None) -> Options:
    """Policies per stage that the closed-form bound does not rule out (ordered by
    recompute time when `ut` is given, else by how much they recompute)."""
    mb = memory_bound(req, make_plan(req, st, kn, _ANY_POLICY * st.pp))
    limit = usable_bytes(req)
    per_stage, lows, most = [], [], []
    fits: list[set[str]] = []
    ordered: dict[tuple, tuple[list[str], set[str]]] = {}  # stages alike: one sort
    for s, n in enumerate(st.layer_split):
        ok, low, best = _stage_fit(mb, s, n, limit)
        hit = ordered.get((ok, n))
        if hit is None:
            by_time = sorted(
                ok, key=lambda o, n=n: (recompute_time_s(o, n, ut) if ut else 0.0, _rank(o))
            )
            hit = ordered[ok, n] = (by_time, set(ok))
        per_stage.append(list(hit[0]))
        fits.append(hit[1])
        lows.append(low)
        most.append(best)

    def bottleneck(o: str) -> float:
        return max(recompute_time_s(o, n, ut) for n in st.layer_split) if ut else 0.0

    uniform = [
        o
        for o in stage_options(max(st.layer_split))
        if all(
            o in f or _same_as_full(o, n) and "full" in f
            for f, n in zip(fits, st.layer_split, strict=True)
        )
    ]
    uniform.sort(key=lambda o: (bottleneck(o), _rank(o)))
    return Options(per_stage, uniform, tuple(lows), tuple(most))


def least_bounds(req: Request, st: Structure, kn: Knobs) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """`options(...).bound_bytes` and `.most_saving` alone (per stage the smallest bound
    and its policy), without working out which policies fit: what ranking a near miss
    reads."""
    mb = memory_bound(req, make_plan(req, st, kn, _ANY_POLICY * st.pp))
    lows, most = [], []
    for s in range(st.pp):
        least = {o: mb.stage(s, o) for o in ("selective", "full")}
        best = min(least, key=lambda o: (least[o], _rank(o)))
        lows.append(least[best])
        most.append(best)
    return tuple(lows), tuple(most)


def _stage_fit(mb: MemoryBound, s: int, n: int, limit: int) -> tuple[tuple[str, ...], int, str]:
    """(the policies of stage `s` whose bound fits, the smallest bound, its policy),
    memoised on the bound for stages alike (see `MemoryBound.stage`)."""
    key = ("fit", *mb.stage_key(s), limit)
    hit = mb.extra.get(key)
    if hit is None:
        ok = tuple(_fitting(lambda o: mb.stage(s, o), n, limit))
        least = {o: mb.stage(s, o) for o in ("selective", "full")}
        best = min(least, key=lambda o: (least[o], _rank(o)))
        hit = mb.extra[key] = (ok, least[best], best)
    return hit


def _fitting(bound, n_blocks: int, limit: int) -> list[str]:
    """The policies of a stage whose bound fits. The bound does not grow with K in
    first:K (each block moved to full recompute keeps less, and restores while its own
    backward runs only what it kept before), so the fitting first:K are K >= some K0:
    found by bisection."""
    ok = [o for o in ("none", "selective") if bound(o) <= limit]
    if bound("full") > limit:
        return ok
    lo, hi = 1, n_blocks  # first:n_blocks is full, which fits
    while lo < hi:
        mid = (lo + hi) // 2
        if bound(f"first:{mid}") <= limit:
            hi = mid
        else:
            lo = mid + 1
    return ok + [f"first:{k}" for k in range(lo, n_blocks)] + ["full"]


def _same_as_full(opt: str, n_blocks: int) -> bool:
    return opt.startswith("first:") and int(opt.split(":")[1]) >= n_blocks


def time_bound_s(
    fam: Family,
    st: Structure,
    m: int,
    ut: UnitTimes,
    opts: Options,
    over,
    pipeline="1f1b",
    walked: bool = True,
    max_walks: int | None = None,
) -> float:
    """Step-time lower bound over every policy choice the memory bound leaves (of the
    knobs' `pipeline`); `walked`: with the offloading stages' whole walks
    (`step_time_lower_bound_s`)."""
    # The resource loads (offload traffic) shrink with recomputation: bounded per stage by
    # the least of every policy left.
    if fam.per_stage_recompute:
        rec = tuple(o[0] for o in opts.per_stage)
        left = tuple(tuple(o) for o in opts.per_stage)
        return step_time_lower_bound_s(
            st.layer_split, m, ut, rec, over, left, pipeline, walked=walked, max_walks=max_walks
        )
    # Per stage the cheapest of the uniform policies left: one bound below all of them.
    rec = tuple(
        min(opts.uniform, key=lambda o, n=n: recompute_time_s(o, n, ut)) for n in st.layer_split
    )
    left = (tuple(opts.uniform),) * st.pp
    return step_time_lower_bound_s(
        st.layer_split, m, ut, rec, over, left, pipeline, walked=walked, max_walks=max_walks
    )


def _depth(opt: str, n_blocks: int) -> int | None:
    """K of first:K (full: the stage's block count), None for none and selective."""
    if opt == "full":
        return n_blocks
    if opt.startswith("first:"):
        return min(int(opt.split(":", 1)[1]), n_blocks)
    return None


class StageFit:
    """The cheapest policy of one stage that the ledger fits, among `policies` (the ones
    the bound leaves, cheapest first), found from replays of the whole plan: `probe` names
    the policy to replay next, `learn` takes whether the stage fitted under it.

    The policies the ledger has not ruled out are taken in order; where the next is a
    first:K, the probe is the midpoint between it and the smallest K known to fit (full if
    none): a first:K that fits makes every larger K fit, one over the cap every smaller
    one. So the answer is the one a walk in order finds, in O(log K) replays."""

    def __init__(self, policies: list[str], n_blocks: int) -> None:
        self.policies = policies
        self.n = n_blocks
        self.over_to = -1
        """Every first:K with K <= over_to is over the cap (full is first:n)."""
        self.fit_from = n_blocks + 1
        """Every first:K with K >= fit_from fits."""
        self.known: dict[str, bool] = {}  # none and selective

    def _fits(self, opt: str) -> bool | None:
        k = _depth(opt, self.n)
        if k is None:
            return self.known.get(opt)
        if k <= self.over_to:
            return False
        return True if k >= self.fit_from else None

    def lowest(self) -> str | None:
        """The cheapest policy not known to be over the cap (None: none is left)."""
        for opt in self.policies:
            if self._fits(opt) is not False:
                return opt
        return None

    def answer(self) -> str | None:
        """The cheapest policy that fits, once known (None while not)."""
        opt = self.lowest()
        return opt if opt is not None and self._fits(opt) else None

    def probe(self) -> str | None:
        """The policy to replay next (None: none is left)."""
        opt = self.lowest()
        k = _depth(opt, self.n) if opt is not None else None
        if k is None or self._fits(opt):
            return opt
        mid = (k + min(self.fit_from, self.n)) // 2
        return "full" if mid >= self.n else f"first:{mid}"

    def learn(self, opt: str, fits: bool) -> None:
        k = _depth(opt, self.n)
        if k is None:
            self.known[opt] = fits
        elif fits:
            self.fit_from = min(self.fit_from, k)
        else:
            self.over_to = max(self.over_to, k)


def beaten_by(times_of, opt: str, found: list[str]) -> bool:
    """A uniform policy no faster on any stage than one already found to fit."""
    mine = times_of(opt)
    return any(all(a >= b for a, b in zip(mine, times_of(f), strict=True)) for f in found)
