"""The schedule checker: hand-broken schedules must be rejected with the reason."""

import copy

import pytest

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.schedule import (
    Action,
    Op,
    Schedule,
    ScheduleError,
    build_schedule,
    check_schedule,
    dry_run,
    find_problems,
    parse_action,
)

TINY = get_preset("tiny")


def plan_of(pp=2, m=2, **kw) -> Plan:
    return Plan(pp=pp, global_batch=m, seq=32, **kw)


def built(plan: Plan) -> Schedule:
    sch = build_schedule(TINY, plan)
    check_schedule(sch, TINY, plan)  # valid before we break it
    return copy.deepcopy(sch)


def problems(sch: Schedule, plan: Plan) -> str:
    with pytest.raises(ScheduleError) as e:
        check_schedule(sch, TINY, plan)
    assert isinstance(e.value, RatrainError)
    return " | ".join(e.value.problems)


def remove(sch: Schedule, text: str) -> Action:
    a = parse_action(text)
    sch.stages[a.stage].remove(a)
    return a


def test_missing_send():
    plan = plan_of()
    sch = built(plan)
    remove(sch, "0SEND_F1@2")
    msg = problems(sch, plan)
    assert "1RECV_F1@2 has no matching 0SEND_F1@2" in msg


def test_unpaired_recv_dependency():
    plan = plan_of()
    sch = built(plan)
    recv = parse_action("0RECV_B0@3")
    sch.deps[recv] = ()
    assert "0RECV_B0@3 does not depend on its 1SEND_B0@3" in problems(sch, plan)


def test_backward_before_its_forward():
    plan = plan_of(pp=1, m=2)
    sch = built(plan)
    acts = sch.stages[0]
    b = remove(sch, "0B1@5")
    acts.insert(acts.index(parse_action("0F1@0")), b)
    assert "0B1@5 before its F" in problems(sch, plan)


def test_missing_forward():
    plan = plan_of(pp=1, m=1)
    sch = built(plan)
    remove(sch, "0F0@3")
    msg = problems(sch, plan)
    assert "0F0@3, which is not in the schedule" in msg  # F0@4 depended on it


def test_double_update():
    plan = plan_of(schedule="ratrain")
    sch = built(plan)
    again = Action(Op.UPDATE, 1, (4,), visit=1)
    sch.stages[1].append(again)
    sch.deps[again] = sch.deps_of(parse_action("1UPD@4"))
    assert "unit 4 updated 2 times, expected once" in problems(sch, plan)


def test_update_before_its_sync_lands():
    plan = plan_of(schedule="ratrain", clip_grad=None)
    sch = built(plan)
    upd = parse_action("0UPD@2")
    sch.deps[upd] = ()
    assert "0UPD@2 does not wait for 0SYNC@2" in problems(sch, plan)


def test_update_must_wait_for_global_checks():
    plan = plan_of(schedule="ratrain", clip_grad=1.0)
    sch = built(plan)
    upd = parse_action("1UPD@3")
    sch.deps[upd] = (parse_action("1SYNC@3"),)
    assert "1UPD@3 does not wait for 1NORM" in problems(sch, plan)


def test_missing_global_check():
    plan = plan_of(schedule="baseline", compute_dtype="fp16")
    sch = built(plan)
    ovf = remove(sch, "0OVF")
    for a, deps in sch.deps.items():
        sch.deps[a] = tuple(d for d in deps if d != ovf)
    assert "stage 0 has 0 OVF, expected 1" in problems(sch, plan)


def test_view_read_after_its_drop():
    plan = plan_of(pp=1, m=2, view_policy="transient", view_lookahead=1)
    sch = built(plan)
    acts = sch.stages[0]
    vd = next(a for a in acts if a.op is Op.VIEW_DROP and a.units == (2,))
    use = next(a for a in acts if a.op is Op.F and a.units == (2,))
    acts.remove(vd)
    acts.insert(acts.index(use), vd)  # drop the view just before it is read
    assert "0F0@2 reads the view of unit 2 after its VIEW_DROP" in problems(sch, plan)


def test_view_read_without_waiting_for_its_fetch():
    plan = plan_of(pp=1, m=1, view_policy="transient")
    sch = built(plan)
    use = parse_action("0F0@3")
    sch.deps[use] = tuple(d for d in sch.deps_of(use) if d.op is not Op.VIEW_FETCH)
    assert "0F0@3 reads unit 3's view without depending on 0VF@3" in problems(sch, plan)


def test_backward_without_its_recompute():
    plan = plan_of(pp=1, m=1, recompute="full")
    sch = built(plan)
    rc = remove(sch, "0RC0@2")
    sch.deps[parse_action("0B0@2")] = (parse_action("0F0@2"), parse_action("0B0@3"))
    del sch.deps[rc]
    assert "0B0@2 needs a RECOMPUTE (policy full)" in problems(sch, plan)


def test_offloaded_activation_read_without_reload():
    plan = plan_of(pp=2, m=3, offload_activations=True)
    sch = built(plan)
    rel = remove(sch, "0REL0@1")
    for a, deps in sch.deps.items():
        sch.deps[a] = tuple(d for d in deps if d != rel)
    assert "0B0@1 reads offloaded activations without a RELOAD" in problems(sch, plan)


def test_a_receive_posted_before_a_send_runs_beside_it():
    # stage 0 posts its RECV_B before its SEND_F: an irecv runs beside an isend, so the
    # activation goes out while the receive waits (`ratrain.schedule.rendezvous`)
    plan = plan_of(pp=2, m=1, schedule="baseline", clip_grad=None)
    sch = built(plan)
    acts = sch.stages[0]
    send = parse_action("0SEND_F0@2")
    recv = parse_action("0RECV_B0@3")
    acts.remove(recv)
    acts.insert(acts.index(send), recv)
    check_schedule(sch, TINY, plan)
    assert dry_run(sch) > 0


def test_deadlock_a_send_whose_receive_is_never_posted_in_time():
    # stage 1 posts its RECV_F after the F that needs it: the activation never moves (a
    # transfer runs once both ends have posted it), and stage 0 waits for the gradient
    plan = plan_of(pp=2, m=1, schedule="baseline", clip_grad=None)
    sch = built(plan)
    acts = sch.stages[1]
    recv = parse_action("1RECV_F0@2")
    acts.remove(recv)
    acts.insert(acts.index(parse_action("1F0@3")) + 1, recv)
    msg = problems(sch, plan)
    assert "deadlock" in msg
    assert "stage 1 waits at 1F0@3 for 1RECV_F0@2" in msg
    assert "stage 0 send to stage 1 queue" not in msg  # the send was never queued
    with pytest.raises(ScheduleError, match="deadlock"):
        dry_run(sch)


def test_dependency_cycle_is_a_deadlock():
    plan = plan_of(pp=1, m=1)
    sch = built(plan)
    f = parse_action("0F0@0")
    sch.add_dep(f, parse_action("0F0@1"))  # F0 waits for F1, which waits for F0
    assert "stage 0 waits at 0F0@0 for 0F0@1" in problems(sch, plan)


def test_global_check_waits_for_every_stage():
    # stage 1 issues its NORM after the UPDATE that waits for it: stage 1 never joins
    # the collective, so stage 0 is stuck in it too
    plan = plan_of(pp=2, m=1, schedule="baseline")
    sch = built(plan)
    acts = sch.stages[1]
    norm = remove(sch, "1NORM")
    acts.insert(acts.index(parse_action("1UPD@3-5")) + 1, norm)
    msg = problems(sch, plan)
    assert "stage 1 waits at 1UPD@3-5 for 1NORM" in msg
    assert "stage 0 dp_net queue stuck at 0NORM, waiting for the other stages" in msg


def test_structure_errors():
    plan = plan_of(pp=2, m=2)
    sch = built(plan)
    assert "2 stage lists for pp=3" in " ".join(find_problems(sch, TINY, plan_of(pp=3, m=2)))
    sch.stages[0].append(parse_action("1F0@3"))
    msg = problems(sch, plan)
    assert "1F0@3 appears 2 times" in msg and "1F0@3 is in stage 0's list" in msg


def test_error_message_is_one_line():
    plan = plan_of(pp=2, m=12)
    sch = built(plan)
    sch.stages[1] = [a for a in sch.stages[1] if a.op is not Op.RECV_F]
    with pytest.raises(ScheduleError) as e:
        check_schedule(sch, TINY, plan)
    assert len(e.value.problems) > 8
    assert "\n" not in str(e.value) and "more" in str(e.value)
