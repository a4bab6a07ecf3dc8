"""A torchrun/Slurm rank takes `ratrain train --threads` (OMP_NUM_THREADS, set by the command
for the ranks it launches) as a spawned rank does: torch sized its pool when imported."""

from __future__ import annotations

import torch

from ratrain.train import job


def test_a_launched_rank_takes_the_threads_asked_for(monkeypatch):
    saved = torch.get_num_threads()
    want = 1 if saved != 1 else 2
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", str(want))
        job._launched_threads()
        assert torch.get_num_threads() == want
        torch.set_num_threads(saved)
        monkeypatch.setenv("OMP_NUM_THREADS", "")  # not set: torch's own choice stays
        job._launched_threads()
        assert torch.get_num_threads() == saved
    finally:
        torch.set_num_threads(saved)
