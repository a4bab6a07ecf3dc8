"""Host memory on CPU ranks: the fixed glibc mmap threshold gives freed tensors back; the
caching allocator reuses blocks by size and trims unused sizes; training is the same bit
for bit on every allocator; bad values are one line before any work."""

import os
import subprocess
import sys
import textwrap

import pytest

import _runtime as harness
from ratrain.cli import main
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.launch.host_memory import (
    LOW_RSS_MMAP_THRESHOLD_BYTES,
    MAX_MMAP_THRESHOLD_BYTES,
    check_mmap_threshold,
)
from ratrain.models.presets import get_preset

# A freed 8 MiB tensor raises glibc's dynamic threshold to 8 MiB; 64 tensors of 1 MiB then
# come from the heap, and with the last one kept on top, the 63 MiB freed below it stay
# resident. With the threshold fixed each 1 MiB tensor is mapped and unmapped on its own.
_CHILD = textwrap.dedent(
    """
    import os, sys, torch
    from ratrain.launch.host_memory import fix_mmap_threshold

    applied = fix_mmap_threshold(int(sys.argv[1]))
    page = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    big = torch.ones(8 * 2**20 // 4)
    del big
    before = rss()
    blocks = [torch.ones(2**20 // 4) for _ in range(64)]
    keep = blocks[-1]
    del blocks
    print(int(applied), rss() - before)
    """
)


def _retained_mib(threshold: int) -> tuple[bool, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(threshold)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    ).stdout.split()
    return out[0] == "1", int(out[1]) / 2**20


@pytest.mark.timeout(240)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc only")
def test_fixed_threshold_returns_freed_tensors():
    applied, fixed = _retained_mib(LOW_RSS_MMAP_THRESHOLD_BYTES)
    if not applied:
        pytest.skip("this C library has no mallopt(M_MMAP_THRESHOLD)")
    _, dynamic = _retained_mib(0)
    assert dynamic > 48, dynamic  # glibc's own threshold keeps the freed heap blocks resident
    assert fixed < 8, fixed  # the fixed one gives them back: ~1 MiB (the kept tensor) is left


def test_check_mmap_threshold():
    check_mmap_threshold(0)
    check_mmap_threshold(LOW_RSS_MMAP_THRESHOLD_BYTES)
    check_mmap_threshold(MAX_MMAP_THRESHOLD_BYTES)
    for bad in (-1, MAX_MMAP_THRESHOLD_BYTES + 1):
        with pytest.raises(RatrainError, match="--malloc-mmap-threshold"):
            check_mmap_threshold(bad)


def test_bad_threshold_is_one_line_before_work(capsys):
    assert main(["train", "--pp", "2", "--steps", "1", "--malloc-mmap-threshold", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert "--malloc-mmap-threshold" in err


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_ranks_train_the_same_on_every_allocator():
    spec = get_preset("tiny")
    plan = Plan(pp=2, dp=1, micro_batch=1, global_batch=4, seq=16, compute_dtype="fp32")
    cfg = TrainConfig(steps=3, warmup_steps=1)
    runs = [("ratrain", {}), ("baseline", {"schedule": "baseline"})]
    caching = harness.run(spec, plan, cfg, runs, cpu_caching_allocator=True)
    malloc = harness.run(spec, plan, cfg, runs)  # the default: malloc
    fixed = harness.run(
        spec,
        plan,
        cfg,
        runs,
        cpu_caching_allocator=False,
        malloc_mmap_threshold_bytes=LOW_RSS_MMAP_THRESHOLD_BYTES,
    )
    for name, _ in runs:
        assert harness.losses(caching, name) == harness.losses(malloc, name)
        assert harness.losses(fixed, name) == harness.losses(malloc, name)
    assert harness.losses(caching, "ratrain") == harness.losses(caching, "baseline")


_CACHING_CHILD = textwrap.dedent(
    """
    import torch
    from ratrain.launch import cpu_allocator

    assert cpu_allocator.install()
    a = torch.ones(2**20)  # 4 MiB: cached once freed
    mapped, cached = cpu_allocator.stats()
    ptr = a.data_ptr()
    del a
    assert cpu_allocator.stats() == (mapped, mapped), cpu_allocator.stats()
    b = torch.zeros(2**20)  # the same size: the same block, nothing new mapped
    assert b.data_ptr() == ptr and float(b.sum()) == 0.0
    assert cpu_allocator.stats() == (mapped, 0)
    c = torch.ones(3 * 2**20)
    del c
    assert cpu_allocator.trim() == 0  # asked for in this period: kept
    assert cpu_allocator.trim() == 12 * 2**20  # not asked for since: given back
    assert cpu_allocator.stats() == (mapped, 0)
    small = torch.ones(10)  # below 128 KiB: malloc, not the pools
    assert cpu_allocator.stats() == (mapped, 0) and float(small.sum()) == 10.0
    print("ok")
    """
)


@pytest.mark.timeout(300)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mmap/munmap on Linux")
def test_caching_allocator_reuses_by_size_and_trims_unused_sizes():
    from ratrain.launch.toolchain import cxx_compiler

    if cxx_compiler() is None:
        pytest.skip("no C++ compiler to build the allocator")
    out = subprocess.run(
        [sys.executable, "-c", _CACHING_CHILD],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=280,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_adamw_in_slices_is_bit_identical_to_one_call():
    import torch

    from ratrain.runtime.optim import _adamw_slice_, adamw_step_
    from ratrain.sizes.workspace import ADAMW_CHUNK_ELEMS

    g = torch.Generator().manual_seed(0)
    n = 2 * ADAMW_CHUNK_ELEMS + 37  # three slices, the last with a scalar tail
    p = torch.randn(n, generator=g)
    sliced = [p.clone(), torch.zeros(n), torch.zeros(n)]
    whole = [p.clone(), torch.zeros(n), torch.zeros(n)]
    kw = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    for step in range(1, 4):
        grad = torch.randn(n, generator=g)
        adamw_step_(sliced[0], grad, sliced[1], sliced[2], step=step, grad_scale=0.5, **kw)
        _adamw_slice_(*whole[:1], grad, *whole[1:], step, *kw.values(), 0.5)
    assert all(torch.equal(a, b) for a, b in zip(sliced, whole, strict=True))
