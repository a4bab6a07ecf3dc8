"""A synthetic token stream whose entropy rate is known exactly.

The stream is a random sparse first-order Markov chain over the vocabulary: token i has
`branching` distinct successors with fixed random probabilities (Dirichlet(alpha)).
Successor 0 of token i is always (i + 1) mod vocab, so the chain is irreducible and has a
unique stationary distribution pi. Every sequence starts from pi, so every position is
distributed as pi and the best possible mean next-token loss of any model, at every
position, is the chain's entropy rate

    H = sum_i pi_i * H(P_i) = -sum_i pi_i sum_j P_ij ln P_ij    (nats per token)

exposed as `entropy_floor_nats`. A model that learns the transition table reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ratrain.data.base import TokenSource, check_positive, window_rng
from ratrain.errors import RatrainError

__all__ = ["SyntheticSource", "markov_chain", "stationary", "entropy_rate_nats"]

_CHAIN_STREAM = 0  # stream ids of `window_rng`: the chain and the walks never share numbers
_WALK_STREAM = 1


def markov_chain(vocab: int, branching: int, seed: int, alpha: float = 1.0):
    """(successors (V, K) int64, probs (V, K) float64): K distinct successors per token."""
    rng = window_rng(seed, _CHAIN_STREAM, 0)
    nxt = (np.arange(vocab) + 1) % vocab
    if vocab * vocab <= 1 << 22:  # small vocab: K smallest of random keys, with i+1 forced first
        keys = rng.random((vocab, vocab))
        keys[np.arange(vocab), nxt] = -1.0
        succ = np.argsort(keys, axis=1)[:, :branching]
        return succ, rng.dirichlet(np.full(branching, alpha), size=vocab)
    succ = np.empty((vocab, branching), dtype=np.int64)
    succ[:, 0] = nxt
    todo = np.arange(vocab)
    while todo.size:  # large vocab, K << V: redraw the rows that hold a repeated successor
        succ[todo, 1:] = rng.integers(0, vocab, size=(todo.size, branching - 1))
        srt = np.sort(succ[todo], axis=1)
        todo = todo[(srt[:, 1:] == srt[:, :-1]).any(axis=1)]
    probs = rng.dirichlet(np.full(branching, alpha), size=vocab)
    return succ, probs


def stationary(succ: np.ndarray, probs: np.ndarray, tol: float = 1e-14) -> np.ndarray:
    """The stationary distribution, by lazy power iteration (converges for any irreducible chain)."""
    vocab = succ.shape[0]
    pi = np.full(vocab, 1.0 / vocab)
    for _ in range(100_000):
        step = np.bincount(succ.ravel(), weights=(pi[:, None] * probs).ravel(), minlength=vocab)
        nxt = 0.5 * (pi + step)
        if np.abs(nxt - pi).sum() < tol:
            return nxt / nxt.sum()
        pi = nxt
    raise AssertionError("stationary distribution did not converge")


def entropy_rate_nats(succ: np.ndarray, probs: np.ndarray, pi: np.ndarray) -> float:
    del succ  # successors are distinct, so a row's entropy is that of its probabilities
    with np.errstate(divide="ignore", invalid="ignore"):
        row_h = -np.where(probs > 0, probs * np.log(probs), 0.0).sum(axis=1)
    return float((pi * row_h).sum())


class SyntheticSource(TokenSource):
    """Walks of a random sparse Markov chain; `entropy_floor_nats` is the best reachable loss."""

    name = "synthetic"

    def __init__(self, vocab: int, seq: int, seed: int = 0, branching: int = 4, alpha: float = 1.0):
        check_positive(vocab=vocab, seq=seq, branching=branching)
        if branching > min(vocab, 64):
            raise RatrainError(
                f"data: branching must be at most min(vocab, 64) = {min(vocab, 64)}, got {branching}"
            )
        if not alpha > 0:
            raise RatrainError(f"data: alpha must be positive, got {alpha!r}")
        self.vocab, self.seq, self.seed, self.branching = vocab, seq, seed, branching
        self.succ, self.probs = markov_chain(vocab, branching, seed, alpha)
        self.pi = stationary(self.succ, self.probs)
        self.entropy_floor_nats = entropy_rate_nats(self.succ, self.probs, self.pi)
        self._pi_cdf = np.cumsum(self.pi)
        self._cdf = np.cumsum(self.probs, axis=1)

    def sequences(self, indices: Sequence[int]) -> np.ndarray:
        # One uniform per token from each sequence's own generator, then one vectorised walk.
        u = np.stack(
            [window_rng(self.seed, _WALK_STREAM, int(n)).random(self.seq + 1) for n in indices]
        )
        out = np.empty(u.shape, dtype=np.int64)  # (n, seq + 1)
        out[:, 0] = np.minimum(np.searchsorted(self._pi_cdf, u[:, 0], side="right"), self.vocab - 1)
        last = self.branching - 1
        for t in range(1, self.seq + 1):
            cur = out[:, t - 1]
            k = (u[:, t, None] >= self._cdf[cur]).sum(axis=1)  # inverse-CDF draw of a successor
            out[:, t] = self.succ[cur, np.minimum(k, last)]
        return out

    def describe(self) -> str:
        return (
            f"synthetic Markov chain (vocab {self.vocab}, {self.branching} successors per token, "
            f"seed {self.seed}, entropy floor {self.entropy_floor_nats:.4f} nats)"
        )
