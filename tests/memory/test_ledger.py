"""The memory ledger and the activation formulas."""

import pytest

from ratrain.config import Plan
from ratrain.memory import STATE_CLASSES, activation_bytes, replay
from ratrain.models.counts import total_params, unit_params
from ratrain.models.presets import get_preset
from ratrain.schedule import Op, build_schedule
from ratrain.sizes.activations import (
    gpt_block_tensors,
    llama_block_tensors,
    recompute_bytes,
    tensors_bytes,
)

TINY = get_preset("tiny")  # h 64, 4 heads, 2 kv heads (kv_dim 32), ffn 176, vocab 256
MODEL_STATES = ("master", "optimizer", "view", "grad")


def plan_of(pp=1, m=1, **kw) -> Plan:
    kw.setdefault("micro_batch", 2)
    kw.setdefault("seq", 64)
    return Plan(pp=pp, global_batch=m * kw["micro_batch"] * kw.get("dp", 1), **kw)


def stage_params(plan: Plan, s: int = 0) -> int:
    return sum(unit_params(TINY, u) for u in plan.stage_units(TINY, s))


def model_states(by_class: dict) -> int:
    return sum(by_class[c] for c in MODEL_STATES)


# -- activation formulas --------------------------------------------------------------------


@pytest.mark.parametrize("h,a,s,b", [(4096, 32, 2048, 1), (1024, 16, 512, 4), (64, 4, 64, 2)])
def test_gpt_block_reduces_to_korthikanti_eq1(h, a, s, b):
    tensors = gpt_block_tensors(h, a, s)
    assert tensors_bytes(tensors, s * b) == 34 * s * b * h + 5 * a * s * s * b  # Table 2 / eq. 1
    assert tensors_bytes(tensors, s * b, "selective") == 34 * s * b * h  # §4.2
    assert tensors_bytes(tensors, s * b, "full") == 2 * s * b * h
    flash = gpt_block_tensors(h, a, s, flash=True)  # no s² term, plus the fp32 log-sum-exp
    assert tensors_bytes(flash, s * b) == 34 * s * b * h + 4 * b * a * s


@pytest.mark.parametrize("name", ["tiny", "llama2-7b", "llama2-70b", "qwen2.5-32b"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_llama_block_closed_forms(name, dtype):
    spec = get_preset(name)
    plan = Plan(micro_batch=2, global_batch=2, seq=128, compute_dtype=dtype)
    s, b, c = plan.seq, plan.micro_batch, 4 if dtype == "fp32" else 2
    h, kv, f, a = spec.hidden, spec.kv_dim, spec.ffn, spec.n_heads
    per_token = c * (6 * h + 2 * kv + 4 * f)
    block = 1

    def act(policy, flash):
        return activation_bytes(spec, plan, block, policy, flash=flash)

    assert act("none", False) == s * b * per_token + c * a * s * s * b
    assert act("none", True) == s * b * per_token + 4 * a * s * b
    assert act("selective", False) == act("selective", True) == s * b * per_token
    assert act("full", False) == act("full", True) == c * s * b * h
    assert (
        recompute_bytes(spec, plan, block, "full", flash=True) == act("none", True) - c * s * b * h
    )
    assert len(llama_block_tensors(spec, s, c, flash=True)) == 13
    # embedding keeps the int64 ids, the head its norm input/output, fp32 log-probs, targets
    assert activation_bytes(spec, plan, 0, "full", flash=True) == 8 * s * b
    head = spec.n_layers + 1
    assert activation_bytes(spec, plan, head, "full", flash=True) == s * b * (
        2 * c * h + 4 * spec.vocab + 8
    )


def test_llama7b_block_at_16_bit_is_close_to_the_gpt_figure():
    # kv = h, ffn = 2.6875 h: 2·(8h + 10.75h) = 37.5·sbh, vs GPT's 34·sbh (no dropout masks,
    # but a wider MLP with one more ffn-wide tensor)
    spec = get_preset("llama2-7b")
    plan = Plan(micro_batch=1, global_batch=1, seq=4096)
    s, h = plan.seq, spec.hidden
    assert activation_bytes(spec, plan, 1, "selective", flash=True) == 37.5 * s * h


# -- the ledger -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
@pytest.mark.parametrize("flash", [True, False])
def test_ledger_activation_per_unit_matches_the_formula(policy, flash):
    plan = plan_of(recompute=policy, schedule="baseline")
    sch = build_schedule(TINY, plan)
    stage = replay(sch, TINY, plan, flash=flash).stages[0]
    act = {i: row["activation"] for i, row in stage.trace}
    acts = sch.stages[0]
    prev = 0
    for i, a in enumerate(acts):
        if a.op is Op.F:
            want = activation_bytes(
                TINY, plan, a.unit, plan.recompute_of(TINY, 0, a.unit), flash=flash
            )
            assert act[i] - prev == want, a
            prev = act[i]
        if a.op is Op.RECOMPUTE:  # units above a.unit have run their B and freed theirs
            kept = sum(
                activation_bytes(TINY, plan, u, plan.recompute_of(TINY, 0, u), flash=flash)
                for u in range(a.unit + 1)
            )
            assert act[i] == kept + recompute_bytes(TINY, plan, a.unit, policy, flash=flash)
    assert any(a.op is Op.RECOMPUTE for a in acts) == (policy != "none")


@pytest.mark.parametrize("pp", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 6])
def test_baseline_holds_min_p_minus_s_m_microbatches_at_its_peak(pp, m):
    plan = plan_of(pp, m, micro_batch=4, seq=128, schedule="baseline")
    ledger = replay(build_schedule(TINY, plan), TINY, plan)
    for st in ledger.stages:
        per_mb = sum(
            activation_bytes(TINY, plan, u, "none", flash=True)
            for u in plan.stage_units(TINY, st.stage)
        )
        assert st.breakdown_at_peak["activation"] == min(pp - st.stage, m) * per_mb


@pytest.mark.parametrize("grad_dtype,per_param", [("fp32", 2 + 4 + 8 + 4), ("bf16", 2 + 4 + 8 + 2)])
def test_model_states_are_mixed_precision_adam(grad_dtype, per_param):
    # bf16 view 2 + fp32 master 4 + Adam m, v 8 + gradient 4 (fp32) or 2 (bf16)
    plan = plan_of(schedule="baseline", grad_dtype=grad_dtype)
    stage = replay(build_schedule(TINY, plan), TINY, plan).stages[0]
    psi = stage_params(plan)
    assert stage.static_bytes == (2 + 4 + 8) * psi
    assert max(model_states(row) for _, row in stage.trace) == per_param * psi


def test_fp32_compute_has_no_separate_view():
    plan = plan_of(schedule="baseline", compute_dtype="fp32")
    stage = replay(build_schedule(TINY, plan), TINY, plan).stages[0]
    assert stage.static_bytes == (4 + 8) * stage_params(plan)
    assert all(row["view"] == 0 for _, row in stage.trace)


@pytest.mark.parametrize("d", [2, 4, 8])
def test_sharding_matches_zero_stage_1_and_2(d):
    # Rajbhandari et al. 2020 with fp16 view and gradients: stage 1 (2 + 2)Ψ + 12Ψ/d while
    # the full gradients live; stage 2 2Ψ + (2 + 12)Ψ/d once the reduce-scatter has landed
    plan = plan_of(
        dp=d, schedule="baseline", shard_optimizer=True, compute_dtype="fp16", grad_dtype="fp16"
    )
    sch = build_schedule(TINY, plan)
    stage = replay(sch, TINY, plan).stages[0]
    psi = stage_params(plan)
    assert psi % d == 0  # the tiny units split evenly, so no rounding
    assert max(model_states(row) for _, row in stage.trace) == (2 + 2) * psi + 12 * psi // d
    at_update = next(i for i, a in enumerate(sch.stages[0]) if a.op is Op.UPDATE)
    assert model_states(dict(stage.trace)[at_update]) == 2 * psi + (2 + 12) * psi // d
    # the default fp32 gradients add 2Ψ (full) / 2Ψ/d (after the reduce-scatter)
    plan32 = plan.replace(grad_dtype="fp32")
    stage32 = replay(build_schedule(TINY, plan32), TINY, plan32).stages[0]
    assert max(model_states(row) for _, row in stage32.trace) == 6 * psi + 12 * psi // d


def test_ratrain_frees_each_gradient_after_its_update():
    d = 4
    plan = plan_of(dp=d, shard_optimizer=True, clip_grad=None)
    sch = build_schedule(TINY, plan)
    trace = dict(replay(sch, TINY, plan).stages[0].trace)
    acts = sch.stages[0]
    grads = [trace[i]["grad"] for i, a in enumerate(acts) if a.op is Op.UPDATE]
    assert grads == sorted(grads, reverse=True) and len(set(grads)) == len(grads)
    last = next(i for i in range(len(acts) - 1, -1, -1) if acts[i].op is Op.UPDATE)
    u = acts[last].unit  # during the last update only its 1/d gradient shard is left
    assert trace[last]["grad"] == unit_params(TINY, u) * 4 // d


def test_trace_and_peak_agree():
    plan = plan_of(2, 3, recompute="selective", offload_activations=True, view_policy="transient")
    sch = build_schedule(TINY, plan)
    ledger = replay(sch, TINY, plan)
    for st in ledger.stages:
        totals = [sum(row.values()) for _, row in st.trace]
        assert [i for i, _ in st.trace] == list(range(len(sch.stages[st.stage])))
        assert st.peak_bytes == max(totals) == totals[st.peak_action_index]
        assert sum(st.breakdown_at_peak.values()) == st.peak_bytes
        assert set(st.breakdown_at_peak) == set(STATE_CLASSES)
        last = st.trace[-1][1]
        assert last["activation"] == last["comm_buffer"] == last["view"] == 0
        assert min(min(row.values()) for _, row in st.trace) >= 0
    assert ledger.peak_bytes == max(st.peak_bytes for st in ledger.stages)
    assert ledger.stages[ledger.worst_stage].peak_bytes == ledger.peak_bytes
    lean = replay(sch, TINY, plan, keep_trace=False)
    assert [st.peak_bytes for st in lean.stages] == [st.peak_bytes for st in ledger.stages]
    assert lean.stages[0].trace == []


GRID = [
    {},
    {"recompute": "full"},
    {"recompute": ("selective", "first:1")},
    {"dp": 2, "shard_optimizer": True},
    {"view_policy": "transient"},
    {"view_policy": "transient", "view_lookahead": 0, "dp": 2, "shard_optimizer": True},
    {"offload_activations": True, "recompute": "full"},
    {"compute_dtype": "fp16", "grad_dtype": "fp16"},
    {"compute_dtype": "fp32", "view_policy": "transient", "clip_grad": None},
]


@pytest.mark.parametrize("pp,m", [(1, 1), (1, 3), (2, 1), (2, 3), (4, 2), (4, 8)])
def test_ratrain_never_holds_more_than_baseline(pp, m):
    for policies in GRID:
        if isinstance(policies.get("recompute"), tuple) and pp != 2:
            continue
        plan = plan_of(pp, m, **policies)
        ratrain = replay(build_schedule(TINY, plan), TINY, plan)
        baseline = replay(build_schedule(TINY, plan.replace(schedule="baseline")), TINY, plan)
        for r, b in zip(ratrain.stages, baseline.stages, strict=True):
            assert r.peak_bytes <= b.peak_bytes, (policies, r.stage)


def test_offload_lowers_the_activation_peak():
    # stage 0 of 4 keeps 4 microbatches in flight: offloading all but the ones in use helps
    plan = plan_of(4, 8, micro_batch=4, seq=128, layer_split=(1, 1, 1, 1), recompute="full")
    kept = replay(build_schedule(TINY, plan), TINY, plan).stages[0]
    off_plan = plan.replace(offload_activations=True)
    off = replay(build_schedule(TINY, off_plan), TINY, off_plan).stages[0]
    assert off.breakdown_at_peak["activation"] < kept.breakdown_at_peak["activation"]


def test_transient_views_bound_the_view_bytes():
    plan = plan_of(1, 2, view_policy="transient", view_lookahead=1)
    stage = replay(build_schedule(TINY, plan), TINY, plan).stages[0]
    block_view = unit_params(TINY, 1) * 2
    assert max(row["view"] for _, row in stage.trace) <= 3 * block_view
    assert stage.static_bytes == (4 + 8) * stage_params(plan)  # no view between steps


def test_boundary_buffers():
    # a middle stage holds a received activation until its first F takes it; the next
    # receive, posted one ahead (`post_receives_ahead`), holds its own buffer from before
    plan = plan_of(3, 2, schedule="baseline", clip_grad=None)
    sch = build_schedule(TINY, plan)
    trace = dict(replay(sch, TINY, plan).stages[1].trace)
    boundary = plan.micro_batch * plan.seq * TINY.hidden * 2
    acts = sch.stages[1]
    recvs = [i for i, a in enumerate(acts) if a.op is Op.RECV_F]
    assert trace[recvs[0]]["comm_buffer"] == boundary
    assert trace[recvs[1]]["comm_buffer"] == 2 * boundary
    first_f = next(i for i, a in enumerate(acts) if a.op is Op.F)
    assert recvs[1] < first_f
    assert trace[first_f]["comm_buffer"] == boundary


def test_tied_embeddings_on_one_stage_are_stored_once():
    spec = get_preset("tiny-tied")
    plan = plan_of(schedule="baseline", seq=32)
    stage = replay(build_schedule(spec, plan), spec, plan).stages[0]
    assert stage.static_bytes == (2 + 4 + 8) * total_params(spec)


# -- the runtime's end-of-step holdings (eager kernels, gloo sends) -------------------------


def test_norm_temporaries_and_held_sends():
    from ratrain.sizes.activations import boundary_bytes
    from ratrain.sizes.workspace import bookkeeping_bytes, norm_workspace_bytes

    plan = plan_of(pp=2, m=4, schedule="baseline", clip_grad=1.0)
    sch = build_schedule(TINY, plan)
    plain = replay(sch, TINY, plan, eager_kernels=True)
    held = replay(sch, TINY, plan, eager_kernels=True, sends_held=True)
    for s, (a, b) in enumerate(zip(plain.stages, held.stages, strict=True)):
        acts = sch.stages[s]
        norm = next(i for i, x in enumerate(acts) if x.op is Op.GRAD_NORM)
        before = dict(a.trace)[norm - 1]
        at = dict(a.trace)[norm]
        nws = max(norm_workspace_bytes(TINY, plan, u) for u in plan.stage_units(TINY, s))
        assert at["workspace"] - before["workspace"] == nws  # transient, at the NORM only
        # Every SEND of the step is still held at the NORM where sends complete only
        # when waited (beside the reductions' bookkeeping); polled, fewer are.
        sends = sum(1 for x in acts[:norm] if x.op in (Op.SEND_F, Op.SEND_B))
        assert sends == 4
        comm = bookkeeping_bytes(TINY, plan)
        assert dict(b.trace)[norm]["comm_buffer"] == comm + sends * boundary_bytes(TINY, plan)
        assert at["comm_buffer"] < dict(b.trace)[norm]["comm_buffer"]
        assert b.peak_bytes >= a.peak_bytes
    fused = replay(sch, TINY, plan)  # fused kernels: no NORM temporaries
    for s, m in enumerate(fused.stages):
        norm = next(i for i, x in enumerate(sch.stages[s]) if x.op is Op.GRAD_NORM)
        assert dict(m.trace)[norm]["workspace"] == 0


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h1", "zb-h2"])
def test_offload_frees_nothing_where_the_host_tier_is_the_same_memory(pipeline):
    # On a CPU an OFFLOAD moves nothing (`Platform.host_is_main_memory`): every stage's peak
    # is the plan's without offload, as the runtime measures it there; elsewhere it saves.
    spec = get_preset("tiny")
    plan = Plan(pp=4, micro_batch=1, global_batch=8, seq=64, pipeline=pipeline)
    off = plan.replace(offload_activations=True)
    sched = build_schedule(spec, off)
    assert any(a.op is Op.OFFLOAD for st in sched.stages for a in st)
    kept = replay(sched, spec, off, offload_frees=False)
    plain = replay(build_schedule(spec, plan), spec, plan)
    moved = replay(sched, spec, off)
    assert [s.peak_bytes for s in kept.stages] == [s.peak_bytes for s in plain.stages]
    assert sum(s.peak_bytes for s in moved.stages) < sum(s.peak_bytes for s in plain.stages)


def test_the_runtime_ledger_and_the_simulator_count_offload_on_a_cpu_as_held():
    from ratrain.platforms import load
    from ratrain.sim import simulate
    from ratrain.train.job import runtime_ledger

    spec = get_preset("tiny")
    plan = Plan(pp=4, micro_batch=1, global_batch=8, seq=64, compute_dtype="fp32")
    off = plan.replace(offload_activations=True)
    cpu = [s.peak_bytes for s in runtime_ledger(spec, off, "cpu").stages]
    assert cpu == [s.peak_bytes for s in runtime_ledger(spec, plan, "cpu").stages]
    assert sum(s.peak_bytes for s in runtime_ledger(spec, off, "cuda").stages) < sum(cpu)
    local = load("cpu-local")
    assert (
        simulate(spec, off, local).peak_memory_bytes
        == simulate(spec, plan, local).peak_memory_bytes
    )
