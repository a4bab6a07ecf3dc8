"""Schedules: the IR, 1F1B generation, the three lowerings and validity checks.

Pure Python (no torch)::

    from ratrain.schedule import build_schedule, check_schedule
    sch = build_schedule(spec, plan)      # baseline | gpu-style | ratrain, per plan.schedule
                                          # (plan.pipeline zb-h1/zb-h2/zb-v: a split backward)
    check_schedule(sch, spec, plan)       # raises ScheduleError listing problems
    ev = build_eval_schedule(spec, plan, n)  # forward only: the held-out loss (no B, no UPD)
"""

from ratrain.schedule.build import build_schedule
from ratrain.schedule.check import ScheduleError, check_schedule, dry_run, find_problems
from ratrain.schedule.eval import build_eval_schedule, eval_plan
from ratrain.schedule.ir import Action, Op, Resource, Schedule, format_action, parse_action
from ratrain.schedule.lowering import action_bytes
from ratrain.schedule.onef1b import build_1f1b, pass_order, warmup_passes
from ratrain.schedule.passes import global_checks, reads_view

__all__ = [
    "Action",
    "Op",
    "Resource",
    "Schedule",
    "ScheduleError",
    "action_bytes",
    "build_1f1b",
    "build_eval_schedule",
    "build_schedule",
    "check_schedule",
    "dry_run",
    "eval_plan",
    "find_problems",
    "format_action",
    "global_checks",
    "pass_order",
    "parse_action",
    "reads_view",
    "warmup_passes",
]
