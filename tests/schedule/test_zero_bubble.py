"""ZB-H1 and ZB-H2 (`pipeline: zb-h1 | zb-h2`): the split backward in the IR, the checker,
the ledger, the simulator, the runtime's execution against Baseline-1F1B, and the
refusals."""

import dataclasses

import pytest

from ratrain.config import Plan
from ratrain.cost import CostModel
from ratrain.cost.compute import unit_kernels
from ratrain.cost.model import ActionCost
from ratrain.errors import RatrainError
from ratrain.memory import replay
from ratrain.models.counts import is_block
from ratrain.models.presets import get_preset
from ratrain.models.spec import ModelSpec
from ratrain.platforms import load
from ratrain.schedule import build_schedule, check_schedule, find_problems
from ratrain.schedule.ir import Action, Op, parse_action
from ratrain.schedule.zerobubble import pass_order
from ratrain.sim import simulate_schedule

UNIFORM = ModelSpec("uniform", 8, 256, 4, 4, 512, 1000, max_seq=64)
UNSHARED = dataclasses.replace(load("cpu-local"), cores_per_node=None, rank_speed=())
SCHEDULES = ["baseline", "gpu-style", "ratrain"]


def _plan(pp, m, pipeline="zb-h1", **kw):
    base = dict(pp=pp, dp=2, micro_batch=1, global_batch=2 * m, seq=64, pipeline=pipeline)
    return Plan(**{**base, **kw})


def test_split_ops_parse_and_format():
    for text in ("1BI3@5", "0BW0@2", "2B1@7"):
        assert str(parse_action(text)) == text
    assert Action(Op.B_IN, 0, (1,), 0).resource is Action(Op.B, 0, (1,), 0).resource


def test_plan_field_round_trips_and_is_validated():
    p = _plan(2, 4)
    assert Plan.from_dict(p.to_dict()) == p
    assert Plan().pipeline == "1f1b"
    assert _plan(2, 4, pipeline="zb-h2").split_backward and not Plan().split_backward
    with pytest.raises(RatrainError, match="pipeline must be one of 1f1b, zb-h1, zb-h2"):
        _plan(2, 4, pipeline="zb-h3")


def _in_flight(order):
    held = peak = 0
    for op, _ in order:
        held += (op is Op.F) - (op is Op.B_W)
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("m", [4, 8])
def test_pass_order_keeps_at_most_pp_in_flight(pp, m):
    for s in range(pp):
        order = pass_order(pp, m, s)
        assert _in_flight(order) <= pp
        assert sorted(mb for op, mb in order if op is Op.B_W) == list(range(m))


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("m", [2, 4, 8, 16])
def test_zb_h2_pass_order_doubles_the_warm_up(pp, m):
    for s in range(pp):
        order = pass_order(pp, m, s, "zb-h2")
        first = next(i for i, (op, _) in enumerate(order) if op is Op.B_IN)
        assert first == min(2 * (pp - s - 1) + 1, m)  # the warm-up's forwards, then one
        assert _in_flight(order) == min(max(pp, 2 * (pp - s) - 1), m)
        for op in (Op.F, Op.B_IN, Op.B_W):
            assert [mb for o, mb in order if o is op] == list(range(m))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("m", [2, 4, 8])
@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
def test_checker_accepts_zb(schedule, pp, m, pipeline):
    spec = get_preset("tiny")
    plan = _plan(pp, m, pipeline, schedule=schedule, sync_bucket_bytes=0)
    sch = build_schedule(spec, plan)
    assert not any(a.op is Op.B for a in sch.actions())
    check_schedule(sch, spec, plan)


def test_checker_accepts_zb_h1_with_buckets_sharding_and_fp16():
    spec = get_preset("tiny")
    for kw in (dict(sync_bucket_bytes=1), dict(shard_optimizer=True), dict(compute_dtype="fp16")):
        plan = _plan(2, 4, **kw)
        check_schedule(build_schedule(spec, plan), spec, plan)


def _broken(sch, s, fn):
    sch.stages[s] = fn(list(sch.stages[s]))
    return sch


def test_checker_rejects_b_w_before_b_in():
    spec = get_preset("tiny")
    plan = _plan(2, 4)
    sch = build_schedule(spec, plan)
    bi, bw = Action(Op.B_IN, 1, (3,), 0), Action(Op.B_W, 1, (3,), 0)

    def swap(acts):
        i, j = acts.index(bi), acts.index(bw)
        acts[i], acts[j] = acts[j], acts[i]
        return acts

    problems = find_problems(_broken(sch, 1, swap), spec, plan)
    assert any("1BW0@3 before its B_IN" in p for p in problems), problems


def test_checker_rejects_sync_before_the_last_b_w():
    spec = get_preset("tiny")
    plan = _plan(2, 4, schedule="ratrain")
    sch = build_schedule(spec, plan)
    sync = next(a for a in sch.stages[0] if a.op is Op.GRAD_SYNC and a.units == (1,))
    last_w = Action(Op.B_W, 0, (1,), 3)

    def move(acts):
        acts.remove(sync)
        acts.insert(acts.index(last_w), sync)
        return acts

    problems = find_problems(_broken(sch, 0, move), spec, plan)
    assert any("0SYNC@1 is issued before the last BW of unit 1" in p for p in problems), problems


def test_checker_rejects_a_missing_or_doubled_half():
    spec = get_preset("tiny")
    plan = _plan(2, 4)
    sch = build_schedule(spec, plan)
    bw = Action(Op.B_W, 1, (4,), 2)
    sch.stages[1].remove(bw)
    sch.stages[1].append(Action(Op.B, 1, (4,), 2))
    problems = find_problems(sch, spec, plan)
    assert any("stage 1 has 1 B, 1 BI and 0 BW of (4, 2)" in p for p in problems), problems


def test_split_kernels_are_the_backward():
    spec = get_preset("llama2-7b")
    for u in (0, 1, spec.n_layers + 1):
        b = unit_kernels(spec, u, 1, 4096, "B")
        bi = unit_kernels(spec, u, 1, 4096, "BI")
        bw = unit_kernels(spec, u, 1, 4096, "BW")
        assert sorted(bi + bw, key=repr) == sorted(b, key=repr)
    f = sum(k.flops for k in unit_kernels(spec, 1, 1, 4096, "F") if k.kind == "gemm")
    w = sum(k.flops for k in unit_kernels(spec, 1, 1, 4096, "BW") if k.kind == "gemm")
    assert w == f  # derived: dW is one GEMM of the forward's size per linear layer
    assert not any(k.kind == "attention" for k in unit_kernels(spec, 1, 1, 4096, "BW"))


class _EqualTimes(CostModel):
    """Blocks: F = B_IN = B_W = 1 s (B = 2 s); everything else free."""

    def action(self, a):
        t = 0.0
        if a.op in (Op.F, Op.B_IN, Op.B_W, Op.B) and is_block(self.spec, a.units[0]):
            t = 2.0 if a.op is Op.B else 1.0
        return ActionCost(t, "compute")

    def stolen_compute_s(self, a):
        return 0.0


def _idle(spec, plan):
    r = simulate_schedule(build_schedule(spec, plan), _EqualTimes(spec, plan, UNSHARED))
    return r.bubble_fraction * r.step_time_s, r


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_zb_h1_bubble_is_a_third_of_1f1b(schedule):
    """pp=4, m=8, equal F/B_in/B_w times T (2 blocks a stage): ZB-H1 idles (p-1)·T per
    stage, 1F1B 3(p-1)·T (Qi et al. 2024, §3.1)."""
    one, r1 = _idle(UNIFORM, _plan(4, 8, "1f1b", schedule=schedule))
    zb, rz = _idle(UNIFORM, _plan(4, 8, schedule=schedule))
    assert one == pytest.approx(3 * 3 * 2)
    assert zb == pytest.approx(3 * 2)
    assert zb <= 0.4 * one  # idle time per stage: exactly a third
    # As a fraction of the (shorter) step: 6/54 against 18/66, 0.41x.
    assert rz.bubble_fraction == pytest.approx(6 / 54)
    assert r1.bubble_fraction == pytest.approx(18 / 66)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_zb_h2_fills_the_wait_for_the_first_gradient(schedule):
    """Equal F/B_in/B_w times per block. Balanced stages: ZB-H2 is ZB-H1 (what is left is
    the ramp). Stage 0 heavier (5 blocks against 3, m = 8, 15 s of compute per microbatch
    against 9): under ZB-H1 stage 0 runs F0, F1 (10 s), then waits for stage 1's F0 and
    B_IN0 (5 + 3 + 3 = 11 s); under ZB-H2 it runs F2 there, and the step is stage 0's
    compute, 8 x 15 = 120 s, with no wait at all."""
    for pp, m in ((2, 8), (4, 8), (4, 4)):
        h1, r1 = _idle(UNIFORM, _plan(pp, m, schedule=schedule))
        h2, r2 = _idle(UNIFORM, _plan(pp, m, "zb-h2", schedule=schedule))
        assert r2.step_time_s == pytest.approx(r1.step_time_s)
    split = dict(schedule=schedule, layer_split=(5, 3))
    steps = {
        pipe: _idle(UNIFORM, _plan(2, 8, pipe, **split))[1].step_time_s
        for pipe in ("1f1b", "zb-h1", "zb-h2")
    }
    assert steps == pytest.approx({"1f1b": 124, "zb-h1": 121, "zb-h2": 120})


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("pp, m", [(2, 4), (2, 8), (4, 4), (4, 8)])
def test_zb_h1_ledger_peak_within_5_percent_of_1f1b(schedule, pp, m):
    spec = get_preset("llama2-7b")
    kw = dict(schedule=schedule, seq=4096)
    peaks = {}
    for pipe in ("1f1b", "zb-h1"):
        plan = _plan(pp, m, pipe, **kw)
        peaks[pipe] = replay(build_schedule(spec, plan), spec, plan).peak_bytes
    assert peaks["zb-h1"] <= 1.05 * peaks["1f1b"]


@pytest.mark.parametrize("pp, m", [(2, 8), (4, 8)])
def test_zb_h2_ledger_holds_more_microbatches_than_zb_h1(pp, m):
    """Stage 0 holds up to 2p - 1 microbatches' activations under ZB-H2 against p: its peak
    grows by exactly p - 1 microbatches' keep; no stage's peak shrinks, and the last
    stage's, whose limit is p under both, is the same."""
    from ratrain.sizes.activations import activation_bytes

    spec = get_preset("llama2-7b")
    peaks = {}
    for pipe in ("zb-h1", "zb-h2"):
        plan = _plan(pp, m, pipe, seq=4096)
        peaks[pipe] = [
            st.peak_bytes for st in replay(build_schedule(spec, plan), spec, plan).stages
        ]
    keep = sum(
        activation_bytes(spec, plan, u, "none", flash=True) for u in plan.stage_units(spec, 0)
    )
    assert all(b >= a for a, b in zip(peaks["zb-h1"], peaks["zb-h2"], strict=True))
    assert peaks["zb-h2"][0] - peaks["zb-h1"][0] == (pp - 1) * keep
    assert peaks["zb-h2"][-1] == peaks["zb-h1"][-1]


def test_zb_h1_ledger_keeps_what_b_w_needs_then_frees_it():
    spec = get_preset("tiny")
    plan = _plan(2, 4)
    sch = build_schedule(spec, plan)
    led = replay(sch, spec, plan)
    end = led.stages[0].rows[-1][1]
    assert end[4] == 0  # activation class: nothing left at the step's end
    # The gradient starts at the first B_W, not at the first B_IN.
    acts = sch.stages[1]
    trace = dict(led.stages[1].rows)
    first_bi = next(i for i, a in enumerate(acts) if a.op is Op.B_IN)
    first_bw = next(i for i, a in enumerate(acts) if a.op is Op.B_W)
    assert trace[first_bi][3] == 0 and trace[first_bw][3] > 0


def test_realistic_simulation_is_faster_and_checked():
    from ratrain.sim import simulate

    spec = get_preset("llama2-7b")
    r = {
        pipe: simulate(
            spec, _plan(4, 8, pipe, seq=4096, dp=1, global_batch=8), "a100-80g", check=True
        )
        for pipe in ("1f1b", "zb-h1")
    }
    assert r["zb-h1"].step_time_s < r["1f1b"].step_time_s
    assert r["zb-h1"].bubble_fraction < r["1f1b"].bubble_fraction


@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
def test_fsdp_pp_is_refused_in_one_line(pipeline):
    spec = get_preset("tiny")
    plan = _plan(2, 4, pipeline, schedule="fsdp-pp", shard_optimizer=True)
    with pytest.raises(RatrainError, match=f"{pipeline} does not support schedule fsdp-pp") as e:
        build_schedule(spec, plan)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize("pp, m", [(2, 8), (4, 8)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_offload_under_a_split_backward(pipeline, pp, m, recompute):
    """Offload with a split backward moves two things, and the checker requires each move
    before its use:
    - a microbatch with another forward between its F and its B_IN: its activations, after
      F, back (``#0``) before its B_IN (or the RECOMPUTE before it);
    - a microbatch whose weight pass waits behind another forward or input-gradient pass:
      what each block's and the head's B_IN keeps for B_W, after B_IN, back (``#1``)
      before B_W.
    Offloading never raises a stage's ledger peak; it lowers stage 0's (which holds the
    most microbatches' activations) where what is offloaded is more than a checkpoint,
    and the last stage's (which holds up to p microbatches' weight-pass state)."""
    spec = get_preset("llama2-7b")
    peaks = {}
    for off in (False, True):
        plan = _plan(pp, m, pipeline, seq=4096, recompute=recompute, offload_activations=off)
        sch = build_schedule(spec, plan)
        check_schedule(sch, spec, plan)
        peaks[off] = [st.peak_bytes for st in replay(sch, spec, plan).stages]
    for s, acts in enumerate(sch.stages):
        order = pass_order(pp, m, s, pipeline)
        at = {(op, mb): i for i, (op, mb) in enumerate(order)}
        f_to_bi = {
            mb: [op for op, _ in order[at[Op.F, mb] + 1 : at[Op.B_IN, mb]]] for mb in range(m)
        }
        bi_to_bw = {
            mb: [op for op, _ in order[at[Op.B_IN, mb] + 1 : at[Op.B_W, mb]]] for mb in range(m)
        }
        acts_out = {mb for mb, ops in f_to_bi.items() if Op.F in ops}
        w_out = {mb for mb, ops in bi_to_bw.items() if set(ops) - {Op.B_W}}
        # the blocks and the head split (no fused loss here); the embedding's B_W runs whole
        split = [u for u in plan.stage_units(spec, s) if u > 0]
        for visit, mbs, units in ((0, acts_out, plan.stage_units(spec, s)), (1, w_out, split)):
            want = {(u, mb) for u in units for mb in mbs}
            for op in (Op.OFFLOAD, Op.RELOAD):
                got = {(a.unit, a.mb) for a in acts if a.op is op and a.visit == visit}
                assert got == want, (s, op, visit)
        for a in acts:
            if a.op is Op.B_W:
                reloads = {d.visit for d in sch.deps_of(a) if d.op is Op.RELOAD}
                assert reloads == (
                    {1} if (a.unit, a.mb) in {(u, mb) for u in split for mb in w_out} else set()
                ), a
    assert all(b <= a for a, b in zip(peaks[False], peaks[True], strict=True))
    if recompute != "full":  # a full recompute's checkpoints can be too small to decide it
        assert peaks[True][0] < peaks[False][0]
    assert peaks[True][-1] < peaks[False][-1]


def test_the_checker_wants_b_w_state_reloaded_before_b_w():
    spec = get_preset("tiny")
    plan = _plan(2, 4, offload_activations=True)
    sch = build_schedule(spec, plan)
    (rel,) = [a for a in sch.stages[1] if a.op is Op.RELOAD and a.visit == 1][:1]
    bw = Action(Op.B_W, rel.stage, rel.units, rel.mb)
    sch.deps[bw] = tuple(d for d in sch.deps_of(bw) if d != rel)
    assert any(
        "does not depend on the RELOAD of what its B_IN kept" in p
        for p in find_problems(sch, spec, plan)
    )
    sch.stages[1] = [a for a in sch.stages[1] if a != rel]
    assert any("offloaded, without a RELOAD" in p for p in find_problems(sch, spec, plan))


RUNTIME_PLAN = Plan(
    pp=2, dp=2, micro_batch=1, global_batch=8, seq=16, compute_dtype="fp32", model="tiny"
)


def _runtime_losses(plan, variants, steps=5, **cfg_kw):
    import _runtime as harness

    return harness.losses_and_reference(get_preset("tiny"), plan, variants, steps, **cfg_kw)


ZB_VARIANTS = {
    # every lowering, the global norm (clip), per-bucket syncs, ZeRO-1 and the fused loss
    "baseline": {"schedule": "baseline"},
    "gpu-style": {"schedule": "gpu-style"},
    "ratrain": {"schedule": "ratrain"},
    "ratrain-buckets": {"schedule": "ratrain", "sync_bucket_bytes": 2**16},
    "ratrain-zero1": {"schedule": "ratrain", "shard_optimizer": True},
    "ratrain-chunked-loss": {"schedule": "ratrain", "loss_chunk_tokens": 8},
}


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_runtime_zb_h1_equals_baseline_1f1b_bitwise_fp32():
    """Executed ZB-H1 (B_IN and a deferred B_W per unit) gives Baseline-1F1B's losses bit
    for bit in fp32, in every lowering and with buckets, ZeRO-1 and the fused loss (whose
    head runs unsplit); and the reference trainer's within 1e-5."""
    pytest.importorskip("torch")
    variants = [("1f1b", {"schedule": "baseline", "pipeline": "1f1b"})]
    variants += [(f"zb-{k}", {**v, "pipeline": "zb-h1"}) for k, v in ZB_VARIANTS.items()]
    variants += [("1f1b-chunked-loss", {"schedule": "baseline", "loss_chunk_tokens": 8})]
    # zb-h2: its longer warm-up holds more microbatches; the sums are the same
    h2 = ("ratrain", "ratrain-zero1", "ratrain-chunked-loss")
    variants += [(f"zb2-{k}", {**ZB_VARIANTS[k], "pipeline": "zb-h2"}) for k in h2]
    out, ref, _ = _runtime_losses(RUNTIME_PLAN, variants)
    base = out["1f1b"]
    assert len(base) == 5 and base[-1] < base[0]
    for name in ZB_VARIANTS:
        want = out["1f1b-chunked-loss"] if "chunked" in name else base
        assert out[f"zb-{name}"] == want, name
    for name in h2:
        want = out["1f1b-chunked-loss"] if "chunked" in name else base
        assert out[f"zb2-{name}"] == want, name
    assert max(abs(a - b) / abs(b) for a, b in zip(out["zb-ratrain"], ref, strict=True)) <= 1e-5


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_runtime_zb_h1_half_precision_equals_1f1b(dtype):
    """bf16 and fp16 (a loss scale that overflows at first: skipped steps, then updates)."""
    pytest.importorskip("torch")
    plan = RUNTIME_PLAN.replace(compute_dtype=dtype)
    variants = [
        ("1f1b", {"schedule": "baseline", "pipeline": "1f1b"}),
        ("zb", {"schedule": "ratrain", "pipeline": "zb-h1"}),
    ]
    out, _, res = _runtime_losses(plan, variants, steps=4, loss_scale_init=2.0**20)
    assert out["zb"] == out["1f1b"]
    if dtype == "fp16":  # the same overflow skips, step by step
        skips = {}
        for name in ("1f1b", "zb"):
            (records,) = [r.runs[name].records for r in res if r.runs[name].records]
            skips[name] = [r["skipped"] for r in records]
        assert skips["zb"] == skips["1f1b"]
        assert any(skips["zb"]) and not all(skips["zb"])


ZB_LIFECYCLE = {
    # recomputed units: RECOMPUTE before B_IN, the weight pass from the recomputed graph
    "full-recompute": dict(recompute="full"),
    "selective-recompute": dict(recompute="selective"),
    # offloaded, with the attention core recomputed inside B_IN
    "offload-selective": dict(offload_activations=True, recompute="selective"),
    # bf16 views fetched per use and all-gathered from ZeRO-1 shards; dropped after B_IN
    # (B_W does not read the view: dW = dYᵀ·X)
    "bf16-transient-sharded-recompute": dict(
        compute_dtype="bf16",
        view_policy="transient",
        view_lookahead=2,
        shard_optimizer=True,
        recompute=("full", "none"),
    ),
}


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(ZB_LIFECYCLE))
def test_runtime_zb_h1_lifecycle_options_equal_1f1b(name):
    pytest.importorskip("torch")
    plan = RUNTIME_PLAN.replace(**ZB_LIFECYCLE[name])
    variants = [
        ("1f1b", {"schedule": "baseline", "pipeline": "1f1b"}),
        ("zb", {"schedule": "ratrain", "pipeline": "zb-h1"}),
    ]
    out, ref, _ = _runtime_losses(plan, variants, steps=3)
    assert out["zb"] == out["1f1b"]
    if ref is not None:
        assert max(abs(a - b) / abs(b) for a, b in zip(out["zb"], ref, strict=True)) <= 1e-5


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_runtime_zb_four_stages_equals_1f1b():
    """Four stages, zb-h1 and zb-h2 (stage 0 runs 6 forwards before its first B_IN, 7 in
    flight), recomputing under zb-h2 too, and offloading under both."""
    pytest.importorskip("torch")
    plan = RUNTIME_PLAN.replace(pp=4, dp=1, recompute="none")
    variants = [
        ("1f1b", {"schedule": "baseline", "pipeline": "1f1b"}),
        ("zb", {"schedule": "ratrain", "pipeline": "zb-h1"}),
        ("zb2", {"schedule": "ratrain", "pipeline": "zb-h2"}),
        ("zb2-recompute", {"schedule": "ratrain", "pipeline": "zb-h2", "recompute": "full"}),
        # offloaded microbatches: B_IN's holder moved out after F and back before B_IN
        ("zb-offload", {"schedule": "ratrain", "pipeline": "zb-h1", "offload_activations": True}),
        (
            "zb2-offload-recompute",
            {
                "schedule": "ratrain",
                "pipeline": "zb-h2",
                "offload_activations": True,
                "recompute": "full",
            },
        ),
    ]
    out, ref, _ = _runtime_losses(plan, variants, steps=3)
    for name in ("zb", "zb2", "zb2-recompute", "zb-offload", "zb2-offload-recompute"):
        assert out[name] == out["1f1b"], name
    assert max(abs(a - b) / abs(b) for a, b in zip(out["zb"], ref, strict=True)) <= 1e-5


def test_runtime_refuses_a_schedule_of_another_pipeline_in_one_line():
    pytest.importorskip("torch")
    from ratrain.runtime.executor import StageExecutor

    spec = get_preset("tiny")
    sch = build_schedule(spec, _plan(2, 4))
    with pytest.raises(RatrainError, match="the schedule's pipeline zb-h1 differs") as e:
        StageExecutor(None, None, None, sch, None, spec, _plan(2, 4, pipeline="1f1b"), None)
    assert "\n" not in str(e.value)


def test_train_refuses_an_unsupported_zb_h1_plan_before_any_rank_starts(tmp_path, capsys):
    from _cli import one_line_error
    from ratrain.config import save_plan

    path = tmp_path / "zb.yaml"
    save_plan(_plan(2, 4, model="tiny", schedule="fsdp-pp", shard_optimizer=True), path)
    err = one_line_error(capsys, ["train", "--plan", str(path), "--steps", "1"])
    assert "pipeline zb-h1 does not support schedule fsdp-pp" in err
    assert capsys.readouterr().out == ""  # nothing started: no header


def test_a_split_backwards_halves_are_charged_a_fixed_cost_per_action():
    """Measured where the platform has the figures, else B's for each half."""
    import copy

    from ratrain.bench.platform import base_platform_dict
    from ratrain.platforms import from_dict

    d = base_platform_dict("cpu-local")
    p = from_dict(d)
    assert p.overhead_s("BI") == p.overhead_s("BW") == p.overhead_s("B") > 0
    d = copy.deepcopy(d)
    d["runtime"]["action_overhead_s"]["BI"] = {"value": 3e-4, "note": "measured: test"}
    p = from_dict(d)
    assert p.overhead_s("BI") == 3e-4 and p.overhead_s("BW") == p.overhead_s("B")


def test_calibrate_measures_the_split_backwards_fixed_costs():
    from ratrain.calibrate.overhead import measure_action_overhead

    got = measure_action_overhead(quick=True)
    assert {"F", "B", "UPD", "RC", "BI", "BW"} <= set(got)
    assert all(v > 0 for v in got.values())
