"""The memory pass's shortcut (a structure whose most memory-saving knob combination the
quick bounds rule out is ruled out whole; one whose such combination they let through keeps
every combination for later) loses no combination that the test of each one alone keeps,
and what it keeps beyond those the per-knob bound of the next step rules out."""

import pytest

from ratrain.models.presets import get_preset
from ratrain.planner.evaluate import usable_bytes
from ratrain.planner.families import ALL_FAMILIES
from ratrain.planner.fit import options
from ratrain.planner.space import Request, family_of, knob_combos, structures
from ratrain.planner.structure import State, memory_pass, ruled_out
from ratrain.platforms.load import load


@pytest.mark.parametrize(
    "model,platform,clusters,gb",
    [("llama2-70b", "a100-80g", 16, 256), ("llama2-13b", "mt3000", 16, 256)],
)
def test_memory_pass_shortcut_keeps_what_each_test_keeps(model, platform, clusters, gb):
    req = Request(get_preset(model), load(platform), clusters, gb, 4096)
    limit = usable_bytes(req)
    whole = kept = 0
    for name in ALL_FAMILIES:
        fam = family_of(name)
        for st in structures(req, fam):
            kns = knob_combos(req, fam, st)
            if not kns:
                continue
            alone = [kn for kn in kns if not ruled_out(req, st, fam, kn, limit, State())]
            got = memory_pass(req, st, fam, kns, State())
            assert all(kn in got for kn in alone), st
            for kn in got:
                if kn not in alone:  # kept for later: `_bound_knobs` rules it out
                    assert not options(req, st, kn, None).feasible(fam.per_stage_recompute)
            whole += not alone
            kept += bool(alone)
    assert whole and kept  # both outcomes exercised
