"""Model specs (pure Python) and, in `ratrain.nn.llama`, the torch model."""

from ratrain.models.presets import PRESETS, get_preset, resolve_model
from ratrain.models.spec import ModelSpec

__all__ = ["ModelSpec", "PRESETS", "get_preset", "resolve_model"]
