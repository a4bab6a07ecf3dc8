"""ZB-V and 1F1B-V: pass orders on a V-shaped placement (Qi et al., ICLR 2024, "Zero
Bubble Pipeline Parallelism", §6; the placement of DualPipeV), at layer granularity.

Pure Python (no torch). The model is cut into 2p chunks (``plan.layer_split`` gives
their blocks); stage s holds chunks s and 2p - 1 - s (`Plan.stage_chunks`). A microbatch's
forward runs down the stages through chunks 0..p-1 and back up through p..2p-1, so stage 0
holds both the embedding and the head, and the loss's gradient starts where the forward
started: the backward runs the V the other way. Stage p - 1 holds chunks p - 1 and p,
which touch: what passes between them stays on the stage.

Under zb-v each backward is split as under zb-h1 (`ratrain.schedule.zerobubble`): per
chunk and microbatch an input-gradient pass (RECV_B where the next unit is on another
stage, B_IN over the chunk's units in reverse, SEND_B where the previous unit is on
another stage) and a deferrable weight pass (B_W in reverse, each after its B_IN only).
Under 1f1b-v the backward pass is whole (B), and the V only halves the bubble, as
interleaved 1F1B does.

The pass order of every stage comes from one list scheduling of the passes
(`pass_orders`), with the ZB paper's heuristics in its priorities: each time a stage is
free it runs, of the passes whose inputs have arrived,

1. an input-gradient pass (the critical path; the lowest microbatch, then the later
   chunk, whose gradient the earlier one waits for);
2. else a forward pass, while the stage holds fewer than `inflight_limit` (chunk,
   microbatch) pairs whose forward ran and whose weight pass did not (the later chunk
   first: a microbatch reaches its loss sooner);
3. else the oldest deferred weight pass, which so fills what would be a bubble.

Under 1f1b-v, with no weight pass to fill with, after a B a ready forward goes first
(1F1B's alternation: B-first alone starved the forwards, and the step ran longer than
1F1B's).

Each pass is timed by `pass_weights`, the FLOPs of its units (`ratrain.models.counts`;
assumed: B_IN and B_W each half the backward's), so that the order is the model's and the
plan's alone, the same for the simulator and the runtime on any platform. The limit under
zb-v is 2p, what 1F1B's stage 0 holds in chunks of half a stage: the activation memory of
1F1B, the paper's ZB-V bound (3p under 1f1b-v, `inflight_limit`).
A list schedule whose simulation runs to the end never deadlocks when run: every stage
follows the order it simulated, and every pass waits only for what it waited for there.

Where the limit starves the scheduler (no stage can run anything: a stage filled with
forwards of its first chunk cannot run the second-chunk forward that the oldest
microbatch's backward waits for, as when a light embedding-only chunk 0 races ahead),
the list scheduling is run again with each microbatch's first forward on a stage
reserving the pair of its second (a first-chunk F runs only while the stage holds at
most limit - 2 pairs, counting the reserved ones; a second-chunk F always may). That
never starves: the oldest unfinished microbatch can always move, so the stage still
holds at most `limit` pairs. (Raising the limit instead, the earlier rule, went up to
m + 1 there, GPipe's activation memory, and took seconds at pp=8, m=128.)
"""

from __future__ import annotations

from ratrain import deadline
from ratrain.config import Plan, v_stage_of_chunk
from ratrain.models.counts import unit_bwd_flops, unit_fwd_flops
from ratrain.models.spec import ModelSpec
from ratrain.schedule.ir import Op, Schedule
from ratrain.schedule.onef1b import build_chunk_passes

__all__ = ["pass_orders", "inflight_limit", "pass_weights", "build_v"]


def inflight_limit(pp: int, split: bool = True) -> int:
    """(chunk, microbatch) pairs a stage may hold between their F and their last B_W (or
    their B): 2pp under zb-v, 1F1B's stage 0; 3pp under 1f1b-v (assumed: with equal pass
    times its step then matches interleaved 1F1B's, (p - 1)(F + B)/2 idle per stage, as
    Megatron's interleaving also holds more than 1F1B; at 2pp it idles a third more)."""
    return 2 * pp if split else 3 * pp


def pass_weights(spec: ModelSpec, plan: Plan, units: range) -> tuple[float, float, float]:
    """The scheduler's times of a chunk's F, B_IN and B_W passes: its units' FLOPs per
    microbatch, in units of a block's forward (at least a hundredth: an embedding-only
    chunk still takes a step)."""
    mb, seq = plan.micro_batch, plan.seq
    block = unit_fwd_flops(spec, 1, mb, seq)
    f = sum(unit_fwd_flops(spec, u, mb, seq) for u in units) / block
    b = sum(unit_bwd_flops(spec, u, mb, seq) for u in units) / block
    return max(f, 0.01), max(b / 2, 0.01), max(b / 2, 0.01)


def pass_orders(
    pp: int,
    m: int,
    weights: list[tuple[float, float, float]],
    limit: int | None = None,
    split: bool = True,
) -> list[list[tuple[Op, int, int]]]:
    """Each stage's passes in order, as (Op.F, Op.B_IN or Op.B_W, chunk, microbatch), for
    a V of 2pp chunks whose F, B_IN and B_W passes take `weights[chunk]` (see the module
    docstring); with `split` False (1f1b-v), (Op.F or Op.B, chunk, microbatch), a B
    taking B_IN's and B_W's time together."""
    limit = max(2, inflight_limit(pp, split) if limit is None else limit)
    orders = _list_schedule(pp, m, weights, limit, split, reserve=False)
    if orders is None:  # starved: the reserving rule, which cannot starve
        orders = _list_schedule(pp, m, weights, limit, split, reserve=True)
    assert orders is not None, (pp, m, limit)
    return orders


_KIND = {Op.F: 0, Op.B_IN: 1, Op.B: 1, Op.B_W: 2}
_CHECK_EVERY = 4096
"""Passes placed between two checks of the planner's deadline: a V of 24 stages over 4096
microbatches places 590k, about 10 s."""


def _list_schedule(
    pp: int,
    m: int,
    weights: list[tuple[float, float, float]],
    limit: int,
    split: bool,
    reserve: bool,
) -> list[list[tuple[Op, int, int]]] | None:
    n_chunks = 2 * pp
    stage_of = [v_stage_of_chunk(pp, c) for c in range(n_chunks)]
    chunks_of = [[c for c in range(n_chunks) if stage_of[c] == s] for s in range(pp)]
    inf = float("inf")
    f_end: dict[tuple[int, int], float] = {}
    bi_end: dict[tuple[int, int], float] = {}
    next_f, next_bi = [0] * n_chunks, [0] * n_chunks
    pending_w: list[list[tuple[float, int, int]]] = [[] for _ in range(pp)]  # (ready, c, mb)
    inflight, free = [0] * pp, [0.0] * pp
    last: list[Op | None] = [None] * pp  # each stage's last pass
    orders: list[list[tuple[Op, int, int]]] = [[] for _ in range(pp)]
    left = (3 if split else 2) * n_chunks * m
    # The pairs a chunk's F takes from its stage's limit: one each; reserving, a first visit
    # (c < pp) takes its second visit's too, which then takes none.
    f_pairs = [(2 if c < pp else 0) if reserve else 1 for c in range(n_chunks)]
    op_b = Op.B_IN if split else Op.B
    if not split:  # one B of both halves' time
        weights = [(f, bi + bw, 0.0) for f, bi, bw in weights]

    def candidates(s: int) -> list[tuple[float, int, tuple[Op, int, int]]]:
        """(ready time, priority, pass) of the passes stage s could run next."""
        out = []
        for c in chunks_of[s]:
            mb = next_bi[c]
            if mb < next_f[c]:
                ready = f_end[(c, mb)] if c == n_chunks - 1 else bi_end.get((c + 1, mb), inf)
                if ready < inf:
                    # unsplit, after a B a ready F goes first: 1F1B's alternation
                    first = 0 if split or last[s] is not Op.B else 1.5
                    out.append((ready, (first, mb, -c), (op_b, c, mb)))
            mb = next_f[c]
            if mb < m and inflight[s] + f_pairs[c] <= limit:
                ready = 0.0 if c == 0 else f_end.get((c - 1, mb), inf)
                if ready < inf:
                    out.append((ready, (1, -c, mb), (Op.F, c, mb)))
        if pending_w[s]:
            ready, c, mb = pending_w[s][0]
            out.append((ready, (2, 0, 0), (Op.B_W, c, mb)))
        return out

    while left:
        if not left % _CHECK_EVERY:
            deadline.check()  # a planner's deadline (`ratrain.deadline`): deep, long Vs
        best = None  # (decision time, stage, pass)
        for s in range(pp):
            cands = candidates(s)
            if not cands:
                continue
            t = max(free[s], min(r for r, _, _ in cands))
            pick = min((prio, p) for r, prio, p in cands if r <= t)[1]
            if best is None or t < best[0]:
                best = (t, s, pick)
        if best is None:
            return None  # every stage waits on another: the limit starves the schedule
        t, s, (op, c, mb) = best
        end = t + weights[c][_KIND[op]]
        free[s] = end
        orders[s].append((op, c, mb))
        last[s] = op
        left -= 1
        if op is Op.F:
            f_end[(c, mb)] = end
            next_f[c] += 1
            inflight[s] += f_pairs[c]
        elif op is Op.B:  # unsplit: the pair is done
            bi_end[(c, mb)] = end
            next_bi[c] += 1
            inflight[s] -= 1
        elif op is Op.B_IN:
            bi_end[(c, mb)] = end
            next_bi[c] += 1
            pending_w[s].append((end, c, mb))
        else:
            pending_w[s].pop(0)
            inflight[s] -= 1
    return orders


def build_v(spec: ModelSpec, plan: Plan, kind: str) -> Schedule:
    """Compute and stage-boundary transfers of one ZB-V or 1F1B-V step, with their dependencies
    (`ratrain.schedule.onef1b.build_chunk_passes` in `pass_orders`' order)."""
    n_chunks = 2 * plan.pp
    weights = [pass_weights(spec, plan, plan.chunk_units(spec, c)) for c in range(n_chunks)]
    orders = pass_orders(plan.pp, plan.microbatches, weights, split=plan.split_backward)
    sch = build_chunk_passes(spec, plan, kind, orders)
    sch.meta["pipeline"] = plan.pipeline
    return sch
