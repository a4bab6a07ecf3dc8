"""The held-out set a job evaluates on (`ratrain.train.parts.EvalOpts`): its source, and the
sequences of it each evaluation walks through the forward-only schedule
(`ratrain.schedule.build_eval_schedule`), the same at every evaluation."""

from __future__ import annotations

from pathlib import Path

from ratrain.config import MAX_MICROBATCHES, Plan
from ratrain.data.base import Batches, TokenSource
from ratrain.errors import RatrainError
from ratrain.models.spec import ModelSpec

__all__ = ["held_out_source", "eval_batches", "EVAL_SEQUENCES", "EVAL_INDEX_BASE"]

EVAL_SEQUENCES = 32
"""The held-out set's default size, in sequences (`eval_batches`)."""
EVAL_INDEX_BASE = 1 << 40
"""The held-out set is sequences EVAL_INDEX_BASE + n of its source: indices no training
step reaches, so an evaluation on the training source itself (e.g. `--eval-data
synthetic`) does not score sequences the model was trained on."""


def held_out_source(
    kind_or_path: str,
    spec: ModelSpec,
    seq: int,
    seed: int = 0,
    *,
    tokenizer: str | None = None,
    dtype: str | None = None,
) -> TokenSource:
    """The held-out source `kind_or_path` names: a directory `ratrain prepare` wrote gives
    its val split; anything else `make_source` takes (synthetic, a text or token file)
    gives itself."""
    from ratrain.data import make_source
    from ratrain.data.prepare import prepared_source, read_manifest

    path = Path(kind_or_path)
    if kind_or_path == "synthetic" or not path.is_dir():
        return make_source(kind_or_path, spec, seq, seed, tokenizer=tokenizer, dtype=dtype)
    if "val" not in read_manifest(path)["splits"]:
        raise RatrainError(
            f"data: {kind_or_path!r} has no held-out (val) split to evaluate on; prepare it "
            "with --val-fraction or --val-tokens > 0, or pass --eval-data SOURCE"
        )
    return prepared_source(
        path, spec.vocab, seq, seed, split="val", tokenizer=tokenizer, dtype=dtype
    )


class _HeldOut(TokenSource):
    """Sequences `EVAL_INDEX_BASE` + n of `source` (see there)."""

    def __init__(self, source: TokenSource):
        self.source, self.name = source, source.name
        self.vocab, self.seq, self.seed = source.vocab, source.seq, source.seed

    def sequences(self, indices):
        return self.source.sequences([EVAL_INDEX_BASE + int(i) for i in indices])

    def describe(self) -> str:
        return self.source.describe()


def eval_batches(source: TokenSource, plan: Plan, tokens: int | None = None) -> Batches:
    """The held-out set of `source` as one step of `plan`'s replicas and microbatches: the
    first ceil(tokens / seq) sequences (default `EVAL_SEQUENCES`) of its held-out indices,
    rounded up to whole microbatches of every replica; the same sequences at every
    evaluation. Its step 0 in replica-major order is what the reference trainer reads."""
    if source.seq != plan.seq:
        raise RatrainError(f"data: held-out source has seq {source.seq}, the plan {plan.seq}")
    per = plan.dp * plan.micro_batch
    n = EVAL_SEQUENCES if tokens is None else -(-tokens // plan.seq)
    m = -(-n // per)
    if m > MAX_MICROBATCHES:
        raise RatrainError(
            f"--eval-tokens {tokens}: {m:,} microbatches per replica, more than the "
            f"{MAX_MICROBATCHES:,} a schedule holds; give at most "
            f"{MAX_MICROBATCHES * per * plan.seq:,}"
        )
    return Batches(_HeldOut(source), plan.micro_batch, m, plan.dp)
