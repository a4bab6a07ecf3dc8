"""The one memory-saving order of knob combinations, derived from the plan's schema
(`ratrain.schema.Knob.saves`): the search's dominance test and the explanation's
most-saving-first scan both read it. Pure Python.

- `saving_order`: a sort key, the combinations that hold the least memory first: each
  ranked field's memory rank, in the plan's field order.
- `saves(a, b)`: whether `a` holds no more memory than `b` by the quick bounds (model
  states, `MemoryBound`), field by field: no higher rank in any ranked field, the views a
  stage holds compared as the bound reads them (`ratrain.schedule.views.view_rank`, the
  only way the lifecycle enters them), and equal in the fields the bound reads that have
  no order (the compute dtype, the loss). Never under fp32 compute, where sharding adds a
  gathered fp32 view.
- `dominant(kns)`: a combination that saves no less than every other, if there is one.
"""

from __future__ import annotations

from functools import lru_cache

from ratrain.config import Plan
from ratrain.schedule.views import view_rank
from ratrain.schema import knob_fields, knob_of, saving_fields

__all__ = ["dominant", "n_saving", "saves", "saving_order"]

_RANKS = tuple((f.name, knob_of(f).saves) for f in saving_fields(Plan))
"""(field, memory rank) of every ranked field, in the plan's field order."""
_EACH = tuple((f.name, knob_of(f).saves) for f in saving_fields(Plan) if not knob_of(f).views)
"""The ranked fields compared one by one (the view fields are compared together)."""
_EQUAL = tuple(
    f.name
    for f in knob_fields(Plan)
    if knob_of(f).bound and knob_of(f).saves is None and knob_of(f).search == "knob"
)
"""The knob fields the bound reads that have no memory order: equal, or not comparable."""


def saving_order(kn) -> tuple[int, ...]:
    """Sort key: the combinations that save the most memory first."""
    return tuple(rank(getattr(kn, name)) for name, rank in _RANKS)


def n_saving(kn) -> int:
    """How many ranked fields are at their most saving value (rank 0)."""
    return sum(rank(getattr(kn, name)) == 0 for name, rank in _RANKS)


def _views(kn) -> int:
    return view_rank(kn.schedule, kn.view_policy, kn.view_lookahead)


def saves(a, b) -> bool:
    """Whether knobs `a` hold no more memory than `b` by the quick bounds (see above)."""
    return (
        a.compute_dtype != "fp32"
        and all(getattr(a, f) == getattr(b, f) for f in _EQUAL)
        and all(rank(getattr(a, f)) <= rank(getattr(b, f)) for f, rank in _EACH)
        and _views(a) <= _views(b)
    )


def dominant(kns) -> object | None:
    """A knob combination that saves no less than every other, if there is one: the first
    such. Only those with the most saving settings can be (one that saves no less than
    every other is at its most saving value wherever any combination is), so only they
    are checked."""
    most = max(map(n_saving, kns), default=0)
    for a in kns:
        if n_saving(a) == most and all(saves(a, b) for b in kns):
            return a
    return None


@lru_cache(maxsize=256)
def dominant_of(kns: tuple) -> object | None:
    """`dominant`, memoised: structures share their knob combinations."""
    return dominant(kns)
