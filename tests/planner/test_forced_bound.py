"""`structure.forced_bound_s` leaves out a knob group whose bound without recomputation or
offload traffic is no smaller than the least found so far: the bound is the same as with
every group worked out, and fewer memory bounds are computed."""

import random

from ratrain.models.presets import get_preset
from ratrain.planner import Request, structure
from ratrain.planner.space import family_of, knob_combos, structures
from ratrain.platforms import load

_JOBS = [
    ("llama2-70b", "h100-80g", 24, 64, 4096),
    ("qwen2.5-32b", "h100-80g", 1000, 512, 32768),
    ("llama3.2-1b", "a100-80g", 96, 256, 2048),
]


def _cases(n_per_job: int = 25):
    rng = random.Random(0)
    for model, platform, clusters, batch, seq in _JOBS:
        req = Request(get_preset(model), load(platform), clusters, batch, seq)
        for name in ("ratrain", "gpu-style"):
            fam = family_of(name)
            sts = list(structures(req, fam))
            for st in rng.sample(sts, min(n_per_job, len(sts))):
                kns = structure.memory_pass(
                    req, st, fam, knob_combos(req, fam, st), structure.State()
                )
                if kns:
                    yield req, st, fam, kns


def test_the_groups_left_out_never_hold_the_least_bound(monkeypatch):
    calls = {"n": 0}
    real = structure.options

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(structure, "options", counted)
    pruned = everything = 0
    n = 0
    for req, st, fam, kns in _cases():
        calls["n"] = 0
        fast = structure.forced_bound_s(req, st, fam, kns)
        pruned += calls["n"]
        calls["n"] = 0
        full = structure.forced_bound_s(req, st, fam, kns, prune=False)
        everything += calls["n"]
        assert fast == full, (st, fam.name, fast, full)
        n += 1
    assert n >= 40
    # Some groups were left out (the test would not exercise the pruning otherwise).
    assert pruned < everything


def test_the_least_offloading_group_is_walked(monkeypatch):
    """The least group bound has its offloading stages walked (`_stage_walk_s`): on
    qwen2.5-32b over 24 h100-80g clusters (32 x 8192), pp=12, the offloading groups' bounds
    without their walks are 14% under every knob combination's (which have them); with two
    stages walked (`FORCED_WALKS`) a tenth higher, with every stage walked within 1% of the
    least, and never above it."""
    req = Request(get_preset("qwen2.5-32b"), load("h100-80g"), 24, 32, 8192)
    fam = family_of("ratrain")
    split = (5, 6, 6, 6, 6, 6, 5, 5, 5, 5, 5, 4)
    (st,) = [s for s in structures(req, fam) if s.layer_split == split and s.micro_batch == 1]
    kns = structure.memory_pass(req, st, fam, knob_combos(req, fam, st), structure.State())
    least = structure.bound_knobs(req, st, fam, kns, structure.State())[0].lb
    two = structure.forced_bound_s(req, st, fam, kns)
    monkeypatch.setattr(structure, "FORCED_WALKS", None)
    every = structure.forced_bound_s(req, st, fam, kns)
    assert two <= every <= least * (1 + 1e-12)
    assert every > 0.99 * least

    real = structure.time_bound_s

    def unwalked(*args, **kwargs):
        kwargs["walked"] = False
        return real(*args, **kwargs)

    monkeypatch.setattr(structure, "time_bound_s", unwalked)
    none = structure.forced_bound_s(req, st, fam, kns)
    assert none < 0.9 * least
    assert two > 1.05 * none
