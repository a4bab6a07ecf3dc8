"""The α–β fit of a message's time, apart from the ranks that time it (`ratrain.calibrate.comm`),
so that the platform file is built and merged without torch."""

from __future__ import annotations

__all__ = ["fit_alpha_beta"]


def fit_alpha_beta(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares t = α + S/β through (S bytes, t seconds): (α ≥ 0, β bytes/s)."""
    n = len(points)
    sx = sum(p[0] for p in points)
    sy = sum(p[1] for p in points)
    sxx = sum(p[0] ** 2 for p in points)
    sxy = sum(p[0] * p[1] for p in points)
    slope = (n * sxy - sx * sy) / max(n * sxx - sx * sx, 1e-30)
    slope = max(slope, 1e-15)
    alpha = max((sy - slope * sx) / n, 0.0)
    return alpha, 1.0 / slope
