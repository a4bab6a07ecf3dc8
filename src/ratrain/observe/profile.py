"""Where one step's time goes on a rank: a torch.profiler run aggregated into buckets.

    with StepProfile() as prof:
        executor.step(k)
    prof.buckets_s   # {"gemm": ..., "attention": ..., ..., "python": ...}

Each operator event's *self* time (its time minus its children's) on the thread that ran
the step goes to one bucket by name:

| bucket | operators |
| --- | --- |
| gemm | mm, addmm, bmm, baddbmm, addmv (and their in-place forms), linear's own dispatch |
| attention | the fused attention kernels (SDPA, flash) and their backward |
| loss | log-softmax, NLL, cross-entropy and their backward; every other operator inside the chunked loss (its GEMMs stay GEMMs) |
| copies | copy_, clone, contiguous, to, cat, fill/zero (memory traffic with no arithmetic) |
| comm | issuing collectives and point-to-point messages (c10d / gloo entry points) |
| elementwise | every other ATen operator (norms, RoPE, SiLU·mul, residual adds, AdamW) |
| autograd | the autograd engine's own per-node time (`autograd::engine::...` wrappers) |
| compiled | time inside compiled (inductor) graphs, where the fused kernels run |

plus, from the executor's clock rather than the profiler:

- `comm_wait`: the walk blocked on in-flight communication (`StageExecutor.wait_s`);
- `python`: the step's wall time minus everything above: the executor's own Python
  (action dispatch, bookkeeping), the dispatcher and the profiler's own overhead.
"""

from __future__ import annotations

import threading
import time

from torch.profiler import ProfilerActivity, profile

__all__ = ["BUCKETS", "StepProfile", "bucket_of"]

BUCKETS = (
    "gemm",
    "attention",
    "elementwise",
    "loss",
    "copies",
    "comm",
    "comm_wait",
    "autograd",
    "compiled",
    "python",
)

_GEMM = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "addmv",
    "mv",
    "matmul",
    "linear",
    "dot",
    # in-place forms: the chunked loss accumulates the head weight's gradient with addmm_
    "addmm_",
    "baddbmm_",
    "addbmm",
    "addbmm_",
    "addmv_",
}
_LOSS_PARTS = ("log_softmax", "nll_loss", "cross_entropy", "logsumexp", "ratrain::loss")
_COPY = {
    "copy_",
    "clone",
    "contiguous",
    "to",
    "_to_copy",
    "cat",
    "fill_",
    "zero_",
    "zeros",
    "zeros_like",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_zeros",
    "resize_",
    "set_",
}


def bucket_of(name: str) -> str:
    """The bucket of one profiler event name (see the module table)."""
    if name.startswith("autograd::") or name.startswith("torch::autograd"):
        return "autograd"
    if any(
        k in name for k in ("CompiledFunction", "CompiledFxGraph", "Torch-Compiled", "inductor")
    ):
        return "compiled"
    if any(p in name for p in _LOSS_PARTS):
        return "loss"
    if name.startswith(("c10d::", "gloo:", "nccl:", "record_param_comms")):
        return "comm"
    op = name.split("::", 1)[-1]
    if "scaled_dot_product" in op or "flash_attention" in op:
        return "attention"
    if op in _GEMM:
        return "gemm"
    if op in _COPY:
        return "copies"
    return "elementwise"


def _in_loss(event) -> bool:
    """Inside the chunked loss (its forward's range, or its backward node): every operator
    there is the loss's, whatever its name."""
    e = event
    while e is not None:
        if e.name == "ratrain::loss" or "ChunkedCrossEntropy" in e.name:
            return True
        e = e.cpu_parent
    return False


class StepProfile:
    """Profile a region (one step) on the calling thread; `buckets_s` once exited.

    `wait_s` (the executor's measured blocking on communication) is passed in after the
    step by `finish(wait_s)`; until then `python` also holds the waits."""

    def __init__(self):
        self.buckets_s: dict[str, float] = {}
        self.ops_s: dict[str, float] = {}
        """Self time per operator name on the step's thread (what the buckets sum)."""
        self.wall_s = 0.0
        self._prof = profile(activities=[ProfilerActivity.CPU])
        self._thread = threading.get_ident()

    def __enter__(self) -> StepProfile:
        self._prof.__enter__()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self._prof.__exit__(*exc)
        self._aggregate()

    def _aggregate(self) -> None:
        acc = dict.fromkeys(BUCKETS, 0.0)
        events = self._prof.events()
        threads: dict[int, float] = {}
        for e in events:  # the step's thread: the one with the most operator time
            threads[e.thread] = threads.get(e.thread, 0.0) + e.self_cpu_time_total
        main = max(threads, key=threads.get) if threads else None
        for e in events:
            if e.thread != main or e.name.startswith("ProfilerStep"):
                continue
            b = bucket_of(e.name)
            if b not in ("gemm", "autograd") and _in_loss(e):
                b = "loss"
            acc[b] += e.self_cpu_time_total * 1e-6  # us -> s
            self.ops_s[e.name] = self.ops_s.get(e.name, 0.0) + e.self_cpu_time_total * 1e-6
        measured = sum(acc.values())
        acc["python"] = max(0.0, self.wall_s - measured)
        self.buckets_s = acc

    def finish(self, wait_s: float) -> dict[str, float]:
        """Move the executor's measured communication wait out of `python`."""
        moved = min(wait_s, self.buckets_s["python"])
        self.buckets_s["comm_wait"] += moved
        self.buckets_s["python"] -= moved
        return self.buckets_s
