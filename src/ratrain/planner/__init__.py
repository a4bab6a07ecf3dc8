"""The resource-aware planner: search the fastest plan that fits the memory cap.

Pure Python (no torch)::

    from ratrain.planner import Request, search, explain
    res = search(Request(spec, platform, clusters=1024, global_batch=1024, seq=4096))
    res.best.plan, res.best.tokens_per_s, res.best.peak_memory_bytes

Feasibility comes from the memory ledger, ranking from the simulator, and a closed-form
lower bound on each (`ratrain.planner.time_bound`, `ratrain.planner.memory_bound`) keeps
the search to the few candidates that can still win. Families (`FAMILIES`) give the
GPU-style baselines their own knobs.
"""

from ratrain.planner.explain import Explanation, explain, find_feasible
from ratrain.planner.families import COMPARED_FAMILIES, FAMILIES, Family
from ratrain.planner.search import Candidate, SearchResult, search
from ratrain.planner.space import Request, parse_pins

__all__ = [
    "COMPARED_FAMILIES",
    "FAMILIES",
    "Candidate",
    "Explanation",
    "Family",
    "Request",
    "SearchResult",
    "explain",
    "find_feasible",
    "parse_pins",
    "search",
]
