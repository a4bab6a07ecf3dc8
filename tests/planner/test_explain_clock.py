"""The explanation's estimate of a ledger confirmation counts the microbatches the ledger
really replays: the shortened step's, or the whole step's where sends are held to the
step's end (cpu-local), where `Evaluator.memory` does not shorten it."""

from ratrain.config import Plan
from ratrain.models.presets import get_preset
from ratrain.planner.evaluate import Evaluator
from ratrain.planner.feasible import ReplayClock
from ratrain.planner.space import Request
from ratrain.platforms.load import load
from ratrain.sim.simulate import memory_microbatches

TINY = get_preset("tiny")


def _plan(m: int) -> Plan:
    return Plan(pp=2, global_batch=m, seq=128, schedule="ratrain", model="tiny")


def test_the_work_is_the_replayed_step():
    plan = _plan(40)
    units = TINY.n_layers + 2
    short = memory_microbatches(plan)
    assert short < plan.microbatches
    held = Request(TINY, load("cpu-local"), 2, 40, 128)
    assert held.platform.sends_held_until_waited
    assert ReplayClock.work(held, plan) == plan.microbatches * units
    fused = Request(TINY, load("mt3000"), 2, 40, 128)
    assert not fused.platform.sends_held_until_waited
    assert ReplayClock.work(fused, plan) == short * units


def test_the_evaluator_replays_those_microbatches():
    """What `work` assumes of `Evaluator.memory`: the report's key plan is the full step on
    cpu-local, the shortened one elsewhere."""
    plan = _plan(40)
    for name, want in (("cpu-local", plan.microbatches), ("mt3000", memory_microbatches(plan))):
        ev = Evaluator(Request(TINY, load(name), 2, 40, 128))
        ev.memory(plan)
        (key,) = ev._mem
        replayed = dict(key)["global_batch"] // (plan.micro_batch * plan.dp)
        assert replayed == want, name
