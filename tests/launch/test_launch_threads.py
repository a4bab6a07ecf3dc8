"""The launcher's threads per rank: OMP_NUM_THREADS where set (`ratrain train --threads`
sets it for the ranks it launches), else the CPUs this process may run on shared by the
ranks, not the machine's count (a `taskset` or container limit would be oversubscribed)."""

import os

import pytest

from ratrain.cli.train import omp_threads
from ratrain.launch import spawn as launch


def test_threads_follow_the_affinity_not_the_machine(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert launch._threads_per_rank(1) == 2
    assert launch._threads_per_rank(2) == 1
    assert launch._threads_per_rank(4) == 1  # at least one


def test_omp_num_threads_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert launch._threads_per_rank(4) == 3


@pytest.mark.parametrize("saved", [None, "5"])
def test_train_threads_reach_the_ranks_and_are_restored(monkeypatch, saved):
    if saved is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", saved)
    with omp_threads(2):
        assert launch._threads_per_rank(4) == 2
    assert os.environ.get("OMP_NUM_THREADS") == saved
    with omp_threads(None):  # no --threads: the environment as it was
        assert os.environ.get("OMP_NUM_THREADS") == saved
