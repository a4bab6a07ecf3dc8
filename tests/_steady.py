"""The comparison of a steady-state extrapolation with the full simulation it stands for,
shared by the two-run and one-run paths' tests."""

import pytest

from ratrain.config import Plan


def assert_same_result(got, full):
    """`got` (extrapolated) equals `full` (simulated in full) up to float rounding."""
    assert got.step_time_s == pytest.approx(full.step_time_s, rel=1e-9, abs=0)
    assert got.tokens_per_s == pytest.approx(full.tokens_per_s, rel=1e-9, abs=0)
    assert got.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-8, abs=1e-12)
    for u, v in zip(got.utilization, full.utilization, strict=True):
        assert u == pytest.approx(v, rel=1e-8, abs=1e-12)
    assert got.peak_memory_bytes == full.peak_memory_bytes
    for e, f in zip(got.exposed, full.exposed, strict=True):
        assert e == pytest.approx(f, rel=1e-9, abs=1e-9 * full.step_time_s)


def offload_plan(pp: int, m: int, view: str = "persistent") -> Plan:
    """A sharded, offloading ratrain plan of `pp` stages, dp=2 and `m` microbatches."""
    return Plan(
        pp=pp,
        dp=2,
        global_batch=2 * m,
        seq=128,
        schedule="ratrain",
        recompute="none",
        shard_optimizer=True,
        view_policy=view,
        compute_dtype="fp16",
        grad_dtype="fp16",
        offload_activations=True,
    )
