"""`ratrain plan`: the fastest plan that fits the memory cap, and the runners-up.

Prints a ranked table (predicted tokens/s, step time, bubble, peak memory against the cap)
and the winner's per-stage memory; `-o plan.yaml` writes the winner for `ratrain simulate
--plan` and the runtime; `--plot` draws its memory per stage against the cap; `--json`
prints one JSON object. When nothing fits it explains why and exits 2. `--trial K` runs
the best K structures' plans, and each other family's best structure and best plan under
ratrain's lifecycle, a few steps on this machine and keeps the fastest measured
(`ratrain.validate.trial`); only then is torch imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from ratrain.cli.common import (
    add_memory_cap_arg,
    add_model_arg,
    nonempty,
    nonneg_float,
    positive_float,
    positive_int,
    with_memory_cap,
)
from ratrain.deadline import (
    DEFAULT_TIME_BUDGET_S,
    EXPLAIN_BUDGET_FACTOR,
    GAP_ENOUGH,
    INFEASIBLE_BUDGET_FACTOR,
    NO_FIT_BUDGET_FACTOR,
    Budget,
)
from ratrain.errors import RatrainError
from ratrain.platforms import PLATFORM_PRESETS

__all__ = [
    "add_arguments",
    "run",
    "default_global_batch",
    "DEFAULT_BATCH_TOKENS",
    "SEQS_PER_CLUSTER",
    "DEFAULT_TIME_BUDGET_S",
]

DEFAULT_BATCH_TOKENS = 4 * 2**20
"""LLaMA 2's global batch, 4M tokens (Touvron et al. 2023, §2.2): 1024 sequences of 4096;
the paper's runs use it. The most tokens `default_global_batch` gives."""

SEQS_PER_CLUSTER = 16
"""assumed: the default global batch gives each cluster 16 sequences a step. On any pp x dp
within the clusters, at micro-batch 1 each pipeline then runs at least 16 x pp
microbatches, so 1F1B's bubble, (pp - 1) / (m + pp - 1), stays under 1/17 (6%) at any
depth, and the per-step costs (gradient sync, optimizer update) are spread over 16
sequences of compute per cluster; more only lengthens the step (and the time between
updates). Capped at `DEFAULT_BATCH_TOKENS` (from 64 clusters at seq 4096), where the
planner trades depth for the bubble itself, as in the paper."""

BATCH_RULE = (
    f"{SEQS_PER_CLUSTER} sequences per cluster, at most "
    f"{DEFAULT_BATCH_TOKENS // 2**20}M tokens as in the paper"
)
"""The default global batch's rule in words (`ratrain plan --help`, its output)."""


def default_global_batch(seq: int, clusters: int) -> int:
    """The global batch (sequences) `ratrain plan` takes without --global-batch:
    `SEQS_PER_CLUSTER` per cluster, capped at `DEFAULT_BATCH_TOKENS` (LLaMA 2's 4M tokens,
    the paper's batch, which large clusters reach: 64 clusters at seq 4096), at least 1."""
    return max(1, min(DEFAULT_BATCH_TOKENS // seq, SEQS_PER_CLUSTER * clusters))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arg(p, default="llama2-7b")
    p.add_argument(
        "--platform",
        type=nonempty,
        default="mt3000",
        help=f"a preset ({', '.join(PLATFORM_PRESETS)}) or a platform YAML file (default mt3000)",
    )
    add_memory_cap_arg(p)
    p.add_argument(
        "--clusters",
        type=positive_int,
        required=True,
        help="compute units to plan for (pp x dp <= clusters; the rest is reported as left over)",
    )
    batch = p.add_mutually_exclusive_group()
    batch.add_argument(
        "--global-batch",
        type=positive_int,
        help=f"sequences per optimizer step, over all replicas (default: {BATCH_RULE}: "
        f"min({DEFAULT_BATCH_TOKENS // 2**20}M tokens / --seq, {SEQS_PER_CLUSTER} x --clusters), "
        "which below the cap keeps the 1F1B bubble under 6%% at micro-batch 1 at any pipeline "
        "depth)",
    )
    batch.add_argument(
        "--global-batch-tokens",
        type=positive_int,
        help="tokens per optimizer step (a multiple of --seq)",
    )
    p.add_argument(
        "--seq", type=positive_int, help="tokens per sequence (default min(4096, the model's max))"
    )
    p.add_argument(
        "--pin",
        action="append",
        metavar="FIELD=VALUE",
        default=[],
        help="fix a plan field, e.g. --pin pp=8 --pin recompute=full --pin schedule=ratrain "
        "(repeatable)",
    )
    p.add_argument(
        "--family",
        action="append",
        choices=("ratrain", "gpu-style", "zero1-pp", "fsdp-pp", "baseline"),
        help="search only these systems (repeatable; default all)",
    )
    p.add_argument(
        "--baselines",
        action="store_true",
        help="also find the best gpu-style, zero1-pp and fsdp-pp plans and print the speedup "
        "over each",
    )
    p.add_argument("--top", type=positive_int, default=3, help="plans to rank (default 3)")
    _add_trial_arguments(p)
    p.add_argument(
        "-o", "--output", metavar="PLAN.yaml", help="write the best plan (YAML, or JSON by suffix)"
    )
    p.add_argument(
        "--plot", metavar="MEM.png", help="write the best plan's memory per stage against the cap"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--time-budget",
        type=nonneg_float,
        default=DEFAULT_TIME_BUDGET_S,
        metavar="SECONDS",
        help="stop the search after this long once a plan fits, and report how far the best "
        f"may be from the optimum; with none fitting yet, after {NO_FIT_BUDGET_FACTOR:g}x this "
        "long, and say so; an infeasible request's suggested changes are searched for "
        f"{EXPLAIN_BUDGET_FACTOR:g}x this long at most (less when start-up and proof took longer than "
        f"{INFEASIBLE_BUDGET_FACTOR - EXPLAIN_BUDGET_FACTOR:g}x); 0 searches until proven "
        "optimal or infeasible "
        f"(default {DEFAULT_TIME_BUDGET_S:g})",
    )
    p.add_argument(
        "--gap",
        type=nonneg_float,
        default=GAP_ENOUGH,
        metavar="FRACTION",
        help="with a time budget, stop sooner once the best plan is certified within this "
        "fraction of the optimum (no plan of the space can be faster than the best step / "
        f"(1 + FRACTION)); 0 searches to the time budget (default {GAP_ENOUGH:g})",
    )


def _add_trial_arguments(p: argparse.ArgumentParser) -> None:
    from ratrain.validate.trial import (
        DEFAULT_LIMIT_S,
        DEFAULT_MARGIN,
        DEFAULT_ROUNDS,
        DEFAULT_STEPS,
        DEFAULT_WARMUP,
    )

    p.add_argument(
        "--trial",
        type=positive_int,
        metavar="K",
        help="measure before choosing: run the best plan of each of the K best predicted "
        "structures, and each other family's (gpu-style, zero1-pp, fsdp-pp) best structure "
        f"and best plan under ratrain's lifecycle, {DEFAULT_WARMUP} untimed + --trial-steps timed steps "
        "each on this machine's cores, and keep the fastest measured (it is what -o "
        "writes); prints each plan's predicted and measured tokens/s and how much slower the "
        "prediction-only pick measured (its regret). Plan for this machine (cpu-local, or "
        "your `ratrain calibrate` file)",
    )
    p.add_argument(
        "--trial-steps",
        type=positive_int,
        default=DEFAULT_STEPS,
        metavar="N",
        help=f"--trial: timed steps per run, their median is its measure (default {DEFAULT_STEPS})",
    )
    p.add_argument(
        "--trial-rounds",
        type=positive_int,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help=f"--trial: runs per plan at most: after the first round, the plans within "
        f"{DEFAULT_MARGIN:.0%}% of the fastest run again, in the reverse order every other "
        f"round, and the median of a plan's runs is its measure (default {DEFAULT_ROUNDS}; "
        "1: one run each)",
    )
    p.add_argument(
        "--trial-time-limit",
        type=positive_float,
        default=DEFAULT_LIMIT_S,
        metavar="SECONDS",
        help="--trial: plans not started within this long are reported as not tried, and a "
        f"plan still running then is stopped (default {DEFAULT_LIMIT_S:g})",
    )


def _request(args: argparse.Namespace):
    from ratrain.models.presets import resolve_model
    from ratrain.planner import Request
    from ratrain.planner.families import ALL_FAMILIES
    from ratrain.planner.space import pin_conflict
    from ratrain.platforms import load

    spec, platform = resolve_model(args.model), with_memory_cap(load(args.platform), args)
    seq = args.seq or min(4096, spec.max_seq)
    if args.global_batch_tokens is not None:
        if args.global_batch_tokens % seq:
            raise RatrainError(
                f"--global-batch-tokens {args.global_batch_tokens} is not a multiple of --seq {seq}"
            )
        gb = args.global_batch_tokens // seq
    elif args.global_batch is not None:
        gb = args.global_batch
    else:
        gb = default_global_batch(seq, args.clusters)
    families = tuple(dict.fromkeys(args.family)) if args.family else ALL_FAMILIES
    pins = _pins(args.pin)
    _check_size(spec, args.clusters, gb, pins)
    req = Request(spec, platform, args.clusters, gb, seq, pins=pins, families=families)
    conflict = pin_conflict(req)  # a pin that rules out every candidate: named, not searched
    if conflict is not None:
        raise RatrainError(conflict)
    return req


def _batch_note(args: argparse.Namespace, req) -> str | None:
    """The line that says the global batch is the default and by which rule (None when
    --global-batch or --global-batch-tokens gave it)."""
    if args.global_batch is not None or args.global_batch_tokens is not None:
        return None
    return (
        f"global batch {req.global_batch:,} sequences (default: {BATCH_RULE}; here "
        f"min({DEFAULT_BATCH_TOKENS // req.seq:,}, {SEQS_PER_CLUSTER} x {req.clusters}); "
        "--global-batch sets it)"
    )


def _pins(items: list[str]) -> dict:
    """--pin's values, each checked as the plan field it sets (one line naming the pin)."""
    from ratrain.config import Plan
    from ratrain.planner import parse_pins

    pins = parse_pins(items)
    for name, value in pins.items():
        around = {"global_batch": 1}
        if name in ("layer_split", "recompute") and isinstance(value, tuple):
            around["pp"] = len(value)
        if name in ("dp", "micro_batch") and isinstance(value, int) and value > 0:
            around["global_batch"] = value
        if name == "schedule" and value == "fsdp-pp":
            around["shard_optimizer"] = True
        try:
            Plan(**{**around, name: value})
        except RatrainError as e:
            why = str(e).removeprefix("plan: ")
            raise RatrainError(f"--pin {name}={_text(value)}: {why}") from None
    return pins


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _check_size(spec, clusters: int, global_batch: int, pins: dict) -> None:
    """Refuse a request the planner cannot search in reasonable time: more clusters than
    `MAX_RANKS`, or a pipeline shape it would examine with more than `MAX_MICROBATCHES`
    microbatches per step (its schedule alone would take minutes and gigabytes)."""
    from ratrain.config import MAX_MICROBATCHES, MAX_RANKS

    if clusters > MAX_RANKS:
        raise RatrainError(
            f"--clusters {clusters:,}: more than the {MAX_RANKS:,} compute units ratrain plans for"
        )
    worst = _most_microbatches(spec.n_layers, clusters, global_batch, pins)
    if worst is not None and worst[0] > MAX_MICROBATCHES:
        m, pp, mb, dp = worst
        raise RatrainError(
            f"a global batch of {global_batch:,} sequences on {clusters:,} clusters: the "
            f"shape pp={pp}, dp={dp:,}, micro-batch {mb} has {m:,} microbatches per step (dp "
            f"divides the batch), more than the {MAX_MICROBATCHES:,} a schedule holds; lower "
            "--global-batch, pick one with more divisors, or --pin pp / micro_batch"
        )


def _most_microbatches(layers: int, clusters: int, gb: int, pins: dict):
    """(microbatches, pp, micro_batch, dp) of the pipeline shape with the most microbatches
    per step among those the planner examines (`ratrain.planner.space.structures`: for each
    pp and micro-batch, the largest dp that fits the clusters and divides the batch); None
    when there is none."""
    import bisect

    from ratrain.config import MAX_MICROBATCHES
    from ratrain.planner.space import MICRO_BATCHES

    pps = [pins["pp"]] if "pp" in pins else range(1, min(layers, clusters) + 1)
    mbs = [pins["micro_batch"]] if "micro_batch" in pins else MICRO_BATCHES
    worst = None
    for mb in mbs:
        if gb % mb:
            continue
        if gb // mb > MAX_MICROBATCHES * clusters:  # more than the cap on every shape
            return gb // mb // clusters, min(pps), mb, clusters
        divisors = _divisors(gb // mb) if "dp" not in pins else [pins["dp"]]
        for pp in pps:
            limit = clusters // pp
            if pp > min(layers, clusters) or limit < 1:
                continue
            dp = (
                divisors[bisect.bisect_right(divisors, limit) - 1]
                if "dp" not in pins
                else pins["dp"]
            )
            if dp < 1 or (gb // mb) % dp:
                continue
            cand = (gb // (mb * dp), pp, mb, dp)
            worst = cand if worst is None or cand > worst else worst
    return worst


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending (n is at most MAX_MICROBATCHES x MAX_RANKS here: the
    trial divisions stop at its square root, under a million)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _progress(args):
    if args.quiet:
        return None
    return lambda msg: print(f"ratrain plan: {msg}", file=sys.stderr, flush=True)


def _budget(args) -> Budget:
    """The answer's `Budget` (`Budget.for_plan`: none at --time-budget 0), from the
    command's start where `main` ran it (its imports and the platform count against the
    explanation's share)."""
    from ratrain.cli import STARTED_AT

    if args.time_budget < 0:
        raise RatrainError(f"--time-budget must be >= 0, got {args.time_budget:g}")
    return Budget.for_plan(args.time_budget or None, origin=STARTED_AT, gap=args.gap)


UNFINISHED = "unfinished"
"""A baseline family's entry when its search stopped at the hard deadline with no plan
found: not a claim that none fits."""


def _baselines(req, progress, budget: Budget) -> dict:
    """family -> its best plan, None where none fits, or `UNFINISHED` (each family's search
    on its own clock, with the answer's limits)."""
    from ratrain.planner import COMPARED_FAMILIES, search

    out = {}
    for name in COMPARED_FAMILIES:
        if req.pins.get("schedule") not in (None, _schedule_of(name)):
            continue
        res = search(
            req.with_(families=(name,)), top=1, progress=progress, budget=budget.restarted()
        )
        out[name] = UNFINISHED if res.unfinished else res.best
    return out


def _schedule_of(family: str) -> str:
    from ratrain.planner import FAMILIES

    return FAMILIES[family].schedule


def run(args: argparse.Namespace) -> int:
    from ratrain.cli.outputs import PLOT_SUFFIXES, prepare_output_file
    from ratrain.planner import explain, search
    from ratrain.planner.report import plot_memory, result_json

    prepare_output_file(args.output, "-o")
    prepare_output_file(args.plot, "--plot", PLOT_SUFFIXES)
    req = _request(args)
    progress = _progress(args)
    budget = _budget(args)
    # A trial looks for K distinct structures among the ranked plans (knob variants of one
    # structure rank side by side): the search ranks more of them.
    top = max(args.top, TRIAL_RANKED_PER_PLAN * args.trial) if args.trial else args.top
    res = search(req, top=top, progress=progress, budget=budget.restarted())
    if not res.feasible:
        ex = explain(
            req,
            res.near,
            budget=budget.explanation(res.search_time_s),
            unexamined=res.structures_left if res.unfinished else None,
        )
        if args.json:
            doc = _with_batch_rule(result_json(res, explanation=ex), args)
            doc["explanation"]["text"] = _untimed_lines(res, ex.lines())
            print(json.dumps(doc))
        else:
            note = _batch_note(args, req)
            print("\n".join([*([note] if note else []), *_untimed_lines(res, ex.lines())]))
        return 2
    baselines = _baselines(req, progress, budget) if args.baselines else None
    trial = _trial(req, res, baselines, args, progress, budget) if args.trial else None
    best = _chosen(res, trial)
    if args.output:
        _save(best, req, args, trial)
    if args.plot:
        plot_memory(
            best,
            args.plot,
            title=f"{req.spec.name} on {req.platform.name}, {req.clusters} clusters",
            headroom_bytes=req.platform.headroom_bytes,
        )
    shown = dataclasses.replace(res, ranked=res.ranked[: args.top])
    if args.json:
        doc = _with_batch_rule(result_json(shown, baselines=baselines), args)
        if trial is not None:
            doc["trial"] = trial.to_json()
        print(json.dumps(doc))
        return 0
    _print(shown, baselines, args, trial)
    return 0


TRIAL_RANKED_PER_PLAN = 4
"""assumed: a search ranking 4 plans per structure a trial asks for finds that many
distinct structures (its best plans are mostly knob variants of a few structures); fewer
are tried where it does not."""


def _trial(req, res, baselines, args, progress, budget: Budget):
    """The trial of `--trial K` (`ratrain.validate.trial`) on this machine's cores."""
    from ratrain.planner.candidates import trial_candidates
    from ratrain.validate.trial import DEFAULT_WARMUP, local_timer, run_trial

    bests = None
    if baselines is not None:
        bests = {f: c for f, c in baselines.items() if c is not UNFINISHED}
    cands = trial_candidates(req, res.ranked, args.trial, bests=bests, budget=budget)
    return run_trial(
        cands,
        local_timer(req.spec),
        warmup=DEFAULT_WARMUP,
        steps=args.trial_steps,
        rounds=args.trial_rounds,
        limit_s=args.trial_time_limit,
        progress=progress,
    )


def _chosen(res, trial):
    """The plan to write and describe: the trial's measured pick, else the search's #1."""
    pick = trial.pick if trial is not None else None
    if pick is None or pick.candidate.found is None:
        return res.best
    return pick.candidate.found


def _with_batch_rule(doc: dict, args: argparse.Namespace) -> dict:
    """`doc` with `global_batch_default`: the rule that gave the global batch, or None
    where a flag gave it."""
    given = args.global_batch is not None or args.global_batch_tokens is not None
    doc["global_batch_default"] = None if given else BATCH_RULE
    return doc


def _untimed_lines(res, lines: list[str]) -> list[str]:
    """The explanation's lines, or, where a plan was found to fit but not timed, that plan
    (the closest miss examined says nothing more then)."""
    u = res.untimed
    if u is None:
        return lines
    from ratrain.planner.report import describe

    gb = 1e9
    return [
        f"no plan timed within the time budget ({res.structures_left} structures not examined; "
        "--time-budget 0 searches them all).",
        f"fits, not timed: {describe(u.plan)}: its worst stage peaks at "
        f"{max(u.peak_bytes) / gb:.2f} of {u.limit_bytes / gb:.2f} GB by the ledger; its step "
        f"takes at least {u.step_lower_bound_s:.3f} s by the bound and was not simulated in "
        "time (--time-budget 0 simulates it)",
    ]


def _save(best, req, args, trial=None) -> None:
    from ratrain.config import save_plan
    from ratrain.models.presets import PRESETS

    extra: dict = {
        "platform": args.platform,
        "clusters": req.clusters,
        "predicted": {
            "tokens_per_s": best.tokens_per_s,
            "step_time_s": best.step_time_s,
            "peak_memory_bytes": list(best.peak_memory_bytes),
        },
    }
    if args.model not in PRESETS:
        extra["model_path"] = args.model
    if getattr(args, "memory_cap", None) is not None:
        from ratrain.cli.common import PLAN_FILE_CAP

        extra[PLAN_FILE_CAP] = args.memory_cap  # train --plan holds the plan to it
    if trial is not None and trial.pick is not None:
        extra["measured"] = {"tokens_per_s": trial.pick.tokens_per_s, "by": "ratrain plan --trial"}
        extra["trial_regret"] = trial.regret
    save_plan(best.plan, args.output, **extra)


def _print(res, baselines, args, trial=None) -> None:
    from ratrain.planner.report import limit_words, ranked_table, stage_table, why

    req, best = res.request, res.best
    left = req.clusters - best.clusters_used
    print(
        f"{req.spec.name} on {req.platform.name}, {req.clusters} clusters, global batch "
        f"{req.global_batch} x {req.seq} tokens; searched {res.candidates_evaluated} of "
        f"{res.candidates_total} candidates ({res.candidates_simulated} simulated) in "
        f"{res.search_time_s:.1f} s"
    )
    note = _batch_note(args, req)
    if note:
        print(note)
    if res.found_apart:
        print(
            f"memory is tight: the fastest structures by their step-time bound do not fit, and "
            f"the plan below was found apart (the most memory-saving knobs, confirmed by the "
            f"ledger); the search did not better it within its time budget "
            f"({args.time_budget:g} s): no plan of the space is faster than "
            f"{res.floor_step_s:.3f} s/step (the smallest bound left), so it is within "
            f"{res.gap:.1%} of the optimum; --time-budget 0 searches to the end"
        )
    elif res.cut and args.gap and res.gap <= args.gap:
        print(
            f"search stopped once its best plan was within {args.gap:.1%} of the optimum: no "
            f"plan of the space is faster than {res.floor_step_s:.3f} s/step (the smallest "
            f"bound left), so the best is within {res.gap:.1%} of it; --gap 0 searches to "
            "the time budget, --time-budget 0 to the end"
        )
    elif res.cut:
        print(
            f"search cut at its time budget ({args.time_budget:g} s): no plan of the space is "
            f"faster than {res.floor_step_s:.3f} s/step (the smallest bound left), so the best "
            f"is within {res.gap:.1%} of the optimum; --time-budget 0 searches to the end"
        )
    if res.v_untried:
        print(
            f"{res.v_untried} V-shaped plan(s) (zb-v, 1f1b-v) not tried within the time budget "
            f"({args.time_budget:g} s); --time-budget 0 tries them all"
        )
    print(ranked_table(res))
    runner = res.ranked[1] if len(res.ranked) > 1 else None
    print(f"\nwhy #1: {why(best, runner, '#2')}")
    for name, base in (baselines or {}).items():
        if base is UNFINISHED:
            print(
                f"vs best {name}: no {name} plan found within the time budget "
                "(--time-budget 0 searches to the end)"
            )
        elif base is None:
            print(f"vs best {name}: no {name} plan fits")
        else:
            print(
                f"vs best {name} ({base.tokens_per_s:,.1f} tokens/s, {_describe(base)}): "
                f"{best.tokens_per_s / base.tokens_per_s:.3f}x; {why(best, base, name)}"
            )
    if trial is not None:
        from ratrain.validate.trial import trial_lines

        print()
        print("\n".join(trial_lines(trial)))
        best = _chosen(res, trial)
        left = req.clusters - best.clusters_used
    if left:
        print(f"{left} of {req.clusters} clusters left over (pp x dp = {best.clusters_used})")
    which = "measured pick" if trial is not None and trial.pick is not None else "best plan"
    print(
        f"\n{which}, per stage (usable {best.limit_bytes / 1e9:.2f} GB: "
        f"{limit_words(req.platform)}):"
    )
    print(stage_table(best))
    for path, what in ((args.output, "plan"), (args.plot, "memory plot")):
        if path:
            print(f"{what} written to {path}")


def _describe(c) -> str:
    from ratrain.planner.report import describe

    return describe(c.plan)


# -- `ratrain train --plan auto` -----------------------------------------------------------

AUTO = "auto"
"""`ratrain train --plan auto`: plan, trial and train the measured pick."""
AUTO_PLATFORM = "cpu-local"
"""The platform `--plan auto` plans on: the ranks it trains run on this machine's cores."""
AUTO_JOB_FIELDS = ("global_batch", "seq")
"""Plan flags that set the job (what is trained), not a knob to search: never pins."""


def auto_plan(args: argparse.Namespace, defaults: dict, default_model) -> None:
    """`ratrain train --plan auto`: search the plans of the job the flags give (the plan
    flags given are pins; `defaults` the job's global batch, sequence and compute dtype
    where no flag gives them; --nproc, else this machine's CPUs, the ranks to plan for;
    --memory-cap the cap), run the trial (`ratrain.validate.trial`, its defaults) and set
    the measured pick as the plan --plan names, said in one line. The job keeps its fields
    (`ratrain.json`'s job), so a resume trains the same plan."""
    import os

    from ratrain.planner.candidates import trial_candidates
    from ratrain.planner.report import describe
    from ratrain.validate.trial import DEFAULT_PLANS, local_timer, pick_lines, run_trial

    if any(v in os.environ for v in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID")):
        raise RatrainError(
            "--plan auto runs its trial on this machine, not under a launcher (every rank "
            "would run its own): run `ratrain plan --trial K -o plan.yaml` once and pass "
            "--plan plan.yaml"
        )
    req = _auto_request(args, defaults, default_model)
    res = _auto_search(req)
    budget = Budget.for_plan(DEFAULT_TIME_BUDGET_S)
    cands = trial_candidates(req, res.ranked, DEFAULT_PLANS, budget=budget)
    say = None if args.quiet else _auto_say
    trial = run_trial(cands, local_timer(req.spec), progress=say)
    chosen = trial.pick.candidate if trial.pick is not None else cands[0]
    args._plan_file = (AUTO, (chosen.plan, _auto_extras(args, req)))  # as a file's (`plan_file`)
    if args.nproc is not None and args.nproc != chosen.plan.pp * chosen.plan.dp:
        args.nproc = None  # the ranks it planned for; the plan may leave some over
    measured = "" if trial.pick is None else f", {trial.pick.tokens_per_s:,.0f} tokens/s measured"
    print(
        f"ratrain train: --plan auto chose {describe(chosen.plan)} ([{chosen.source}] of "
        f"{len(cands)} plans tried in {trial.wall_s:.0f} s{measured}; {pick_lines(trial)[-1]})",
        file=sys.stderr,
        flush=True,
    )


def _auto_request(args: argparse.Namespace, defaults: dict, default_model):
    """The planner's request of `--plan auto`: the plan flags given as pins."""
    import os

    from ratrain.config import Plan
    from ratrain.models.presets import resolve_model
    from ratrain.planner import Request
    from ratrain.planner.families import ALL_FAMILIES
    from ratrain.platforms import load
    from ratrain.schema import cli_fields, knob_of

    model = args.model or default_model
    spec = model if not isinstance(model, str) else resolve_model(model)
    capped = argparse.Namespace(memory_cap=args.memory_cap)
    platform = with_memory_cap(load(AUTO_PLATFORM), capped)
    pins: dict = {"compute_dtype": defaults.get("compute_dtype")}
    for f in cli_fields(Plan):
        v = getattr(args, f.name, None)
        if v is None or f.name in AUTO_JOB_FIELDS:
            continue
        pin = knob_of(f).pin
        if pin == "policy_list":
            v = tuple(v.split(",")) if "," in v else v
        elif pin == "optional_float":
            v = v or None
        pins[f.name] = v
    pins = {k: v for k, v in pins.items() if v is not None}
    seq = min(args.seq or defaults["seq"], spec.max_seq)
    gb = args.global_batch or defaults["global_batch"]
    clusters = args.nproc or os.cpu_count() or 1
    return Request(spec, platform, clusters, gb, seq, pins=pins, families=ALL_FAMILIES)


def _auto_search(req):
    from ratrain.planner import search
    from ratrain.validate.trial import DEFAULT_PLANS

    budget = Budget.for_plan(DEFAULT_TIME_BUDGET_S)
    res = search(req, top=TRIAL_RANKED_PER_PLAN * DEFAULT_PLANS, budget=budget)
    if not res.feasible:
        raise RatrainError(
            f"--plan auto: no plan of {req.spec.name} fits on {req.clusters} ranks under the "
            f"cap (global batch {req.global_batch} x {req.seq}); `ratrain plan --platform "
            f"{AUTO_PLATFORM} --clusters {req.clusters} ...` says why"
        )
    return res


def _auto_extras(args: argparse.Namespace, req) -> dict:
    """What `ratrain plan -o` writes beside a plan, for the pick of `--plan auto`."""
    from ratrain.cli.common import PLAN_FILE_CAP
    from ratrain.models.presets import PRESETS

    extras: dict = {"platform": AUTO_PLATFORM, "clusters": req.clusters}
    if args.memory_cap is not None:
        extras[PLAN_FILE_CAP] = args.memory_cap
    if isinstance(args.model, str) and args.model not in PRESETS:
        extras["model_path"] = args.model
    return extras


def _auto_say(msg: str) -> None:
    print(f"ratrain train: --plan auto: {msg}", file=sys.stderr, flush=True)
