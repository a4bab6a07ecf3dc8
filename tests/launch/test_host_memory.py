"""Host memory on CPU ranks: the ranks run on the allocator asked for (jemalloc or tcmalloc
preloaded, else glibc's malloc), even where a fork server of an earlier job had another;
oneDNN's raw allocations work on each; training is the same bit for bit on every one; the
fixed glibc mmap threshold gives freed tensors back; nothing an interrupted first run
leaves behind hangs a later one; bad values are one line before any work."""

import contextlib
import functools
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import _runtime as harness
from ratrain.cli import main
from ratrain.config import Plan, TrainConfig
from ratrain.errors import RatrainError
from ratrain.launch import host_memory
from ratrain.launch.host_memory import (
    DEBIAN_PACKAGES,
    LOW_RSS_MMAP_THRESHOLD_BYTES,
    MAX_MMAP_THRESHOLD_BYTES,
    HostAllocator,
    check_mmap_threshold,
    find_allocator_library,
    loaded_host_allocator,
    preload_value,
    resolve_host_allocator,
)
from ratrain.launch.spawn import spawn
from ratrain.models.presets import get_preset
from ratrain.train.job import Launch

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


_ALLOCATORS = ("tcmalloc", "jemalloc")


def _library_or_skip(name: str) -> str:
    library = find_allocator_library(name)
    if library is None:
        pytest.skip(f"{name} is not installed (apt-get install {DEBIAN_PACKAGES[name]})")
    return library


def _fake_libraries(tmp_path, monkeypatch, *files: str) -> None:
    """Only `files` (empty stand-ins) in the allocator search path."""
    for f in files:
        (tmp_path / f).write_bytes(b"")
    monkeypatch.setattr(host_memory, "_library_dirs", lambda: [str(tmp_path)])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
def test_auto_takes_tcmalloc_then_jemalloc_then_malloc(tmp_path, monkeypatch):
    _fake_libraries(tmp_path, monkeypatch, "libjemalloc.so.2", "libtcmalloc_minimal.so.4")
    assert resolve_host_allocator("auto") == HostAllocator(
        "tcmalloc", str(tmp_path / "libtcmalloc_minimal.so.4")
    )
    assert resolve_host_allocator("jemalloc").library == str(tmp_path / "libjemalloc.so.2")
    assert resolve_host_allocator("malloc") == HostAllocator("malloc")
    # glibc's mmap threshold is a malloc setting: auto keeps malloc, an explicit other refuses
    assert resolve_host_allocator("auto", LOW_RSS_MMAP_THRESHOLD_BYTES) == HostAllocator("malloc")
    with pytest.raises(RatrainError, match="--malloc-mmap-threshold is a setting of glibc"):
        resolve_host_allocator("tcmalloc", LOW_RSS_MMAP_THRESHOLD_BYTES)
    (tmp_path / "libtcmalloc_minimal.so.4").unlink()
    assert resolve_host_allocator("auto").name == "jemalloc"
    (tmp_path / "libjemalloc.so.2").unlink()
    assert resolve_host_allocator("auto") == HostAllocator("malloc")
    with pytest.raises(RatrainError, match="apt-get install libtcmalloc-minimal4"):
        resolve_host_allocator("tcmalloc")
    with pytest.raises(RatrainError, match="--host-allocator must be one of"):
        resolve_host_allocator("hoard")


@pytest.mark.parametrize("name", _ALLOCATORS)
def test_an_allocator_not_installed_is_one_line_naming_its_package(
    name, tmp_path, monkeypatch, capsys
):
    _fake_libraries(tmp_path, monkeypatch)
    assert main(["train", "--pp", "2", "--steps", "1", "--host-allocator", name]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert f"apt-get install {DEBIAN_PACKAGES[name]}" in err and "--host-allocator" in err, err


def test_preload_value_puts_the_allocator_first_and_drops_other_allocators():
    jem, tc = "/usr/lib/libjemalloc.so.2", "/opt/lib/libtcmalloc_minimal.so.4"
    assert preload_value(None, jem) == jem
    assert preload_value(None, None) == ""
    assert preload_value(f"/x/libfoo.so {tc}", jem) == f"{jem}:/x/libfoo.so"
    assert preload_value(f"{jem}:/x/libfoo.so", None) == "/x/libfoo.so"


def test_loaded_allocator_is_read_from_the_memory_map(tmp_path):
    maps = tmp_path / "maps"
    line = "7f0-7f1 r-xp 00000000 08:01 42 {}\n"
    maps.write_text(line.format("/usr/lib/libc.so.6") + "7f2-7f3 rw-p 0 0:0 0 [heap]\n")
    assert loaded_host_allocator(str(maps)) == "malloc"
    maps.write_text(maps.read_text() + line.format("/usr/lib/libtcmalloc_minimal.so.4.5.10"))
    assert loaded_host_allocator(str(maps)) == "tcmalloc"
    assert loaded_host_allocator(str(tmp_path / "absent")) == "malloc"


def test_a_launched_rank_must_have_the_allocator_it_asks_for(monkeypatch):
    monkeypatch.setattr(host_memory, "loaded_host_allocator", lambda: "jemalloc")
    alloc = resolve_host_allocator("auto", launched=True)
    assert alloc == HostAllocator("jemalloc", launched=True)
    assert "LD_PRELOAD of the launch" in alloc.describe()
    assert resolve_host_allocator("jemalloc", launched=True).name == "jemalloc"
    with pytest.raises(
        RatrainError,
        match="--host-allocator tcmalloc: this rank process runs on jemalloc.*LD_PRELOAD=",
    ):
        resolve_host_allocator("tcmalloc", launched=True)
    with pytest.raises(RatrainError, match="--malloc-mmap-threshold"):
        resolve_host_allocator("auto", LOW_RSS_MMAP_THRESHOLD_BYTES, launched=True)


def _rank_allocator(rdzv) -> tuple[str, int]:
    """A rank's allocator, as its memory map shows, and its fork server's pid."""
    return loaded_host_allocator(), os.getppid()


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
def test_ranks_run_on_the_allocator_asked_for_and_the_fork_server_follows():
    """Each job's ranks have the allocator it asked for, even where the fork server of an
    earlier job in this process was started with another (it is replaced), and the same
    one is reused while the setting stays."""
    libraries = {"malloc": None}
    libraries.update({n: p for n in _ALLOCATORS if (p := find_allocator_library(n))})
    if len(libraries) == 1:
        pytest.skip(
            "neither tcmalloc nor jemalloc is installed (apt-get install libtcmalloc-minimal4)"
        )
    order = [*libraries, *libraries][1:]  # every switch, and back: e.g. jem, tc, malloc, jem
    servers = []
    for name in order:
        out = spawn(_rank_allocator, 2, deadline_s=100, allocator_library=libraries[name])
        assert [a for a, _ in out] == [name, name], (name, out)
        servers.append(out[0][1])
        again = spawn(_rank_allocator, 1, deadline_s=100, allocator_library=libraries[name])
        assert again == [(name, servers[-1])]  # the same fork server while nothing changes
    assert len(set(servers)) == len(servers)  # a new one at every switch


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("allocator", [*_ALLOCATORS, "malloc-mmap-threshold"])
def test_ranks_train_the_same_on_every_allocator(allocator):
    """Losses are bit-identical on glibc's malloc, with its mmap threshold fixed, and on
    jemalloc and tcmalloc: only where the bytes live changes."""
    if allocator in _ALLOCATORS:
        _library_or_skip(allocator)
        kw = {"host_allocator": allocator}
    else:
        kw = {"host_allocator": "malloc", "malloc_mmap_threshold_bytes": 128 * 1024}
    other = _tiny_losses(**kw)
    assert other == _tiny_losses(host_allocator="malloc")
    assert other["ratrain"] == other["baseline"]


@functools.cache
def _tiny_losses(**kw) -> dict[str, list[float]]:
    spec = get_preset("tiny")
    plan = Plan(pp=2, dp=1, micro_batch=1, global_batch=4, seq=16, compute_dtype="fp32")
    cfg = TrainConfig(steps=3, warmup_steps=1)
    runs = [("ratrain", {}), ("baseline", {"schedule": "baseline"})]
    results = harness.run(spec, plan, cfg, runs, launch=Launch(**kw))
    return {name: harness.losses(results, name) for name, _ in runs}


# oneDNN takes memory for its reorders, outputs and scratchpads from torch's CPU allocator
# with raw_allocate/raw_deallocate, which require a DataPtr whose context is its data
# pointer: the home-made caching allocator this replaced broke that for blocks of 128 KiB
# and more (INTERNAL ASSERT FAILED at c10/core/Allocator.h, raw_deallocate; with it
# installed in `setup` this child aborts, on AVX2 as on AVX512-BF16). fp32 convolutions and
# linear layers on oneDNN tensors take that path on every x86 CPU; the bf16 matmul is oneDNN
# where the CPU has native bf16 units (the crash that was reported), torch's own elsewhere.
_ONEDNN_CHILD = textwrap.dedent(
    """
    import torch
    {setup}
    from ratrain.launch.host_memory import loaded_host_allocator

    torch.set_num_threads(1)
    F = torch.nn.functional
    assert torch.backends.mkldnn.is_available()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, 32, 32, generator=g)  # 256 KiB
    w = torch.randn(32, 32, 3, 3, generator=g)

    def conv(enabled):
        with torch.backends.mkldnn.flags(enabled=enabled):
            xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = F.conv2d(xs, ws, padding=1)
            y.square().sum().backward()
            return y.detach(), xs.grad, ws.grad

    for a, b in zip(conv(True), conv(False)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-2)
    a, b = torch.randn(128, 512, generator=g), torch.randn(256, 512, generator=g)
    lin = torch._C._nn.mkldnn_linear(a.to_mkldnn(), b.to_mkldnn(), None).to_dense()
    torch.testing.assert_close(lin, a @ b.T, rtol=1e-4, atol=1e-3)
    m = torch.randn(256, 256, generator=g).bfloat16()
    torch.testing.assert_close((m @ m).float(), m.float() @ m.float(), rtol=2e-2, atol=0.5)
    print("allocator", loaded_host_allocator())
    """
)


def onednn_child(library: str | None, isa: str | None, setup: str = "") -> tuple[str, str]:
    """Run the oneDNN child in a process set up as a rank is (`library` preloaded the way
    `spawn` does it), oneDNN limited to `isa` (None: the CPU's own): (stdout, its
    allocator)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ONEDNN_VERBOSE": "1"}
    env["LD_PRELOAD"] = preload_value(os.environ.get("LD_PRELOAD"), library)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    out = subprocess.run(
        [sys.executable, "-c", _ONEDNN_CHILD.format(setup=setup)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, (out.returncode, (out.stdout + out.stderr)[-1500:])
    return out.stdout, out.stdout.split()[-1]


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="emulates an AVX2-only x86 CPU"
)
@pytest.mark.parametrize("isa", [None, "AVX2"], ids=["native-isa", "avx2"])
@pytest.mark.parametrize("allocator", ["malloc", *_ALLOCATORS])
def test_onednn_raw_allocations_run_on_the_ranks_allocator(allocator, isa):
    library = None if allocator == "malloc" else _library_or_skip(allocator)
    log, loaded = onednn_child(library, isa)
    assert loaded == allocator
    assert "primitive,exec,cpu,convolution" in log  # oneDNN ran the convolutions
    if isa:
        assert "isa:Intel AVX2" in log, log[:400]


def _train(env, *flags: str, timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ratrain", "train", "--steps", "2", "--quiet", *flags]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd[3:])} did not finish within {timeout} s") from e


def _interrupted_compile(env, lock_dir) -> None:
    """A first `--compile` run killed while inductor compiles (its lock files left)."""
    cmd = [sys.executable, "-m", "ratrain", "train", "--steps", "2", "--quiet", "--compile"]
    run = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    end = time.monotonic() + 90
    while run.poll() is None and time.monotonic() < end and not list(lock_dir.glob("*.lock")):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGKILL)  # the launcher and its ranks, as a closed terminal
    run.wait(timeout=30)


def _stale_lock_env(tmp_path) -> dict:
    """A home whose torch-extension cache holds the build locks an interrupted first run of
    the removed C++ allocator left (torch's FileBaton waited forever on them)."""
    import torch

    env = {**os.environ, "HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    for var in ("XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR", "RANK", "SLURM_PROCID"):
        env.pop(var, None)
    cu = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    ext = (
        tmp_path
        / ".cache"
        / "torch_extensions"
        / f"py{sys.version_info[0]}{sys.version_info[1]}_{cu}"
    )
    for name in ("ratrain_cpu_caching_allocator", "ratrain_cpu_caching_allocator_v1"):
        (ext / name).mkdir(parents=True)
        (ext / name / "lock").write_text("")
    return env


@pytest.mark.dist
@pytest.mark.timeout(180)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, /proc")
def test_stale_build_locks_of_an_interrupted_first_run_hang_nothing(tmp_path):
    """The extension build locks and a stale inductor lock file cannot hang an eager run
    (the interrupted compile itself: the slow test below)."""
    env = _stale_lock_env(tmp_path)
    lock_dir = tmp_path / "ind" / "locks"
    lock_dir.mkdir(parents=True)
    (lock_dir / "stale.lock").write_text("")
    t0 = time.monotonic()
    out = _train(env, timeout=60)
    assert out.returncode == 0 and "final loss" in out.stdout, out.stderr[-2000:]
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(420)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, /proc")
def test_stale_locks_of_an_interrupted_first_compile_hang_nothing(tmp_path):
    """What an interrupted first `--compile` run leaves behind cannot hang a later one:
    inductor's lock files (flock: a dead holder holds nothing) and its partial cache, with
    the extension build locks of `_stale_lock_env` beside them."""
    env = _stale_lock_env(tmp_path)
    lock_dir = tmp_path / "ind" / "locks"
    _interrupted_compile(env, lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    (lock_dir / "stale.lock").write_text("")  # in case the kill came before the first
    assert list(lock_dir.glob("*.lock"))
    # --compile reads the interrupted run's inductor cache and locks (a cold compile of the
    # tiny model's blocks is ~25 s on the 2-core machine: the bound leaves room for load)
    out = _train(env, "--compile", timeout=180)
    assert out.returncode == 0 and "final loss" in out.stdout, out.stderr[-2000:]


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
