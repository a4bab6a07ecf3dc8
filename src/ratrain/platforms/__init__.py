"""Platform descriptions: compute, memory tiers and network of one compute unit and its cluster.

Pure Python (no torch). Presets are YAML files beside this module; users write their own
with the same schema. Every number in a preset carries a note saying where it comes from
(``sourced: ...``) or why it was chosen (``assumed: ...``).

Schema (YAML), all sizes in bytes, bandwidths in bytes/s, times in seconds:

    name: mt3000
    description: ...
    usable_memory_bytes: {value: 20.0e9, note: "sourced: ..."}
    workspace_bytes:     {value: ..., note: ...}   # reserved for kernels/fragmentation
    compute:
      peak_flops: {fp16: {value, note}, bf16: {...}, fp32: {...}}
      efficiency: {value, note}                    # achieved / peak for large GEMMs
    tiers:            # fastest first; the last is the unit's main memory (DDR / HBM)
      - {name: am, capacity_bytes: {...}, bandwidth_bytes_per_s: {...}, latency_s: {...}, copies: 24}
    host:             # the tier activations are offloaded to
      bandwidth_bytes_per_s: {...}
      latency_s: {...}
    network:
      units_per_node: {...}
      intra_node: {bandwidth_bytes_per_s: {...}, latency_s: {...}, efficiency: {...}}
      inter_node: {bandwidth_bytes_per_s: {...}, latency_s: {...}, efficiency: {...}}
      algorithm: ring | tree | hierarchical

The loader (`ratrain.platforms.load`) turns this into the frozen dataclasses below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Tier", "Link", "Platform", "PLATFORM_PRESETS", "load"]


@dataclass(frozen=True)
class Tier:
    """One level of a compute unit's memory hierarchy."""

    name: str
    capacity_bytes: int
    """Capacity of one copy of this tier (e.g. one core's array memory)."""
    bandwidth_bytes_per_s: float
    """Bandwidth of moves between this tier and the next slower one, per copy."""
    latency_s: float = 0.0
    """Fixed cost of one move (DMA descriptor setup)."""
    copies: int = 1
    """How many independent copies a unit has (e.g. 24 cores each with its own AM)."""


@dataclass(frozen=True)
class Link:
    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float = 1.0
    """Achieved / nominal bandwidth for large messages."""


@dataclass(frozen=True)
class Platform:
    name: str
    usable_memory_bytes: int
    """The hard cap: bytes of main memory a training process may use per compute unit."""
    workspace_bytes: int
    """Reserved out of the cap for kernel workspace and fragmentation."""
    peak_flops: dict[str, float]
    """Per dtype (fp16, bf16, fp32): peak FLOP/s of one compute unit."""
    efficiency: float
    """Achieved / peak FLOP/s for the model's GEMMs (used when no tile model applies)."""
    tiers: tuple[Tier, ...]
    """Fastest first; the last is main memory."""
    host: Link
    """Main memory <-> host tier (activation offload)."""
    intra_node: Link
    inter_node: Link
    units_per_node: int
    collective_algorithm: str = "ring"
    notes: dict[str, str] = field(default_factory=dict)
    """Provenance of each value: dotted key -> 'sourced: ...' or 'assumed: ...'."""
    description: str = ""

    @property
    def main_memory(self) -> Tier:
        return self.tiers[-1]


# After the dataclasses: the loader builds them.
from ratrain.platforms.load import PLATFORM_PRESETS, load  # noqa: E402
