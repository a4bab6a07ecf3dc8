"""Flags shared by the commands that take a plan (simulate, train, plan, verify), and the
argparse types every command's flags use: a bad value is one line naming the flag at parse
time, before any import of torch or any work (`positive_int`, `nonneg_int`,
`positive_float`, `nonneg_float`, `timeout_s`, `port`, `seed`, `thread_count`,
`local_processes`, `nonempty`, `positive_int_list`, `name_list`)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from ratrain.config import V_PIPELINES, Plan, load_plan
from ratrain.errors import RatrainError
from ratrain.models.presets import resolve_model
from ratrain.models.spec import ModelSpec
from ratrain.schema import cli_fields, knob_of

__all__ = [
    "add_model_arg",
    "add_plan_args",
    "plan_from_args",
    "plan_platform",
    "plan_file",
    "positive_int",
    "nonneg_int",
    "positive_float",
    "nonneg_float",
    "timeout_s",
    "port",
    "bounded_float",
    "seed",
    "thread_count",
    "local_processes",
    "MAX_SEED",
    "MAX_THREADS_PER_CPU",
    "nonempty",
    "positive_int_list",
    "name_list",
    "MAX_INT",
    "add_memory_cap_arg",
    "with_memory_cap",
    "memory_cap",
    "PLAN_FILE_CAP",
]

MAX_INT = 2**63 - 1
"""The largest integer a flag takes: what a 64-bit counter (torch's, numpy's) holds."""
MAX_TIMEOUT_S = 10**9
"""The longest timeout a flag takes (about 31 years): a timedelta of 1e300 s overflows the
collectives' timers in the ranks (an OverflowError after they started)."""
MAX_SEED = 2**32 - 1
"""The largest seed a flag takes: what numpy's and most tools' seeding takes. The weights'
generators are seeded with seed x 1,000,003 + unit, which overflows torch's 64-bit seed
(a ValueError in every rank) from about 2**44."""
MAX_THREADS_PER_CPU = 4
"""assumed: more threads per CPU than this only oversubscribe the cores (and torch crashes
at exit with some 10**5 of them)."""


def _note(msg: str) -> None:
    print(f"ratrain: {msg}", file=sys.stderr, flush=True)


def plan_file(args: argparse.Namespace):
    """The plan file --plan names, as (plan, extras), read once per command: the platform,
    the memory cap and the plan itself all come from the one reading."""
    cached = getattr(args, "_plan_file", None)
    if cached is None or cached[0] != args.plan:
        cached = (args.plan, load_plan(args.plan))
        args._plan_file = cached
    return cached[1]


def plan_platform(args: argparse.Namespace, default: str) -> str:
    """The platform to use: --platform, else the plan file's, else `default`. Says so on
    stderr when --platform overrides the platform the plan file was made for."""
    flag = getattr(args, "platform", None)
    recorded = None
    if getattr(args, "plan", None):
        _, extras = plan_file(args)
        recorded = extras.get("platform")
    if flag and recorded and str(flag) != str(recorded):
        _note(f"--platform {flag} overrides the plan file's platform {recorded}")
    return flag or recorded or default


def _int(text: str, low: int, what: str, high: int = MAX_INT) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    if v > high:
        most = " of at most 2**63 - 1" if high == MAX_INT else ""
        raise argparse.ArgumentTypeError(f"expected {what}{most}, got {v}")
    return v


def positive_int(text: str) -> int:
    """argparse type: an integer 1 .. 2**63 - 1."""
    return _int(text, 1, "a positive integer")


def nonneg_int(text: str) -> int:
    """argparse type: an integer 0 .. 2**63 - 1."""
    return _int(text, 0, "an integer >= 0")


def _float(text: str, positive: bool) -> float:
    what = "a positive number" if positive else "a number >= 0"
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise argparse.ArgumentTypeError(f"expected a finite {what[2:]}, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (no nan, no inf)."""
    return _float(text, positive=True)


def nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0 (no nan, no inf)."""
    return _float(text, positive=False)


def timeout_s(text: str) -> float:
    """argparse type: seconds, a finite number > 0 and at most `MAX_TIMEOUT_S`."""
    v = positive_float(text)
    if v > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_TIMEOUT_S:.0e} seconds, got {text!r}"
        )
    return v


def bounded_float(most: float, unit: str):
    """An argparse type: a finite number > 0 and at most `most` (in `unit`)."""

    def parse(text: str) -> float:
        v = positive_float(text)
        if v > most:
            raise argparse.ArgumentTypeError(f"expected at most {most:g} {unit}, got {text!r}")
        return v

    parse.__name__ = "bounded_float"
    return parse


def port(text: str) -> int:
    """argparse type: a TCP port, 1 .. 65535."""
    return _int(text, 1, "a TCP port 1..65535", 65535)


def seed(text: str) -> int:
    """argparse type: a seed, 0 .. `MAX_SEED`."""
    return _int(text, 0, f"a seed 0..{MAX_SEED} (2**32 - 1)", MAX_SEED)


def _per_cpu(text: str, what: str) -> int:
    v = positive_int(text)
    most = MAX_THREADS_PER_CPU * (os.cpu_count() or 1)
    if v > most:
        raise argparse.ArgumentTypeError(
            f"expected at most {most} {what} ({MAX_THREADS_PER_CPU} per CPU of this "
            f"machine), got {v}"
        )
    return v


def thread_count(text: str) -> int:
    """argparse type: CPU threads, 1 .. `MAX_THREADS_PER_CPU` per CPU of this machine."""
    return _per_cpu(text, "threads")


def local_processes(text: str) -> int:
    """argparse type: processes started on this machine, 1 .. `MAX_THREADS_PER_CPU` per
    CPU of it."""
    return _per_cpu(text, "processes")


def nonempty(text: str) -> str:
    """argparse type: a string that is not empty (an empty path or name is a mistake, not
    "the default")."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a value, got an empty string")
    return text


def positive_int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated positive integers, e.g. 8,16,32."""
    try:
        return tuple(positive_int(x) for x in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, e.g. 8,16,32, got {text!r}"
        ) from None


def name_list(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated non-empty names, e.g. tiny,llama2-7b."""
    names = tuple(x.strip() for x in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated names, e.g. tiny,llama2-7b, got {text!r}"
        )
    return names


def add_memory_cap_arg(p: argparse.ArgumentParser) -> None:
    """`--memory-cap GIB`: the platform's usable memory per rank, overridden; `--headroom
    FRACTION`: the part of it (less the workspace) a plan keeps free, overridden."""
    p.add_argument(
        "--memory-cap",
        type=positive_float,
        metavar="GIB",
        help="usable memory per rank in GiB (2**30 bytes), in place of the platform's "
        "(its workspace is still reserved out of it)",
    )
    p.add_argument(
        "--headroom",
        type=headroom_fraction,
        metavar="FRACTION",
        help="fraction of the usable memory (less the workspace) a plan keeps free for the "
        "allocator's fragmentation, in place of the platform's (a100-80g, h100-80g: 0.15; "
        "mt3000: 0; 0 plans up to the limit)",
    )


def headroom_fraction(text: str) -> float:
    """argparse type: a fraction in [0, 0.9]."""
    try:
        v = float(text)
    except ValueError:
        v = None
    if v is None or not 0.0 <= v <= 0.9:
        raise argparse.ArgumentTypeError(
            f"expected a fraction from 0 to 0.9 (e.g. 0.1 keeps 10% free), got {text!r}"
        )
    return v


PLAN_FILE_CAP = "memory_cap_gib"
"""The plan file's entry (beside `plan`) that `ratrain plan --memory-cap GIB -o` writes."""


def memory_cap(args: argparse.Namespace) -> tuple[float | None, str]:
    """The usable memory per rank in GiB and what to call it: --memory-cap, else the cap
    the plan file (--plan) was planned under (`PLAN_FILE_CAP`), else None."""
    flag = getattr(args, "memory_cap", None)
    recorded = None
    if getattr(args, "plan", None):
        _, extras = plan_file(args)
        recorded = extras.get(PLAN_FILE_CAP)
        if recorded is not None:
            try:
                recorded = positive_float(str(recorded))
            except argparse.ArgumentTypeError as e:
                raise RatrainError(f"plan file {args.plan}: {PLAN_FILE_CAP}: {e}") from None
    if flag is not None:
        if recorded is not None and flag != recorded:
            _note(f"--memory-cap {flag:g} overrides the plan file's {recorded:g} GiB")
        return flag, "--memory-cap"
    if recorded is not None:
        return recorded, f"the cap {args.plan} was planned for (--memory-cap overrides it)"
    return None, "--memory-cap"


def with_memory_cap(platform, args: argparse.Namespace):
    """`platform` with its usable memory replaced by --memory-cap, or by the cap the plan
    file was planned under (`memory_cap`), when either is given. A cap at or below the
    platform's workspace reservation (kept out of the usable memory) is a RatrainError: it
    would leave nothing, or less than nothing, for the model."""
    import dataclasses

    headroom = getattr(args, "headroom", None)
    if headroom is not None:
        platform = dataclasses.replace(platform, headroom_fraction=headroom)
    cap, label = memory_cap(args)
    if cap is None:
        return platform
    cap_bytes = int(cap * 2**30)
    if cap_bytes <= platform.workspace_bytes:
        ws = platform.workspace_bytes / 2**30
        said = f"--memory-cap {cap:g} GiB" if label == "--memory-cap" else f"{label}: {cap:g} GiB"
        raise RatrainError(
            f"{said} is {'below' if cap_bytes < platform.workspace_bytes else 'no more than'} "
            f"the {ws:.3g} GiB workspace that platform {platform.name} "
            f"reserves out of each rank's usable memory, which leaves nothing for the model; "
            f"raise --memory-cap above {ws:.3g} GiB (the platform's own usable memory is "
            f"{platform.usable_memory_bytes / 2**30:.3g} GiB)"
        )
    return dataclasses.replace(platform, usable_memory_bytes=cap_bytes)


def _split(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def add_model_arg(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument(
        "--model",
        type=nonempty,
        default=default,
        help="a preset name or a path to a Hugging Face config.json",
    )


def _cli_types() -> dict:
    return {
        "positive_int": positive_int,
        "nonneg_int": nonneg_int,
        "nonneg_float": nonneg_float,
        "nonempty": nonempty,
        "int_list": _split,
    }


def add_plan_args(p: argparse.ArgumentParser, *, defaults: dict | None = None) -> None:
    """The plan flags, generated from the plan's schema (`ratrain.schema.Knob`: flag, help,
    how the flag reads its text). `defaults` overrides the dataclass defaults for one
    command (in the help's "default ...")."""
    d = {**Plan().to_dict(), **(defaults or {})}
    p.add_argument(
        "--plan",
        type=nonempty,
        help="a plan file (YAML/JSON) written by `ratrain plan -o`; flags override it",
    )
    types = _cli_types()
    for f in cli_fields(Plan):
        k = knob_of(f)
        kw: dict = {"dest": f.name}
        if k.help is not None:
            kw["help"] = k.help.replace("{default}", str(d[f.name]))
        if k.cli == "bool":
            kw |= {"action": argparse.BooleanOptionalAction, "default": None}
        elif k.cli == "choice":
            kw["choices"] = k.choices
        else:
            kw["type"] = types[k.cli]
        p.add_argument(k.flag, **kw)
    p.set_defaults(_plan_defaults=d)


_FLAG_FIELDS = tuple(f.name for f in cli_fields(Plan))
_FLAG_NAMES = {f.name: knob_of(f).flag for f in cli_fields(Plan)}
_CONVERTED = {f.name: knob_of(f).pin for f in cli_fields(Plan)}
"""How a flag's value becomes the field's: a list of policies ("full,none"), a clip of 0
(none), or as it is."""


def _flag_value(name: str, v):
    how = _CONVERTED[name]
    if how == "policy_list":
        parts = v.split(",")
        return parts[0] if len(parts) == 1 else tuple(parts)
    if how == "optional_float":
        return v or None
    return v


def plan_from_args(
    args: argparse.Namespace, default_model: str | ModelSpec | None = None
) -> tuple[ModelSpec, Plan]:
    """Build (spec, plan) from --plan and the flags; flags override the file.
    `default_model` (a name, or a spec, e.g. a resumed checkpoint's) when neither names one."""
    base: dict = dict(args._plan_defaults)
    model_name = getattr(args, "model", None)
    if getattr(args, "plan", None):
        file_plan, extras = plan_file(args)
        base = file_plan.to_dict()
        # --model with a plan for another model is refused by `Plan.check_for` (a plan's
        # split and memory fit belong to its model); a config path naming it is accepted.
        model_name = model_name or extras.get("model_path") or file_plan.model
    model_name = model_name or default_model
    if model_name is None:
        raise RatrainError("no model given: pass --model NAME_OR_CONFIG_JSON or --plan FILE")
    spec = model_name if isinstance(model_name, ModelSpec) else resolve_model(model_name)
    file_pipeline = base.get("pipeline")
    for f in _FLAG_FIELDS:
        v = getattr(args, f, None)
        if v is None:
            continue
        if _CONVERTED[f] in ("policy_list", "optional_float"):
            base[f] = _flag_value(f, v)  # no note: the file's form differs (a list, None)
            continue
        if getattr(args, "plan", None) and base.get(f) != v:
            _note(f"{_FLAG_NAMES[f]} {v} overrides the plan file's {base.get(f)}")
        base[f] = v
    if isinstance(base.get("recompute"), list):
        base["recompute"] = tuple(base["recompute"])
    if (
        isinstance(base.get("recompute"), tuple)
        and len(set(base["recompute"])) == 1
        and base.get("pp") != len(base["recompute"])
    ):
        base["recompute"] = base["recompute"][0]
    if getattr(args, "plan", None) is None or base.get("model") is None:
        base["model"] = spec.name
    if (
        getattr(args, "pp", None) is not None
        and getattr(args, "layer_split", None) is None
        and getattr(args, "plan", None)
    ):
        base["layer_split"] = None  # a new pp invalidates the file's split
    pipe = getattr(args, "pipeline", None)
    if (
        pipe is not None
        and getattr(args, "layer_split", None) is None
        and getattr(args, "plan", None)
        and (pipe in V_PIPELINES) != (file_pipeline in V_PIPELINES)
    ):
        base["layer_split"] = None  # blocks per stage vs per chunk: the file's split is moot
    plan = Plan.from_dict(base)
    plan.check_for(spec)
    plan.check_size()
    return spec, plan
