"""`StageFit`: the cheapest recompute policy of a stage that the ledger fits, found by
bisecting the first:K; the same answer as a walk in order, in far fewer replays. And the
structure-level bound with forced recomputation (`forced_bound_s`) stays below every knob
combination's bound."""

import itertools
import random

from ratrain.models.presets import get_preset
from ratrain.planner import Request
from ratrain.planner.families import ALL_FAMILIES
from ratrain.planner.fit import StageFit, stage_options
from ratrain.planner.space import family_of, knob_combos, structures
from ratrain.planner.structure import State, bound_knobs, forced_bound_s, memory_pass
from ratrain.platforms.load import load


def _order(n: int, selective_at: int) -> list[str]:
    """A stage's policies cheapest first, with selective placed among the first:K."""
    chain = [o for o in stage_options(n) if o not in ("none", "selective")]
    return ["none", *chain[:selective_at], "selective", *chain[selective_at:]]


def _walk(policies: list[str], fits) -> str | None:
    return next((o for o in policies if fits(o)), None)


def _bisect(policies: list[str], n: int, fits) -> tuple[str | None, int]:
    f = StageFit(policies, n)
    probes = 0
    while f.lowest() is not None and f.answer() is None:
        p = f.probe()
        f.learn(p, fits(p))
        probes += 1
    return f.answer(), probes


def _depth(o: str, n: int) -> int | None:
    if o == "full":
        return n
    return int(o.split(":")[1]) if o.startswith("first:") else None


def test_stage_fit_finds_what_a_walk_in_order_finds():
    random.seed(0)
    cases = 0
    for n, sel_at, k0, none_fits, sel_fits in itertools.product(
        (0, 1, 2, 5, 40), (0, 2, 7), (1, 2, 3, 20, 39, 40, 41), (False, True), (False, True)
    ):
        policies = _order(n, min(sel_at, n))
        # The bound may already have ruled out the smallest K: start the chain anywhere.
        start = random.randint(0, 2)
        policies = [o for o in policies if _depth(o, n) is None or _depth(o, n) >= min(start, n)]

        def fits(o, n=n, k0=k0, none_fits=none_fits, sel_fits=sel_fits):
            k = _depth(o, n)
            if k is None:
                return none_fits if o == "none" else sel_fits
            return k >= k0  # the ledger keeps no more as K grows

        got, probes = _bisect(policies, n, fits)
        assert got == _walk(policies, fits), (n, sel_at, k0, policies)
        cases += 1
        if n == 40 and not none_fits and not sel_fits:
            assert probes <= 8  # a walk takes up to 41
    assert cases > 300


def test_forced_bound_is_below_every_knob_combination():
    random.seed(1)
    checked = tighter = 0
    for platform, model, clusters, gb in (
        ("a100-80g", "llama2-70b", 64, 512),
        ("mt3000", "llama2-7b", 1024, 1024),
        ("h100-80g", "qwen2.5-32b", 96, 256),
    ):
        req = Request(get_preset(model), load(platform), clusters, gb, 4096)
        for name in ALL_FAMILIES:
            fam = family_of(name)
            sts = list(structures(req, fam))
            random.shuffle(sts)
            for st in sts[:4]:
                kns = memory_pass(req, st, fam, knob_combos(req, fam, st), State())
                if not kns:
                    continue
                forced = forced_bound_s(req, st, fam, kns)
                queue = bound_knobs(req, st, fam, kns, State())
                least = min((q.lb for q in queue), default=float("inf"))
                assert forced <= least * (1 + 1e-12), (platform, model, name, st)
                checked += 1
                tighter += forced > 1.1 * _no_recompute(req, st, kns)
    assert checked > 30
    assert tighter  # the recomputation a tight cap forces lifts some bounds by a tenth or more


def _no_recompute(req, st, kns) -> float:
    from ratrain.planner.structure import losses_of, unit_times_of, zb_pipelines
    from ratrain.planner.time_bound import lowest_unit_times, step_time_lower_bound_s

    ut = lowest_unit_times([unit_times_of(req, st, loss) for loss in losses_of(kns)])
    m = st.microbatches(req.global_batch)
    return min(
        step_time_lower_bound_s(st.layer_split, m, ut, pipeline=p)
        for p in ("1f1b", *zb_pipelines(kns))
    )
