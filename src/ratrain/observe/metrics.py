"""Training metrics: a JSONL file, a stderr progress bar, and TensorBoard or Weights &
Biases (offline) when available.

No third-party dependency: the progress bar redraws one line on a terminal and prints a
plain line every `every_s` seconds otherwise (logs, CI). TensorBoard needs the
`tensorboard` package (`pip install 'ratrain[tensorboard]'`): asking for it without the
package is one line (`require_tensorboard`, which `ratrain train --tensorboard` calls before
any work), never a run that silently logs nothing. Weights & Biases (`--wandb PROJECT`)
is the same: the `wandb` package (`pip install wandb`), checked by `require_wandb`; its run
is offline (no network), its files in a `wandb/` folder beside the metrics file.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path
from typing import IO

from ratrain.errors import RatrainError

__all__ = [
    "JsonlWriter",
    "Progress",
    "TensorBoardWriter",
    "format_duration",
    "require_tensorboard",
    "TENSORBOARD_EXTRA",
    "WandbWriter",
    "require_wandb",
    "wandb_dir",
    "WANDB_EXTRA",
]

TENSORBOARD_EXTRA = "pip install 'ratrain[tensorboard]'"
"""How to install what `--tensorboard` needs (the `tensorboard` extra of pyproject.toml)."""
WANDB_EXTRA = "pip install wandb"
"""How to install what `--wandb` needs (also `pip install 'ratrain[wandb]'`)."""


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class JsonlWriter:
    """One JSON object per line, flushed after each so a crashed run keeps its history."""

    def __init__(self, path: str | Path, *, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # append: a resumed run continues the file of the run it resumes
        self._f = self.path.open("a" if append else "w")

    def write(self, record: dict) -> None:
        # Strict JSON: a non-finite value (the grad norm of a skipped fp16 step) becomes null.
        self._f.write(json.dumps(_finite(record), allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


class Progress:
    """`[#####.....] 50/100  3.1 it/s  ETA 0:16  loss 2.314` on stderr.

    On a terminal the line is redrawn at most every `redraw_s`; elsewhere one line is
    printed every `every_s` seconds and at the end. `quiet=True` prints nothing. `start`:
    the steps already done before this run (a resumed run counts on from there; the rate
    and the ETA are of this run's steps only).
    """

    def __init__(
        self,
        total: int,
        desc: str = "",
        *,
        stream: IO[str] | None = None,
        every_s: float = 10.0,
        redraw_s: float = 0.1,
        width: int = 24,
        quiet: bool = False,
        start: int = 0,
    ):
        self.total, self.desc, self.width, self.quiet = total, desc, width, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = redraw_s if self.tty else every_s
        self.start = self.done = start
        self.postfix = ""
        self._t0 = time.perf_counter()
        self._last_print = -math.inf

    def update(self, n: int = 1, **postfix: float | str) -> None:
        self.done += n
        if postfix:
            self.postfix = "  ".join(f"{k} {_fmt(v)}" for k, v in postfix.items())
        now = time.perf_counter()
        if now - self._last_print >= self.interval_s or self.done >= self.total:
            self._last_print = now
            self._print(now)

    def line(self, now: float | None = None) -> str:
        elapsed = (time.perf_counter() if now is None else now) - self._t0
        rate = (self.done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else math.inf
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        bar = "#" * int(frac * self.width)
        head = f"{self.desc} " if self.desc else ""
        return (
            f"{head}[{bar:.<{self.width}}] {self.done}/{self.total}  {rate:.2f} it/s  "
            f"ETA {format_duration(eta)}  {self.postfix}".rstrip()
        )

    def _print(self, now: float) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K" + self.line(now))
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        elif self._last_print == -math.inf or self.done < self.total:
            self._print(time.perf_counter())


def _fmt(v: float | str) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


def require_tensorboard(flag: str = "--tensorboard") -> None:
    """One line (RatrainError) unless the `tensorboard` package is installed: checked
    without importing it (or torch), so a command can refuse before any work."""
    if importlib.util.find_spec("tensorboard") is None:
        raise RatrainError(
            f"{flag} needs the tensorboard package, which is not installed: {TENSORBOARD_EXTRA}"
        )


class TensorBoardWriter:
    """Scalars to TensorBoard under `logdir` (None: a writer that does nothing). A `logdir`
    without the `tensorboard` package installed is one line (RatrainError)."""

    def __init__(self, logdir: str | Path | None):
        self._w = None
        if logdir is None:
            return
        require_tensorboard()
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # installed, yet not importable (a broken install)
            raise RatrainError(
                f"--tensorboard: cannot import TensorBoard ({e}); {TENSORBOARD_EXTRA}"
            ) from None
        self._w = SummaryWriter(str(logdir))

    @property
    def active(self) -> bool:
        return self._w is not None

    def write(self, step: int, record: dict) -> None:
        if self._w is None:
            return
        for k, v in record.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                self._w.add_scalar(f"train/{k}", v, step)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()


def require_wandb(flag: str = "--wandb") -> None:
    """One line (RatrainError) unless the `wandb` package is installed: checked without
    importing it (or torch), so a command can refuse before any work."""
    if importlib.util.find_spec("wandb") is None:
        raise RatrainError(f"{flag} needs the wandb package, which is not installed: {WANDB_EXTRA}")


def wandb_dir(metrics_path: str | Path | None) -> Path:
    """Where an offline Weights & Biases run keeps its files: `wandb/` in the metrics
    file's folder (the current one without a metrics file)."""
    return Path(metrics_path).parent if metrics_path else Path(".")


class WandbWriter:
    """The metrics records to an offline Weights & Biases run of `project` (None: a writer
    that does nothing), its files under `dir`/wandb (`wandb sync` uploads them later). A
    `project` without the `wandb` package installed is one line (RatrainError)."""

    def __init__(self, project: str | None, dir: str | Path = ".", config: dict | None = None):
        self._run = None
        if project is None:
            return
        require_wandb()
        try:
            import wandb
        except ImportError as e:  # installed, yet not importable (a broken install)
            raise RatrainError(f"--wandb: cannot import wandb ({e}); {WANDB_EXTRA}") from None
        Path(dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project, dir=str(dir), mode="offline", config=config)

    @property
    def active(self) -> bool:
        return self._run is not None

    def write(self, step: int, record: dict) -> None:
        """A record's numbers as scalars (`train/<key>`), and the highest rank's value of
        each per-rank list (`train/<key>_max`)."""
        if self._run is None:
            return
        scalars = {}
        for k, v in record.items():
            if isinstance(v, (list, tuple)):
                v = max((x for x in v if _is_number(x)), default=None)
                k = f"{k}_max"
            if _is_number(v) and k != "step":
                scalars[f"train/{k}"] = v
        self._run.log(scalars, step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
