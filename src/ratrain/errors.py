"""User-facing errors.

`RatrainError` marks a mistake in what the user asked for (a bad flag, a malformed file,
a plan that cannot run). The CLI prints its message on one line and exits non-zero;
internal invariants use `assert` instead.
"""

from __future__ import annotations

__all__ = ["RatrainError", "InfeasibleError"]


class RatrainError(ValueError):
    """A user mistake: the message says what is wrong and how to fix it."""

    exit_code = 2


class InfeasibleError(RatrainError):
    """No configuration fits the request (memory cap, cluster count, ...)."""
