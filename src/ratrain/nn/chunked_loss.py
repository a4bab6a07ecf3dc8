"""Fused, chunked cross-entropy for the head unit: the fp32 logits of a whole microbatch
never exist at once.

`chunked_cross_entropy(h, w, targets, chunk_tokens)` is the mean next-token loss of
`h @ w.T` (h: the head's normalised hidden states, (N, H); w: the head weight, (V, H)),
computed `chunk_tokens` rows at a time, as Liger Kernel's fused linear cross-entropy does
(Hsu et al. 2024, "Liger Kernel: Efficient Triton Kernels for LLM Training", §3.3): for
each chunk, the fp32 logits (chunk, V), their log-softmax and the loss terms; then, in the
same pass, the logits' gradient softmax - one-hot *in place* and its two products scaled
by 1 / n_valid, the chunk's rows of dL/dh and its term of dL/dw. Forward keeps dL/dh (N, H, in
h's dtype) and dL/dw (V, H, fp32) for backward, which only scales them by the incoming
gradient; nothing of size N x V outlives a chunk.

Exactness: the same arithmetic as `cross_entropy(h @ w.T, targets)` up to the order of
the sums (the loss is summed chunk by chunk, dL/dw accumulated over chunks), so fp32
values agree to rounding (tests: within 1e-5 relative); not bit for bit.

Memory, per microbatch (what `ratrain.sizes.activations` counts): kept from F to B,
dL/dh (c·H per token) and dL/dw (4·V·H bytes); transient, one fp32 (chunk, V) buffer
that holds a chunk's logits, then their log-softmax, then the softmax's gradient, in place
(`torch._log_softmax(..., out=)` on its own input: each row is reduced before it is
written).
"""

from __future__ import annotations

import torch

from ratrain.config import DEFAULT_LOSS_CHUNK_TOKENS

__all__ = ["chunked_cross_entropy", "DEFAULT_LOSS_CHUNK_TOKENS"]


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, targets, chunk_tokens: int, ignore_index: int):
        n = h.shape[0]
        valid = targets != ignore_index
        n_valid = int(valid.sum())
        wf = w.float()  # (V, H); the same tensor when w is fp32
        grad_h = torch.empty_like(h)  # (N, H)
        grad_w = None  # (V, H) fp32: the first chunk's product, then accumulated
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        inv = 1.0 / max(n_valid, 1)
        # one (c, V) fp32 buffer for every chunk: logits, log-probabilities and the softmax's
        # gradient each overwrite it (a fresh buffer per chunk costs page faults on CPU)
        buf = torch.empty((min(chunk_tokens, n), wf.shape[0]), dtype=torch.float32, device=h.device)
        with torch.profiler.record_function("ratrain::loss"):
            for i in range(0, n, chunk_tokens):
                hc = h[i : i + chunk_tokens].float()  # (c, H)
                tc = targets[i : i + chunk_tokens]
                vc = valid[i : i + chunk_tokens]
                tgt = torch.where(vc, tc, 0).unsqueeze(1)  # (c, 1)
                logp = buf[: hc.shape[0]]  # (c, V)
                torch.mm(hc, wf.t(), out=logp)
                # log-softmax in place of the logits, then the softmax in place of it: two
                # passes over (c, V) besides the GEMMs
                torch._log_softmax(logp, 1, False, out=logp)
                picked = logp.gather(1, tgt).squeeze(1)
                loss -= torch.where(vc, picked, 0.0).sum()
                # dL/dlogits = (softmax - onehot) / n_valid on valid rows; the 1/n_valid is
                # applied to the (c, H) and (V, H) products instead of the (c, V) one
                probs = logp.exp_()
                probs.scatter_add_(1, tgt, torch.full_like(picked, -1.0).unsqueeze(1))
                if not bool(vc.all()):
                    probs[~vc] = 0.0
                grad_h[i : i + chunk_tokens] = torch.mm(probs, wf).mul_(inv).to(h.dtype)
                if grad_w is None:  # no zero-filled (V, H) buffer to add the first one to
                    grad_w = torch.mm(probs.t(), hc).mul_(inv)
                else:
                    grad_w.addmm_(probs.t(), hc, alpha=inv)
        if grad_w is None:  # no tokens
            grad_w = torch.zeros_like(wf)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.w_dtype = w.dtype
        return loss * inv

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        if not torch.equal(grad_out, torch.ones_like(grad_out)):
            grad_h = grad_h * grad_out.to(grad_h.dtype)
            grad_w = grad_w.mul_(grad_out)  # saved only for this backward: reuse it
        return grad_h, grad_w.to(ctx.w_dtype), None, None, None


def chunked_cross_entropy(
    h: torch.Tensor,
    w: torch.Tensor,
    targets: torch.Tensor,
    chunk_tokens: int = DEFAULT_LOSS_CHUNK_TOKENS,
    *,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Mean loss of logits `h @ w.T` (fp32) against `targets`, chunk by chunk.

    h: (..., H) hidden states, w: (V, H), targets: (...) already shifted."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    H = h.shape[-1]
    return _ChunkedCrossEntropy.apply(
        h.reshape(-1, H), w, targets.reshape(-1), chunk_tokens, ignore_index
    )
