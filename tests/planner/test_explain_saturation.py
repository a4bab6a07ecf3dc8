"""The explanation's scan over cluster counts stops where more clusters change nothing:
from `saturation_clusters` on, every pipeline depth has as many replicas as the batch
allows and the memory-aware split no longer moves, so the structures the scan reads are
the same at any larger count, and a request that does not fit there fits at none."""

from ratrain.models.presets import get_preset
from ratrain.planner import explain, search
from ratrain.planner.explain import find_feasible, saturation_clusters
from ratrain.planner.families import ALL_FAMILIES
from ratrain.planner.space import Request, family_of, structures
from ratrain.platforms.load import load


def test_the_structures_stop_changing_at_the_saturation_count():
    for model, platform, gb, pins in (
        ("llama2-7b", "cpu-local", 256, {"micro_batch": 1}),
        ("qwen2.5-32b", "mt3000", 64, {"micro_batch": 2}),
        ("llama2-13b", "a100-80g", 32, {"micro_batch": 1, "pp": 8}),
    ):
        req = Request(get_preset(model), load(platform), 8, gb, 4096, pins=pins)
        n = saturation_clusters(req)
        for name in ALL_FAMILIES:
            fam = family_of(name)
            at = list(structures(req.with_(clusters=n), fam))
            assert at and at == list(structures(req.with_(clusters=4 * n + 3), fam))
            if pins == {"micro_batch": 1}:  # the count is the least there: one below differs
                assert list(structures(req.with_(clusters=n - 1), fam)) != at


def test_no_cluster_count_fits_is_said_from_the_saturation_count():
    req = Request(get_preset("qwen2.5-32b"), load("cpu-local"), 256, 1024, 4096)
    n = saturation_clusters(req)
    assert n == 64 * 1024 < 256 * 1024
    res = search(req)
    assert not res.feasible
    ex = explain(req, res.near, budget_s=None)
    assert f"no cluster count fits (from {n} on" in ex.note
    assert find_feasible(req.with_(clusters=8 * n), confirm=False) is None
