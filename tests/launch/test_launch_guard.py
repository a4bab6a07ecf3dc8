"""A local launch this machine cannot sensibly run (a plan for a cluster: more than
max(8, 4 x CPUs) ranks, or more tensor bytes than the available memory) is refused in one
line naming the rank count and how to launch it on a cluster, before anything is spawned."""

from __future__ import annotations

import functools
import time

import pytest

import ratrain.launch.spawn as spawn_mod
import ratrain.train.job as job_mod
from ratrain.cli import main
from ratrain.config import Plan, TrainConfig, save_plan
from ratrain.data import make_source
from ratrain.errors import RatrainError
from ratrain.launch.spawn import check_local_launch, local_rank_limit
from ratrain.models.presets import get_preset
from ratrain.train.job import Job, run_job

SMALL = ["--seq", "16", "--micro-batch", "1", "--steps", "2", "--quiet"]


@pytest.fixture
def no_spawn(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a rank was spawned")

    monkeypatch.setattr(job_mod, "spawn", refuse)


def _one_line(capfd, argv) -> str:
    t0 = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - t0 < 30
    out, err = capfd.readouterr()
    assert out == ""  # not even the header
    err = err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.timeout(60)
def test_plan_for_1024_ranks_is_refused_before_spawning(tmp_path, capfd, no_spawn):
    plan = Plan(pp=4, dp=256, micro_batch=1, global_batch=256, seq=16, model="tiny")
    save_plan(plan, tmp_path / "plan.yaml")
    err = _one_line(capfd, ["train", "--plan", str(tmp_path / "plan.yaml"), *SMALL])
    assert "the plan (pp 4 x dp 256) has 1024 ranks" in err, err
    assert f"at most {local_rank_limit()}" in err
    assert "torchrun --nnodes N --nproc-per-node M" in err and "srun -n 1024" in err


@pytest.mark.timeout(60)
def test_flags_over_the_limit_are_refused(capfd, no_spawn, monkeypatch):
    monkeypatch.setattr(spawn_mod, "_cpus", lambda: 2)
    assert local_rank_limit() == 8  # max(8, 4 x 2)
    argv = ["train", "--pp", "3", "--dp", "3", "--global-batch", "9", *SMALL]
    err = _one_line(capfd, argv)
    assert "has 9 ranks" in err and "max(8, 4 x 2 CPUs)" in err, err


def test_limit_rule():
    ok = local_rank_limit()
    check_local_launch(ok)  # at the limit: fine
    with pytest.raises(RatrainError, match=f"this job has {ok + 1} ranks"):
        check_local_launch(ok + 1, lambda: pytest.fail("memory asked after the count failed"))


def test_more_tensor_bytes_than_available_memory_is_refused(monkeypatch, no_spawn):
    spec = get_preset("tiny")
    plan = Plan(pp=2, dp=1, micro_batch=1, global_batch=2, seq=16, model="tiny")
    cfg = TrainConfig(steps=1)
    job = Job(spec, plan, cfg, functools.partial(make_source, "synthetic", spec, 16, 0))
    monkeypatch.setattr(spawn_mod, "available_memory_bytes", lambda: 2**20)  # 1 MiB left
    with pytest.raises(RatrainError, match=r"2 ranks that need at least .* GiB .*memory ledger"):
        run_job(job)
    monkeypatch.setattr(spawn_mod, "available_memory_bytes", lambda: None)  # unknown: allowed
    job_mod.check_local(job)
