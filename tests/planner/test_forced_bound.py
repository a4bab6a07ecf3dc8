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
