"""The planner's memo: a dict cleared whole once it outgrows its limit.

The search asks the same bounds, splits and plans again and again (families share
structures, the explanation re-plans at many cluster counts), so their makers are memoised
at module level. Clearing on overflow, not evicting one entry at a time, keeps a hit to
one dict lookup, and a search that outgrows the limit only pays the misses of a cold
start. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Memo"]

V = TypeVar("V")


class Memo(Generic[V]):
    """Values by key, cleared before an insertion once more than `limit` are held (None:
    never). A value of None is not remembered (it is made again on each call)."""

    __slots__ = ("limit", "_values")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._values: dict[Hashable, V] = {}

    def get_or(self, key: Hashable, make: Callable[..., V], *args) -> V:
        """The value of `key`, made by `make(*args)` on a miss (arguments, not a closure:
        a hit then builds nothing)."""
        values = self._values
        hit = values.get(key)
        if hit is None:
            if self.limit is not None and len(values) > self.limit:
                values.clear()
            hit = values[key] = make(*args)
        return hit

    def get_or_owned(self, key: Hashable, owner: object, make: Callable[..., object], *args):
        """`get_or` where the key names an unhashable object by its id (a platform):
        the value is kept beside `owner` and made again where the id is now another
        object's. This memo's values are (owner, value) pairs."""
        hit = self._values.get(key)
        if hit is not None and hit[0] is owner:
            return hit[1]
        value = make(*args)
        self.put(key, (owner, value))
        return value

    def get(self, key: Hashable) -> V | None:
        return self._values.get(key)

    def put(self, key: Hashable, value: V) -> None:
        values = self._values
        if self.limit is not None and len(values) > self.limit:
            values.clear()
        values[key] = value

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)
