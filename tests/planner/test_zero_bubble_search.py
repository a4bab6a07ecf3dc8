"""The planner's pipeline knob: zb-h1 is searched beside 1F1B where it is
supported and the pipeline has a bubble, under every recompute policy, kept where the
simulator finds it faster and the ledger finds it fits; its bounds stay below what the
simulator and the ledger say, with recomputation and transient views too."""

import itertools
from dataclasses import replace

import pytest

from ratrain.cli import main
from ratrain.config import Plan, load_plan
from ratrain.cost.model import CostModel
from ratrain.errors import RatrainError
from ratrain.memory import replay
from ratrain.models.presets import get_preset
from ratrain.planner import Request, search
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.fit import memory_bound
from ratrain.planner.paper import AblationRow, ZbRow
from ratrain.planner.space import family_of, knob_combos, make_plan, structures
from ratrain.planner.time_bound import (
    overheads,
    peak_unit_times,
    step_time_lower_bound_s,
    unit_times,
)
from ratrain.platforms import load
from ratrain.schedule import build_schedule, check_schedule
from ratrain.schedule.zerobubble import refuse_unsupported
from ratrain.sim import simulate_schedule
from ratrain.sim.simulate import memory_microbatches, platform_ledger

TINY = get_preset("tiny")
A100 = load("a100-80g")


def _req(pins=None, families=("ratrain",), platform=A100, clusters=8, gb=32):
    return Request(TINY, platform, clusters, gb, 128, pins=pins or {}, families=families)


def _unsupported(p: Plan) -> bool:
    """What zb-h1 is never combined with: what `refuse_unsupported` refuses."""
    try:
        refuse_unsupported(p.replace(pipeline="zb-h1"))
    except RatrainError:
        return True
    return False


def test_picks_zb_h1_where_the_simulator_finds_it_faster_and_it_fits():
    req = _req()
    best = search(req, top=3).best
    one = search(req.with_(families=("ratrain-no-zb",)), top=1).best
    assert best.plan.pipeline == "zb-h1" and best.plan.pp > 1
    assert one.plan.pipeline == "1f1b"
    assert best.tokens_per_s > one.tokens_per_s
    # The same plan with 1F1B's pass order is slower in the simulator.
    ev = Evaluator(req)
    assert ev.simulate(best.plan.replace(pipeline="1f1b")).step_time_s > best.step_time_s
    # It passes the schedule checker, and the ledger's full replay fits the cap.
    sch = build_schedule(TINY, best.plan)
    check_schedule(sch, TINY, best.plan)
    led = platform_ledger(sch, TINY, best.plan, A100, keep_trace=False)
    assert max(s.peak_bytes for s in led.stages) <= usable_bytes(req)


def test_pruned_search_equals_exhaustive_with_zb_h1():
    req = _req({"pp": 2}, clusters=4, gb=8)
    got = search(req, top=3)
    want = search(req, top=3, prune=False)
    assert got.best.plan.pipeline == "zb-h1"
    assert [c.plan for c in got.ranked] == [c.plan for c in want.ranked]


@pytest.mark.parametrize(
    "pins, families",
    [
        ({"pp": 2}, ("fsdp-pp",)),
        ({"pp": 1}, ("ratrain",)),
    ],
)
def test_1f1b_where_zb_h1_is_unsupported_or_has_no_bubble(pins, families):
    res = search(_req(pins, families=families), top=5)
    assert res.ranked
    assert all(c.plan.pipeline == "1f1b" for c in res.ranked)


def test_zb_h1_knobs_only_where_supported():
    req = _req({"pipeline": "zb-h1"}, families=("ratrain", "gpu-style", "fsdp-pp"))
    seen = 0
    for name in req.families:
        fam = family_of(name)
        for st in structures(req, fam):
            kns = knob_combos(req, fam, st)
            if name == "fsdp-pp":
                assert kns == []
            for kn in kns:
                assert kn.pipeline == "zb-h1"
                assert not _unsupported(make_plan(req, st, kn, ("none",) * st.pp))
                seen += 1
    assert seen
    # Never combined with what it does not support, whatever is ranked.
    for pins in ({}, {"pp": 2}, {"pp": 3, "micro_batch": 1}):
        for c in search(_req(pins, families=("ratrain", "gpu-style", "fsdp-pp")), top=8).ranked:
            assert c.plan.pipeline == "1f1b" or not _unsupported(c.plan)
            assert c.plan.pipeline == "1f1b" or c.plan.pp > 1
    # Offload is supported: a pin of both plans offloading zero-bubble candidates.
    res = search(_req({"pipeline": "zb-h1", "offload_activations": True, "pp": 2}), top=3)
    assert res.ranked
    assert all(c.plan.pipeline == "zb-h1" and c.plan.offload_activations for c in res.ranked)


def test_recomputing_candidates_have_their_zb_h1_twins():
    # Recomputation pinned: zb-h1 is searched with it, and ranked beside 1F1B.
    res = search(_req({"pp": 2, "recompute": "full"}), top=8)
    assert {c.plan.pipeline for c in res.ranked} == {"1f1b", "zb-h1"}
    assert all(set(c.plan.recompute) == {"full"} for c in res.ranked)
    # A cap under which the best zb-h1 plan recomputes: the pruned search still equals
    # the unpruned one, and every zb-h1 plan ranked fits by the ledger.
    tight = replace(
        A100, usable_memory_bytes=2_600_000, workspace_bytes=100_000, headroom_fraction=0.0
    )
    req = _req({"pipeline": "zb-h1"}, platform=tight, clusters=4, gb=8)
    got, want = search(req, top=3), search(req, top=3, prune=False)
    assert got.ranked and [c.plan for c in got.ranked] == [c.plan for c in want.ranked]
    assert set(got.best.plan.recompute) != {"none"}
    for c in got.ranked:
        assert c.plan.pipeline == "zb-h1"
        led = platform_ledger(build_schedule(TINY, c.plan), TINY, c.plan, tight, keep_trace=False)
        assert max(s.peak_bytes for s in led.stages) <= usable_bytes(req)


@pytest.mark.parametrize(
    "pins, families, conflict",
    [
        ({"schedule": "fsdp-pp"}, ("fsdp-pp",), "--pin schedule=fsdp-pp"),
        ({}, ("fsdp-pp",), "--family fsdp-pp"),
    ],
)
def test_a_pin_zb_h1_refuses_is_named_in_one_line(pins, families, conflict, capsys):
    argv = ["plan", "--model", "tiny", "--platform", "a100-80g", "--clusters", "8"]
    argv += ["--global-batch", "32", "--seq", "128", "--pin", "pipeline=zb-h1"]
    argv += [f"--pin={k}={v}" for k, v in pins.items()]
    argv += [x for f in families for x in ("--family", f)]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--pin pipeline=zb-h1 conflicts with {conflict}: pipeline zb-h1 does not support" in err


_CASES = [
    (platform, model, schedule, pp, m)
    for platform in ("mt3000", "a100-80g", "cpu-local")
    for model in ("tiny", "llama2-7b")
    for schedule in ("ratrain", "gpu-style", "baseline")
    for pp, m in ((2, 1), (2, 5), (3, 4), (4, 9))
]


@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize("platform, model, schedule, pp, m", _CASES[::5])
def test_zb_bounds_stay_below_the_simulator_and_the_ledger(
    platform, model, schedule, pp, m, pipeline
):
    pf, spec = load(platform), get_preset(model)
    dt = "fp32" if platform == "cpu-local" else "bf16"
    seq = min(512, spec.max_seq)
    kw = dict(pp=pp, dp=2, micro_batch=1, global_batch=2 * m, seq=seq, schedule=schedule)
    plan = Plan(**kw, compute_dtype=dt, pipeline=pipeline, model=spec.name)
    split = plan.blocks_per_stage(spec)
    sch = build_schedule(spec, plan)
    step = simulate_schedule(sch, CostModel(spec, plan, pf)).step_time_s
    ut = unit_times(spec, pf, 1, seq, dt)
    over = overheads(spec, plan, pf)
    for lb in (
        step_time_lower_bound_s(split, m, ut, ("none",) * pp, over, pipeline=pipeline),
        step_time_lower_bound_s(split, m, peak_unit_times(spec, pf, 1, seq, dt), pipeline=pipeline),
    ):
        assert lb <= step * (1 + 1e-9)
    # The memory bound of no recomputation: below the ledger's peak of every stage.
    led = platform_ledger(sch, spec, plan, pf, keep_trace=False)
    mb = memory_bound(Request(spec, pf, 2 * pp, 2 * m, seq), plan)
    for s in range(pp):
        assert mb.stage(s, "none") <= led.stages[s].peak_bytes


_VIEWS = [
    ("ratrain", "persistent", 1),
    ("ratrain", "transient", 1),
    ("ratrain", "transient", 2),
    ("gpu-style", "persistent", 1),
    ("baseline", "persistent", 1),
]
_MIXED = ("none", "selective", "first:2", "full")
_RC_CASES = list(
    itertools.product(
        ("mt3000", "a100-80g", "cpu-local"),
        ("tiny", "llama2-7b"),
        _VIEWS,
        ("selective", "full", "first:1", "per-stage"),
        ((2, 1), (2, 5), (3, 4), (4, 9)),
    )
)[::11]
"""A slice of the 480 combinations that still meets every pair of views and policy,
policy and shape, platform and model (the whole grid: 7 s on the 2-core machine)."""


@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
def test_zb_bounds_with_recompute_stay_below_the_simulator_and_the_ledger(pipeline):
    """RECOMPUTE before each B_IN: its time on the paths back in the step-time bound, and
    in the memory bound what B_IN leaves for B_W whatever the policy, of the units above
    and of the microbatches waiting for their B_W pass (`MemoryBound`)."""
    tight = _check_bounds(_RC_CASES, pipeline, offload=False)
    assert tight > len(_RC_CASES)  # most stages: within 5% of the ledger


_OFF_CASES = [c for c in _RC_CASES if c[2][0] == "ratrain"] + [
    c
    for c in itertools.product(
        ("mt3000", "cpu-local"),
        ("llama2-7b",),
        _VIEWS[:3],
        ("none", "full", "per-stage"),
        ((4, 9),),
    )
][::2]
"""Offload exists in the lifecycle lowering only: the ratrain cases above, and more with
four stages (where stage 0 offloads the most)."""


@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
def test_zb_bounds_with_offload_stay_below_the_simulator_and_the_ledger(pipeline):
    """Offload under a split backward: the microbatches with another forward before their
    B_IN leave the device between F and B_IN, and what B_IN keeps stays (`MemoryBound`'s
    offload terms, the split backward's profile on top)."""
    _check_bounds(_OFF_CASES, pipeline, offload=True)


def _check_bounds(cases, pipeline: str, offload: bool) -> int:
    """Both step-time bounds under the simulator and the memory bound under the ledger's
    peak of every stage, for each case; returns how many stages are within 5%."""
    tight = 0
    for platform, model, (schedule, views, ahead), rec, (pp, m) in cases:
        pf, spec = load(platform), get_preset(model)
        dt = "fp32" if platform == "cpu-local" else "bf16"
        seq = min(512, spec.max_seq)
        policy = tuple(_MIXED[s % 4] for s in range(pp)) if rec == "per-stage" else (rec,) * pp
        plan = Plan(
            pp=pp,
            dp=2,
            micro_batch=1,
            global_batch=2 * m,
            seq=seq,
            schedule=schedule,
            view_policy=views,
            view_lookahead=ahead,
            shard_optimizer=True,
            compute_dtype=dt,
            recompute=policy,
            pipeline=pipeline,
            offload_activations=offload,
            model=spec.name,
        )
        case = (platform, model, schedule, views, ahead, policy, pp, m)
        split = plan.blocks_per_stage(spec)
        sch = build_schedule(spec, plan)
        step = simulate_schedule(sch, CostModel(spec, plan, pf)).step_time_s
        ut, peak = unit_times(spec, pf, 1, seq, dt), peak_unit_times(spec, pf, 1, seq, dt)
        over = overheads(spec, plan, pf)
        for lb in (
            step_time_lower_bound_s(split, m, ut, policy, over, pipeline=pipeline),
            step_time_lower_bound_s(split, m, peak, policy, pipeline=pipeline),
        ):
            assert lb <= step * (1 + 1e-9), case
        led = platform_ledger(sch, spec, plan, pf, keep_trace=False)
        mb = memory_bound(Request(spec, pf, 2 * pp, 2 * m, seq), plan)
        for s in range(pp):
            bound, peak_bytes = mb.stage(s, policy[s]), led.stages[s].peak_bytes
            assert bound <= peak_bytes, (case, s)
            assert sum(mb.breakdown(s, policy[s]).values()) == bound
            tight += bound > 0.95 * peak_bytes
    return tight


@pytest.mark.parametrize("pipeline", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize("schedule", ["ratrain", "gpu-style", "baseline", "ratrain+offload"])
@pytest.mark.parametrize("pp", [2, 4])
def test_the_shortened_memory_step_holds_for_zb(schedule, pp, pipeline):
    spec = get_preset("llama2-7b")
    schedule, _, offload = schedule.partition("+")
    base = Plan(
        pp=pp,
        dp=2,
        micro_batch=1,
        global_batch=2,
        seq=512,
        schedule=schedule,
        offload_activations=bool(offload),
    )
    peaks = set()
    long = base.replace(global_batch=200, pipeline=pipeline)
    for m in (memory_microbatches(long), 3 * pp + 5):
        plan = base.replace(global_batch=2 * m, pipeline=pipeline)
        peaks.add(
            tuple(s.peak_bytes for s in replay(build_schedule(spec, plan), spec, plan).stages)
        )
    assert len(peaks) == 1


def test_plan_writes_and_reports_zb_h1(tmp_path, capsys):
    out = tmp_path / "zb.yaml"
    argv = ["plan", "--model", "tiny", "--platform", "a100-80g", "--clusters", "8"]
    argv += ["--global-batch", "32", "--seq", "128", "--family", "ratrain", "--pin", "pp=4"]
    assert main([*argv, "-o", str(out)]) == 0
    assert "pipeline=zb-h1" in capsys.readouterr().out
    plan, extra = load_plan(out)
    assert plan.pipeline == "zb-h1" and "pipeline: zb-h1" in out.read_text()
    assert Plan.from_dict(plan.to_dict()) == plan
    check_schedule(build_schedule(TINY, plan), TINY, plan)


def test_bench_tables_show_what_zero_bubble_adds():
    from ratrain.cli.bench_ablation import ablation_json, ablation_markdown, zb_json, zb_markdown

    req = _req()
    best = search(req, top=1).best
    one = search(req.with_(families=("ratrain-no-zb",)), top=1).best
    zb = {p: search(req.with_(pins={"pipeline": p}), top=1).best for p in ("zb-h1", "zb-h2")}
    row = ZbRow("tiny", one, best, zb)
    md = "\n".join(zb_markdown([row], "a100-80g"))
    assert "ratrain (1f1b) tokens/s" in md and "best zb-h2 plan tokens/s" in md
    assert f"{row.gain():.3f}x" in md and row.gain() > 1.0
    assert f"| {best.tokens_per_s:,.0f} |" in md and f"| {one.tokens_per_s:,.0f} |" in md
    for p, c in zb.items():
        assert f"| {c.tokens_per_s:,.0f} | {row.zb_ratio(p):.3f}x |" in md
        assert f"Best {p} plans" in md
    (j,) = zb_json([row])
    assert j["chosen_pipeline"] == best.plan.pipeline and j["gain"] == pytest.approx(row.gain())
    assert j["zb_h2_vs_1f1b"] == pytest.approx(zb["zb-h2"].tokens_per_s / one.tokens_per_s)
    assert j["best_zb_h1_plan"]["pipeline"] == "zb-h1" and j["closest_zb_h2_miss"] is None
    # The ablation has its column: RATrain with the 1F1B pass order only.
    abl = AblationRow("tiny", best, {"ratrain-no-zb": one})
    assert "no zero bubble" in "\n".join(ablation_markdown([abl], "a100-80g"))
    assert ablation_json([abl])[0]["relative"]["ratrain-no-zb"] == pytest.approx(1 / row.gain())
    # Where, without offload, no zb-h1 plan fits (what each deferred B_W needs outgrows
    # what recomputation saves) the search keeps 1F1B with pp > 1, and the table says so
    # and names the nearest miss (a zb-h1 plan, recomputing).
    tight = replace(
        A100, usable_memory_bytes=1_800_000, workspace_bytes=100_000, headroom_fraction=0.0
    )
    res = search(_req({"pipeline": "zb-h1", "offload_activations": False}, platform=tight))
    assert res.best is None and res.near.plan.pipeline == "zb-h1"
    assert set(res.near.plan.recompute) != {"none"}
    kept = search(_req({"offload_activations": False}, platform=tight), top=1).best
    assert kept.plan.pipeline == "1f1b" and kept.plan.pp > 1
    # A little more memory: still none without offload, but with it (what B_IN keeps for a
    # deferred B_W leaves the device too) one fits.
    roomier = replace(tight, usable_memory_bytes=2_000_000)
    pins = {"pipeline": "zb-h1", "offload_activations": False}
    assert search(_req(pins, platform=roomier), top=1).best is None
    fits = search(_req({"pipeline": "zb-h1"}, platform=roomier), top=1).best
    assert fits is not None and fits.plan.offload_activations and fits.plan.pp > 1
    row = ZbRow("tiny", kept, kept, {"zb-h1": None}, {"zb-h1": res.near})
    miss = "\n".join(zb_markdown([row], "x"))
    assert "| none fits | — |" in miss and "none fits; nearest miss found" in miss


def test_picks_zb_h2_where_its_warm_up_fills_a_wait_and_it_fits():
    """The runtime_vs_peers job at pp=2 on cpu-local: stage 0 (5 blocks and the embedding)
    outlasts stage 1 (3 blocks and the head), and under zb-h1 it waits for microbatch 0's
    gradient after its two forwards. zb-h2's longer warm-up fills that wait: the planner
    ranks it first, then zb-h1, then 1F1B, on the same split. Under a cap between zb-h1's
    stage-0 peak and zb-h2's, zb-h1 is picked, and what is ranked fits."""
    spec = get_preset("bench-512")
    pins = dict(pp=2, dp=1, micro_batch=2, compute_dtype="fp32", schedule="ratrain")
    pins.update(clip_grad=None, recompute="none", shard_optimizer=False)
    pins.update(view_policy="persistent", layer_split=(5, 3), offload_activations=False)
    cpu = load("cpu-local")
    req = Request(spec, cpu, 2, 16, 256, pins=pins, families=("ratrain",))
    best = {}
    for c in search(req, top=8).ranked:
        best.setdefault(c.plan.pipeline, c)
    assert list(best) == ["zb-h2", "zb-h1", "1f1b"]
    h1, h2 = best["zb-h1"], best["zb-h2"]
    assert h2.step_time_s < h1.step_time_s < best["1f1b"].step_time_s
    assert h2.peak_memory_bytes[0] > h1.peak_memory_bytes[0]
    cap = (h1.peak_memory_bytes[0] + h2.peak_memory_bytes[0]) // 2
    tight = replace(cpu, usable_memory_bytes=cap + cpu.workspace_bytes)
    res = search(req.with_(platform=tight), top=8)
    assert res.best.plan.pipeline == "zb-h1"
    assert all(max(c.peak_memory_bytes) <= usable_bytes(res.request) for c in res.ranked)
    assert "zb-h2" not in {c.plan.pipeline for c in res.ranked}
