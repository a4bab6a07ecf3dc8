"""The schema of a plan's knobs: what each field of `ratrain.config.Plan` means beyond its
type, written once, beside the field, and read by everything that handles knobs.

Each field of `Plan` carries a `Knob` in its dataclass metadata: its group, its command-line
flag and help, how `--pin` reads it, which part of the search varies it, and which of its
values hold less memory. From these:

- `ratrain.cli.common.add_plan_args` generates the plan flags, and `plan_from_args` the
  overrides of a plan file by them;
- `parse_pin` and `normalize_pins` read `ratrain plan --pin FIELD=VALUE`;
- `ratrain.planner.space.Knobs` is generated from the fields the search varies per
  structure (`search="knob"`);
- `ratrain.planner.saving` derives the one memory-saving order (`saves`) that the search
  and the explanation share;
- `ratrain.planner.memory_bound.MemoryBound.key` reads the fields whose `bound` is set.

Pure Python, no ratrain imports but `errors`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ratrain.errors import RatrainError

__all__ = [
    "GROUPS",
    "Knob",
    "knob",
    "knob_of",
    "knob_fields",
    "pinnable",
    "parse_pin",
    "normalize_pins",
    "cli_fields",
    "saving_fields",
    "bound_fields",
    "search_fields",
]

GROUPS = ("structure", "memory", "communication", "numerics", "identity")
"""The parts of a plan: the pipeline's shape and batch; what decides the memory of a stage;
what decides the collectives and transfers; the arithmetic; and what the plan is for."""

_BOOL_TEXT = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@dataclass(frozen=True)
class Knob:
    """The metadata of one plan field (`dataclasses.field(metadata={"knob": ...})`)."""

    group: str
    """One of `GROUPS`."""
    flag: str | None = None
    """Its command-line flag (`--pp`); None: no flag of its own."""
    help: str | None = None
    """The flag's help; `{default}` is replaced by the command's default."""
    cli: str = "value"
    """How the flag reads its text: an argparse type of `ratrain.cli.common` by name
    (positive_int, nonneg_int, nonneg_float, nonempty, int_list), "choice" (one of
    `choices`) or "bool" (--x / --no-x)."""
    cli_order: int = 0
    """Where the flag stands among the plan flags (ascending)."""
    choices: tuple[Any, ...] | None = None
    """The values it may take, where they are few."""
    pin: str | None = "value"
    """How `--pin FIELD=VALUE` reads the value: "value" (by the field's default's type),
    "int_list", "policy_list", "optional_float", "optional_int"; None: not pinnable."""
    search: str | None = None
    """The part of the search that varies it: "structure" (pp, dp, micro-batch, split),
    "knob" (`ratrain.planner.space.Knobs`, per structure), "policy" (the recompute policy
    fitted per stage), "request" (fixed by the request); None: a pin or the default."""
    saves: Callable[[Any], int] | None = None
    """Its memory rank: values of a lower rank hold no more memory, all else equal (0: the
    least); None: its values are not ordered by memory (they must be equal to compare)."""
    bound: bool = False
    """Read by the planner's per-stage memory bound (`MemoryBound.key`) as it is."""
    views: bool = False
    """Decides which parameter views a stage holds, read together with the other fields
    so marked (`ratrain.schedule.views.view_rank`) rather than one by one."""
    yaml: str | None = None
    """Its name in a plan file; None: the field's name."""


def knob(default: Any, meta: Knob) -> Any:
    """A dataclass field with a default and its `Knob`."""
    return dataclasses.field(default=default, metadata={"knob": meta})


def knob_of(f: dataclasses.Field) -> Knob:
    return f.metadata["knob"]


def knob_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields of `cls` that carry a `Knob`, in declaration order."""
    return tuple(f for f in dataclasses.fields(cls) if "knob" in f.metadata)


def cli_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields with a flag, in `cli_order`."""
    return tuple(
        sorted((f for f in knob_fields(cls) if knob_of(f).flag), key=lambda f: knob_of(f).cli_order)
    )


def pinnable(cls: type) -> tuple[str, ...]:
    """The names of the fields `--pin` may set."""
    return tuple(f.name for f in knob_fields(cls) if knob_of(f).pin is not None)


def search_fields(cls: type, part: str) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in knob_fields(cls) if knob_of(f).search == part)


def saving_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields with a memory rank, in declaration order."""
    return tuple(f for f in knob_fields(cls) if knob_of(f).saves is not None)


def bound_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in knob_fields(cls) if knob_of(f).bound)


def parse_pin(cls: type, name: str, text: str) -> Any:
    """The value of field `name` that `--pin name=text` sets (one line on a bad value)."""
    f = {f.name: f for f in knob_fields(cls)}[name]
    how, low = knob_of(f).pin, text.strip().lower()
    if how == "int_list":
        try:
            return tuple(int(x) for x in text.split(","))
        except ValueError:
            raise RatrainError(f"pin {name}={text!r}: expected comma-separated integers") from None
    if how == "policy_list":
        parts = tuple(p.strip() for p in text.split(","))
        return parts[0] if len(parts) == 1 else parts
    if how == "optional_float":
        if low in ("none", "0", "off"):
            return None
        try:
            return float(text)
        except ValueError:
            raise RatrainError(
                f"pin {name}={text!r}: expected a number (or none: no clipping)"
            ) from None
    if how == "optional_int":
        if low == "none":
            return None
        try:
            return int(text)
        except ValueError:
            raise RatrainError(f"pin {name}={text!r}: expected an integer or none") from None
    if isinstance(f.default, bool):
        if low not in _BOOL_TEXT:
            raise RatrainError(f"pin {name}={text!r}: expected true or false")
        return _BOOL_TEXT[low]
    if isinstance(f.default, int):
        try:
            return int(text)
        except ValueError:
            raise RatrainError(f"pin {name}={text!r}: expected an integer") from None
    return text.strip()


def normalize_pins(cls: type, pins: Mapping[str, object]) -> dict[str, object]:
    """Pins as the search compares them with a candidate's fields, checked: a known field
    each; text for a field that is not text read as `--pin` reads it ("5,3" -> (5, 3), "2"
    -> 2); a list of blocks per stage as a tuple; a choice among the field's choices. A
    pin the search could never match would otherwise leave the ranking empty, unexplained."""
    names = pinnable(cls)
    by_name = {f.name: f for f in knob_fields(cls)}
    out: dict[str, object] = {}
    for name, value in pins.items():
        if name not in names:
            raise RatrainError(
                f"pin {name}={value!r}: unknown field {name!r}; pinnable: {', '.join(names)}"
            )
        f, meta = by_name[name], knob_of(by_name[name])
        if isinstance(value, str) and not isinstance(f.default, str):
            value = parse_pin(cls, name, value)
        if meta.pin == "int_list":
            if isinstance(value, list):
                value = tuple(value)
            if not (
                isinstance(value, tuple)
                and value
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)
            ):
                raise RatrainError(
                    f'pin {name}={value!r}: expected blocks per stage, e.g. (5, 3) or "5,3"'
                )
        if meta.choices is not None and value not in meta.choices:
            raise RatrainError(f"pin {name}={value!r}: choose one of {', '.join(meta.choices)}")
        out[name] = value
    return out
