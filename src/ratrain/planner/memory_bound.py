"""The memory bounds: cheap lower bounds on each stage's ledger peak, from the same state
sizes the ledger uses (the step-time bound is `ratrain.planner.time_bound`).

- `persistent_lower_bound_bytes` / `persistent_bound_of`: per stage, what no schedule goes
  below (master weights and Adam states, plus the largest unit's view or gradient); the
  search reads it before it builds a structure's plans.
- `MemoryBound`: per stage and recompute policy, the largest of what the ledger surely
  holds at a few moments of the stage's 1F1B or zero-bubble walk (one chunk per stage:
  V-shaped plans are not bounded).

Pure Python.
"""

from __future__ import annotations

from functools import lru_cache

from ratrain.config import Plan
from ratrain.models import counts
from ratrain.models.spec import ModelSpec
from ratrain.planner.cache import Memo
from ratrain.planner.memory_tables import (
    Layout,
    Run,
    reload_moments_of,
    unit_tables,
    zb_profile_of,
)
from ratrain.schedule.lowering import RELOAD_AHEAD_UNITS
from ratrain.schedule.passes import global_checks
from ratrain.schedule.views import prefetched_views_of, transient_views_of
from ratrain.schedule.zerobubble import warmup
from ratrain.schema import bound_fields
from ratrain.sizes.states import (
    ADAM_BYTES_PER_PARAM,
    MASTER_BYTES_PER_PARAM,
    grad_bytes_per_param,
    shards,
    view_bytes_per_param,
)

__all__ = [
    "gradients_bound_of",
    "persistent_bound_of",
    "persistent_lower_bound_bytes",
    "MemoryBound",
]


def persistent_lower_bound_bytes(spec: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """Per stage, bytes no schedule goes below: the fp32 master weights and Adam states of
    all its units (their shard, when sharded) are held through the step, and at some time
    the largest unit's view (while its forward runs) or its full gradient (from its first
    backward) exists on top of them."""
    most = max(view_bytes_per_param(plan), grad_bytes_per_param(plan))
    return persistent_bound_of(spec, plan.blocks_per_stage(spec), shards(plan), most)


def persistent_bound_of(
    spec: ModelSpec, split: tuple[int, ...], n_shards: int, most_bytes_per_param: int
) -> tuple[int, ...]:
    """`persistent_lower_bound_bytes` from what it reads of a plan: the layer split, the
    shard count and the wider of the view and gradient bytes per parameter (the search
    bounds structures with it before it builds their plans)."""
    key = (spec, split, n_shards, most_bytes_per_param)
    return _PERSISTENT.get_or(key, _persistent, spec, split, n_shards, most_bytes_per_param)


_PERSISTENT: Memo[tuple[int, ...]] = Memo(100_000)
"""`persistent_bound_of` by its arguments."""


def gradients_bound_of(
    spec: ModelSpec, split: tuple[int, ...], n_shards: int, grad_bpp: int, view_bpp: int
) -> tuple[int, ...]:
    """Per stage, the model states a step of two or more microbatches holds at once: the
    fp32 master weights and Adam states of its units (their shard), every unit's full
    gradient, and the views where they persist through the step (`view_bpp`: 0 where they
    are transient). A unit's gradient exists from its first backward (or weight) pass to
    its sync after its last: as the second pass starts on the stage's last unit, every
    unit has run its first and none its last (`MemoryBound`'s moments from the second
    backward pass, and its last weight pass under a split backward, hold it too)."""
    key = (spec, split, n_shards, grad_bpp, view_bpp)
    return _GRADIENTS.get_or(key, _gradients, spec, split, n_shards, grad_bpp, view_bpp)


def _gradients(spec, split, n_shards: int, grad_bpp: int, view_bpp: int) -> tuple[int, ...]:
    per_param = MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM
    return tuple(
        stored * per_param // n_shards + stored * (grad_bpp + view_bpp)
        for _, _, stored in _stage_params(spec, split)
    )


def _persistent(spec: ModelSpec, split: tuple[int, ...], n_shards: int, most: int):
    per_param = MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM
    every = _unit_params(spec)
    _, peak = _unit_prefix(spec)
    out = []
    for lo, hi, stored in _stage_params(spec, split):
        # The largest unit: the blocks share one size, so the largest of the range is
        # among its ends and one block.
        largest = max(every[lo], every[hi - 1], peak if hi - lo > 2 else 0)
        out.append(stored * per_param // n_shards + largest * most)
    return tuple(out)


def _stage_params(spec: ModelSpec, split: tuple[int, ...]):
    """Per stage: its units' range [lo, hi) (as `Plan.stage_units` has them) and the
    parameters it stores, a tied embedding matrix once where the embedding and the head
    share the stage (`stored_params`)."""
    n_units = len(_unit_params(spec))
    prefix, _ = _unit_prefix(spec)
    start, pp = 1, len(split)
    for s in range(pp):
        lo, hi = (0 if s == 0 else start), (n_units if s == pp - 1 else start + split[s])
        start += split[s]
        stored = prefix[hi] - prefix[lo]
        if spec.tied_embeddings and lo == 0 and hi == n_units:
            stored -= spec.vocab * spec.hidden
        yield lo, hi, stored


@lru_cache(maxsize=64)
def _unit_prefix(spec: ModelSpec) -> tuple[tuple[int, ...], int]:
    """Prefix sums of the units' parameters, and the largest block's (blocks are one size:
    asserted)."""
    every = _unit_params(spec)
    blocks = set(every[1:-1])
    assert len(blocks) <= 1, "blocks of one model hold the same parameters"
    prefix = [0]
    for n in every:
        prefix.append(prefix[-1] + n)
    return tuple(prefix), max(blocks, default=0)


@lru_cache(maxsize=64)
def _unit_params(spec: ModelSpec) -> tuple[int, ...]:
    """Every unit's parameters, by unit (embedding, blocks, head)."""
    return tuple(counts.unit_params(spec, u) for u in range(spec.n_layers + 2))


_GRADIENTS: Memo[tuple] = Memo(100_000)
"""`gradients_bound_of` by what it reads."""
_STAGE_MEMO: Memo[int] = Memo(200_000)
"""`MemoryBound.stage` by what it reads (`MemoryBound._share`) and the stage's key."""
_TABLES: Memo[tuple] = Memo(1024)
"""`MemoryBound`'s per-unit activation, workspace and parameter tables, by what they read."""


_BOUND_FIELDS = bound_fields(Plan)


class MemoryBound:
    """A lower bound on each stage's ledger peak under a recompute policy, from moments of
    its 1F1B walk (one plan's knobs; the plan's own recompute field is not read). One chunk
    per stage (asserted): a V-shaped plan (zb-v, 1f1b-v) is not bounded, and the search
    tries those only after it (`ratrain.planner.search`).

    The stage runs w = min(pp - s - 1, m) forward passes before its first backward pass
    (`ratrain.schedule.zerobubble.warmup`: twice as many under zb-h2).
    While B(u, mb) runs, the ledger holds at least: the master and Adam states and the
    persistent views; the view of u if views are transient; the activations of every other
    microbatch whose forward pass is done and whose backward pass is not, and mb's own for
    the units its backward has not reached (u and below); what RECOMPUTE(u, mb) restored;
    the backward workspace; and the gradients of the units the backward has met, all of
    them from the second backward pass on (gradients live from a unit's first B to the
    UPDATE after its last). In flight: min(w + 1, m) microbatches at mb = 0 and
    min(w + 1, m - 1) at mb = 1. Offloaded microbatches count for nothing. With
    `sends_held`, the buffers of the sends already made (one per finished forward pass
    unless the stage is the last, one per finished backward pass unless it is the first),
    and the last backward pass is a moment too (all m forward sends and m - 1 backward
    sends held, on top of its own activations and all the gradients); otherwise comm
    buffers, and other transient bytes, only add. With `eager_kernels`, the activations
    and backward workspaces of the runtime's eager kernels, as the ledger counts them on
    such a platform (`Platform.eager_kernels`).

    Under `pipeline` zb-h1 the same moments are B_IN(u, mb)'s (`ratrain.schedule.
    zerobubble`: 1F1B's warm-up and steady pairing of F and B_IN, so as many microbatches
    in flight, each holding its kept activations until its B_IN; zb-h2: the same with its
    own, longer, warm-up w, which the stage key carries; RECOMPUTE(u, mb) runs
    just before B_IN(u, mb); B_IN holds B's workspace). What differs is what the backward
    leaves: B_IN(u, mb) adds u's output gradients as it starts, and from its end to its
    B_W each (u, mb) keeps what the weight pass needs (`weight_grad_bytes`, whatever the
    policy: recompute rebuilt it before B_IN). So at B_IN(u, mb) the units above u keep
    that for mb, and so does every unit for each microbatch whose B_IN pass has run and
    whose B_W pass has not (`zb_profile`, `ZbProfile`: up to s of them on stage s). Gradients exist
    from the stage's first B_W pass, all of them at once (a pass covers every unit), and
    none before it. The pass order reads pp, so the moments taken are those where these
    counts change, besides 1F1B's.
    """

    def __init__(
        self, spec: ModelSpec, plan: Plan, sends_held: bool = False, eager_kernels: bool = False
    ) -> None:
        assert plan.chunks == 1, (
            f"MemoryBound bounds one chunk per stage; pipeline {plan.pipeline!r} places "
            f"{plan.chunks} on each"
        )
        self.spec, self.plan = spec, plan
        emb, head = counts.embedding_unit(spec), counts.head_unit(spec)
        kinds = {"emb": emb, "block": 1, "head": head}
        # The activation tables read the tokens, the dtype and the loss chunking only:
        # shared by the bounds of every structure and knob combination alike there.
        tkey = (
            spec,
            plan.micro_batch,
            plan.seq,
            plan.compute_dtype,
            plan.loss_chunk_tokens,
            eager_kernels,
        )
        tables = _TABLES.get_or(tkey, unit_tables, spec, plan, kinds, eager_kernels)
        self.keep, self.bws, self.params, boundary, wgrad = tables
        # A stage with the embedding and the head stores a tied matrix once (the ledger's
        # `stored_params`): the head's parameters there, less it.
        shared = spec.vocab * spec.hidden if spec.tied_embeddings else 0
        self.params_both = {**self.params, "head": self.params["head"] - shared}
        self.gbp, vbp = grad_bytes_per_param(plan), view_bytes_per_param(plan)
        self.zb = plan.split_backward
        # zb-h1: what B_IN keeps for B_W (policy-independent), per unit kind: all of it,
        # and its output gradients alone (added when B_IN starts).
        self.w_keep = {k: sum(v) for k, v in wgrad.items()} if self.zb else {}
        self.w_out = {k: v[1] for k, v in wgrad.items()} if self.zb else {}
        # Under zb-h1 every gradient exists from the stage's first B_W pass on, and none
        # before it: counted per moment (`_stage`), not as the backward meets the units.
        self.zb_gbp = self.gbp if self.zb else 0
        if self.zb:
            self.gbp = 0
        # With a global check (the gradient norm for clipping, fp16's overflow flag), each
        # unit's GRAD_SYNC lands only at that check, after the stage's last B_W
        # (`ledger._landings`): there every full gradient of the stage exists at once.
        self.checked = bool(global_checks(plan))
        self.transient = transient_views_of(plan.schedule, plan.view_policy) and vbp > 0
        self.prefetch = self.transient and prefetched_views_of(
            plan.schedule, plan.view_policy, plan.view_lookahead
        )
        self.vbp = vbp
        self.state_per_param = (MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM) / shards(plan)
        # Everything `_stage` reads besides the stage's key: bounds of other structures
        # (another pp, split or family) with the same share their stages' values.
        self._share = (
            tkey,
            shards(plan),
            plan.microbatches,
            self.transient,
            self.prefetch,
            vbp,
            self.gbp,
            plan.offload_activations,
            sends_held,
            # zb-h1: its pass order reads pp (`zb_profile`); its gradients count apart.
            (plan.pp, self.zb_gbp, self.checked) if self.zb else None,
        )
        self.m = plan.microbatches
        # Sends held to the step's end (`Platform.sends_held_until_waited`): every output a
        # finished forward pass sent on, and every input gradient a finished backward pass
        # sent back, is still held.
        self.held_send_bytes = boundary if sends_held else 0
        self._layouts: dict[tuple, tuple] = {}
        """`_stage`'s layout and unit terms by (blocks, embedding, head, policy)."""
        self.extra: dict[tuple, object] = {}
        """Derived results memoised by their users on the same stage keys."""

    @staticmethod
    def key(plan: Plan) -> tuple:
        """The plan fields the bound reads besides the split (for sharing one instance):
        those the schema marks `bound`, the microbatches they make, and the views a stage
        holds (all that the lifecycle and the view policy change here)."""
        views = (
            transient_views_of(plan.schedule, plan.view_policy),
            prefetched_views_of(plan.schedule, plan.view_policy, plan.view_lookahead),
        )
        return (plan.microbatches, views, *(getattr(plan, f) for f in _BOUND_FIELDS))

    def stage_key(self, stage: int) -> tuple[int, bool, bool, int]:
        """What the bound reads of a stage: its blocks, whether it holds the embedding or
        the head, and its warmup depth w (stages alike share their bounds). One chunk per
        stage: the constructor asserts it, and a plan set later shares the pipeline, which
        `key` holds."""
        plan = self.plan
        n_blocks = plan.layer_split[stage] if plan.layer_split else None
        if n_blocks is None:
            n_blocks = plan.blocks_per_stage(self.spec)[stage]
        w = warmup(plan.pp, self.m, stage, plan.pipeline)
        return (n_blocks, stage == 0, stage == plan.pp - 1, w)

    def stage(self, stage: int, policy: str) -> int:
        return self.stage_at(self.stage_key(stage), policy)

    def stage_at(self, stage_key: tuple[int, bool, bool, int], policy: str) -> int:
        """`stage` of the stage whose `stage_key` is given (the plan's split not read)."""
        return _STAGE_MEMO.get_or(
            (self._share, (*stage_key, policy)), self._stage, *stage_key, policy
        )

    def breakdown(self, stage: int, policy: str) -> dict[str, int]:
        """The bound of `stage` under `policy` by state class (the ledger's classes), at
        the moment that gives it: the parts sum to `stage(stage, policy)`."""
        parts = self._stage(*self.stage_key(stage), policy, parts=True)
        assert sum(parts.values()) == self.stage(stage, policy)
        return parts

    def _layout(self, n_blocks: int, emb: bool, head: bool, policy: str) -> Layout:
        """The stage's units as runs of units alike, their static bytes, and the units at
        which what a backward pass holds can be largest (see `Layout`)."""
        # The stage's units as runs of units alike: (kind, policy, count), none empty.
        spans = [("emb", "none", 1)] if emb else []
        if policy.startswith("first:"):
            k = min(int(policy.split(":")[1]), n_blocks)
            spans += [("block", "full", k), ("block", "none", n_blocks - k)]
        else:
            spans.append(("block", policy, n_blocks))
        if head:
            spans.append(("head", "none", 1))
        spans = [r for r in spans if r[2] > 0]
        params = self.params_both if emb and head else self.params
        static = sum(c * int(params[k] * self.state_per_param) for k, _, c in spans)
        runs, start, keep_below, params_below, w_below = [], 0, 0, 0, 0
        for k, p, c in spans:
            keep = self.keep[(k, p)]
            runs.append(Run(k, p, c, start, keep, keep_below, params_below, w_below))
            start += c
            keep_below += c * keep
            params_below += c * params[k]
            w_below += c * self.w_keep.get(k, 0)
        n_params = params_below  # now over the whole stage
        views = 0 if self.transient else n_params * self.vbp
        static += views
        # Within a run, what is held grows or shrinks linearly with the unit, except the
        # reload window near the run's start: the largest value is at the run's first
        # `ahead` + 1 units or at its last. Those units: (index, run, index in the run).
        ahead = RELOAD_AHEAD_UNITS
        at = tuple(
            (run.start + j, r, j)
            for r, run in enumerate(runs)
            for j in sorted({*range(min(ahead, run.count - 1) + 1), run.count - 1})
        )
        return Layout(
            runs=tuple(runs),
            static=static,
            views=views,
            total_keep=keep_below,
            all_grads=n_params * self.gbp,
            at=at,
            total_w=w_below,
            zb_grads=n_params * self.zb_gbp,
            params=params,
        )

    def _unit(self, lay: Layout, u: int, r: int, j: int) -> tuple:
        """What does not depend on the moment, for unit `u` (run `r`, `j`-th in it):
        (kind, running, keep of units 0..u, the same when the microbatch is offloaded,
        the gradients not yet met below it, the next unit's view fetched ahead)."""
        run = lay.runs[r]
        k, keep_u = run.kind, run.keep
        running = self.keep[(k, "none")] - keep_u + self.bws[k]
        if self.transient and k != "emb":
            running += lay.params[k] * self.vbp
        # The unit the backward pass reads next (the one below, unless it is the
        # embedding, whose B reads no view): its view is fetched before B(u) starts.
        below_kind = k if j > 0 else (lay.runs[r - 1].kind if r > 0 else None)
        ahead_view = 0
        if self.prefetch and k != "emb" and below_kind == "block":
            ahead_view = self.params["block"] * self.vbp
        running += ahead_view
        above_w = 0
        if self.zb:
            # B_IN(u, mb) adds u's output gradients as it starts, and every unit above u
            # has run its B_IN of mb: each keeps what its B_W needs (`above_w`; with
            # offload, a microbatch whose weight pass is deferred moves it off the device,
            # `_add_weight_offload`: not counted then).
            running += self.w_out[k]
            above_w = lay.total_w - (run.w_below + (j + 1) * self.w_keep[k])
        upto = run.keep_below + (j + 1) * keep_u  # keep of units 0..u
        # An offloaded microbatch holds the unit running and the ones reloaded ahead.
        mine_off = upto - lay.below(max(0, u - RELOAD_AHEAD_UNITS))
        met = run.params_below + j * lay.params[k]
        return k, running, upto, mine_off, lay.all_grads - met * self.gbp, ahead_view, above_w

    def _stage(
        self, n_blocks: int, emb: bool, head: bool, w: int, policy: str, parts: bool = False
    ):
        plan = self.plan
        # The layout and the units' terms read neither the warm-up nor the moment: one per
        # (blocks, embedding, head, policy), shared by the stages of every warm-up.
        hit = self._layouts.get((n_blocks, emb, head, policy))
        if hit is None:
            lay = self._layout(n_blocks, emb, head, policy)
            hit = (lay, [self._unit(lay, u, r, j) for u, r, j in lay.at])
            self._layouts[(n_blocks, emb, head, policy)] = hit
        lay, terms = hit
        static, views, total_keep, all_grads = lay.static, lay.views, lay.total_keep, lay.all_grads
        # Per unit, what does not depend on the moment; two switches do: whether every
        # unit's gradient exists (from the second backward pass on) and whether the
        # microbatch is offloaded. The largest unit per setting of the two is found once,
        # and each moment adds its own terms to it (integers: the same sums as unit by
        # unit, and the first unit at the largest, as before).
        largest: dict[tuple, tuple] = {}
        # Held while the backward pass of the stage's first unit runs, besides its terms:
        # with offload, what a deferred weight pass right after reloads before it
        # (`_reloaded_w`); in the cool-down, with views prefetched, the view of the unit
        # the next backward pass reads first (`_next_view`).
        reload_w = self._reloaded_w(lay) if self.zb and plan.offload_activations else 0
        next_view = self._next_view(lay, emb, head)

        def largest_unit(grads_all: bool, off: bool, above: bool, first: tuple) -> tuple:
            """The largest unit's value and terms; `first`, (kept bytes, view bytes), held
            besides the stage's first unit's (terms[0]; a few values per stage)."""
            hit = largest.get((grads_all, off, above, first))
            if hit is None:
                top, arg, add = None, None, first
                for k, running, upto, mine_off, grads_some, ahead_view, above_w in terms:
                    grads = all_grads if grads_all else grads_some
                    mine = mine_off if off else upto
                    run = running + above_w if above else running
                    if add:  # the first unit's, then no other's
                        run += add[0] + add[1]
                        ahead_view += add[1]
                        add = None
                    v = grads + mine + run
                    if top is None or v > top:
                        top, arg = v, (grads, mine, run, k, ahead_view)
                hit = largest[(grads_all, off, above, first)] = (top, arg)
            return hit

        best, at_best = 0, None
        m = plan.microbatches
        # B(., i) runs after F(min(i + w, m - 1)): microbatches i .. i + w are in flight.
        # From i = 1 on every unit's gradient exists; i = m - 1 - w is the last steady pair.
        # With sends held, the last backward pass too: fewer microbatches in flight, but
        # every forward pass's send and all the earlier backward passes' are held.
        moments = {0, min(1, m - 1), max(0, m - 1 - w)}
        if self.held_send_bytes:
            moments.add(m - 1)
        profile = zb_profile_of(plan.pp, m, w, plan.pipeline) if self.zb else None
        if profile is not None:
            # Under zb-h1 the microbatches past their B_IN and before their B_W, and
            # whether a B_W has run, change too: what is held is linear in mb between
            # the changes, so the largest is at one end of a stretch without one.
            moments |= profile.moments()
            if reload_w:
                moments |= reload_moments_of(plan.pp, m, w, plan.pipeline)
        for mb in sorted(moments) if terms else ():
            others, grads_all = min(w, m - 1 - mb), mb >= 1
            off, others_b = self._offload(mb, others, m, w, total_keep)
            sent = (0 if head else min(mb + w, m - 1) + 1) + (0 if emb else mb)
            held = sent * self.held_send_bytes
            at = profile.at(mb) if profile is not None else None
            moved = at is not None and plan.offload_activations and at[2]
            view = next_view if m - 1 - w <= mb < m - 1 else 0  # no forward pass left
            kept = 0
            if reload_w and at is not None and profile.reloads_after(mb):
                kept = reload_w
            first = (kept, view) if kept or view else None
            v, (grads, mine, running, k, ahead_view) = largest_unit(
                grads_all, off, not moved, first
            )
            if at is not None:
                waiting, w_started, _ = at
                if not plan.offload_activations:  # else offloaded until its B_W nears
                    others_b += waiting * lay.total_w  # each keeps what its B_W pass needs
                grads += lay.zb_grads if w_started else 0
                v += lay.zb_grads if w_started else 0
            total = static + others_b + held + v
            if total > best:
                best, at_best = total, (grads, mine + others_b, running, k, held, ahead_view)
        if self.zb and self.checked and terms:
            # The stage's last B_W (its first unit's, of the last microbatch), as it
            # starts: every unit's full gradient exists (each sync lands at the global
            # check after it), and what B_IN kept for it (the last microbatch's is never
            # offloaded). The moments above are B_IN's: with few microbatches (one: every
            # B_W after every B_IN) none has them all.
            own = self.w_keep[lay.runs[0].kind]
            end = static + lay.zb_grads + own
            if end > best:
                best, at_best = end, (lay.zb_grads, own, 0, None, 0, 0)
        if profile is not None and terms and m > 1:
            # The first weight pass after the last B_IN, on the stage's first unit.
            k = profile.weight_pass_after(m - 1)
            kept = self._tail_kept(lay, profile, k, reload_w)
            # With k = m - 1 the units above have run their last B_W: without a global
            # check their syncs may have landed.
            grads = lay.zb_grads if k < m - 1 or self.checked else 0
            tail = static + grads + kept
            if tail > best:
                best, at_best = tail, (grads, kept, 0, None, 0, 0)
        if not parts:
            return best
        return self._parts(static - views, views, at_best)

    def _reloaded_w(self, lay: Layout) -> int:
        """What a deferred weight pass reloads before the compute action that precedes it
        (`ratrain.schedule.lowering._add_weight_offload`): what B_IN kept for B_W of the
        stage's last `RELOAD_AHEAD_UNITS` units, of those that offload it (the blocks, and
        the head unless the fused chunked loss runs it whole; not the embedding). Held,
        from the RELOADs' issue, while that action (B_IN of the stage's first unit)
        runs."""
        out, left = 0, RELOAD_AHEAD_UNITS
        for run in reversed(lay.runs):
            n = min(left, run.count)
            if run.kind == "block" or (run.kind == "head" and not self.plan.loss_chunk_tokens):
                out += n * self.w_keep[run.kind]
            left -= n
            if not left:
                break
        return out

    def _tail_kept(self, lay: Layout, profile, k: int, reload_w: int) -> int:
        """What B_IN passes kept that the ledger holds while the first weight pass after
        the stage's last B_IN, B_W(k), runs on the stage's first unit: k's own for that
        unit (the units above have run theirs), and of each later microbatch all of it,
        or with offload (every later one but the last is deferred past k + 1,
        `ZbProfile.deferred`, and moved off) only the last's, plus the reloads ahead of
        k + 1's pass when it is deferred (`reload_w`). k: `weight_pass_after(m - 1)`."""
        m = profile.m
        kept = self.w_keep[lay.runs[0].kind]
        if not self.plan.offload_activations:
            return kept + (m - 1 - k) * lay.total_w
        if k < m - 1:
            kept += lay.total_w  # the last microbatch's: never offloaded
        if k + 1 < m - 1:
            kept += reload_w
        return kept

    def _next_view(self, lay: Layout, emb: bool, head: bool) -> int:
        """With views prefetched, the view of the stage's last unit, which the next
        backward pass reads first: held while the backward pass of the first unit runs
        where no forward pass comes between (the cool-down; a weight pass reads no view).
        Not counted where the two are one unit, or on the embedding's stage (its first
        unit reads no view)."""
        if not self.prefetch or emb or lay.runs[-1].start + lay.runs[-1].count < 2:
            return 0
        return self.params["head" if head else "block"] * self.vbp

    def _parts(self, states: int, views: int, at_best) -> dict[str, int]:
        """`_stage`'s maximum split into the ledger's state classes."""
        grads, kept, running, k, held, ahead_view = at_best or (0, 0, 0, "block", 0, 0)
        fetched = self.params[k] * self.vbp if self.transient and k not in ("emb", None) else 0
        fetched += ahead_view
        workspace = self.bws[k] if at_best and k is not None else 0
        share = MASTER_BYTES_PER_PARAM / (MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM)
        master = int(states * share)  # each unit's states, rounded once: split by share
        return {
            "master": master,
            "optimizer": states - master,
            "view": views + fetched,
            "grad": grads,
            "activation": kept + running - fetched - workspace,
            "comm_buffer": held,
            "workspace": workspace,
        }

    def _offload(self, mb: int, others: int, m: int, w: int, total_keep: int) -> tuple[bool, int]:
        """Whether microbatch `mb` is offloaded at its backward, and the bytes the other
        microbatches in flight keep on the device. Offload moves a microbatch with another
        forward pass between its F and B: all but the last when w >= 1."""
        if not self.plan.offload_activations or w == 0:
            return False, others * total_keep
        last_in_flight = mb < m - 1 <= mb + others  # another microbatch, kept on device
        return mb < m - 1, int(last_in_flight) * total_keep
