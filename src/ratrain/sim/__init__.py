"""The simulator: a deterministic discrete-event replay of the schedule IR on a platform
model, with traces (Chrome/Perfetto JSON) and plots. Pure Python (no torch)."""

from ratrain.sim.engine import Timing, replay
from ratrain.sim.plot import plot
from ratrain.sim.result import SimEvent, SimResult
from ratrain.sim.simulate import simulate, simulate_schedule
from ratrain.sim.trace import RESOURCE_TIDS, trace_events, write_trace

__all__ = [
    "RESOURCE_TIDS",
    "SimEvent",
    "SimResult",
    "Timing",
    "plot",
    "replay",
    "simulate",
    "simulate_schedule",
    "trace_events",
    "write_trace",
]
