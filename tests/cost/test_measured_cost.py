"""The measured platform terms: loader, efficiency curves, memory-bound kernels, shared
cores, per-action overhead, measured collectives; bounds stay below the simulation."""

import pytest
import yaml

from ratrain.config import Plan
from ratrain.cost import comm
from ratrain.cost.compute import gemm_time_s, unit_kernels
from ratrain.cost.measured import compute_speed, curve_efficiency
from ratrain.cost.model import CostModel
from ratrain.errors import RatrainError
from ratrain.memory import activation_bytes, replay
from ratrain.models.presets import get_preset
from ratrain.planner.time_bound import (
    overheads,
    peak_unit_times,
    step_time_lower_bound_s,
    unit_times,
)
from ratrain.platforms import load
from ratrain.platforms.load import PRESETS_DIR
from ratrain.schedule import build_schedule
from ratrain.schedule.ir import Action, Op
from ratrain.sim import simulate

TINY = get_preset("tiny")
M = "measured: test figure, by hand"


def _measured(tmp_path, cores=2, thread_eff=0.5):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    for dt in ("fp32", "bf16", "fp16"):
        data["compute"]["peak_flops"][dt] = {"value": 1e11, "note": M}
    c = data["compute"]
    c["efficiency_curves"] = {
        "gemm.fp32": {"value": [[1e6, 0.1], [1e9, 0.5]], "note": M},
        "gemm_bwd.fp32": {"value": [[1e6, 0.05], [1e9, 0.4]], "note": M},
        "attention_fwd.fp32": {"value": [[1e6, 0.1], [1e9, 0.2]], "note": M},
        "attention_bwd.fp32": {"value": [[1e6, 0.1], [1e9, 0.15]], "note": M},
    }
    c["memory_bound_bytes_per_s"] = {
        f"{op}.{d}.fp32": {"value": 2e9, "note": M}
        for op in ("rmsnorm", "rope", "swiglu", "add", "cross_entropy")
        for d in ("fwd", "bwd")
    }
    c["cores_per_node"] = {"value": cores, "note": M}
    c["thread_efficiency"] = {"value": thread_eff, "note": M}
    for extra in (
        "rank_speed",
        "rank_speed_tokens",
        "unit_time_factor",
    ):  # tested apart (test_unit_and_rank_...)
        c.pop(extra, None)
    data["runtime"] = {
        "action_overhead_s": {
            "F": {"value": 1e-3, "note": M},
            "B": {"value": 2e-3, "note": M},
            "SEND_F": {"value": 1e-4, "note": M},
            "default": {"value": 0, "note": M},
        },
        "eager_kernels": {"value": True, "note": M},
    }
    data["network"]["collectives"] = {
        "all_reduce": {"value": [[2, 1e-3, 1e8], [4, 2e-3, 5e7]], "note": M}
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    return load(str(path))


def test_loader_reads_measured_sections_and_notes(tmp_path):
    p = _measured(tmp_path)
    assert p.notes["compute.cores_per_node"].startswith("measured")
    assert p.efficiency_curves["gemm.fp32"] == ((1e6, 0.1), (1e9, 0.5))
    assert p.memory_bound_bytes_per_s["rmsnorm.fwd.fp32"] == 2e9
    assert p.overhead_s("F") == 1e-3 and p.overhead_s("UPD") == 0.0
    assert p.collectives["all_reduce"] == ((2, 1e-3, 1e8), (4, 2e-3, 5e7))
    assert p.eager_kernels and p.cores_per_node == 2


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda d: d["compute"].update(cores_per_node={"value": 2}), "provenance"),
        (lambda d: d.update(runtime={"bogus": 1}), "unknown field"),
        (
            lambda d: d["compute"].update(
                efficiency_curves={"gemm.fp32": {"value": [[1, 2, 3]], "note": M}}
            ),
            "2 numbers",
        ),
        (
            lambda d: d.update(runtime={"eager_kernels": {"value": "yes", "note": M}}),
            "true or false",
        ),
    ],
)
def test_loader_rejects_bad_measured_sections(tmp_path, mutate, msg):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RatrainError, match=msg):
        load(str(path))


def test_curve_interpolates_in_log_flops_and_is_flat_beyond():
    pts = ((1e6, 0.1), (1e8, 0.5))
    assert curve_efficiency(pts, 1e3) == 0.1 and curve_efficiency(pts, 1e12) == 0.5
    assert curve_efficiency(pts, 1e7) == pytest.approx(0.3)


def test_gemm_uses_the_measured_curve_and_backward_its_own(tmp_path):
    p = _measured(tmp_path)
    t, bound = gemm_time_s(1000, 1000, 500, "fp32", p)  # 1e9 FLOPs: 0.5 of 1e11
    assert bound == "measured" and t == pytest.approx(1e9 / 5e10)
    tb, _ = gemm_time_s(1000, 1000, 500, "fp32", p, backward=True)
    assert tb == pytest.approx(1e9 / 4e10)
    # bf16 was not measured: the flat model
    assert gemm_time_s(1000, 1000, 500, "bf16", p)[1] == "flat"


def test_memory_bound_kernels_are_charged_only_where_measured(tmp_path):
    p = _measured(tmp_path)
    plan = Plan(micro_batch=2, global_batch=2, seq=64, compute_dtype="fp32")
    ks = unit_kernels(TINY, 1, 2, 64, "F", dtype="fp32")
    ew = [k for k in ks if k.kind == "elementwise"]
    assert {k.args[0] for k in ew} == {"rmsnorm", "rope", "swiglu", "add"}
    with_ew = CostModel(TINY, plan, p).time_s(Action(Op.F, 0, (1,), 0))
    bare = load("a100-80g")
    assert not bare.memory_bound_bytes_per_s  # a datasheet preset does not charge them
    tokens = 2 * 64
    elements = tokens * (2 * TINY.hidden + TINY.hidden + TINY.kv_dim + TINY.ffn + 2 * TINY.hidden)
    # speed 1.0 with 1 rank on 2 cores and 2 threads at efficiency 0.5 -> 1.5
    assert CostModel(TINY, plan, p).speed == pytest.approx(1.5)
    no_ew = _measured_without_ew(tmp_path)
    diff = with_ew - CostModel(TINY, plan, no_ew).time_s(Action(Op.F, 0, (1,), 0))
    assert diff == pytest.approx(elements * 4 / 2e9 / 1.5)


def _measured_without_ew(tmp_path):
    p = _measured(tmp_path)
    from dataclasses import replace

    return replace(p, memory_bound_bytes_per_s={})


def test_shared_cores_slow_every_rank(tmp_path):
    p = _measured(tmp_path, cores=2, thread_eff=0.5)
    assert compute_speed(p, 1) == pytest.approx(1.5)  # two threads
    # Two ranks of one thread each share the same aggregate as one rank's two threads.
    assert compute_speed(p, 2) == pytest.approx(0.75)
    assert compute_speed(p, 4) == pytest.approx(0.375)  # 4 ranks take turns on that
    ideal = _measured(tmp_path, cores=2, thread_eff=1.0)  # independent cores
    assert compute_speed(ideal, 2) == 1.0 and compute_speed(ideal, 4) == 0.5
    f = Action(Op.F, 0, (1,), 0)
    one = CostModel(TINY, Plan(pp=2, global_batch=4, seq=64, compute_dtype="fp32"), p)
    four = CostModel(TINY, Plan(pp=2, dp=2, global_batch=4, seq=64, compute_dtype="fp32"), p)
    over = p.overhead_s("F")
    assert four.time_s(f) - over == pytest.approx(2 * (one.time_s(f) - over))


def _with(tmp_path, **compute):
    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    for extra in ("rank_speed", "rank_speed_tokens", "unit_time_factor"):
        data["compute"].pop(extra, None)
    for k, v in compute.items():  # a mapping is a section of entries, else one entry
        data["compute"][k] = (
            {e: {"value": x, "note": M} for e, x in v.items()}
            if isinstance(v, dict)
            else {"value": v, "note": M}
        )
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return load(str(path))


def test_measured_rank_speed_replaces_the_thread_formula(tmp_path):
    p = _with(tmp_path, rank_speed=[[1, 1.6], [2, 0.8], [4, 0.4]])
    assert p.rank_speed == ((1, 1.6), (2, 0.8), (4, 0.4))
    assert compute_speed(p, 1) == pytest.approx(1.6)
    # between measured counts: the aggregate interpolated (1.6 at 2 and at 4), shared by 3
    assert compute_speed(p, 3) == pytest.approx(1.6 / 3)
    q = _with(tmp_path, rank_speed=[[1, 1.0], [2, 0.9], [4, 0.5]])  # aggregates 1.8, 2.0
    assert compute_speed(q, 3) == pytest.approx(1.9 / 3)  # per-rank interpolation: 0.7
    assert compute_speed(p, 8) == pytest.approx(0.2)  # beyond: 4 ranks' aggregate shared
    plan = Plan(pp=2, global_batch=4, seq=64, compute_dtype="fp32")
    f = Action(Op.F, 0, (1,), 0)
    base = _with(tmp_path, rank_speed=[[1, 1.0], [2, 1.0]])
    over = p.overhead_s("F")
    slow, fast = CostModel(TINY, plan, p).time_s(f), CostModel(TINY, plan, base).time_s(f)
    assert slow - over == pytest.approx((fast - over) / 0.8)


def test_unit_time_factor_scales_blocks_and_head_not_the_embedding(tmp_path):
    plan = Plan(pp=1, global_batch=4, seq=64, compute_dtype="fp32")
    one = CostModel(TINY, plan, _with(tmp_path))
    p = _with(tmp_path, unit_time_factor={"block.fwd.fp32": 1.5, "head.bwd.fp32": 0.5})
    scaled = CostModel(TINY, plan, p)
    head = TINY.n_layers + 1
    over = {op: p.overhead_s(op) for op in ("F", "B", "RC")}

    def pair(op, unit):
        a = Action(op, 0, (unit,), 0)
        return one.time_s(a) - over[op.value], scaled.time_s(a) - over[op.value]

    plain, fwd = pair(Op.F, 1)
    assert fwd == pytest.approx(1.5 * plain)
    plain, bwd = pair(Op.B, 1)
    assert bwd == pytest.approx(plain)  # block.bwd not measured: 1
    plain, bwd = pair(Op.B, head)
    assert bwd == pytest.approx(0.5 * plain)
    plain, fwd = pair(Op.F, 0)
    assert fwd == pytest.approx(plain)  # the embedding is a gather: no factor


def test_split_backward_halves_take_their_own_factors_else_the_backwards(tmp_path):
    """B_IN's kernels take the "bin" factor and B_W's the "bw" factor where the platform
    measured them; a half without one takes "bwd"'s, as both did before they were
    measured; 1F1B's F and B are untouched by them."""
    plan = Plan(pp=1, global_batch=4, seq=64, compute_dtype="fp32", pipeline="zb-h1")
    one = CostModel(TINY, plan, _with(tmp_path))
    head = TINY.n_layers + 1
    bwd = {"block.bwd.fp32": 1.2, "head.bwd.fp32": 0.8}
    halves = {"block.bin.fp32": 1.5, "block.bw.fp32": 0.7, "head.bin.fp32": 1.1}
    old = CostModel(TINY, plan, _with(tmp_path, unit_time_factor=bwd))
    new = CostModel(TINY, plan, _with(tmp_path, unit_time_factor={**bwd, **halves}))

    def kernels_s(cm, op, unit):
        a = Action(op, 0, (unit,), 0)
        return cm.time_s(a) - cm.platform.overhead_s(op.value)

    for unit, kind in ((1, "block"), (head, "head")):
        for op, half in ((Op.B_IN, "bin"), (Op.B_W, "bw")):
            plain = kernels_s(one, op, unit)
            assert plain > 0
            assert kernels_s(old, op, unit) == pytest.approx(bwd[f"{kind}.bwd.fp32"] * plain)
            want = halves.get(f"{kind}.{half}.fp32", bwd[f"{kind}.bwd.fp32"])  # head.bw: bwd's
            assert kernels_s(new, op, unit) == pytest.approx(want * plain), (kind, half)
        for op in (Op.F, Op.B):  # what 1F1B runs: the same with or without the halves
            assert kernels_s(new, op, unit) == pytest.approx(kernels_s(old, op, unit))
    # the embedding takes no factor: its B_W (the scatter-add) is the kernels' time
    assert kernels_s(new, Op.B_W, 0) == pytest.approx(kernels_s(one, Op.B_W, 0))
    # a half without even a "bwd" factor: 1
    only_fwd = CostModel(TINY, plan, _with(tmp_path, unit_time_factor={"block.fwd.fp32": 2.0}))
    assert kernels_s(only_fwd, Op.B_IN, 1) == pytest.approx(kernels_s(one, Op.B_IN, 1))


def test_the_fused_head_takes_its_own_factors_else_the_plain_heads(tmp_path):
    """Under the fused chunked loss the head's F and B take "head-fused" factors where the
    platform measured them, else the plain head's; its B_IN (the whole backward: the
    runtime does not split it) takes "bwd"'s. Blocks never take them."""
    plan = Plan(pp=1, global_batch=4, seq=64, compute_dtype="fp32", loss_chunk_tokens=32)
    head = TINY.n_layers + 1
    plain = {"head.fwd.fp32": 1.2, "head.bwd.fp32": 0.8, "head.bin.fp32": 0.6}
    fused = {"head-fused.fwd.fp32": 1.5, "head-fused.bwd.fp32": 2.0, "block.fwd.fp32": 1.1}
    one = CostModel(TINY, plan, _with(tmp_path))
    old = CostModel(TINY, plan, _with(tmp_path, unit_time_factor=plain))
    new = CostModel(TINY, plan, _with(tmp_path, unit_time_factor={**plain, **fused}))
    zb = plan.replace(pipeline="zb-h1")
    new_zb = CostModel(TINY, zb, _with(tmp_path, unit_time_factor={**plain, **fused}))

    def kernels_s(cm, op, unit=head):
        a = Action(op, 0, (unit,), 0)
        return cm.time_s(a) - cm.platform.overhead_s(op.value)

    assert kernels_s(old, Op.F) == pytest.approx(1.2 * kernels_s(one, Op.F))
    assert kernels_s(old, Op.B) == pytest.approx(0.8 * kernels_s(one, Op.B))
    assert kernels_s(new, Op.F) == pytest.approx(1.5 * kernels_s(one, Op.F))
    assert kernels_s(new, Op.B) == pytest.approx(2.0 * kernels_s(one, Op.B))
    assert kernels_s(new_zb, Op.B_IN) == pytest.approx(2.0 * kernels_s(one, Op.B))
    assert kernels_s(new, Op.F, 1) == pytest.approx(1.1 * kernels_s(one, Op.F, 1))


def test_a_units_fixed_time_is_charged_per_action_at_the_ranks_speed(tmp_path):
    """`unit_fixed_s` adds its seconds / the rank's speed to every F, B, B_IN and B_W of a
    block or the head (keyed as the factors, halves falling back to "bwd"), not to the
    embedding; a full recomputation pays the forward's, a selective one none."""
    fixed = {"block.fwd.fp32": 2e-3, "block.bwd.fp32": 3e-3, "head.fwd.fp32": 1e-3}
    head = TINY.n_layers + 1
    for pipeline in ("1f1b", "zb-h1"):
        plan = Plan(pp=1, global_batch=4, seq=64, compute_dtype="fp32", pipeline=pipeline)
        one = CostModel(TINY, plan, _with(tmp_path))
        more = CostModel(TINY, plan, _with(tmp_path, unit_fixed_s=fixed))
        ops = (Op.F, Op.B) if pipeline == "1f1b" else (Op.F, Op.B_IN, Op.B_W)
        for op in ops:
            for unit, kind in ((0, None), (1, "block"), (head, "head")):
                a = Action(op, 0, (unit,), 0)
                d = "fwd" if op is Op.F else "bwd"
                want = fixed.get(f"{kind}.{d}.fp32", 0.0) if kind else 0.0
                got = more.time_s(a) - one.time_s(a)
                assert got == pytest.approx(want / one.speed, abs=1e-15), (op, unit)
    for policy, want in (("full", 2e-3), ("selective", 0.0)):
        plan = Plan(pp=1, global_batch=4, seq=64, compute_dtype="fp32", recompute=policy)
        one = CostModel(TINY, plan, _with(tmp_path))
        more = CostModel(TINY, plan, _with(tmp_path, unit_fixed_s=fixed))
        rc = Action(Op.RECOMPUTE, 0, (1,), 0)
        assert more.time_s(rc) - one.time_s(rc) == pytest.approx(want / one.speed, abs=1e-15)


def test_unit_fixed_s_loads_zero_and_refuses_negative(tmp_path):
    assert _with(tmp_path, unit_fixed_s={"block.fwd.fp32": 0}).unit_fixed_s == {"block.fwd.fp32": 0}
    with pytest.raises(RatrainError, match="unit_fixed_s.block.fwd.fp32"):
        _with(tmp_path, unit_fixed_s={"block.fwd.fp32": -1e-3})


@pytest.mark.parametrize("name", ["cpu-local", "a100-80g", "mt3000"])
def test_shipped_platform_files_cost_as_before(tmp_path, name):
    """A platform file as shipped (no "bin"/"bw" factors) loads, and every action of a 1F1B
    schedule costs its kernels times the file's "fwd"/"bwd" factor, as before the halves
    were measured; adding halves to it changes no 1F1B cost nor the simulated step."""
    from dataclasses import replace

    from ratrain.cost.compute import kernels_time_s

    p = load(name)
    assert not any(k.split(".")[1] in ("bin", "bw") for k in p.unit_time_factor)
    plan = Plan(pp=2, micro_batch=2, global_batch=8, seq=64, compute_dtype="fp32")
    cm = CostModel(TINY, plan, p)
    sched = build_schedule(TINY, plan)
    seen = set()
    for a in (x for stage in sched.stages for x in stage):
        if a.op not in (Op.F, Op.B):
            continue
        seen.add(a.op)
        want = 0.0
        for u in a.units:
            t, _ = kernels_time_s(cm.kernels(Action(a.op, a.stage, (u,), a.mb)), "fp32", p)
            kind = "head" if u == TINY.n_layers + 1 else "block"
            d = "fwd" if a.op is Op.F else "bwd"
            f = p.unit_time_factor.get(f"{kind}.{d}.fp32", 1.0) if u else 1.0
            want += t * f / cm.speed
        assert cm.time_s(a) == pytest.approx(want + p.overhead_s(a.op.value), rel=1e-12)
    assert seen == {Op.F, Op.B}
    halves = {f"{kind}.{d}.fp32": 3.0 for kind in ("block", "head") for d in ("bin", "bw")}
    more = replace(p, unit_time_factor={**p.unit_time_factor, **halves})
    assert simulate(TINY, plan, more).step_time_s == simulate(TINY, plan, p).step_time_s
    zb = plan.replace(pipeline="zb-h1")
    if p.unit_time_factor:  # the halves do reach a zero-bubble plan
        assert simulate(TINY, zb, more).step_time_s > simulate(TINY, zb, p).step_time_s


def test_norm_pays_the_slowest_stage_sum_of_squares(tmp_path):
    from ratrain.models.counts import unit_params

    data = yaml.safe_load((PRESETS_DIR / "cpu-local.yaml").read_text())
    mb = data["compute"]["memory_bound_bytes_per_s"]
    mb.pop("grad_norm.fwd.fp32", None)
    without = tmp_path / "a.yaml"
    without.write_text(yaml.safe_dump(data))
    mb["grad_norm.fwd.fp32"] = {"value": 1e9, "note": M}
    with_ = tmp_path / "b.yaml"
    with_.write_text(yaml.safe_dump(data))
    plan = Plan(pp=2, global_batch=4, seq=64, compute_dtype="fp32", clip_grad=1.0)
    a, b = CostModel(TINY, plan, load(str(without))), CostModel(TINY, plan, load(str(with_)))
    norm = Action(Op.GRAD_NORM, 1)
    stage_params = [sum(unit_params(TINY, u) for u in plan.stage_units(TINY, s)) for s in range(2)]
    extra = max(stage_params) * 4 / 1e9 / b.speed
    assert b.time_s(norm) - a.time_s(norm) == pytest.approx(extra)
    sharded = Plan(
        pp=2,
        dp=2,
        global_batch=4,
        seq=64,
        compute_dtype="fp32",
        clip_grad=1.0,
        shard_optimizer=True,
    )
    sh = CostModel(TINY, sharded, load(str(with_)))
    base = CostModel(TINY, sharded, load(str(without)))
    per_replica = -(-max(stage_params) // 2) * 4 / 1e9 / sh.speed
    assert sh.time_s(norm) - base.time_s(norm) == pytest.approx(per_replica)


def test_collective_compute_is_charged_to_the_next_compute_action(tmp_path):
    from ratrain.sim.simulate import simulate_schedule

    per_byte = 1e-9
    off, on = _with(tmp_path, collective_compute_s_per_byte=0.0), None
    on = _with(tmp_path, collective_compute_s_per_byte=per_byte)
    for plan, kind_share in (
        (Plan(pp=1, dp=2, global_batch=4, seq=64, compute_dtype="fp32"), 1.0),
        (Plan(pp=1, dp=2, global_batch=4, seq=64, compute_dtype="fp32", shard_optimizer=True), 0.5),
    ):
        sched = build_schedule(TINY, plan)
        a, b = CostModel(TINY, plan, off), CostModel(TINY, plan, on)
        syncs = [x for x in sched.stages[0] if x.op is Op.GRAD_SYNC]
        assert syncs
        for x in syncs:
            assert b.stolen_compute_s(x) == pytest.approx(per_byte * kind_share * b.nbytes(x))
            assert a.stolen_compute_s(x) == 0.0
        # What the compute actions gain is what the collectives before each of them took;
        # a collective with no compute after it in its stage's list is not charged.
        acts = sched.stages[0]
        expected, pending = 0.0, 0.0
        for x in acts:
            if x.resource.value == "compute":
                expected, pending = expected + pending, 0.0
            else:
                pending += b.stolen_compute_s(x)
        ra, rb = simulate_schedule(sched, a), simulate_schedule(sched, b)
        busy = [
            sum(e.end_s - e.start_s for e in r.events if e.resource == "compute") for r in (ra, rb)
        ]
        assert expected > 0
        assert busy[1] - busy[0] == pytest.approx(expected)
        assert rb.step_time_s >= ra.step_time_s
    # One replica: no collective traffic, nothing charged.
    solo = Plan(pp=2, dp=1, global_batch=4, seq=64, compute_dtype="fp32")
    sched = build_schedule(TINY, solo)
    assert simulate_schedule(sched, CostModel(TINY, solo, on)).step_time_s == pytest.approx(
        simulate_schedule(sched, CostModel(TINY, solo, off)).step_time_s
    )


def test_overhead_and_measured_collectives(tmp_path):
    p = _measured(tmp_path)
    plan = Plan(pp=1, dp=2, global_batch=4, seq=64, compute_dtype="fp32")
    cm = CostModel(TINY, plan, p)
    sync = cm.action(Action(Op.GRAD_SYNC, 0, (1,)))
    nbytes = cm.nbytes(Action(Op.GRAD_SYNC, 0, (1,)))
    assert sync.algorithm == "all_reduce:measured:intra"
    assert sync.time_s == pytest.approx(1e-3 + nbytes / 1e8)
    t, algo = comm.collective_time_s("all_reduce", 1e6, comm.Group(4, 1, 4), p)
    assert algo == "measured:intra" and t == pytest.approx(2e-3 + 1e6 / 5e7)
    # reduce-scatter was not measured: the α–β formula
    assert comm.collective_time_s("reduce_scatter", 1e6, comm.Group(2, 1, 2), p)[1] == "ring:intra"
    send = CostModel(TINY, Plan(pp=2, global_batch=4, seq=64, compute_dtype="fp32"), p)
    a = Action(Op.SEND_F, 0, (2,), 0)
    assert send.time_s(a) == pytest.approx(1e-4 + comm.p2p_time_s(send.nbytes(a), p.intra_node))


@pytest.mark.parametrize("cores", [1, 2, 8])
def test_planner_bounds_stay_below_the_simulation_on_measured_platforms(tmp_path, cores):
    p = _measured(tmp_path, cores=cores)
    ut = unit_times(TINY, p, 1, 64, "fp32")
    peak = peak_unit_times(TINY, p, 1, 64, "fp32")
    for f in ("f_block", "b_block", "f_head", "b_head", "rc_full", "rc_selective"):
        assert getattr(peak, f) <= getattr(ut, f) * (1 + 1e-12)
    for pp, dp, m, rec, sched in [
        (1, 1, 2, "none", "ratrain"),
        (2, 1, 4, "full", "baseline"),
        (2, 2, 3, "selective", "gpu-style"),
        (4, 1, 6, "none", "ratrain"),
    ]:
        plan = Plan(
            pp=pp,
            dp=dp,
            global_batch=dp * m,
            seq=64,
            compute_dtype="fp32",
            recompute=rec,
            schedule=sched,
        )
        res = simulate(TINY, plan, p)
        split = plan.blocks_per_stage(TINY)
        lb = step_time_lower_bound_s(
            split, plan.microbatches, ut, plan.recompute, overheads(TINY, plan, p)
        )
        assert lb <= res.step_time_s * (1 + 1e-12), (plan, lb, res.step_time_s)


def test_eager_ledger_counts_more_than_the_fused_one(tmp_path):
    for dtype in ("fp32", "bf16"):
        plan = Plan(pp=2, micro_batch=2, global_batch=8, seq=64, compute_dtype=dtype)
        for unit in (1, TINY.n_layers + 1):
            fused = activation_bytes(TINY, plan, unit, "none", flash=True)
            eager = activation_bytes(TINY, plan, unit, "none", flash=True, eager_kernels=True)
            assert eager > fused
        sch = build_schedule(TINY, plan)
        a = replay(sch, TINY, plan, keep_trace=False)
        b = replay(sch, TINY, plan, keep_trace=False, eager_kernels=True)
        assert all(y.peak_bytes > x.peak_bytes for x, y in zip(a.stages, b.stages, strict=True))
    p = _measured(tmp_path)
    plan = Plan(pp=2, micro_batch=2, global_batch=8, seq=64, compute_dtype="bf16")
    sim = simulate(TINY, plan, p)
    assert sim.peak_memory_bytes == [
        s.peak_bytes
        for s in replay(build_schedule(TINY, plan), TINY, plan, eager_kernels=True).stages
    ]
