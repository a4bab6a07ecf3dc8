import math
import subprocess
import sys

import pytest

from ratrain.config import Plan
from ratrain.cost import (
    CostModel,
    collective_time_s,
    comm,
    dp_group,
    gemm_time_s,
    only,
    unit_kernels,
)
from ratrain.cost.compute import attention_time_s
from ratrain.errors import RatrainError
from ratrain.models import counts
from ratrain.models.presets import get_preset
from ratrain.platforms import Link, load
from ratrain.schedule.ir import Action, Op

MT = load("mt3000")
GPU = load("a100-80g")  # no on-chip tiers declared: the flat kernel model applies
SPEC = get_preset("llama2-7b")


def test_flat_gemm_and_attention():
    t, bound = gemm_time_s(4096, 4096, 4096, "bf16", GPU)
    assert bound == "flat"
    assert t == pytest.approx(2 * 4096**3 / (312e12 * GPU.efficiency))
    fwd, _ = attention_time_s(1, 32, 32, 4096, 128, "bf16", GPU, causal=False, backward=False)
    causal, _ = attention_time_s(1, 32, 32, 4096, 128, "bf16", GPU, causal=True, backward=False)
    bwd, _ = attention_time_s(1, 32, 32, 4096, 128, "bf16", GPU, causal=False, backward=True)
    assert fwd == pytest.approx(4 * 4096**2 * 4096 / (312e12 * GPU.efficiency))
    assert causal == pytest.approx(fwd / 2) and bwd == pytest.approx(2 * fwd)


def test_tile_model_plugs_in_for_tiered_platforms():
    tiling = pytest.importorskip("ratrain.cost.tiling")
    assert tiling.applies(MT) and not tiling.applies(GPU)
    assert gemm_time_s(512, 512, 512, "fp16", MT) == tiling.gemm_time_s(512, 512, 512, "fp16", MT)


@pytest.mark.parametrize("unit", [1, 17, 33])
def test_unit_kernels_match_counts(unit):
    b, s = 2, 1024
    fwd = sum(k.flops for k in unit_kernels(SPEC, unit, b, s, "F"))
    bwd = sum(k.flops for k in unit_kernels(SPEC, unit, b, s, "B"))
    # Counts charge the full s×s attention; the causal kernel does half of it.
    attn = counts.attention_core_fwd_flops(SPEC, b, s) if counts.is_block(SPEC, unit) else 0
    assert fwd == counts.unit_fwd_flops(SPEC, unit, b, s) - attn // 2
    assert bwd == counts.unit_bwd_flops(SPEC, unit, b, s) - attn
    sel = sum(k.flops for k in unit_kernels(SPEC, unit, b, s, "RC:selective"))
    assert sel == (attn // 2 if attn else 0)


def _plan(**kw):
    d = dict(pp=4, dp=8, micro_batch=1, global_batch=64, seq=4096, compute_dtype="fp16")
    return Plan(**{**d, **kw})


def test_update_is_memory_bound_adam_traffic():
    cm = CostModel(SPEC, _plan(), MT)
    c = cm.action(Action(Op.UPDATE, 1, (5,)))
    params = counts.block_params(SPEC)
    assert c.nbytes == params * (24 + 4) and c.bound == "memory"
    assert c.time_s == pytest.approx(MT.main_memory.latency_s + c.nbytes / 30e9)
    sharded = CostModel(SPEC, _plan(shard_optimizer=True), MT).action(Action(Op.UPDATE, 1, (5,)))
    assert sharded.nbytes == -(-params // 8) * 28


def test_ring_tree_hierarchical_formulas():
    link = Link(bandwidth_bytes_per_s=10e9, latency_s=1e-5, efficiency=0.5)
    S, n = 1e9, 8
    assert comm.ring_allreduce_s(S, n, link) == pytest.approx(2 * 7 / 8 * S / 5e9 + 14e-5)
    assert comm.ring_reduce_scatter_s(S, n, link) == pytest.approx(7 / 8 * S / 5e9 + 7e-5)
    assert comm.tree_allreduce_s(S, n, link) == pytest.approx(2 * S / 5e9 + 6e-5)
    assert comm.ring_allreduce_s(S, 1, link) == 0.0
    a100 = load("a100-80g")
    # 16 ranks, 8 per node: reduce-scatter in the node, all-reduce of S/8 across, all-gather.
    g = comm.Group(n=16, nodes=2, local=8)
    t, algo = collective_time_s("all_reduce", S, g, a100)
    want = 2 * comm.ring_reduce_scatter_s(S, 8, a100.intra_node) + comm.ring_allreduce_s(
        S / 8, 2, a100.inter_node
    )
    assert algo == "hierarchical" and t == pytest.approx(want)
    t1, algo1 = collective_time_s("all_reduce", S, comm.Group(8, 1, 8), a100)
    assert algo1 == "hierarchical:intra" and t1 < t
    # A flat ring that crosses nodes runs at the inter-node pace.
    t_ring, algo_ring = collective_time_s("all_reduce", S, g, MT)
    assert algo_ring == "ring:inter"
    assert t_ring == pytest.approx(comm.ring_allreduce_s(S, 16, MT.inter_node))


def test_rank_layouts_place_groups():
    # pp-inner (the runtime's): rank = replica * pp + stage; DP peers stride by pp.
    assert comm.rank_of(1, 2, pp=4, dp=8) == 9
    assert comm.rank_of(1, 2, pp=4, dp=8, layout="dp-inner") == 10
    assert dp_group(0, pp=4, dp=2, units_per_node=4) == comm.Group(n=2, nodes=2, local=1)
    assert dp_group(0, 4, 2, 4, "dp-inner") == comm.Group(n=2, nodes=1, local=2)
    assert dp_group(1, 2, 64, 4, "dp-inner") == comm.Group(n=64, nodes=16, local=4)
    # Stage neighbours: in a node under pp-inner when the node holds the pipeline.
    assert comm.p2p_link(0, 1, pp=4, dp=2, platform=MT) is MT.intra_node
    assert comm.p2p_link(0, 1, 4, 2, MT, "dp-inner") is MT.intra_node
    assert comm.p2p_link(1, 2, 4, 2, MT, "dp-inner") is MT.inter_node


def test_action_costs_and_categories():
    cm = CostModel(SPEC, _plan(compute_dtype="bf16"), GPU)
    f = cm.action(Action(Op.F, 1, (5,), 0))
    assert f.category == "compute" and f.bound == "flat" and f.time_s > 0
    assert cm.action(Action(Op.B, 1, (5,), 0)).time_s == pytest.approx(2 * f.time_s)
    assert cm.action(Action(Op.F, 3, (33,), 0)).category == "edge"
    assert cm.action(Action(Op.B, 0, (0,), 0)).bound == "memory"
    sync = cm.action(Action(Op.GRAD_SYNC, 1, (5,)))
    assert sync.algorithm.startswith("all_reduce:") and sync.nbytes == counts.block_params(SPEC) * 4
    send = cm.action(Action(Op.SEND_F, 1, (8,), 0))
    assert send.nbytes == 4096 * 4096 * 2 and send.time_s > 0
    assert cm.action(Action(Op.RECV_F, 2, (8,), 0)).time_s == 0.0
    norm = cm.action(Action(Op.GRAD_NORM, 0))
    assert norm.category == "global"
    assert norm.time_s == pytest.approx(2 * math.ceil(math.log2(32)) * GPU.inter_node.latency_s)


def test_scale_zeroes_categories():
    free = CostModel(SPEC, _plan(), GPU, scale=only("compute"))
    assert free.action(Action(Op.F, 1, (5,), 0)).time_s > 0
    for a in [
        Action(Op.F, 0, (0,), 0),
        Action(Op.B, 3, (33,), 0),
        Action(Op.GRAD_SYNC, 1, (5,)),
        Action(Op.UPDATE, 1, (5,)),
        Action(Op.SEND_F, 1, (8,), 0),
        Action(Op.VIEW_FETCH, 1, (5,)),
    ]:
        assert free.action(a).time_s == 0.0, a
    with pytest.raises(RatrainError, match="unknown cost category 'net'"):
        CostModel(SPEC, _plan(), GPU, scale={"net": 0})
    with pytest.raises(RatrainError, match="unknown rank layout"):
        CostModel(SPEC, _plan(), GPU, rank_layout="zigzag")


def test_cost_imports_no_torch():
    code = "import sys, ratrain.cost, ratrain.sim; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_view_fetch_cast_or_all_gather():
    from ratrain.schedule.ir import Resource

    vf = Action(Op.VIEW_FETCH, 1, (5,))
    cast = CostModel(SPEC, _plan(compute_dtype="bf16"), GPU)
    assert cast.action(vf).algorithm == "cast" and cast.resource(vf) is Resource.COPY
    assert cast.action(vf).nbytes == counts.block_params(SPEC) * 2
    gather = CostModel(SPEC, _plan(compute_dtype="bf16", shard_optimizer=True), GPU)
    assert gather.action(vf).algorithm.startswith("all_gather:")
    assert gather.resource(vf) is Resource.DP_NET
    assert gather.action(Action(Op.GRAD_SYNC, 1, (5,))).algorithm.startswith("reduce_scatter:")


@pytest.mark.parametrize("name", ["llama2-7b", "bench-512"])
def test_the_fused_loss_moves_the_heads_gemms_into_its_forward(name):
    # `ratrain.nn.chunked_loss` computes dL/dh and dL/dw in its forward; the backward only
    # scales them. Same GEMM FLOPs in all, none of the plain loss's backward pass.
    spec, b, s = get_preset(name), 2, 512
    head = counts.head_unit(spec)

    def ks(kind, chunk, unit=head):
        return unit_kernels(spec, unit, b, s, kind, loss_chunk_tokens=chunk)

    def flops(kind, chunk):
        return sum(k.flops for k in ks(kind, chunk))

    assert flops("F", 256) == flops("F", None) + flops("B", None)
    assert flops("B", 256) == 0
    assert ks("BI", 256) == ks("B", 256) and ks("BW", 256) == []  # not split
    assert "cross_entropy.bwd" in {k.name for k in ks("B", None)}
    assert "cross_entropy.bwd" not in {k.name for k in ks("B", 256) + ks("F", 256)}
    for kind in ("F", "B", "BI", "BW"):  # blocks and the embedding are the same
        for unit in (0, 1):
            assert ks(kind, 256, unit) == ks(kind, None, unit)


def test_the_cost_model_times_the_fused_head_by_its_own_kernels():
    spec, cpu = get_preset("bench-512"), load("cpu-local")
    plain = CostModel(spec, Plan(pp=2, micro_batch=2, global_batch=4, seq=256), cpu)
    fused = CostModel(spec, plain.plan.replace(loss_chunk_tokens=256), cpu)
    head = Action(Op.F, 1, (counts.head_unit(spec),), 0)
    back = Action(Op.B, 1, (counts.head_unit(spec),), 0)
    assert fused.time_s(head) > plain.time_s(head)
    assert fused.time_s(back) < plain.time_s(back)
    block = Action(Op.F, 1, (5,), 0)
    assert fused.time_s(block) == plain.time_s(block)
