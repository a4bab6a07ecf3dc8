"""Where a stage offloads, the cheapest recompute that fits is not the fastest when the copy
engine is its bottleneck: recomputing more offloads less. A knob combination that offloads
is also simulated under its relieved policies (`structure._relieved`: per offloading stage,
the policy whose terms of the step-time bound are least)."""

from ratrain.models.presets import get_preset
from ratrain.planner import Request, structure
from ratrain.planner.search import search
from ratrain.platforms import load

# llama2-70b on 24 h100-80g clusters at 64 x 4096, one structure and knob combination:
# under the cheapest policies that fit, stages 6-9 offload and reload for 21 s of a 23.6 s step.
_PINS = dict(
    pp=11,
    dp=2,
    micro_batch=1,
    layer_split=(7, 8, 8, 8, 7, 7, 7, 7, 7, 7, 7),
    pipeline="zb-h2",
    offload_activations=True,
    view_policy="transient",
    view_lookahead=1,
    shard_optimizer=True,
    rank_layout="dp-inner",
    loss_chunk_tokens=None,
)


def _answer():
    req = Request(
        get_preset("llama2-70b"), load("h100-80g"), 24, 64, 4096, families=("ratrain",), pins=_PINS
    )
    return search(req, top=1).ranked[0]


def test_an_offloading_stage_recomputes_more_where_that_shortens_the_step(monkeypatch):
    relieved = _answer()
    monkeypatch.setattr(structure, "_relieved", lambda ctx, opts, rec: rec)
    cheapest = _answer()
    # The cheapest policies: copy-bound stages. Relieved: more recompute, far less offload.
    assert relieved.step_time_s <= 0.8 * cheapest.step_time_s
    assert max(relieved.peak_memory_bytes) <= relieved.limit_bytes
    more = [
        s
        for s, (a, b) in enumerate(
            zip(relieved.plan.recompute, cheapest.plan.recompute, strict=True)
        )
        if a != b
    ]
    assert more and all(relieved.plan.recompute[s] != "none" for s in more)
