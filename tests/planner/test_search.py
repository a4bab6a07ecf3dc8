"""The planner: its bounds hold against the ledger and the simulator, pruning never drops
the plan exhaustive search picks, families keep to their knobs, pins hold."""

import itertools
import sys
from dataclasses import replace

import pytest

from _planner import TINY, exhaustive, small_cap
from ratrain.config import DEFAULT_LOSS_CHUNK_TOKENS, Plan
from ratrain.errors import RatrainError
from ratrain.memory import replay
from ratrain.models.presets import get_preset
from ratrain.planner import FAMILIES, Request, parse_pins, search
from ratrain.planner.evaluate import Evaluator, usable_bytes
from ratrain.planner.memory_bound import MemoryBound
from ratrain.planner.space import (
    knob_combos,
    loss_chunks,
    structures,
)
from ratrain.planner.time_bound import (
    first_unit_times,
    overheads,
    peak_unit_times,
    step_time_lower_bound_s,
    unit_times,
)
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.sim import simulate


def _grid(spec, seq, pps=(1, 2, 4), ms=(1, 2, 3, 6)):
    for pp, dp, m, sched, rec, shard, view, off in itertools.product(
        pps,
        (1, 4),
        ms,
        ("baseline", "gpu-style", "ratrain", "fsdp-pp"),
        ("none", "selective", "first:1", "full"),
        (False, True),
        ("persistent", "transient"),
        (False, True),
    ):
        if sched in ("baseline", "gpu-style") and (view == "transient" or off):
            continue
        if sched == "fsdp-pp" and (off or not shard):
            continue
        yield Plan(
            pp=pp,
            dp=dp,
            global_batch=dp * m,
            seq=seq,
            schedule=sched,
            recompute=rec,
            shard_optimizer=shard,
            view_policy=view,
            compute_dtype="fp16",
            grad_dtype="fp16",
            offload_activations=off,
        )


@pytest.mark.parametrize("name,seq", [("tiny", 128), ("llama2-7b", 1024)])
def test_memory_bound_never_exceeds_the_ledger(name, seq):
    spec = get_preset(name)
    ratios = []
    small = name == "tiny"
    for plan in _grid(
        spec, seq, pps=(1, 2, 4) if small else (2, 4), ms=(1, 3, 6) if small else (1, 6)
    ):
        led = replay(build_schedule(spec, plan), spec, plan, keep_trace=False)
        bound = MemoryBound(spec, plan)
        for s, st in enumerate(led.stages):
            lb = bound.stage(s, plan.recompute[s])
            assert lb <= st.peak_bytes, (plan, s, lb, st.peak_bytes)
            ratios.append(lb / st.peak_bytes)
    ratios.sort()
    assert ratios[len(ratios) // 2] > 0.95  # tight enough to pick the recompute policy


@pytest.mark.parametrize("platform", ["mt3000", "a100-80g"])
def test_step_bound_never_exceeds_the_simulation(platform):
    pl = load(platform)
    ut = unit_times(TINY, pl, 1, 128, "fp16")
    peak = peak_unit_times(TINY, pl, 1, 128, "fp16")
    for f in ("f_block", "b_block", "f_head", "b_head", "rc_full", "rc_selective"):
        assert getattr(peak, f) <= getattr(ut, f)  # the lazy bound is a bound
    tight = 0
    for plan in _grid(TINY, 128, ms=(1, 2, 6)):
        res = simulate(TINY, plan, pl)
        split = plan.blocks_per_stage(TINY)
        lb = step_time_lower_bound_s(
            split, plan.microbatches, ut, plan.recompute, overheads(TINY, plan, pl)
        )
        assert lb <= res.step_time_s * (1 + 1e-12), (plan, lb, res.step_time_s)
        assert step_time_lower_bound_s(split, plan.microbatches, peak) <= lb
        tight += lb > 0.9 * res.step_time_s
    assert tight > 0


def test_first_bounds_take_the_kernel_model_where_it_is_cheap():
    """A structure's first bound: the kernel model's times on a flat-efficiency platform
    (h100-80g: twice the peak's at its 0.5), those at peak under mt3000's tile model until
    its kernel times are known."""
    spec = get_preset("llama2-7b")
    h100 = load("h100-80g")
    assert first_unit_times(spec, h100, 3, 4096, "bf16") == unit_times(spec, h100, 3, 4096, "bf16")
    assert unit_times(spec, h100, 3, 4096, "bf16").f_block == pytest.approx(
        2 * peak_unit_times(spec, h100, 3, 4096, "bf16").f_block
    )
    mt = load("mt3000")
    args = (spec, mt, 3, 1000, "fp32")  # a shape no other test computes
    assert first_unit_times(*args) == peak_unit_times(*args)
    known = unit_times(*args)
    assert first_unit_times(*args) == known != peak_unit_times(*args)


@pytest.mark.parametrize("platform", ["a100-80g", "h100-80g"])
def test_step_bound_with_fetch_bound_forwards_never_exceeds_the_simulation(platform):
    # Short sequences on a GPU: a block's forward is shorter than its view's all-gather, so
    # the forward passes wait for their fetches and the bound's fetch term is in play.
    spec, pl = get_preset("llama2-7b"), load(platform)
    ut = unit_times(spec, pl, 1, 128, "bf16")
    active = 0
    for sched, view, lookahead, pp, m in itertools.product(
        ("ratrain", "fsdp-pp"), ("transient", "persistent"), (1, 2), (1, 2), (1, 3)
    ):
        plan = Plan(
            pp=pp,
            dp=4,
            global_batch=4 * m,
            seq=128,
            schedule=sched,
            shard_optimizer=True,
            view_policy=view,
            view_lookahead=lookahead,
            compute_dtype="bf16",
            grad_dtype="bf16",
        )
        over = overheads(spec, plan, pl)
        split = plan.blocks_per_stage(spec)
        lb = step_time_lower_bound_s(split, m, ut, plan.recompute, over)
        step = simulate(spec, plan, pl).step_time_s
        assert lb <= step * (1 + 1e-12), (plan, lb, step)
        plain = replace(over, forward_pass_s=())
        active += lb > step_time_lower_bound_s(split, m, ut, plan.recompute, plain)
    assert active  # the fetch term tightened some of them


@pytest.mark.parametrize("name", ["tiny", "llama2-7b"])
def test_shortened_memory_replay_equals_the_full_one(name):
    spec = get_preset(name)
    ev = Evaluator(Request(spec, load("mt3000"), 64, 64, 128))
    plans = list(_grid(spec, 128, pps=(2, 4), ms=(14,))) if name == "tiny" else []
    plans += [
        Plan(
            pp=pp,
            dp=2,
            global_batch=2 * m,
            seq=128,
            schedule=sched,
            shard_optimizer=sched == "fsdp-pp",
            view_policy=view,
            view_lookahead=la,
            recompute=rec,
            offload_activations=off,
            compute_dtype="fp16",
        )
        for pp, la, rec, off, m in itertools.product(
            (3, 4), (2, 3), ("none", "full"), (False, True), (13, 20)
        )
        for sched, view in (("ratrain", "transient"), ("fsdp-pp", "persistent"))
        if not (sched == "fsdp-pp" and off)
    ]
    for plan in plans:
        full = replay(build_schedule(spec, plan), spec, plan, keep_trace=False)
        short = ev.memory(plan)
        assert short.peak_bytes == tuple(s.peak_bytes for s in full.stages), plan


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "platform,clusters,global_batch",
    [
        ("mt3000", 3, 3),
        ("mt3000", 2, 8),
        pytest.param("a100-80g", 3, 6, marks=pytest.mark.slow),  # about 20 s on 2 cores
    ],
)
def test_pruning_never_drops_the_exhaustive_best(platform, clusters, global_batch):
    req = Request(TINY, small_cap(platform=platform), clusters, global_batch, 128)
    want, feasible, infeasible = exhaustive(req)
    assert feasible and infeasible  # the cap binds: recompute and sharding matter
    pruned = search(req, top=1)
    full = search(req, top=1, prune=False)
    assert pruned.best.tokens_per_s == pytest.approx(want, rel=1e-12)
    assert full.best.tokens_per_s == pytest.approx(want, rel=1e-12)
    assert pruned.candidates_simulated < full.candidates_simulated
    assert all(p <= usable_bytes(req) for p in pruned.best.peak_memory_bytes)


def test_a_search_cut_at_its_budget_bounds_the_optimum():
    req = Request(TINY, small_cap(), 4, 8, 128)
    exact = search(req, top=1)
    cut = search(req, top=1, time_budget_s=0.0)  # stops as soon as one plan is ranked
    assert not exact.cut and exact.gap == 0.0
    assert cut.cut and cut.ranked and cut.candidates_simulated < exact.candidates_simulated
    # The floor left is a lower bound on the optimum, and the gap measures the best from it.
    assert cut.floor_step_s <= exact.best.step_time_s
    assert cut.best.step_time_s >= exact.best.step_time_s
    assert cut.gap == pytest.approx(max(0.0, cut.best.step_time_s / cut.floor_step_s - 1))


def test_baseline_families_keep_to_their_knobs():
    req = Request(TINY, small_cap(4_000_000), 4, 8, 128)
    for fam, schedule in (
        ("gpu-style", "gpu-style"),
        ("zero1-pp", "baseline"),
        ("fsdp-pp", "fsdp-pp"),
    ):
        res = search(req.with_(families=(fam,)), top=3)
        assert res.ranked
        for c in res.ranked:
            p = c.plan
            assert c.family == fam and p.schedule == schedule
            assert len(set(p.recompute)) == 1 and not p.offload_activations
            assert p.view_policy == "persistent" or fam == "fsdp-pp"
            if fam == "zero1-pp" and p.dp > 1 or fam == "fsdp-pp":
                assert p.shard_optimizer


def test_ranked_plans_fit_and_are_ordered():
    req = Request(TINY, small_cap(), 4, 8, 128)
    res = search(req, top=4)
    steps = [c.step_time_s for c in res.ranked]
    assert steps == sorted(steps) and len(steps) == 4
    for c in res.ranked:
        assert c.clusters_used <= 4
        assert max(c.peak_memory_bytes) <= usable_bytes(req)
        res2 = simulate(TINY, c.plan, req.platform)
        assert tuple(res2.peak_memory_bytes) == c.peak_memory_bytes
        assert res2.step_time_s == c.step_time_s


def test_pins_are_respected():
    pins = parse_pins(["pp=2", "recompute=full", "schedule=ratrain", "shard_optimizer=false"])
    assert pins == {"pp": 2, "recompute": "full", "schedule": "ratrain", "shard_optimizer": False}
    res = search(Request(TINY, small_cap(), 4, 8, 128, pins=pins), top=2)
    for c in res.ranked:
        p = c.plan
        assert (p.pp, p.schedule, p.shard_optimizer) == (2, "ratrain", False)
        assert set(p.recompute) == {"full"}
    split = parse_pins(["layer_split=1,3", "recompute=none,full"])
    res = search(Request(TINY, load("mt3000"), 4, 8, 128, pins={"pp": 2, **split}), top=1)
    assert res.best.plan.layer_split == (1, 3) and res.best.plan.recompute == ("none", "full")


def test_offload_is_not_searched_where_the_host_tier_is_main_memory():
    # cpu-local: offloading to the host moves nothing and frees nothing (host.same_memory)
    cpu = Request(get_preset("bench-512"), load("cpu-local"), 4, 16, 256, pins={"pp": 4})
    assert cpu.platform.host_is_main_memory
    fam = FAMILIES["ratrain"]
    for st in structures(cpu, fam):
        assert not any(kn.offload_activations for kn in knob_combos(cpu, fam, st))
    pinned = cpu.with_(pins={"pp": 4, "offload_activations": True})
    st = next(s for s in structures(pinned, fam) if s.microbatches(16) > 1)
    assert all(kn.offload_activations for kn in knob_combos(pinned, fam, st))
    gpu = cpu.with_(platform=load("a100-80g"))
    st = next(s for s in structures(gpu, fam) if s.microbatches(16) > 1)
    assert any(kn.offload_activations for kn in knob_combos(gpu, fam, st))


def test_pinned_loss_and_sync_buckets_reach_the_plan():
    pins = parse_pins(["loss_chunk_tokens=64", "sync_bucket_bytes=1048576"])
    res = search(Request(TINY, load("mt3000"), 4, 8, 128, pins=pins), top=3)
    assert res.ranked
    for c in res.ranked:
        assert (c.plan.loss_chunk_tokens, c.plan.sync_bucket_bytes) == (64, 2**20)


def test_the_fused_loss_is_searched_where_the_platform_measured_the_loss():
    mt = Request(TINY, load("mt3000"), 4, 8, 128)
    assert loss_chunks(mt) == (None,)  # no loss pass measured: timed alike, plain kept
    assert loss_chunks(mt.with_(pins={"loss_chunk_tokens": 64})) == (64,)
    cpu = Request(get_preset("bench-512"), load("cpu-local"), 2, 16, 256, pins={"pp": 2})
    assert loss_chunks(cpu) == (None, DEFAULT_LOSS_CHUNK_TOKENS)
    assert loss_chunks(cpu.with_(pins={"pp": 2, "loss_chunk_tokens": None})) == (None,)
    res = search(cpu, top=1, time_budget_s=None)
    best = res.best.plan
    # the search's choice of loss is the simulator's: the other loss on the same plan is
    # no faster
    chunk = None if best.loss_chunk_tokens else DEFAULT_LOSS_CHUNK_TOKENS
    other = best.replace(loss_chunk_tokens=chunk)
    assert simulate(cpu.spec, other, cpu.platform).tokens_per_s <= res.best.tokens_per_s


@pytest.mark.parametrize(
    "bad", ["pp", "nosuch=1", "pp=two", "shard_optimizer=maybe", "schedule=x", "global_batch=8"]
)
def test_bad_pins_are_user_errors(bad):
    with pytest.raises(RatrainError):
        parse_pins([bad])


def test_request_pins_given_as_text_or_lists_read_as_the_cli_reads_them():
    # The Python API takes a pin as the field's value or as --pin's text: both plan alike.
    as_text = Request(TINY, load("mt3000"), 4, 8, 128, pins={"pp": "2", "layer_split": "1,3"})
    as_list = Request(TINY, load("mt3000"), 4, 8, 128, pins={"pp": 2, "layer_split": [1, 3]})
    assert as_text.pins == as_list.pins == {"pp": 2, "layer_split": (1, 3)}
    assert search(as_text, top=1).best.plan.layer_split == (1, 3)


@pytest.mark.parametrize(
    "pins",
    [
        {"nosuch": 1},
        {"layer_split": "1;3"},
        {"layer_split": (1.5, 2)},
        {"pipeline": "zb-h9"},
        {"clip_grad": "abc"},
        {"loss_chunk_tokens": "x"},
    ],
)
def test_request_pins_the_search_could_never_match_are_user_errors(pins):
    with pytest.raises(RatrainError, match="pin"):
        Request(TINY, load("mt3000"), 4, 8, 128, pins=pins)


def test_min_pp_searches_only_pipelines_that_deep():
    req = Request(TINY, load("mt3000"), 4, 8, 128)
    assert search(req, top=1).best.plan.pp == 1  # the tiny model fits on one stage
    deeper = search(req.with_(min_pp=2), top=8)
    assert deeper.ranked and all(c.plan.pp >= 2 for c in deeper.ranked)
    with pytest.raises(RatrainError, match="min_pp must be a positive integer"):
        Request(TINY, load("mt3000"), 4, 8, 128, min_pp=0)


def test_infeasible_search_reports_the_nearest_miss():
    from ratrain.planner import explain

    req = Request(TINY, small_cap(1_200_000, 100_000), 2, 4, 128)
    res = search(req, top=1)
    assert not res.feasible and res.near is not None
    ex = explain(req, res.near)
    assert ex.over_bytes > 0 and ex.stage is not None and ex.largest_class in ex.breakdown
    assert ex.changes and all(max(c.peak_bytes) <= usable_bytes(req) for c in ex.changes)
    assert any("clusters" in c.what for c in ex.changes)


def test_planner_does_not_import_torch():
    import subprocess

    code = "import sys, ratrain.planner, ratrain.planner.paper; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
