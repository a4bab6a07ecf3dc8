"""The model shapes calibration times its units, the runtime's fixed cost and the speed
probe at.

Plain `ModelSpec`s, apart from the torch code that runs them (`ratrain.calibrate.units`,
`.overhead`, `.probe`), because the platform file's builder needs them too: it charges the
cost model's kernels at the same shapes (`platform_file._unit_factors`) and names the
probe in its note, without torch.
"""

from __future__ import annotations

from ratrain.cost.measured import FUSED_HEAD
from ratrain.models.spec import ModelSpec

__all__ = ["TINY_SPEC", "UNIT_SHAPES", "TINY_SHAPE", "PROBE_SHAPE", "PROBE_WHAT", "FUSED"]

TINY_SPEC = ModelSpec(
    name="calib-tiny", n_layers=2, hidden=32, n_heads=2, n_kv_heads=2, ffn=64, vocab=64
)
"""Too small to compute anything: its actions' time is the runtime's dispatch alone."""

# (spec, micro_batch, seq): widths between and beside the default grid's (256/384/512).
_SPEC_A = ModelSpec(
    name="calib-a", n_layers=1, hidden=320, n_heads=5, n_kv_heads=5, ffn=864, vocab=6144
)
_SPEC_B = ModelSpec(
    name="calib-b", n_layers=1, hidden=448, n_heads=7, n_kv_heads=7, ffn=1216, vocab=6144
)
UNIT_SHAPES = ((_SPEC_A, 1, 128), (_SPEC_A, 4, 128), (_SPEC_B, 2, 128))
TINY_SHAPE = (TINY_SPEC, 1, 16)

PROBE_SHAPE = UNIT_SHAPES[2]
PROBE_WHAT = "the model's Block forward+backward (fp32, hidden 448, 2x128 tokens), one thread"
"""The speed probe (`ratrain.calibrate.probe`) as the platform file's note names it."""

FUSED = FUSED_HEAD
"""The unit kind of the head under the fused chunked loss (`Plan.loss_chunk_tokens`, at
`ratrain.config.DEFAULT_LOSS_CHUNK_TOKENS`), measured beside "block" and "head": its
forward runs the loss's gradient GEMMs too, its backward only scales
(`ratrain.cost.compute._fused_head`). Its factors are
`unit_time_factor.head-fused.<fwd/bwd>.<dt>` (`ratrain.cost.measured.unit_factor`)."""
