"""The ablation of RATrain's lifecycle mechanisms: each ablated family keeps the mechanism
off, and (a subset of RATrain's space) never beats RATrain; the bench table shows it."""

from dataclasses import replace

from ratrain.cli.bench_ablation import ablation_json, ablation_markdown
from ratrain.config import even_split
from ratrain.models.presets import get_preset
from ratrain.planner import Request, search
from ratrain.planner.ablation import ABLATIONS
from ratrain.planner.paper import AblationRow
from ratrain.platforms.load import load

TINY = get_preset("tiny")


def test_ablations_switch_their_mechanism_off_and_never_beat_ratrain():
    pl = replace(load("mt3000"), usable_memory_bytes=3_000_000, workspace_bytes=500_000)
    req = Request(TINY, pl, 4, 8, 128)
    full = search(req.with_(families=("ratrain",)), top=1).best
    assert full is not None
    off = {}
    for name in ABLATIONS:
        res = search(req.with_(families=(name,)), top=3)
        off[name] = res.best
        for c in res.ranked:
            p = c.plan
            assert c.family == name
            if name == "ratrain-no-layer-sync":
                assert p.schedule == "gpu-style"
            else:
                assert p.schedule == "ratrain"
                # a subset of RATrain's space: exact search never finds a faster plan
                assert c.tokens_per_s <= full.tokens_per_s * (1 + 1e-12)
            if name == "ratrain-no-transient-views":
                assert p.view_policy == "persistent"
            if name == "ratrain-no-per-stage-recompute":
                assert len(set(p.recompute)) == 1
            if name == "ratrain-no-offload":
                assert not p.offload_activations
            if name == "ratrain-no-uneven-split":
                assert p.layer_split == even_split(TINY.n_layers, p.pp)
    row = AblationRow("tiny", full, off)
    md = "\n".join(ablation_markdown([row], "mt3000"))
    assert "no offload" in md and "tiny" in md
    (j,) = ablation_json([row])
    assert set(j["relative"]) == set(ABLATIONS)
    assert all(v is None or v > 0 for v in j["relative"].values())
