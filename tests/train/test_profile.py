"""The step profile's buckets: operator names land where the docs say, and the buckets
add up to the profiled wall time."""

from __future__ import annotations

import torch

from ratrain.observe.profile import BUCKETS, StepProfile, bucket_of


def test_bucket_of_names():
    assert bucket_of("aten::mm") == "gemm"
    assert bucket_of("aten::addmm") == "gemm"
    assert bucket_of("aten::addmm_") == "gemm"  # the chunked loss's dL/dw accumulation
    assert bucket_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert bucket_of("aten::_log_softmax_backward_data") == "loss"
    assert bucket_of("ratrain::loss") == "loss"
    assert bucket_of("aten::copy_") == "copies"
    assert bucket_of("aten::cat") == "copies"
    assert bucket_of("c10d::allreduce_") == "comm"
    assert bucket_of("aten::silu_backward") == "elementwise"
    assert bucket_of("autograd::engine::evaluate_function: MmBackward0") == "autograd"
    assert bucket_of("## Call CompiledFxGraph fabc ##") == "compiled"


def test_step_profile_buckets_sum_to_wall_time():
    a = torch.randn(128, 128, requires_grad=True)
    with StepProfile() as prof:
        y = torch.nn.functional.silu(a @ a).sum()
        y.backward()
    buckets = prof.finish(wait_s=0.0)
    assert set(buckets) == set(BUCKETS)
    assert buckets["gemm"] > 0 and buckets["elementwise"] > 0
    assert abs(sum(buckets.values()) - prof.wall_s) < 1e-6 + 1e-3 * prof.wall_s
    moved = prof.finish(wait_s=buckets["python"] / 2)  # the executor's measured wait
    assert moved["comm_wait"] > 0 and moved["python"] >= 0


def test_chunked_loss_operators_count_as_loss():
    from ratrain.nn.chunked_loss import chunked_cross_entropy

    h = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (64,))
    with StepProfile() as prof:
        chunked_cross_entropy(h, w, t, 16).backward()
    b = prof.finish(0.0)
    assert b["loss"] > 0 and b["gemm"] > 0  # its GEMMs stay GEMMs
    assert b["elementwise"] < b["loss"]  # exp, logsumexp, scatter... are the loss's


def test_chunked_loss_head_gemms_count_as_gemm():
    """Every GEMM of the chunked loss (logits, dL/dh, the in-place dL/dw accumulation) is
    GEMM time, not loss time: at a vocabulary this wide they are most of it."""
    from ratrain.nn.chunked_loss import chunked_cross_entropy

    h = torch.randn(256, 256, requires_grad=True)
    w = torch.randn(4096, 256, requires_grad=True)
    t = torch.randint(0, 4096, (256,))
    with StepProfile() as prof:
        chunked_cross_entropy(h, w, t, 128).backward()
    ops = prof.ops_s
    assert ops.get("aten::addmm_", 0.0) > 0 and ops.get("aten::mm", 0.0) > 0
    b = prof.finish(0.0)
    assert b["gemm"] >= ops["aten::addmm_"] + ops["aten::mm"] - 1e-9
    assert b["loss"] > 0
