"""`--wandb PROJECT`: an optional extra, as `--tensorboard` is. Without the package it is
one line before any work; with it (a stand-in module here: the real one is not a test
dependency and is never installed by the tests) the records go to an offline run whose
files lie beside the metrics file."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

from ratrain.cli import main
from ratrain.errors import RatrainError
from ratrain.observe import metrics
from ratrain.observe.metrics import WandbWriter, require_wandb, wandb_dir

SMALL = ["--seq", "16", "--micro-batch", "2", "--global-batch", "4", "--threads", "1"]


def _no_wandb(monkeypatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name, *a, **kw):
        return None if name == "wandb" else real(name, *a, **kw)

    monkeypatch.setattr(metrics.importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of it fails too


def test_wandb_without_the_package_is_one_line_before_work(tmp_path, capsys, monkeypatch):
    _no_wandb(monkeypatch)
    m = tmp_path / "run" / "m.jsonl"
    argv = ["train", "--wandb", "proj", "--metrics", str(m), "--pp", "1", "--steps", "1"]
    assert main([*argv, *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert "--wandb" in err and "pip install wandb" in err, err
    assert not (tmp_path / "run").exists()  # nothing done: not even the metrics folder
    with pytest.raises(RatrainError, match="pip install wandb"):
        require_wandb()
    with pytest.raises(RatrainError, match="pip install wandb"):
        WandbWriter("proj", tmp_path)
    assert not WandbWriter(None).active


def test_pyproject_has_the_wandb_extra_outside_the_test_extra():
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    doc = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extras = doc["project"]["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["wandb"]] == ["wandb"]
    assert not any(r.startswith("wandb") for r in extras["test"])


class _FakeRun:
    def __init__(self, **kw):
        self.init, self.logged, self.finished = kw, [], False

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def test_writer_logs_offline_beside_the_metrics(tmp_path, monkeypatch):
    runs = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(_FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(metrics, "require_wandb", lambda flag="--wandb": None)

    where = wandb_dir(tmp_path / "out" / "m.jsonl")
    assert where == tmp_path / "out" and wandb_dir(None) == Path(".")
    w = WandbWriter("proj", where)
    assert w.active and where.is_dir()
    rec = {
        "step": 3,
        "loss": 2.5,
        "tokens_per_s": 1000.0,
        "peak_bytes_per_rank": [10, 30],
        "peak_bytes_source": "rss",
        "grad_norm": None,
        "skipped": False,
    }
    w.write(3, rec)
    w.close()
    (run,) = runs
    assert run.init == {"project": "proj", "dir": str(where), "mode": "offline", "config": None}
    assert run.logged == [
        (3, {"train/loss": 2.5, "train/tokens_per_s": 1000.0, "train/peak_bytes_per_rank_max": 30})
    ]
    assert run.finished and not w.active
