"""A structure's knob queue runs fastest bound first, each bound scaled by how far over it
its group's simulated steps came (`structure.run_queue`): a group whose bounds prove loose
waits behind tighter ones. Only the order changes: a cut's floor is the least bound left."""

from ratrain.models.presets import get_preset
from ratrain.planner import Request, structure
from ratrain.planner.result import Top
from ratrain.planner.space import family_of, knob_combos, structures
from ratrain.platforms import load


def _queue():
    req = Request(get_preset("llama2-70b"), load("a100-80g"), 24, 64, 4096)
    fam = family_of("ratrain")
    st = next(s for s in structures(req, fam) if s.pp == 12 and s.dp == 2)
    state = structure.State()
    kns = structure.memory_pass(req, st, fam, knob_combos(req, fam, st), state)
    return req, st, fam, structure.bound_knobs(req, st, fam, kns, state)


def _run(monkeypatch, loose: float, cut_after: int):
    req, st, fam, queue = _queue()
    ran = []
    state = structure.State()
    first = structure._bound_group(queue[0].kn)

    def fake_fit(ctx, opts):
        ran.append(ctx.kn)
        # The group of the queue's least bound proves loose; the others tight.
        over = loose if structure._bound_group(ctx.kn) == first else 1.0
        ctx.last_step_s = ctx.lb * over
        if len(ran) == cut_after:
            state.cut_at(ctx.lb)

    monkeypatch.setattr(structure, "_per_stage", fake_fit)
    structure.run_queue(None, req, st, fam, queue, Top(1), state, prune=False)
    return queue, ran, state


def test_a_loose_group_waits_behind_a_tight_one(monkeypatch):
    queue, ran, _ = _run(monkeypatch, loose=1.2, cut_after=0)
    assert len(ran) == len(queue)
    # After the queue's least bound ran 20% over, the other groups' combinations (bounds
    # within 20% of it) run before the rest of its group.
    group = structure._bound_group
    first = group(queue[0].kn)
    assert ran[0] is queue[0].kn
    other_ran = next(i for i, kn in enumerate(ran) if group(kn) != first)
    other_bound = next(i for i, q in enumerate(queue) if group(q.kn) != first)
    assert other_ran < other_bound


def test_a_cut_leaves_the_least_bound_left_as_its_floor(monkeypatch):
    queue, ran, state = _run(monkeypatch, loose=1.2, cut_after=3)
    assert len(ran) == 3
    left = [q.lb for q in queue if not any(q.kn is kn for kn in ran)]
    assert state.floor is not None
    assert state.floor <= min(left)
