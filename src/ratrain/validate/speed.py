"""The machine's speed during a validation against its calibration, from the speed probe's
times (`ratrain.calibrate.probe`): a diagnostic beside the statistics, scaling nothing.

Apart from the probe, which runs torch, so that re-scoring (`ratrain.validate.rescore`)
reports it from a file's recorded times without torch.
"""

from __future__ import annotations

__all__ = ["DRIFT_WARN", "relative_speeds", "machine_speed", "describe"]


def relative_speeds(calibrated_s: float | None, probes_s: list[float]) -> list[float]:
    """The machine's speed at each probe relative to calibration (> 1: faster now);
    empty when the platform file has no probe."""
    if not calibrated_s or not probes_s:
        return []
    return [calibrated_s / p for p in probes_s if p > 0]


DRIFT_WARN = 0.10
"""assumed: a machine more than 10% faster or slower than calibrated moves every prediction
by as much as the validation's 10% MAPE target: worth saying."""


def machine_speed(calibrated_s: float | None, probes_s: list[float]) -> dict | None:
    """The validation's `machine_speed` summary: the probe's times during it and the
    machine's speed relative to calibration at each; None when there is nothing to compare."""
    rel = relative_speeds(calibrated_s, probes_s)
    if not rel:
        return None
    return {
        "calibrated_probe_s": calibrated_s,
        "probes_s": list(probes_s),
        "relative_speed": rel,
        "moved": min(rel) < 1 - DRIFT_WARN or max(rel) > 1 + DRIFT_WARN,
    }


def describe(speed: dict | None) -> str | None:
    """One line for validate's table."""
    if not speed:
        return None
    lo, hi = min(speed["relative_speed"]), max(speed["relative_speed"])
    line = (
        f"machine speed during validation (the speed probe, {len(speed['probes_s'])} times): "
        f"{lo:.2f}x .. {hi:.2f}x of calibration"
    )
    if speed["moved"]:
        line += (
            f"; it moved more than {DRIFT_WARN:.0%} since calibration, and every prediction "
            "assumes calibration's speed: re-calibrate, or validate on a quieter machine"
        )
    return line
