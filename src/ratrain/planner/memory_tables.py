"""The tables `ratrain.planner.memory_bound.MemoryBound` reads: per unit kind, the bytes
each state takes (`unit_tables`); a stage's units as runs of units alike (`Run`, `Layout`);
and a zero-bubble stage's pass profile (`zb_profile`). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ratrain.config import Plan
from ratrain.models import counts
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Op
from ratrain.schedule.lowering import deferred_weight_mbs
from ratrain.schedule.zerobubble import inflight_limit, order_of
from ratrain.sizes.activations import (
    activation_bytes,
    backward_workspace_bytes,
    boundary_bytes,
    weight_grad_bytes,
)

__all__ = [
    "Layout",
    "Run",
    "ZbProfile",
    "reload_moments_of",
    "unit_tables",
    "zb_profile",
    "zb_profile_of",
]


@lru_cache(maxsize=4096)
def zb_profile(pp: int, m: int, w: int, pipeline: str) -> tuple[tuple[int, bool, bool], ...]:
    """Per input-gradient pass mb of a zero-bubble stage with warm-up w (in its pass order,
    `ratrain.schedule.zerobubble.pass_order`), as B_IN(., mb) starts: the microbatches
    whose B_IN pass has run and whose B_W pass has not, whether some B_W pass has run, and
    whether mb's own weight pass waits behind another pass (with offload, what its B_IN
    keeps then leaves the device: `ratrain.schedule.lowering.weight_offloaded_mbs`)."""
    order = order_of(m, w, inflight_limit(pp, w, pipeline))
    deferred = deferred_weight_mbs(order)
    out, done_in, done_w = [], 0, 0
    for op, _ in order:
        if op is Op.B_IN:
            out.append((done_in - done_w, done_w > 0, done_in in deferred))
            done_in += 1
        elif op is Op.B_W:
            done_w += 1
    return tuple(out)


@dataclass(frozen=True)
class ZbProfile:
    """`zb_profile` in closed form, for a stage with warm-up `w` and in-flight limit `limit`
    (`ratrain.schedule.zerobubble.order_of`; limit >= w + 1 under zb-h1 and zb-h2). Its
    steady state pairs F(f) with B_IN(f - w) and, from f = limit - 1 on, with B_W(f -
    limit + 1); each cool-down B_IN is followed by a B_W. So at B_IN(mb) the weight passes
    done are max(0, mb + w - limit + 1, mb + w - m): none before `first_w`, then one more
    per microbatch. Reading `order_of`'s pass order, O(m), for every stage's bound was most
    of the search's time on deep pipelines; this is O(1) per microbatch."""

    m: int
    w: int
    limit: int

    def __post_init__(self) -> None:
        assert 0 <= self.w <= self.m and self.limit >= self.w + 1, (self.m, self.w, self.limit)

    def done_w(self, mb: int) -> int:
        """Weight passes run before B_IN(mb)."""
        return max(0, mb + self.w - self.limit + 1, mb + self.w - self.m)

    @property
    def first_w(self) -> int:
        """The first microbatch whose B_IN follows a B_W pass (m where none does)."""
        return min(self.limit - self.w, self.m - self.w + 1, self.m)

    def deferred(self, mb: int) -> bool:
        """Whether mb's B_W waits behind another pass than a B_W (`deferred_weight_mbs`):
        the steady state's weight passes run limit - 1 - w input-gradient passes late, the
        cool-down's m - w - steady ones, and the last ones after every B_IN."""
        m, w, limit = self.m, self.w, self.limit
        steady = max(0, m - limit + 1)  # weight passes in the steady state
        if mb < steady:
            return limit > w + 1
        if mb < steady + w:
            return steady < m - w
        return mb < m - 1

    def weight_pass_after(self, mb: int) -> int | None:
        """The microbatch whose B_W pass runs right after B_IN(mb)'s pass (`order_of`: a
        weight pass follows an input-gradient pass, or none does), or None."""
        done = self.done_w(mb)
        if mb == self.m - 1 or self.done_w(mb + 1) > done:
            return done
        return None

    def reload_moments(self) -> frozenset[int]:
        """The microbatches where whether a deferred weight pass follows B_IN(mb)'s pass
        (`weight_pass_after`, `deferred`) changes, each with the one before: with offload,
        that pass's first units are reloaded before B_IN(mb)'s last unit (`MemoryBound`).
        The weight pass after B_IN(mb) is B_W(mb + w - limit + 1) in the steady state and
        B_W(mb + w - m) in the cool-down, and `deferred` changes only at its flips: the
        change points are among a few candidates, each tested."""
        m, w, limit = self.m, self.w, self.limit
        steady = max(0, m - limit + 1)
        points = {limit - w - 1, m - w - 1, m - w, m - 1}
        for k in (steady, steady + w, m - 1):  # where `deferred` may change
            points |= {k + limit - w - 1, k + m - w}
        near = {j + d for j in points for d in (-1, 0, 1)}
        return frozenset(
            i
            for j in near
            if 0 < j < m and self.reloads_after(j) != self.reloads_after(j - 1)
            for i in (j - 1, j)
        )

    def reloads_after(self, mb: int) -> bool:
        """Whether the weight pass right after B_IN(mb)'s pass is deferred (with offload,
        reloaded ahead of it)."""
        after = self.weight_pass_after(mb)
        return after is not None and self.deferred(after)

    def at(self, mb: int) -> tuple[int, bool, bool]:
        """`zb_profile(...)[mb]`."""
        done = self.done_w(mb)
        return mb - done, done > 0, self.deferred(mb)

    def moments(self) -> set[int]:
        """The microbatches `MemoryBound` looks at besides 1F1B's moments. The scan over
        `zb_profile` takes every one whose profile differs from the one before, and that
        one; what the bound adds up is linear in mb between the points where one of its
        terms changes slope or steps (`kinks`), so the ends of each run of such moments
        and the kinks inside it, with their neighbours, give the same largest value. Up
        to `first_w` every microbatch is such a moment (one more B_IN waits for its B_W);
        past it, only where `deferred` changes."""
        m, w = self.m, self.w
        if m < 2:
            return set()
        last = min(self.first_w, m - 1)  # 0..last: one run of moments
        steady = max(0, m - self.limit + 1)
        flips = {i for i in (steady, steady + w, m - 1) if 0 < i < m}
        flips = {i for i in flips if self.deferred(i) != self.deferred(i - 1)}
        kinks = {1, m - 1 - w, m - w, m - 2, m - 1, last, *flips}
        out = {0, last}
        out |= {k + d for k in kinks for d in (-1, 0, 1) if 0 <= k + d <= last}
        out |= {j for i in flips if i > last for j in (i - 1, i)}
        return out


@lru_cache(maxsize=4096)
def reload_moments_of(pp: int, m: int, w: int, pipeline: str) -> frozenset[int]:
    """`ZbProfile.reload_moments` of `zb_profile_of(pp, m, w, pipeline)`, memoised (every
    policy of a stage, and stages alike, read the same)."""
    return zb_profile_of(pp, m, w, pipeline).reload_moments()


@lru_cache(maxsize=4096)
def zb_profile_of(pp: int, m: int, w: int, pipeline: str) -> ZbProfile:
    """The `ZbProfile` of a zero-bubble stage with warm-up w."""
    return ZbProfile(m, w, inflight_limit(pp, w, pipeline))


def unit_tables(spec: ModelSpec, plan: Plan, kinds: dict[str, int], eager: bool) -> tuple:
    """Per unit kind: the activations kept under each policy, the backward workspace and
    the parameters; the boundary bytes; and per unit kind what a split backward keeps from
    B_IN to B_W, (inputs, out_grads) (memoised by `MemoryBound`)."""
    keep = {
        (k, p): activation_bytes(spec, plan, u, p, flash=True, eager_kernels=eager)
        for k, u in kinds.items()
        for p in ("none", "selective", "full")
    }
    bws = {
        k: backward_workspace_bytes(spec, plan, u, flash=True, eager_kernels=eager)
        for k, u in kinds.items()
    }
    params = {k: counts.unit_params(spec, u) for k, u in kinds.items()}
    wgrad = {k: weight_grad_bytes(spec, plan, u) for k, u in kinds.items()}
    return keep, bws, params, boundary_bytes(spec, plan), wgrad


@dataclass(frozen=True)
class Run:
    """Units alike on a stage, in the stage's order: `count` units of `kind` under `policy`,
    and what the bound reads of the units before the run."""

    kind: str
    """emb, block or head."""
    policy: str
    count: int
    start: int
    """Its first unit's index on the stage."""
    keep: int
    """One unit's kept activations for one microbatch under `policy`."""
    keep_below: int
    """The same, summed over the units before the run."""
    params_below: int
    """The parameters of the units before the run."""
    w_below: int
    """zb-h1: what one microbatch's B_IN pass leaves for its B_W pass, summed over the
    units before the run (0 otherwise)."""


@dataclass(frozen=True)
class Layout:
    """A stage's units for `MemoryBound`: its runs of units alike (`Run`), the static
    bytes (states and persistent views), the views among them, one microbatch's keep over
    the stage, every gradient's bytes, and `at`: the units (index, run, index in the run)
    where what a backward pass holds can be largest. Under zb-h1 also what one
    microbatch's B_IN pass leaves for its B_W pass over the stage (`total_w`), and every
    gradient's bytes (`zb_grads`, which exist from the stage's first B_W)."""

    runs: tuple[Run, ...]
    static: int
    views: int
    total_keep: int
    all_grads: int
    at: tuple[tuple[int, int, int], ...]
    total_w: int
    zb_grads: int
    params: dict[str, int]
    """Parameters stored per unit kind on the stage: with tied embeddings and both the
    embedding and the head on it, the head's less the shared matrix (`stored_params`)."""

    def below(self, u: int) -> int:
        """Keep of the units before unit u."""
        for run in self.runs:
            if u <= run.start + run.count:
                return run.keep_below + (u - run.start) * run.keep
        return self.total_keep
