"""Statistics of predictions against measurements (pure Python).

- `mape`: mean absolute percentage error, |pred - meas| / meas, averaged;
- `max_error`: the largest of those;
- `kendall_tau`: Kendall's τ-b between the predicted and measured orders (ties in either
  count as neither concordant nor discordant, and shrink the denominator);
- `best_within`: how much slower, measured, the plan picked by prediction is than the
  measured fastest (0.0 when the pick is the fastest).
"""

from __future__ import annotations

import math

__all__ = ["errors", "mape", "max_error", "kendall_tau", "best_within"]


def errors(predicted: list[float], measured: list[float]) -> list[float]:
    """Signed relative errors (pred - meas) / meas."""
    if len(predicted) != len(measured) or not measured:
        raise ValueError("predicted and measured must be non-empty and of one length")
    if any(m <= 0 for m in measured):
        raise ValueError("measured values must be positive")
    return [(p - m) / m for p, m in zip(predicted, measured, strict=True)]


def mape(predicted: list[float], measured: list[float]) -> float:
    e = errors(predicted, measured)
    return sum(abs(x) for x in e) / len(e)


def max_error(predicted: list[float], measured: list[float]) -> float:
    return max(abs(x) for x in errors(predicted, measured))


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's τ-b of two paired lists (1: same order, -1: reversed)."""
    n = len(xs)
    if n != len(ys) or n < 2:
        raise ValueError("kendall_tau needs two lists of one length >= 2")
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denom if denom else 0.0


def best_within(predicted: list[float], measured: list[float]) -> tuple[int, float]:
    """(index of the predicted-fastest plan, its measured time over the measured fastest,
    minus 1)."""
    errors(predicted, measured)  # validates
    pick = min(range(len(predicted)), key=predicted.__getitem__)
    return pick, measured[pick] / min(measured) - 1.0
