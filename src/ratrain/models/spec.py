"""Model specification: the architecture facts every layer of ratrain reads.

Pure Python (no torch): the planner, the ledger and the simulator size a model from here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ratrain.errors import RatrainError

__all__ = ["ModelSpec", "POSITION_SCHEMES", "ROPE_TYPES"]

POSITION_SCHEMES = ("rope", "alibi")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only transformer of the LLaMA family."""

    name: str
    n_layers: int
    """Number of transformer blocks."""
    hidden: int
    """Model width h."""
    n_heads: int
    """Attention heads a."""
    n_kv_heads: int
    """Key/value heads (GQA when < n_heads)."""
    ffn: int
    """SwiGLU intermediate size."""
    vocab: int
    max_seq: int = 4096
    """Longest sequence the position scheme is configured for."""
    norm_eps: float = 1e-5
    position: str = "rope"
    """'rope' or 'alibi'."""
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    tied_embeddings: bool = False
    normalized_head: bool = False
    """Baichuan2's NormHead: the head's rows are L2-normalised before the projection."""
    rope_type: str = "default"
    """RoPE frequency scaling, as Hugging Face `rope_parameters.rope_type`: 'default',
    'linear' (frequencies / rope_factor) or 'llama3' (Llama 3.1's banded scaling)."""
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    """llama3 only; Llama 3.1 config.json uses 1."""
    rope_high_freq_factor: float = 4.0
    """llama3 only; Llama 3.1 config.json uses 4."""
    rope_original_max_seq: int = 0
    """llama3 only: the pre-training context the bands are measured against (0: unused)."""

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab", "max_seq"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise RatrainError(
                    f"model {self.name!r}: {f} must be a positive integer, got {v!r}"
                )
        if self.hidden % self.n_heads:
            raise RatrainError(
                f"model {self.name!r}: heads ({self.n_heads}) must divide hidden ({self.hidden}); "
                "choose a head count that divides the width"
            )
        if self.n_heads % self.n_kv_heads:
            raise RatrainError(
                f"model {self.name!r}: kv heads ({self.n_kv_heads}) must divide heads ({self.n_heads})"
            )
        if self.position not in POSITION_SCHEMES:
            raise RatrainError(
                f"model {self.name!r}: position must be one of {POSITION_SCHEMES}, got {self.position!r}"
            )
        if not (self.norm_eps > 0):
            raise RatrainError(
                f"model {self.name!r}: norm_eps must be positive, got {self.norm_eps!r}"
            )
        if self.position == "rope" and not (self.rope_theta > 0):
            raise RatrainError(
                f"model {self.name!r}: rope_theta must be positive, got {self.rope_theta!r}"
            )
        self._check_rope_scaling()
        if self.position == "rope" and self.head_dim % 2:
            raise RatrainError(
                f"model {self.name!r}: RoPE needs an even head dim, got {self.head_dim}"
            )

    def _check_rope_scaling(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise RatrainError(
                f"model {self.name!r}: rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}"
            )
        if self.rope_type != "default" and self.position != "rope":
            raise RatrainError(f"model {self.name!r}: rope_type {self.rope_type!r} needs RoPE")
        if not (self.rope_factor > 0):
            raise RatrainError(
                f"model {self.name!r}: rope_factor must be positive, got {self.rope_factor!r}"
            )
        if self.rope_type == "llama3":
            lo, hi = self.rope_low_freq_factor, self.rope_high_freq_factor
            if not (0 < lo < hi):
                raise RatrainError(
                    f"model {self.name!r}: llama3 RoPE needs 0 < low_freq_factor < "
                    f"high_freq_factor, got {lo!r} and {hi!r}"
                )
            o = self.rope_original_max_seq
            if not isinstance(o, int) or isinstance(o, bool) or o <= 0:
                raise RatrainError(
                    f"model {self.name!r}: llama3 RoPE needs a positive "
                    f"rope_original_max_seq, got {o!r}"
                )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise RatrainError(
                f"model spec: unknown fields {sorted(unknown)}; known: {sorted(known)}"
            )
        return cls(**d)
