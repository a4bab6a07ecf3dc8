"""Autoregressive decoding of a `LlamaModel`: greedy or sampled, with a KV cache.

The prompt runs through the model once, filling the cache (`ratrain.nn.llama.KVCache`);
each new token is then one position. Sampling follows transformers' logits processors, in
their order: logits / temperature, then top-k, then top-p (nucleus: the smallest set of
most likely tokens whose probability reaches p; the most likely token always stays), then a
draw from the softmax with a seeded generator. Temperature 0 is greedy (argmax; ties go to
the lowest id, as in transformers). Decoding stops after `max_new_tokens` or at a stop id
(EOS), which is returned. ALiBi models have no cache: every step reruns the whole sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ratrain.nn.llama import KVCache, LlamaModel

__all__ = ["Sampling", "generate", "next_token"]


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 64
    temperature: float = 1.0
    """0: greedy."""
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop_ids: tuple[int, ...] = ()
    """Decoding ends after producing one of these (EOS)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def next_token(logits: torch.Tensor, s: Sampling, gen: torch.Generator | None) -> int:
    """The next token from one position's logits (V,)."""
    logits = logits.float()
    if s.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits / s.temperature
    if s.top_k is not None and s.top_k < logits.numel():
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1:
        # transformers' TopPLogitsWarper: drop the tokens whose ascending cumulative
        # probability stays within 1 - p, never the most likely one.
        sorted_logits, order = torch.sort(logits, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum <= 1 - s.top_p
        drop[-1] = False
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    probs = logits.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=gen))


@torch.no_grad()
def generate(
    model: LlamaModel,
    prompt: list[int],
    s: Sampling,
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """The tokens that follow `prompt` (a stop id, when reached, is the last); `on_token` is
    called with each as it comes. The prompt and the new tokens must fit `max_seq`."""
    spec = model.spec
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) + s.max_new_tokens > spec.max_seq:
        raise ValueError(
            f"the prompt ({len(prompt)} tokens) and {s.max_new_tokens} new tokens exceed the "
            f"model's {spec.max_seq} positions"
        )
    param = next(model.parameters())
    device, n = param.device, len(prompt) + s.max_new_tokens
    gen = torch.Generator(device="cpu").manual_seed(s.seed)
    cached = spec.position == "rope"
    cache = KVCache(spec, 1, n, dtype=param.dtype, device=device) if cached else None
    seq = torch.tensor([prompt], dtype=torch.long, device=device)
    step_in = seq
    out: list[int] = []
    for _ in range(s.max_new_tokens):
        logits = model(step_in, cache) if cached else model(seq)
        tok = next_token(logits[0, -1].cpu(), s, gen)
        out.append(tok)
        if on_token is not None:
            on_token(tok)
        if tok in s.stop_ids:
            break
        step_in = torch.tensor([[tok]], dtype=torch.long, device=device)
        if not cached:
            seq = torch.cat([seq, step_in], dim=1)
    return out
