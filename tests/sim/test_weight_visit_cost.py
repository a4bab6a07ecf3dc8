"""An OFFLOAD or RELOAD of what B_IN keeps for a deferred B_W (`WEIGHT_VISIT`) moves other
bytes than the same unit's activations: the simulator and the cost model's cache price them
apart (they once shared one cache key, and a stage that moves both, under zb-h1 every
stage but the first and last, charged one the other's time)."""

from ratrain.config import Plan
from ratrain.cost.model import CostModel
from ratrain.models.presets import get_preset
from ratrain.platforms.load import load
from ratrain.schedule.ir import WEIGHT_VISIT, Action, Op
from ratrain.schedule.lowering import action_bytes
from ratrain.sim import simulate


def test_weight_visits_and_activation_moves_are_priced_apart():
    spec, platform = get_preset("llama2-7b"), load("a100-80g")
    plan = Plan(
        pp=4,
        dp=1,
        global_batch=12,
        seq=1024,
        schedule="ratrain",
        pipeline="zb-h1",
        recompute="none",
        compute_dtype="bf16",
        grad_dtype="bf16",
        offload_activations=True,
    )
    res = simulate(spec, plan, platform, memory_timeline=False)
    kinds = set()
    for e in res.events:
        a = e.action
        if a.op not in (Op.OFFLOAD, Op.RELOAD):
            continue
        fresh = CostModel(spec, plan, platform).time_s(a)  # no cache shared with others
        assert abs(e.dur_s - fresh) <= 1e-12 * max(1.0, fresh), (e.name, e.dur_s, fresh)
        kinds.add((a.stage, a.units[0], a.visit == WEIGHT_VISIT))
    both = {(s, u) for s, u, w in kinds if w} & {(s, u) for s, u, w in kinds if not w}
    assert both  # some unit of some stage moves both
    s, u = min(both)
    act = action_bytes(Action(Op.OFFLOAD, s, (u,), 0), spec, plan)
    weight = action_bytes(Action(Op.OFFLOAD, s, (u,), 0, WEIGHT_VISIT), spec, plan)
    assert act != weight  # so that sharing one price is wrong
    cm = CostModel(spec, plan, platform)
    assert cm.time_s(Action(Op.OFFLOAD, s, (u,), 0)) != cm.time_s(
        Action(Op.OFFLOAD, s, (u,), 0, WEIGHT_VISIT)
    )
