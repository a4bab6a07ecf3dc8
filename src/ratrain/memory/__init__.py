"""The memory ledger: bytes of every training state per stage over one step.

Pure Python (no torch)::

    from ratrain.memory import replay, activation_bytes
    ledger = replay(build_schedule(spec, plan), spec, plan)
    ledger.stages[s].peak_bytes, ledger.stages[s].breakdown_at_peak
"""

from ratrain.memory.ledger import Ledger, StageMemory, replay
from ratrain.sizes.activations import activation_bytes
from ratrain.sizes.states import STATE_CLASSES

__all__ = ["activation_bytes", "replay", "Ledger", "StageMemory", "STATE_CLASSES"]
