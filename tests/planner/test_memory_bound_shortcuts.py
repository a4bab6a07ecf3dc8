"""The quick memory test's speed-ups give the same answers: `MemoryBound._stage` with the
largest unit found once per setting of the two moment switches equals the unit-by-unit
walk it replaced (value and breakdown), and `first_overflow_bytes` found by the bound's
key without building a Plan equals the test on the Plan's own bound."""

import random

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.planner import fit
from ratrain.planner.evaluate import usable_bytes
from ratrain.planner.fit import first_overflow_bytes, memory_bound, structure_bound
from ratrain.planner.memory_bound import MemoryBound
from ratrain.planner.space import Request, family_of, knob_combos, make_plan, structures
from ratrain.platforms.load import load


class _UnitByUnit(MemoryBound):
    """The bound computed as before: every moment x every unit (the stage's layout, each
    unit's moment-free terms and the cool-down's next view as `MemoryBound` has them; the
    walk over moments and units, and the offloaded keep taken per moment, its own)."""

    def _stage(
        self, n_blocks: int, emb: bool, head: bool, w: int, policy: str, parts: bool = False
    ):
        m = self.plan.microbatches
        lay = self._layout(n_blocks, emb, head, policy)
        best, at_best = 0, None
        # B(., i) runs after F(min(i + w, m - 1)): microbatches i .. i + w are in flight.
        moments = {0, min(1, m - 1), max(0, m - 1 - w)}
        if self.held_send_bytes:
            moments.add(m - 1)
        for mb in sorted(moments):
            others, grads_all = min(w, m - 1 - mb), mb >= 1
            mine_off, others_b = self._offload(mb, others, m, w, lay.total_keep)
            sent = (0 if head else min(mb + w, m - 1) + 1) + (0 if emb else mb)
            held = sent * self.held_send_bytes
            for u, r, j in lay.at:
                k, running, upto, off_keep, grads_some, ahead_view, above_w = self._unit(
                    lay, u, r, j
                )
                running += above_w  # zero bubble: the units above keep what B_W needs
                if u == 0 and m - 1 - w <= mb < m - 1:  # the cool-down: the next view
                    running += self._next_view(lay, emb, head)
                    ahead_view += self._next_view(lay, emb, head)
                mine = off_keep if mine_off else upto
                grads = lay.all_grads if grads_all else grads_some
                total = lay.static + grads + mine + others_b + running + held
                if total > best:
                    best, at_best = total, (grads, mine + others_b, running, k, held, ahead_view)
        if not parts:
            return best
        return self._parts(lay.static - lay.views, lay.views, at_best)


def _random_plans(n: int, seed: int):
    rnd = random.Random(seed)
    for _ in range(n):
        pp, dp, m = rnd.choice([1, 2, 3, 4, 6]), rnd.choice([1, 2, 4]), rnd.choice([1, 2, 3, 7])
        sched = rnd.choice(["gpu-style", "ratrain", "fsdp-pp", "zero1-pp"])
        ours = sched == "ratrain"
        yield dict(
            pp=pp,
            dp=dp,
            micro_batch=rnd.choice([1, 2]),
            global_batch=m * dp * 2,
            seq=rnd.choice([64, 128]),
            schedule=sched,
            view_policy=rnd.choice(["transient", "persistent"]) if ours else "persistent",
            shard_optimizer=sched == "fsdp-pp" or (dp > 1 and rnd.random() < 0.5),
            compute_dtype=rnd.choice(["fp16", "bf16", "fp32"]),
            grad_dtype=rnd.choice(["fp32", "bf16"]),
            offload_activations=ours and rnd.random() < 0.5,
        )


def test_stage_bound_equals_the_unit_by_unit_walk():
    spec = get_preset("tiny")
    checked = 0
    for held in (False, True):
        for eager in (False, True):
            for fields in _random_plans(60, seed=held + 2 * eager):
                try:
                    plan = Plan(**fields)
                    plan.check_for(spec)
                except RatrainError:
                    continue
                new = MemoryBound(spec, plan, sends_held=held, eager_kernels=eager)
                old = _UnitByUnit(spec, plan, sends_held=held, eager_kernels=eager)
                n = max(plan.blocks_per_stage(spec))
                for s in range(plan.pp):
                    key = new.stage_key(s)
                    for pol in ("none", "selective", "full", *(f"first:{k}" for k in (1, n))):
                        assert new._stage(*key, pol) == old._stage(*key, pol), (plan, s, pol)
                        got = new._stage(*key, pol, parts=True)
                        assert got == old._stage(*key, pol, parts=True), (plan, s, pol)
                checked += 1
    assert checked >= 100


def test_first_overflow_by_key_equals_the_plan_bound():
    """Over whole spaces (every structure and knob combination) of two models on a GPU
    preset and on cpu-local (sends held, eager kernels), with caps that rule some out."""
    seen = 0
    for platform, model, clusters, gb in (
        ("cpu-local", "llama2-7b", 16, 64),
        ("a100-80g", "llama2-13b", 8, 32),
    ):
        req = Request(get_preset(model), load(platform), clusters, gb, 2048)
        limit = usable_bytes(req)
        for name in req.families:
            fam = family_of(name)
            for st in structures(req, fam):
                for kn in knob_combos(req, fam, st):
                    plan = make_plan(req, st, kn, ("full",) * st.pp)
                    mb = memory_bound(req, plan)
                    assert structure_bound(req, st, kn) is mb
                    want = None
                    pols = ("full", "selective", "none")
                    for s in dict.fromkeys((0, st.pp - 1, *range(1, st.pp - 1))):
                        bounds = [mb.stage(s, o) for o in pols]
                        if min(bounds) > limit:
                            want = min(bounds) - limit
                            break
                    assert first_overflow_bytes(req, st, kn) == want, (st, kn)
                    seen += want is not None
    assert seen > 0
    fit._BOUNDS.clear()  # the key path must also work from an empty memo
    req = Request(get_preset("llama2-7b"), load("cpu-local"), 16, 64, 2048)
    fam = family_of(req.families[0])
    st = next(iter(structures(req, fam)))
    kn = knob_combos(req, fam, st)[0]
    assert structure_bound(req, st, kn) is memory_bound(req, make_plan(req, st, kn, ("full",)))
