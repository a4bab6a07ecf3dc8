"""The engine's plain path (`ratrain.sim.flat`) against the reference engine
(`ratrain.sim.engine._Engine`, which the processor-sharing engine extends): the same issue,
start and end times, bit for bit, on random plans' schedules with random durations (with
many ties, to exercise simultaneous events), and the same deadlock error."""

import random

import pytest

from ratrain.config import SCHEDULES, Plan
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.schedule import build_schedule
from ratrain.schedule.ir import Action, Op, Resource, Schedule
from ratrain.sim.engine import _Engine, run_flat
from ratrain.sim.flat import graph, run_plain

TINY = get_preset("tiny")


def _reference(schedule, durations, resources):
    eng = _Engine(schedule, durations, resources)
    eng.run()
    return eng.issue, eng.start, eng.end


def _random_plan(rng: random.Random) -> Plan:
    schedule = rng.choice(SCHEDULES)
    pp = rng.choice((1, 2, 3, 4))
    dp = rng.choice((1, 2))
    return Plan(
        pp=pp,
        dp=dp,
        global_batch=dp * rng.randint(1, 7),
        seq=64,
        schedule=schedule,
        recompute=rng.choice(("none", "selective", "full", "first:1")),
        shard_optimizer=schedule == "fsdp-pp" or rng.random() < 0.5,
        view_policy=rng.choice(("persistent", "transient")),
        view_lookahead=rng.choice((1, 2)),
        offload_activations=rng.random() < 0.4,
        compute_dtype=rng.choice(("fp16", "bf16")),
    )


@pytest.mark.parametrize("seed", range(24))
def test_plain_path_equals_the_reference_engine(seed):
    rng = random.Random(seed)
    plan = _random_plan(rng)
    sch = build_schedule(TINY, plan)
    acts = [a for stage in sch.stages for a in stage]
    # Few distinct durations (zeros too): many events fall at the same instant.
    durations = [float(rng.choice((0, 1, 1, 2, 3))) * 0.5 for _ in acts]
    gather = rng.random() < 0.5  # a view fetch may queue on the DP network (an all-gather)
    resources = [Resource.DP_NET if gather and a.op is Op.VIEW_FETCH else a.resource for a in acts]
    want = _reference(sch, durations, resources)
    got = run_plain(graph(sch), durations, resources)
    assert got == want
    assert run_flat(sch, durations, resources) == want
    assert min(want[2]) >= 0  # every action ran


def test_deadlock_is_reported_as_the_reference_does():
    a = Action(Op.F, 0, (1,), 0)
    b = Action(Op.F, 0, (2,), 0)
    sch = Schedule(stages=[[a, b]], deps={a: (b,)})  # a waits for b, which follows it
    assert run_plain(graph(sch), [1.0, 1.0], [Resource.COMPUTE] * 2) is None
    with pytest.raises(RatrainError, match="deadlocks"):
        run_flat(sch, [1.0, 1.0], [Resource.COMPUTE] * 2)


def test_schedule_errors_are_kept():
    a = Action(Op.F, 0, (1,), 0)
    with pytest.raises(RatrainError, match="appears twice"):
        graph(Schedule(stages=[[a, Action(Op.F, 0, (1,), 0)]]))
    with pytest.raises(RatrainError, match="in no stage's list"):
        graph(Schedule(stages=[[a]], deps={a: (Action(Op.B, 0, (1,), 0),)}))
    send = Action(Op.SEND_F, 0, (1,), 0)
    with pytest.raises(RatrainError, match="matching receive"):
        graph(Schedule(stages=[[a, send], []]))
