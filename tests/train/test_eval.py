"""Evaluation through the pipeline: the forward-only schedule in the IR (checked, replayed by
the ledger, timed by the simulator), the runtime's held-out loss against the reference
trainer's (pp=2 x dp=2 and pp=1, fp32), training unchanged by evaluating, `ratrain eval`
of a checkpoint equal to the in-training evaluation, and one-line errors for bad flags."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

import _runtime as harness
from ratrain.cli import main
from ratrain.config import Plan, TrainConfig
from ratrain.memory import replay
from ratrain.models.presets import get_preset
from ratrain.schedule import (
    Action,
    Op,
    ScheduleError,
    build_eval_schedule,
    check_schedule,
    eval_plan,
    find_problems,
)
from ratrain.train.job import EvalOpts, eval_batches, held_out_source, run_job
from ratrain.train.reference import ReferenceTrainer

SPEC = get_preset("tiny")
PLAN = Plan(pp=2, dp=2, micro_batch=1, global_batch=4, seq=16, compute_dtype="fp32", model="tiny")
CFG = TrainConfig(steps=3, warmup_steps=1)

VARIANTS = {
    "baseline": dict(schedule="baseline"),
    "gpu-style": dict(schedule="gpu-style", compute_dtype="bf16"),
    "ratrain-transient-sharded": dict(
        compute_dtype="bf16", view_policy="transient", view_lookahead=2, shard_optimizer=True
    ),
    "ratrain-recompute-offload": dict(recompute=("full", "selective"), offload_activations=True),
    "fsdp-pp": dict(schedule="fsdp-pp", shard_optimizer=True, compute_dtype="bf16"),
}


# -- the IR ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_eval_schedule_is_forward_only_checked_replayed_and_simulated(name):
    from ratrain.cost.model import CostModel
    from ratrain.platforms import load
    from ratrain.sim import simulate_schedule

    plan = PLAN.replace(**VARIANTS[name])
    sch = build_eval_schedule(SPEC, plan, 5)
    check_schedule(sch, SPEC, plan)  # the training plan: the count comes from the schedule
    check_schedule(sch, SPEC, eval_plan(plan, 5))
    ops = {a.op for a in sch.actions()}
    assert ops <= {Op.F, Op.SEND_F, Op.RECV_F, Op.VIEW_FETCH, Op.VIEW_DROP}
    assert sum(a.op is Op.F for a in sch.actions()) == 5 * (SPEC.n_layers + 2)
    transient = sch.meta["view_policy"] == "transient"
    assert (Op.VIEW_FETCH in ops) == transient
    assert transient == (name in ("ratrain-transient-sharded", "fsdp-pp"))
    ledger = replay(sch, SPEC, plan, eager_kernels=True)
    for m in ledger.stages:  # nothing kept for a backward: F's activations end with it
        assert m.breakdown_at_peak["grad"] == 0
        assert m.peak_bytes - m.static_bytes < 4 * 2**20
    res = simulate_schedule(sch, CostModel(SPEC, plan, load("cpu-local")), ledger=ledger)
    assert res.step_time_s > 0 and len(res.peak_memory_bytes) == plan.pp


def test_check_refuses_backward_work_in_a_forward_only_schedule():
    sch = build_eval_schedule(SPEC, PLAN, 2)
    b = Action(Op.B, 1, (SPEC.n_layers + 1,), 0)
    sch.stages[1].append(b)
    sch.deps[b] = (Action(Op.F, 1, (SPEC.n_layers + 1,), 0),)
    problems = find_problems(sch, SPEC, PLAN)
    assert any("in a forward-only schedule" in p for p in problems), problems
    sch = build_eval_schedule(SPEC, PLAN, 2)
    sch.stages[0].remove(Action(Op.F, 0, (1,), 1))
    with pytest.raises(ScheduleError, match=r"0 F\(1, 1\), expected 1"):
        check_schedule(sch, SPEC, PLAN)


# -- the runtime against the reference ---------------------------------------------------
def _synthetic(plan: Plan):
    return functools.partial(held_out_source, "synthetic", SPEC, plan.seq, CFG.seed)


def _job(plan: Plan, eval_every: int | None, **kw):
    job = harness.job(SPEC, plan, CFG, [("run", {})], timeout_s=60, deadline_s=240, **kw)
    if eval_every is None:
        return job
    return dataclasses.replace(job, evaluation=EvalOpts(every=eval_every, source=_synthetic(plan)))


def _run(plan: Plan, eval_every: int | None) -> tuple[list[float], list[tuple[int, float]]]:
    results = run_job(_job(plan, eval_every))
    evals = {tuple(r.runs["run"].evals) for r in results}
    assert len(evals) == 1, evals  # every rank got the same held-out losses
    return harness.losses(results, "run"), list(evals.pop())


def _reference_evals(plan: Plan, at: list[int]) -> list[tuple[int, float]]:
    ref = ReferenceTrainer(SPEC, plan, CFG, harness.source(SPEC, plan, CFG)())
    batches = eval_batches(_synthetic(plan)(), plan)
    out = []
    for k in range(CFG.steps):
        ref.train_step(k)
        if k + 1 in at:
            out.append((k + 1, ref.evaluate(batches)))
    return out


def _assert_close(evals, ref) -> float:
    assert [k for k, _ in evals] == [k for k, _ in ref]
    worst = max(abs(x - y) / abs(y) for (_, x), (_, y) in zip(evals, ref, strict=True))
    assert worst <= 1e-6, (evals, ref)
    return worst


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_pp2_dp2_eval_equals_reference_and_leaves_training_unchanged():
    losses, evals = _run(PLAN, eval_every=2)
    assert [k for k, _ in evals] == [2, 3]  # every 2 steps, and after the last
    _assert_close(evals, _reference_evals(PLAN, [2, 3]))
    plain, none = _run(PLAN, eval_every=None)
    assert none == [] and losses == plain  # bit for bit


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_pp1_eval_equals_reference():
    plan = PLAN.replace(pp=1, dp=1, global_batch=2, recompute="none")
    _, evals = _run(plan, eval_every=1)
    assert [k for k, _ in evals] == [1, 2, 3]
    _assert_close(evals, _reference_evals(plan, [1, 2, 3]))


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_transient_sharded_views_and_recompute_leave_training_unchanged():
    plan = PLAN.replace(
        compute_dtype="bf16",
        view_policy="transient",
        shard_optimizer=True,
        recompute=("selective", "full"),
    )
    losses, evals = _run(plan, eval_every=2)
    assert losses == _run(plan, eval_every=None)[0]
    ref = _reference_evals(plan, [2, 3])
    assert max(abs(x - y) / y for (_, x), (_, y) in zip(evals, ref, strict=True)) <= 1e-2


# -- the commands ------------------------------------------------------------------------
SMALL = ["--seq", "16", "--micro-batch", "1", "--global-batch", "4", "--quiet"]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_ratrain_eval_of_a_checkpoint_equals_the_in_training_eval(tmp_path, capsys):
    from _text import make_docs, make_tokenizer, write_jsonl

    docs = make_docs(300)
    write_jsonl(tmp_path / "c.jsonl", docs)
    make_tokenizer(tmp_path / "tok", docs)
    data = str(tmp_path / "data")
    argv = ["prepare", str(tmp_path / "c.jsonl"), "--tokenizer", str(tmp_path / "tok")]
    assert main([*argv, "-o", data, "--val-fraction", "0.05", "--workers", "1"]) == 0
    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ck"
    train = ["train", "--data", data, "--model", "tiny", "--pp", "2", "--dp", "2", *SMALL]
    train += ["--steps", "2", "--eval-every", "1", "--save", str(ckpt), "--metrics", str(metrics)]
    assert main(train) == 0
    out = capsys.readouterr().out
    assert "evaluating every 1 steps" in out and "eval_loss" in out
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [("eval_loss" in r) for r in records] == [True, True]
    want = records[-1]["eval_loss"]  # after step 1: the weights of step-00000002
    assert main(["eval", str(ckpt), "--data", data, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["eval_loss"] == want and got["step"] == 2 and got["sequences"] == 32
    assert main(["eval", str(ckpt), "--data", data, "--pp", "1", "--dp", "1", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)["eval_loss"]
    assert abs(other - want) / want <= 1e-6  # another plan, the same held-out loss


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--eval-every", "0"], "--eval-every: expected a positive integer"),
        (["--eval-every", "x"], "--eval-every: expected a positive integer"),
        (["--eval-every", "2", "--eval-tokens", "0"], "--eval-tokens: expected a positive"),
        (["--eval-tokens", "64"], "--eval-tokens needs --eval-every N"),
        (["--eval-data", "synthetic"], "--eval-data needs --eval-every N"),
        (["--eval-data", ""], "--eval-data: expected a value"),
        (["--eval-every", "2"], "--eval-every needs a held-out set"),
        (["--eval-every", "2", "--eval-data", "nope.jsonl"], "'nope.jsonl' not found"),
        (
            ["--eval-every", "2", "--eval-data", "synthetic", "--eval-tokens", str(2**40)],
            "microbatches per replica, more than",
        ),
    ],
)
def test_bad_eval_flags_are_one_line_exit_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--pp", "1", "--steps", "1", *SMALL, *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_prepared_data_without_a_held_out_split_is_one_line(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from _text import make_docs, make_tokenizer, write_jsonl

    docs = make_docs(40)
    write_jsonl(tmp_path / "c.jsonl", docs)
    make_tokenizer(tmp_path / "tok", docs)
    data = str(tmp_path / "data")
    argv = ["prepare", str(tmp_path / "c.jsonl"), "--tokenizer", str(tmp_path / "tok"), "-o", data]
    assert main([*argv, "--val-fraction", "0", "--workers", "1"]) == 0
    capsys.readouterr()
    train = ["train", "--data", data, "--pp", "1", "--steps", "1", "--eval-every", "1", *SMALL]
    assert main(train) == 2
    err = capsys.readouterr().err
    assert "has no held-out (val) split" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["nope", "--data", "synthetic"], "CKPT 'nope': no such checkpoint directory"),
        (["nope", "--data", "synthetic", "--eval-tokens", "0"], "expected a positive integer"),
        (["nope"], "the following arguments are required: --data"),
    ],
)
def test_bad_eval_command_input_is_one_line_exit_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
