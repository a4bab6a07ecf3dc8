"""The fused chunked cross-entropy equals the plain loss and its gradients (fp32), and the
ledger counts what it keeps."""

from __future__ import annotations

import pytest
import torch

from ratrain.config import Plan
from ratrain.errors import RatrainError
from ratrain.models.presets import get_preset
from ratrain.nn.chunked_loss import chunked_cross_entropy
from ratrain.nn.llama import Head, cross_entropy
from ratrain.sizes.activations import (
    activation_bytes,
    backward_workspace_bytes,
    forward_workspace_bytes,
)


def _plain_and_chunked(h, w, t, chunk, scale):
    out = []
    for fn in (
        lambda h, w: cross_entropy(h @ w.t(), t),
        lambda h, w: chunked_cross_entropy(h, w, t, chunk),
    ):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss = fn(hh, ww)
        (loss * scale).backward()
        out.append((loss.detach(), hh.grad, ww.grad))
    return out


@pytest.mark.parametrize("chunk", [1, 7, 16, 64, 1000])
def test_chunked_equals_plain_loss_and_gradients(chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 24, 32, generator=g)  # (B, T, H)
    w = torch.randn(300, 32, generator=g) * 0.3  # (V, H)
    t = torch.randint(0, 300, (2, 24), generator=g)
    t[0, :5] = -100  # ignored positions
    (lp, hp, wp), (lc, hc, wc) = _plain_and_chunked(h, w, t, chunk, scale=0.37)
    assert lc.dtype == torch.float32
    assert torch.allclose(lc, lp, rtol=1e-6, atol=0)
    assert torch.allclose(hc, hp, rtol=1e-5, atol=1e-8)
    assert torch.allclose(wc, wp, rtol=1e-5, atol=1e-8)
    assert hc[0, :5].abs().max() == 0  # ignored tokens get no gradient


def test_head_loss_chunked_equals_plain_with_norm_head():
    spec = get_preset("tiny-alibi")  # NormHead: the weight is row-normalised in the graph
    x = torch.randn(2, 16, spec.hidden, generator=torch.Generator().manual_seed(1))
    t = torch.randint(0, spec.vocab, (2, 16), generator=torch.Generator().manual_seed(2))
    grads = []
    for chunk in (None, 5):
        head = Head(spec, seed=0)
        xx = x.clone().requires_grad_()
        loss = head.loss(xx, t, chunk)
        loss.backward()
        grads.append((loss.detach(), xx.grad, head.weight.grad, head.norm.weight.grad))
    for a, b in zip(*grads, strict=True):
        # fp32 rounding of differently ordered sums: relative to the tensor's scale
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), (a - b).abs().max() / b.abs().max()


def test_chunk_validation():
    with pytest.raises(ValueError):
        chunked_cross_entropy(torch.zeros(4, 2), torch.zeros(3, 2), torch.zeros(4).long(), 0)
    with pytest.raises(RatrainError, match="loss_chunk_tokens"):
        Plan(loss_chunk_tokens=0)


def test_ledger_counts_chunked_head():
    spec = get_preset("tiny")
    head = spec.n_layers + 1
    plain = Plan(micro_batch=4, global_batch=4, seq=64, compute_dtype="fp32")
    chunked = plain.replace(loss_chunk_tokens=32)
    tokens, V, H = 4 * 64, spec.vocab, spec.hidden
    kept = activation_bytes(spec, chunked, head, "none", flash=True)
    assert kept == tokens * 2 * 4 * H + 4 * V * H  # norm input, dL/dh, fp32 dL/dw
    # one fp32 (chunk, V) buffer, reused in place by every chunk
    assert forward_workspace_bytes(spec, chunked, head, "none", flash=True) == 32 * V * 4
    assert backward_workspace_bytes(spec, chunked, head, flash=True) == tokens * 4 * H
    # No V-wide tensor per token survives: the transient shrinks by 2 tokens / chunk.
    assert forward_workspace_bytes(spec, plain, head, "none", flash=True) == tokens * V * 8
    # Blocks are unchanged.
    assert activation_bytes(spec, chunked, 1, "none", flash=True) == activation_bytes(
        spec, plain, 1, "none", flash=True
    )
