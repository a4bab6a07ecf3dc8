"""A caching allocator for CPU tensors: freed blocks are kept by size and handed out again.

glibc's malloc serves a training step's activations from its heap, which fragments: on
the issue-12 job rank 0's heap grew to ~730 MiB for 529 MiB of live tensors, and freed
heap memory stays resident (`benchmarks/rss_breakdown.py`, docs/runtime.md "Host
memory"). Mapping every tensor on its own (`host_memory.fix_mmap_threshold`) removes the
waste but pays a page fault per 4 KiB of every allocation. This allocator does what
CUDA's caching allocator does on a GPU: blocks of at least 128 KiB are mapped once, page
rounded, and on free go to a free list of their exact size, from which the next request
of that size is served, with no fault and no heap to fragment. A step allocates the same
sizes in every step, so after the first one nothing new is mapped. Smaller requests go to
`posix_memalign` as before (64-byte aligned, as torch's own CPU allocator).

`trim()` (called after every step) unmaps the cached blocks of every size no request asked
for since the previous call, so sizes a run stops using are given back.

It is C++ (torch's CPU allocator cannot be replaced from Python), built once with
`torch.utils.cpp_extension.load_inline` (about 40 s; cached under
~/.cache/torch_extensions) and installed with `c10::SetCPUAllocator` before the rank's
first tensor. Without a C++ compiler the rank keeps torch's allocator, after one line on
stderr. Its pools are never destroyed, so tensors freed while the process exits stay safe.
"""

from __future__ import annotations

import functools
import os
import sys

from ratrain.launch.toolchain import cxx_compiler

__all__ = ["build", "install", "stats", "trim"]

_NAME = "ratrain_cpu_caching_allocator"

_SRC = r"""
#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {
constexpr size_t kMinCached = 128 * 1024;  // below this: posix_memalign, as torch does
constexpr size_t kPage = 4096;
struct Block { void* ptr; size_t size; };
struct Pool {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  std::unordered_map<size_t, bool> asked;  // size -> requested since the last trim
  size_t mapped = 0, cached = 0;
};
Pool& pool() { static Pool* p = new Pool(); return *p; }  // never destroyed: see docstring

void release_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  Pool& P = pool();
  {
    std::lock_guard<std::mutex> g(P.mu);
    P.free_blocks[b->size].push_back(b->ptr);
    P.cached += b->size;
  }
  delete b;
}

void small_free(void* p) { std::free(p); }

struct CachingCPU final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::Device cpu(c10::DeviceType::CPU);
    if (n < kMinCached) {
      void* p = nullptr;
      TORCH_CHECK(posix_memalign(&p, 64, n ? n : 1) == 0, "out of memory: ", n, " bytes");
      return {p, p, &small_free, cpu};
    }
    size_t size = (n + kPage - 1) / kPage * kPage;
    void* p = nullptr;
    Pool& P = pool();
    {
      std::lock_guard<std::mutex> g(P.mu);
      P.asked[size] = true;
      auto it = P.free_blocks.find(size);
      if (it != P.free_blocks.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        P.cached -= size;
      }
    }
    if (p == nullptr) {
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(p != MAP_FAILED, "out of memory: mmap of ", size, " bytes failed");
      std::lock_guard<std::mutex> g(P.mu);
      P.mapped += size;
    }
    return {p, new Block{p, size}, &release_block, cpu};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
}  // namespace

void install() {
  static CachingCPU* alloc = new CachingCPU();
  c10::SetCPUAllocator(alloc, /*priority=*/100);
}

std::vector<int64_t> trim() {
  Pool& P = pool();
  std::lock_guard<std::mutex> g(P.mu);
  size_t released = 0;
  for (auto& [size, blocks] : P.free_blocks) {
    if (P.asked[size]) continue;
    for (void* p : blocks) { munmap(p, size); released += size; }
    P.cached -= size * blocks.size();
    P.mapped -= size * blocks.size();
    blocks.clear();
  }
  for (auto& [size, flag] : P.asked) flag = false;
  return {(int64_t)released};
}

std::vector<int64_t> stats() {
  Pool& P = pool();
  std::lock_guard<std::mutex> g(P.mu);
  return {(int64_t)P.mapped, (int64_t)P.cached};
}
"""


@functools.cache
def _module():
    if cxx_compiler() is None:
        return None
    from torch.utils import cpp_extension

    try:  # a private helper: only to say why the first run pauses
        built = os.path.join(cpp_extension._get_build_directory(_NAME, False), f"{_NAME}.so")
    except Exception:
        built = None
    if built is not None and not os.path.exists(built):
        print(
            "ratrain: building the CPU caching allocator (once, ~1 min; "
            "--no-cpu-caching-allocator skips it)",
            file=sys.stderr,
            flush=True,
        )
    try:
        return cpp_extension.load_inline(
            _NAME,
            cpp_sources=_SRC,
            functions=["install", "trim", "stats"],
            extra_cflags=["-O2"],
        )
    except Exception as e:  # a broken toolchain: train on torch's allocator, say why once
        first = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"ratrain: the CPU caching allocator did not build ({first})", file=sys.stderr)
        return None


def build() -> bool:
    """Build (or load the cached build of) the allocator; False, after one line on stderr,
    without a C++ compiler or when the build fails. The launcher calls it once; ranks then
    only load the build (and are not asked to install it when it failed)."""
    if _module() is not None:
        return True
    if cxx_compiler() is None:  # (a failed build has said why already)
        print(
            "ratrain: no C++ compiler ($CXX, c++, g++ or clang++): CPU tensors use torch's "
            "own allocator (the caching allocator needs one to build)",
            file=sys.stderr,
        )
    return False


_installed: list = []  # the built module, once installed in this process


def install() -> bool:
    """Make the caching allocator torch's CPU allocator in this process; False without a
    C++ compiler (torch's own stays)."""
    mod = _module()
    if mod is None:
        return False
    if not _installed:
        mod.install()
        _installed.append(mod)
    return True


def trim() -> int:
    """Unmap the cached blocks of sizes nothing asked for since the last call: bytes freed
    (0 when the allocator is not installed)."""
    return int(_installed[0].trim()[0]) if _installed else 0


def stats() -> tuple[int, int]:
    """(bytes the allocator has mapped, of which cached free); (0, 0) when not installed."""
    return tuple(int(x) for x in _installed[0].stats()) if _installed else (0, 0)
