"""The per-step log of a training run: a lagged all-gather of every rank's (peak bytes,
peak RSS, step time, stop flag, losses) each step, and on the metrics rank the records made
from it (JSONL, TensorBoard, the progress bar).

The stop flag is how the ranks agree on where to stop after a SIGTERM/SIGINT
(`ratrain.launch.faults.StopRequest`): each rank puts the signal it got (0: none) in its
row; every rank reads the same table, so all of them see a request in the same step's
table and stop after the same step. It rides on the all-gather the metrics need anyway
(8 bytes per rank per step, no collective of its own), at the price of the lag: a table is
read at the end of the next step (or at a save's flush)."""

from __future__ import annotations

import math

import torch

from ratrain.checkpoint.hooks import keep_records_before
from ratrain.config import Plan
from ratrain.models.spec import ModelSpec
from ratrain.observe.memory import peaks_per_rank
from ratrain.observe.metrics import JsonlWriter, Progress, TensorBoardWriter, WandbWriter, wandb_dir
from ratrain.runtime.comm import Handle
from ratrain.runtime.executor import StepResult

__all__ = ["StepLog", "max_rss_bytes"]


def max_rss_bytes() -> int:
    """The process's peak resident set (Linux reports KiB): tensors plus the runtime itself."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return -1
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class StepLog:
    """The lagged per-step all-gather of (peak bytes, max RSS, step time, stop flag, losses)
    and, on the metrics rank, the records made from it. `stop_signum`: the stop signal some
    rank reported in a table read so far (0: none), the same on every rank."""

    def __init__(
        self,
        grid,
        comm,
        plan: Plan,
        spec: ModelSpec,
        job=None,
        kind: str = "",
        start: int = 0,
    ):
        self.grid, self.comm, self.plan, self.spec = grid, comm, plan, spec
        self.m = plan.microbatches
        self.pending: tuple[StepResult, torch.Tensor, Handle] | None = None
        self.losses: list[float] = []
        self.stop_signum = 0
        self.records: list[dict] = []
        self.eval_loss: float | None = None  # the latest held-out loss, kept on the bar
        self.jsonl = self.tb = self.wandb = self.bar = None
        self.cap_bytes = job.memory_cap.cap_bytes if job and job.memory_cap else None
        if job is not None:
            out = job.outputs
            if out.metrics_path and start:
                keep_records_before(out.metrics_path, start)  # the resumed run continues it
            self.jsonl = (
                JsonlWriter(out.metrics_path, append=start > 0) if out.metrics_path else None
            )
            self.tb = TensorBoardWriter(out.tensorboard_dir) if out.tensorboard_dir else None
            if out.wandb_project:  # offline, its files beside the metrics file
                self.wandb = WandbWriter(out.wandb_project, wandb_dir(out.metrics_path))
            quiet = not out.progress or job.launch.run_steps == 0  # --steps 0 only converts
            self.bar = Progress(job.cfg.steps, kind, quiet=quiet, start=start)

    def push(self, res: StepResult, peak_bytes: int | None, stop_signum: int = 0) -> None:
        """Issue this step's all-gather (with this rank's stop signal, 0 for none) and read
        the previous step's."""
        losses = res.losses if res.losses else [math.nan] * self.m
        peak = peak_bytes if peak_bytes is not None else -1
        row = [peak, max_rss_bytes(), res.time_s, stop_signum, *losses]
        vec = torch.tensor(row, dtype=torch.float64)
        table, handle = self.comm.world_all_gather(vec.to(self.grid.device))
        prev, self.pending = self.pending, (res, table, handle)
        if prev is not None:
            self._resolve(*prev)

    def flush(self) -> None:
        if self.pending is not None:
            self._resolve(*self.pending)
            self.pending = None

    def _resolve(self, res: StepResult, table: torch.Tensor, handle: Handle) -> None:
        handle.wait()
        table = table.cpu()  # (world, 4 + m): peak bytes, max RSS, step time, stop, m losses
        if not self.stop_signum:
            self.stop_signum = int(table[:, 3].max().item())
        if self.bar is None:
            return
        loss_sum = 0.0
        for r in range(self.plan.dp):  # replica-major, microbatch order: the reference's sum
            for v in table[self.grid.rank_of(self.plan.head_stage(), r), 4:].tolist():
                loss_sum += v
        loss = loss_sum / (self.plan.dp * self.m)
        rss = [int(p) for p in table[:, 1].tolist()]
        tensor_peaks = [int(p) if p >= 0 else None for p in table[:, 0].tolist()]
        peaks, source = peaks_per_rank(tensor_peaks, rss)
        rec = {
            "step": res.step,
            "loss": loss,
            "lr": res.lr,
            "grad_norm": res.grad_norm,
            "tokens_per_s": self.plan.tokens_per_step / res.time_s,
            "step_time_s": res.time_s,
            "peak_bytes_per_rank": peaks,
            "peak_bytes_source": source,  # "tensors" (tensor bytes) or "rss" (peak RSS)
            "max_rss_bytes_per_rank": rss,
        }
        if self.cap_bytes is not None:  # the declared cap the peaks are held to (`ratrain plot`)
            rec["memory_cap_bytes"] = self.cap_bytes
        if self.plan.compute_dtype == "fp16":
            rec.update(loss_scale=res.loss_scale, skipped=res.skipped)
        if res.eval_loss is not None:  # evaluated after this step (`EvalOpts.every`)
            rec["eval_loss"] = self.eval_loss = res.eval_loss
        self.losses.append(loss)
        self.records.append(rec)
        if self.jsonl is not None:
            self.jsonl.write(rec)
        if self.tb is not None:
            self.tb.write(res.step, {k: v for k, v in rec.items() if not k.endswith("_per_rank")})
        if self.wandb is not None:
            self.wandb.write(res.step, rec)
        held_out = {} if self.eval_loss is None else {"eval_loss": self.eval_loss}
        self.bar.update(1, loss=loss, **held_out, **{"tok/s": f"{rec['tokens_per_s']:,.0f}"})

    def close(self) -> None:
        for w in (self.jsonl, self.tb, self.wandb, self.bar):
            if w is not None:
                w.close()
