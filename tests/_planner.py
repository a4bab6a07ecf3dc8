"""Shared by the planner's tests: the tiny model, a cap its plans straddle, and the best
plan of a space found by trying every plan (the search's reference)."""

from __future__ import annotations

import itertools
from dataclasses import replace

from ratrain.models.presets import get_preset
from ratrain.planner.evaluate import usable_bytes
from ratrain.planner.families import FAMILIES
from ratrain.planner.fit import stage_options
from ratrain.planner.space import Request, knob_combos, make_plan, structures
from ratrain.platforms.load import load
from ratrain.schedule import build_schedule
from ratrain.sim import simulate
from ratrain.sim.simulate import platform_ledger

TINY = get_preset("tiny")


def small_cap(usable: int = 3_000_000, workspace: int = 500_000, platform: str = "mt3000"):
    """A platform (mt3000 by default) with a cap that the tiny model's plans straddle (so
    recompute matters)."""
    return replace(load(platform), usable_memory_bytes=usable, workspace_bytes=workspace)


def exhaustive(req: Request) -> tuple[float, int, int]:
    """Best tokens/s over every plan of the space, every recompute choice included."""
    best, feasible, infeasible = 0.0, 0, 0
    limit = usable_bytes(req)
    for name in req.families:
        fam = FAMILIES[name]
        for st in structures(req, fam):
            for kn in knob_combos(req, fam, st):
                if fam.per_stage_recompute:
                    recs = itertools.product(*(stage_options(n) for n in st.layer_split))
                else:
                    recs = ((o,) * st.pp for o in stage_options(max(st.layer_split)))
                for rec in recs:
                    plan = make_plan(req, st, kn, tuple(rec))
                    sch = build_schedule(req.spec, plan)
                    # memory as the planner and the simulator count it (the platform's
                    # eager kernels and held sends)
                    led = platform_ledger(sch, req.spec, plan, req.platform, keep_trace=False)
                    if any(s.peak_bytes > limit for s in led.stages):
                        infeasible += 1
                        continue
                    feasible += 1
                    best = max(best, simulate(req.spec, plan, req.platform).tokens_per_s)
    return best, feasible, infeasible
