"""The token-source interface and the map from (step, microbatch, DP replica) to sequences.

A source is a random-access collection of sequences: `sequences(indices)` returns, for
each global sequence index n, the `seq + 1` tokens of sequence n (inputs are the first
`seq`, targets the last `seq`). Sequence n depends only on (source, seed, n), so:

- any rank can build any slice of any step, with no communication and no shared state;
- resuming at step k needs nothing but k (position arithmetic; there is no iterator state).

`Batches` fixes the batch shape. The global batch of step k is the concatenation, over
DP replicas r = 0..dp-1, of replica r's m microbatches mb = 0..m-1, each `micro_batch`
sequences long. Sequence i of microbatch mb of replica r in step k is global sequence

    n = k * global_batch + (r * m + mb) * micro_batch + i

The reference trainer walks the dp * m microbatches of a step in that order; a pipeline
rank of replica r asks for `batch(k, mb, r)` and gets exactly the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ratrain.errors import RatrainError

__all__ = ["TokenSource", "WindowSource", "Batches", "check_positive", "window_rng"]


def check_positive(**values: int) -> None:
    """RatrainError unless every value is a positive integer."""
    for name, v in values.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise RatrainError(f"data: {name} must be a positive integer, got {v!r}")


def window_rng(seed: int, stream: int, index: int) -> np.random.Generator:
    """The generator of one sequence: independent of every other index (random access)."""
    return np.random.default_rng([seed, stream, index])


class TokenSource:
    """A deterministic, random-access collection of token sequences of `seq + 1` tokens."""

    name: str = "source"
    vocab: int
    """Token ids are in [0, vocab)."""
    seq: int
    seed: int

    def sequences(self, indices: Sequence[int]) -> np.ndarray:
        """Sequences `indices` as an int64 array of shape (len(indices), seq + 1)."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} (vocab {self.vocab}, seq {self.seq}, seed {self.seed})"


class WindowSource(TokenSource):
    """Random windows of `seq + 1` tokens from one long token array, each drawn by (seed, index)."""

    _WINDOW_STREAM = 2

    def __init__(self, tokens: np.ndarray, vocab: int, seq: int, seed: int, name: str):
        check_positive(vocab=vocab, seq=seq)
        if len(tokens) < seq + 1:
            raise RatrainError(
                f"data: {name} holds {len(tokens)} tokens, fewer than seq + 1 = {seq + 1}; "
                "use a shorter --seq or more data"
            )
        self.tokens, self.vocab, self.seq, self.seed, self.name = tokens, vocab, seq, seed, name

    def sequences(self, indices: Sequence[int]) -> np.ndarray:
        n_starts = len(self.tokens) - self.seq  # windows [s, s + seq] with s in [0, n_starts)
        starts = [
            int(window_rng(self.seed, self._WINDOW_STREAM, int(i)).integers(n_starts))
            for i in indices
        ]
        return np.stack(
            [np.asarray(self.tokens[s : s + self.seq + 1], dtype=np.int64) for s in starts]
        )

    def describe(self) -> str:
        return f"{self.name} ({len(self.tokens):,} tokens, vocab {self.vocab}, seed {self.seed})"


@dataclass(frozen=True)
class Batches:
    """A source cut into steps, DP replicas and microbatches (see the module docstring)."""

    source: TokenSource
    micro_batch: int
    microbatches: int
    """m: microbatches per step per DP replica."""
    dp: int = 1

    def __post_init__(self) -> None:
        check_positive(micro_batch=self.micro_batch, microbatches=self.microbatches, dp=self.dp)

    @classmethod
    def from_plan(cls, source: TokenSource, plan) -> Batches:
        if plan.seq != source.seq:
            raise RatrainError(f"data: source has seq {source.seq} but the plan has seq {plan.seq}")
        return cls(source, plan.micro_batch, plan.microbatches, plan.dp)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.microbatches * self.dp

    def indices(self, step: int, micro: int, dp_rank: int = 0) -> range:
        """Global sequence indices of microbatch `micro` of replica `dp_rank` in `step`."""
        if step < 0 or not 0 <= micro < self.microbatches or not 0 <= dp_rank < self.dp:
            raise IndexError(
                f"batch (step {step}, micro {micro}, dp_rank {dp_rank}) outside "
                f"steps >= 0, {self.microbatches} microbatches, {self.dp} replicas"
            )
        start = step * self.global_batch + (dp_rank * self.microbatches + micro) * self.micro_batch
        return range(start, start + self.micro_batch)

    def batch(self, step: int, micro: int, dp_rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each int64 of shape (micro_batch, seq); targets shifted by one."""
        return _split(self.source.sequences(self.indices(step, micro, dp_rank)))

    def global_batch_of(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole step: (global_batch, seq) inputs and targets, replica-major order."""
        start = step * self.global_batch
        return _split(self.source.sequences(range(start, start + self.global_batch)))


def _split(tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))  # (n, seq + 1)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()  # (n, seq) each
