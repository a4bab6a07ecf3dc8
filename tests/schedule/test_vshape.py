"""ZB-V and 1F1B-V (`pipeline: zb-v | 1f1b-v`, `ratrain.schedule.vshape`): two chunks per
stage in a V, the loss on stage 0. The plan's chunks and units, the list-scheduled pass order (checked by
the checker, replayed by the ledger, timed by the simulator with equal pass times), the
transfers both ways between neighbours, and the runtime against Baseline-1F1B (fp32 bit
for bit, bf16 and fp16, recompute, transient sharded views, four stages, evaluation)."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
from test_zero_bubble import _idle  # equal F/B_in/B_w times per block

from _runtime import max_rel
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.memory import replay
from ratrain.models.presets import get_preset
from ratrain.models.spec import ModelSpec
from ratrain.schedule import build_eval_schedule, build_schedule, check_schedule
from ratrain.schedule.ir import Op
from ratrain.schedule.vshape import inflight_limit, pass_orders

SPEC8 = ModelSpec("eight", 8, 256, 4, 4, 512, 1000, max_seq=64)
# A head and an embedding of next to no FLOPs: the scheduler's pass weights
# (`pass_weights`, FLOPs) are then the equal per-block times the simulator is given.
THIN_HEAD = dataclasses.replace(SPEC8, vocab=8)


def _plan(pp, m, pipeline="zb-v", **kw):
    base = dict(pp=pp, dp=2, micro_batch=1, global_batch=2 * m, seq=64, pipeline=pipeline)
    return Plan(**{**base, **kw})


# -- the plan ------------------------------------------------------------------------------
def test_a_v_places_chunk_s_and_2p_minus_1_minus_s_on_stage_s():
    plan = _plan(4, 8)
    assert plan.chunks == 2 and plan.blocks_per_chunk(SPEC8) == (1,) * 8
    assert [plan.stage_of_chunk(c) for c in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert tuple(plan.stage_units(SPEC8, 0)) == (0, 1, 8, 9)  # embedding, block 1, 8, head
    assert tuple(plan.stage_units(SPEC8, 3)) == (4, 5)  # the tip: two chunks that touch
    assert plan.blocks_per_stage(SPEC8) == (2, 2, 2, 2)
    assert plan.head_stage() == 0 and _plan(4, 8, "zb-h1").head_stage() == 3
    owner = plan.stage_of_unit(SPEC8)
    assert sorted(owner) == list(range(10)) and owner[9] == 0
    split = _plan(2, 8, layer_split=(1, 3, 3, 1))
    assert [tuple(split.chunk_units(SPEC8, c)) for c in range(4)] == [
        (0, 1),
        (2, 3, 4),
        (5, 6, 7),
        (8, 9),
    ]
    assert split.recompute_of(SPEC8, 0, 8) == "none"
    first = _plan(2, 8, layer_split=(1, 3, 3, 1), recompute="first:2")
    assert [first.recompute_of(SPEC8, 0, u) for u in (1, 8)] == ["full", "full"]


def test_bad_v_splits_are_refused_in_one_line():
    with pytest.raises(RatrainError, match=r"give one count per chunk \(4\)") as e:
        _plan(2, 8, layer_split=(4, 4))
    assert "\n" not in str(e.value)
    with pytest.raises(RatrainError, match="16 chunks, more than eight's 8 layers; use pp <= 4"):
        _plan(8, 8).blocks_per_chunk(SPEC8)
    for pipeline in ("zb-v", "1f1b-v"):
        plan = _plan(2, 8, pipeline, offload_activations=True, schedule="ratrain")
        with pytest.raises(RatrainError, match=f"pipeline {pipeline} does not support offload"):
            build_schedule(SPEC8, plan)


# -- the schedule ----------------------------------------------------------------------------
@pytest.mark.parametrize("pipeline", ["zb-v", "1f1b-v"])
@pytest.mark.parametrize("schedule", ["baseline", "gpu-style", "ratrain"])
@pytest.mark.parametrize("pp, m", [(1, 4), (2, 1), (2, 4), (2, 8), (4, 3), (4, 8)])
def test_checker_accepts_the_v_pipelines(pipeline, schedule, pp, m):
    plan = _plan(pp, m, pipeline, schedule=schedule)
    sch = build_schedule(SPEC8, plan)
    check_schedule(sch, SPEC8, plan)
    assert sch.meta["pipeline"] == pipeline
    ops = {a.op for a in sch.actions()}
    assert (Op.B_IN in ops, Op.B in ops) == ((True, False) if pipeline == "zb-v" else (False, True))
    assert sorted(u for us in sch.meta["stage_units"] for u in us) == list(range(10))


@pytest.mark.parametrize(
    "kw",
    [
        dict(sync_bucket_bytes=2**20),
        dict(shard_optimizer=True, compute_dtype="bf16"),
        dict(compute_dtype="fp16", recompute="full"),
        dict(recompute="selective", view_policy="transient", compute_dtype="bf16"),
    ],
)
def test_checker_accepts_the_v_pipelines_with_the_lifecycle_options(kw):
    for pipeline in ("zb-v", "1f1b-v"):
        plan = _plan(4, 8, pipeline, schedule="ratrain", **kw)
        check_schedule(build_schedule(SPEC8, plan), SPEC8, plan)


def test_neighbours_exchange_activations_and_gradients_both_ways():
    """Stage 0 sends chunk 0's output down and receives chunk 3's input back up from stage
    1; no transfer crosses the tip (stage 1's chunks 1 and 2 touch)."""
    plan = _plan(2, 2, layer_split=(1, 3, 3, 1))
    sch = build_schedule(SPEC8, plan)
    s0 = {(a.op, a.unit) for a in sch.stages[0] if a.op.value.startswith(("SEND", "RECV"))}
    assert s0 == {
        (Op.SEND_F, 1),  # block 1 -> block 2 on stage 1
        (Op.RECV_F, 7),  # block 7 (stage 1) -> block 8
        (Op.SEND_B, 8),  # block 8's input gradient -> block 7
        (Op.RECV_B, 2),  # block 2's input gradient -> block 1
    }
    s1 = {a.unit for a in sch.stages[1] if a.op.value.startswith(("SEND", "RECV"))}
    assert s1 == {1, 2, 7, 8}


@pytest.mark.parametrize("split", [True, False])
def test_every_pass_order_respects_the_in_flight_limit(split):
    for pp, m in ((2, 8), (4, 8), (4, 16), (3, 5)):
        orders = pass_orders(pp, m, [(1.0, 1.0, 1.0)] * (2 * pp), split=split)
        for s, order in enumerate(orders):
            held = peak = 0
            for op, _, _ in order:
                held += (op is Op.F) - (op is (Op.B_W if split else Op.B))
                peak = max(peak, held)
            assert peak <= inflight_limit(pp, split), (pp, m, s)
            # F, B_IN, B_W (or F, B) of each microbatch of each of its two chunks
            assert len(order) == (3 if split else 2) * 2 * m


def _replays(orders, split):
    """Whether every stage can run its order to the end, each pass after what it waits for
    (its F after the previous chunk's, its B_IN or B after the next chunk's or its own F on
    the last chunk, its B_W after its B_IN)."""
    done, pos, n = set(), [0] * len(orders), 2 * len(orders)
    while any(p < len(o) for p, o in zip(pos, orders, strict=True)):
        moved = False
        for s, order in enumerate(orders):
            while pos[s] < len(order):
                op, c, mb = order[pos[s]]
                if op is Op.F:
                    need = None if c == 0 else ("F", c - 1, mb)
                elif op is Op.B_W:
                    need = ("B", c, mb)
                else:
                    need = ("F", c, mb) if c == n - 1 else ("B", c + 1, mb)
                if need is not None and need not in done:
                    break
                done.add(("F" if op is Op.F else "W" if op is Op.B_W else "B", c, mb))
                pos[s] += 1
                moved = True
        if not moved:
            return False
    return True


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("pp, m", [(2, 8), (4, 32), (8, 64)])
def test_a_light_first_chunk_keeps_the_in_flight_limit(split, pp, m):
    """An embedding-only chunk 0 (next to no FLOPs) races ahead and fills stage 0 with its
    forwards before the last chunk's first forward arrives: the plain limit starves. The
    order is then scheduled with each first visit reserving its second, and still holds
    at most the limit (raising the limit instead went to m + 1, GPipe's memory)."""
    weights = [(1.0, 1.0, 1.0)] * (2 * pp)
    weights[0], weights[-1] = (0.05, 0.05, 0.05), (2.0, 1.5, 1.5)  # embedding; head
    orders = pass_orders(pp, m, weights, split=split)
    for order in orders:
        held = peak = 0
        for op, _, _ in order:
            held += (op is Op.F) - (op is (Op.B_W if split else Op.B))
            peak = max(peak, held)
        assert peak <= inflight_limit(pp, split)
        assert len(order) == (3 if split else 2) * 2 * m
    assert _replays(orders, split)


@pytest.mark.parametrize("pp, m", [(2, 4), (2, 8), (4, 4), (4, 8), (4, 16)])
def test_zb_v_idles_less_than_zb_h1_with_equal_pass_times(pp, m):
    """Equal F, B_in and B_w times per block (half a stage per chunk): ZB-V idles less
    than ZB-H1 at no greater step time; e.g. pp=4, m=8: 4 s against 6 s and 1F1B's 18 s."""
    pipes = ("1f1b", "zb-h1", "zb-v", "1f1b-v")
    idle = {p: _idle(THIN_HEAD, _plan(pp, m, p))[0] for p in pipes}
    assert idle["zb-v"] < idle["zb-h1"] < idle["1f1b"]
    assert idle["zb-v"] <= 0.25 * idle["1f1b"]
    if m >= 8:  # 1f1b-v: about interleaved 1F1B's, half of 1F1B's idle time
        assert idle["1f1b-v"] <= 0.6 * idle["1f1b"]


@pytest.mark.parametrize("pp, m", [(2, 8), (4, 8)])
def test_zb_v_ledger_peak_near_1f1b(pp, m):
    """Stage 0 holds the head's and the embedding's chunks: under zb-v the largest peak is
    within 10% of 1F1B's (llama2-7b at 4k tokens: 5.8% over at pp=4, 4.0% at pp=2), under
    1f1b-v, with 3pp chunks in flight, within 20% (14.8%, 10.5%)."""
    spec = get_preset("llama2-7b")
    peaks = {}
    for pipe in ("1f1b", "zb-v", "1f1b-v"):
        plan = _plan(pp, m, pipe, seq=4096)
        peaks[pipe] = max(
            s.peak_bytes for s in replay(build_schedule(spec, plan), spec, plan).stages
        )
    assert peaks["1f1b"] < peaks["zb-v"] <= 1.10 * peaks["1f1b"]
    assert peaks["zb-v"] < peaks["1f1b-v"] <= 1.20 * peaks["1f1b"]


def test_eval_schedule_of_a_v_is_checked():
    plan = _plan(2, 4)
    sch = build_eval_schedule(SPEC8, plan, 3)
    check_schedule(sch, SPEC8, plan)
    assert sum(a.op is Op.F for a in sch.actions()) == 3 * 10


# -- the runtime -----------------------------------------------------------------------------
TINY = get_preset("tiny")
RUNTIME_PLAN = Plan(
    pp=2, dp=2, micro_batch=1, global_batch=8, seq=16, compute_dtype="fp32", model="tiny"
)


def _losses(spec, plan, variants, steps=3, **cfg_kw):
    import _runtime as harness

    out, ref, _ = harness.losses_and_reference(spec, plan, variants, steps, **cfg_kw)
    return out, ref


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_runtime_zb_v_equals_baseline_1f1b_bitwise_fp32():
    """pp=2 x dp=2: every lowering, per-bucket syncs, ZeRO-1, the fused loss and full
    recompute give Baseline-1F1B's losses bit for bit, and the reference's within 1e-5."""
    pytest.importorskip("torch")
    v = {
        "baseline": {"schedule": "baseline"},
        "gpu-style": {"schedule": "gpu-style"},
        "ratrain": {"schedule": "ratrain"},
        "buckets": {"schedule": "ratrain", "sync_bucket_bytes": 2**16},
        "zero1": {"schedule": "ratrain", "shard_optimizer": True},
        "recompute": {"schedule": "ratrain", "recompute": "full"},
        "chunked-loss": {"schedule": "ratrain", "loss_chunk_tokens": 8},
    }
    variants = [("1f1b", {"schedule": "baseline"})]
    variants += [("1f1b-chunked-loss", {"schedule": "baseline", "loss_chunk_tokens": 8})]
    variants += [(f"v-{k}", {**kw, "pipeline": "zb-v"}) for k, kw in v.items()]
    unsplit = ("gpu-style", "ratrain", "zero1", "chunked-loss")
    variants += [(f"1f1bv-{k}", {**v[k], "pipeline": "1f1b-v"}) for k in unsplit]
    out, ref = _losses(TINY, RUNTIME_PLAN, variants, steps=4)
    assert out["1f1b"][-1] < out["1f1b"][0]
    for name in v:
        want = out["1f1b-chunked-loss"] if "chunked" in name else out["1f1b"]
        assert out[f"v-{name}"] == want, name
        if name in unsplit:
            assert out[f"1f1bv-{name}"] == want, name
    assert max_rel(out["v-ratrain"], ref) <= 1e-5


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_runtime_zb_v_half_precision_equals_1f1b(dtype):
    """bf16 with transient views all-gathered from ZeRO-1 shards and selective recompute;
    fp16 with a loss scale that overflows at first (the same skipped steps)."""
    pytest.importorskip("torch")
    kw = dict(compute_dtype=dtype)
    if dtype == "bf16":
        kw.update(view_policy="transient", view_lookahead=2, shard_optimizer=True)
        kw.update(recompute="selective")
    plan = RUNTIME_PLAN.replace(**kw)
    variants = [("1f1b", {"schedule": "baseline"}), ("v", {"pipeline": "zb-v"})]
    out, _ = _losses(TINY, plan, variants, steps=4, loss_scale_init=2.0**20)
    assert out["v"] == out["1f1b"]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_runtime_zb_v_four_stages_equals_1f1b():
    """Four stages of an eight-block model (eight chunks), an even and an uneven chunk
    split with recompute: Baseline-1F1B's losses bit for bit, the reference's to 1e-5."""
    pytest.importorskip("torch")
    spec = dataclasses.replace(TINY, name="tiny-8", n_layers=8)
    plan = RUNTIME_PLAN.replace(pp=4, dp=1, model=None, recompute="none")
    variants = [
        ("1f1b", {"schedule": "baseline"}),
        ("v", {"pipeline": "zb-v"}),
        ("v-split", {"pipeline": "zb-v", "layer_split": (0, 2, 1, 1, 1, 1, 2, 0)}),
        ("v-recompute", {"pipeline": "zb-v", "schedule": "gpu-style", "recompute": "full"}),
        ("1f1bv", {"pipeline": "1f1b-v", "layer_split": (0, 2, 1, 1, 1, 1, 2, 0)}),
    ]
    out, ref = _losses(spec, plan, variants)
    for name in ("v", "v-split", "v-recompute", "1f1bv"):
        assert out[name] == out["1f1b"], name
    assert max_rel(out["v"], ref) <= 1e-5


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_runtime_zb_v_evaluates_as_1f1b():
    """The held-out loss through a V (the loss on stage 0) equals 1F1B's plan's, and
    evaluating leaves training unchanged."""
    pytest.importorskip("torch")
    import _runtime as harness
    from ratrain.train.job import EvalOpts, held_out_source, run_job

    cfg = TrainConfig(steps=2, warmup_steps=1)
    evals = {}
    for pipe in ("1f1b", "zb-v"):
        plan = RUNTIME_PLAN.replace(pipeline=pipe)
        job = harness.job(TINY, plan, cfg, [("run", {})], timeout_s=60, deadline_s=240)
        src = functools.partial(held_out_source, "synthetic", TINY, plan.seq, cfg.seed)
        job = dataclasses.replace(job, evaluation=EvalOpts(every=1, source=src))
        results = run_job(job)
        got = {tuple(r.runs["run"].evals) for r in results}
        assert len(got) == 1  # every rank got the same held-out losses
        evals[pipe] = (got.pop(), harness.losses(results, "run"))
    assert evals["zb-v"] == evals["1f1b"]


# -- the planner ----------------------------------------------------------------------------
def test_the_planner_tries_zb_v_on_its_best_structures():
    """Pinned, the ranking is V plans alone, on `v_splits`' chunk splits, each timed as
    `simulate` times it; unpinned, the same V plans are ranked with the rest (the best of
    either is the best)."""
    from ratrain.planner import search
    from ratrain.planner.space import Request
    from ratrain.planner.splits import v_splits
    from ratrain.platforms import load
    from ratrain.sim import simulate

    spec, pf = get_preset("bench-512"), load("cpu-local")
    pins = {"pp": 2, "dp": 1, "compute_dtype": "fp32", "clip_grad": None}
    req = Request(spec, pf, 2, 16, 256, pins=pins, families=("ratrain",))
    free = search(req, top=20)
    pinned = search(req.with_(pins={**pins, "pipeline": "zb-v"}), top=20)
    assert pinned.ranked and all(c.plan.pipeline == "zb-v" for c in pinned.ranked)
    for c in pinned.ranked:
        assert c.plan.layer_split in v_splits(spec, 2)
        assert simulate(spec, c.plan, pf).tokens_per_s == pytest.approx(c.tokens_per_s)
    best_v = pinned.ranked[0].tokens_per_s
    others = [c.tokens_per_s for c in free.ranked if c.plan.pipeline != "zb-v"]
    assert free.ranked[0].tokens_per_s == pytest.approx(max(best_v, max(others)))
    one_chunk = search(req.with_(pins={**pins, "pipeline": "zb-h2"}), top=5)
    assert all(c.plan.pipeline == "zb-h2" for c in one_chunk.ranked)


def test_the_v_pass_stops_at_the_time_budget(capsys, monkeypatch):
    """Past the budget with a plan ranked, the V plans left are not built or simulated,
    and the answer says how many; pinned, a V is searched until one of its plans is
    ranked whatever the budget."""
    from ratrain.cli import main
    from ratrain.planner import search
    from ratrain.planner.space import Request
    from ratrain.platforms import load

    pins = {"pp": 2, "dp": 1, "compute_dtype": "fp32", "clip_grad": None}
    req = Request(get_preset("bench-512"), load("cpu-local"), 2, 16, 256, pins=pins)
    full = search(req, top=20)
    assert full.v_untried == 0 and any(c.plan.chunks == 2 for c in full.ranked)
    cut = search(req, top=20, time_budget_s=1e-9)  # out of time once the first plan ranks
    assert cut.feasible and cut.v_untried > 0
    assert all(c.plan.chunks == 1 for c in cut.ranked)
    pinned = search(req.with_(pins={**pins, "pipeline": "zb-v"}), top=5, time_budget_s=1e-9)
    assert pinned.ranked and pinned.ranked[0].plan.pipeline == "zb-v"
    # The CLI with no hard deadline: the first plan is always ranked, then the cut.
    monkeypatch.setattr("ratrain.deadline.NO_FIT_BUDGET_FACTOR", 1e18)
    argv = ["plan", "--model", "bench-512", "--platform", "cpu-local", "--clusters", "2"]
    argv += ["--global-batch", "16", "--seq", "256", "--pin", "pp=2", "--quiet"]
    assert main([*argv, "--time-budget", "1e-9"]) == 0
    out = capsys.readouterr().out
    assert "V-shaped plan(s) (zb-v, 1f1b-v) not tried within the time budget" in out
    assert main([*argv, "--time-budget", "1e-9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["v_untried"] > 0


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_runtime_v_trains_a_tied_model_on_two_stages():
    """A V holds the embedding and the head on stage 0, so a model that ties them trains
    at pp=2 (the one-chunk pipelines refuse it in one line): the reference trainer's losses
    within 1e-5."""
    pytest.importorskip("torch")
    from ratrain.runtime.stage import check_tied

    spec = dataclasses.replace(get_preset("tiny-tied"), name="tiny-tied-4", n_layers=4)
    plan = RUNTIME_PLAN.replace(model=None)
    with pytest.raises(RatrainError, match="use --pp 1, or a V-shaped pipeline") as e:
        check_tied(spec, plan)
    assert "\n" not in str(e.value)
    variants = [("v", {"pipeline": "zb-v"}), ("1f1bv", {"pipeline": "1f1b-v"})]
    out, ref = _losses(spec, plan.replace(pipeline="zb-v"), variants, steps=4)
    for name, _ in variants:
        assert max_rel(out[name], ref) <= 1e-5
