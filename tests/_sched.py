"""A hand-built non-interleaved 1F1B schedule in the IR, for tests of the simulator that
must not depend on the schedule generator."""

from ratrain.schedule.ir import Action, Op, Schedule


def _chain(sch, acts):
    for later, earlier in zip(acts[1:], acts[:-1], strict=True):
        sch.add_dep(later, earlier)


# A transfer is named by the unit on its sending side (the IR's convention, by which the
# simulator pairs a send with its receive): the last unit's output, the first's gradient.
def _forward(sch, s, pp, units, i):
    acts = [Action(Op.RECV_F, s, (units[0] - 1,), i)] if s > 0 else []
    acts += [Action(Op.F, s, (u,), i) for u in units]
    if s < pp - 1:
        acts.append(Action(Op.SEND_F, s, (units[-1],), i))
    _chain(sch, acts)
    return acts


def _backward(sch, s, pp, units, i):
    acts = [Action(Op.RECV_B, s, (units[-1] + 1,), i)] if s < pp - 1 else []
    acts += [Action(Op.B, s, (u,), i) for u in reversed(units)]
    if s > 0:
        acts.append(Action(Op.SEND_B, s, (units[0],), i))
    _chain(sch, acts)
    sch.add_dep(Action(Op.B, s, (units[-1],), i), Action(Op.F, s, (units[-1],), i))
    return acts


def one_f_one_b(spec, plan):
    """Warmup, steady 1F1B, cooldown; then a stage-wide sync and update (Baseline style)."""
    pp, m = plan.pp, plan.microbatches
    sch = Schedule([], kind="hand-1f1b")
    for s in range(pp):
        units = tuple(plan.stage_units(spec, s))
        w = min(pp - s - 1, m)
        order = [("F", i) for i in range(w)]
        for i in range(m - w):
            order += [("F", w + i), ("B", i)]
        order += [("B", i) for i in range(m - w, m)]
        acts = []
        for kind, i in order:
            acts += (_forward if kind == "F" else _backward)(sch, s, pp, units, i)
        sync, upd = Action(Op.GRAD_SYNC, s, units), Action(Op.UPDATE, s, units)
        sch.add_dep(sync, Action(Op.B, s, (units[0],), m - 1))
        sch.add_dep(upd, sync)
        sch.stages.append(acts + [sync, upd])
    return sch
