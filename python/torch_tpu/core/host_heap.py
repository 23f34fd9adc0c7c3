"""glibc malloc settings for a tpu_dist process on XLA:CPU: freed collective outputs are
reused instead of handed back to the kernel.

XLA:CPU allocates every program output with the C allocator, on one of its client's
worker threads, and its all-reduce never writes into its operand: each collective call
gets a fresh output buffer of the operand's size. With glibc's defaults a buffer of
32 MB or more is a fresh `mmap` (and a worker thread's arena cannot hold 64 MB at
all), so every call faults in and zeroes every page (16,385 minor faults per 64 MB
all-reduce) and `munmap`s them when the previous output is freed. Two settings make
the freed buffer the next call's output, as PyTorch's gloo reduces in one tensor:

* `share_main_arena()` -- `M_ARENA_MAX=1`, so XLA's worker threads allocate from the
  main (brk) heap, the only one that can hold any size. An arena is chosen per thread
  at its first allocation and the limit is fixed once glibc has made 8 arenas, so this
  must run before any thread starts: at `import torch` (the `torch.backends` autoload),
  in a process a launcher started (`WORLD_SIZE` > 1) on XLA:CPU (not on a machine
  whose PyTorch is a CUDA/ROCm build or that has a TPU/CUDA PjRT plugin, unless
  `TORCH_TPU_PLATFORM=cpu`; on a CPU-only machine with torch_tpu installed, a gloo job's
  workers get it too: `TORCH_TPU_DIST_REUSE_HOST_MEMORY=0` there). (Set when the client
  starts, it reached only some of XLA's threads: 4,369 faults per 64 MB call. Threads
  that a library imported before torch started and that allocated keep their own arenas,
  and XLA's threads may then share those.)
* `keep_freed_memory()` -- `M_MMAP_MAX=0` (large buffers from the heap too) and
  `M_TRIM_THRESHOLD=RETAINED_BYTES` (a freed top of the heap is kept up to that size),
  when the multi-process XLA:CPU client is created.

The cost: the process keeps up to `RETAINED_BYTES` of freed memory, every thread
allocates from one arena, and memory freed below the heap's top is reused but never
returned. `TORCH_TPU_DIST_REUSE_HOST_MEMORY=0` leaves glibc's defaults. Other C
libraries (musl) and other platforms: nothing is changed. Measured figures are in
docs/explanation/distributed.md ("Performance").

Standard library only: it runs at `import torch`, before jaxlib loads.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

from . import config, plugins

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8

# Freed memory at the top of the heap kept for reuse (glibc's default moves between
# 128 KB and 64 MB): room for a few outputs of the largest collectives a CPU job runs.
RETAINED_BYTES = 1 << 30

_applied: set[str] = set()


def _mallopt():
    """glibc's `mallopt`, or None (another C library or platform)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        gnu_get_libc_version = libc.gnu_get_libc_version  # glibc only
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    del gnu_get_libc_version
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def enabled() -> bool:
    """`TORCH_TPU_DIST_REUSE_HOST_MEMORY` (on unless set to 0)."""
    return bool(config.get("TORCH_TPU_DIST_REUSE_HOST_MEMORY"))


# Packages whose presence means the runtime would pick a TPU or CUDA PjRT plugin when
# `TORCH_TPU_PLATFORM` is unset.
ACCELERATOR_PLUGIN_MODULES = (plugins.TPU_PLUGIN_PACKAGE, *plugins.CUDA_PLUGIN_PACKAGES)


def accelerator_plugin_installed() -> bool:
    """Whether a TPU or CUDA PjRT plugin is configured or installed (a cheap look: the
    module specs and the path variables, no import; the runtime decides at client start)."""
    if config.get("TPU_LIBRARY_PATH") or config.get("TORCH_TPU_CUDA_PLUGIN_PATH"):
        return True
    return any(_module_present(name) for name in ACCELERATOR_PLUGIN_MODULES)


def _module_present(name: str) -> bool:
    """Whether module `name` can be found, without importing anything: `find_spec` of a
    dotted name imports its parent package, so a submodule is looked up as a folder or
    file in the parent's search locations."""
    parent, _, child = name.rpartition(".")
    try:
        spec = importlib.util.find_spec(parent or child)
    except (ImportError, ValueError):
        return False
    if spec is None or not parent:
        return spec is not None
    return any(os.path.isdir(os.path.join(folder, child)) or os.path.isfile(os.path.join(folder, child + ".py"))
               for folder in spec.submodule_search_locations or ())


def launched_on_cpu(accelerator_build: bool = False) -> bool:
    """Whether this process is a launcher's worker of a multi-process job (`WORLD_SIZE`
    > 1, as torchrun sets it) that runs on XLA:CPU: `TORCH_TPU_PLATFORM=cpu`, or unset on
    a machine with no TPU/CUDA plugin and a PyTorch that is not a CUDA/ROCm build
    (`accelerator_build`), so another backend's torchrun job on a GPU host never gets
    these settings. Decided from the environment alone: it runs at `import torch`."""
    try:
        world = config.get("WORLD_SIZE")
        platform = (config.get("TORCH_TPU_PLATFORM") or "").strip().lower()
        if world <= 1:
            return False
        if platform:
            return platform == "cpu"
        return not accelerator_build and not accelerator_plugin_installed()
    except config.EnvVarError:
        return False  # reported where the job reads it; never at `import torch`


def _set(settings: dict[int, int], name: str) -> bool:
    if name in _applied:
        return True
    mallopt = _mallopt()
    if mallopt is None:
        return False
    if not all(mallopt(param, value) == 1 for param, value in settings.items()):
        return False
    _applied.add(name)
    return True


def share_main_arena(accelerator_build: bool = False) -> bool:
    """Every thread started from now on allocates from the main heap (see the module
    docstring) in a launcher's worker on XLA:CPU (`launched_on_cpu`); True when set. Never raises: it runs at `import torch` (an unparsable
    `TORCH_TPU_DIST_REUSE_HOST_MEMORY` is reported by `keep_freed_memory`)."""
    try:
        wanted = enabled() and launched_on_cpu(accelerator_build)
    except config.EnvVarError:
        return False
    return wanted and _set({M_ARENA_MAX: 1}, "arena")


def keep_freed_memory() -> bool:
    """Large buffers come from the heap and freed ones stay for reuse (see the module
    docstring); True when set. Called where the multi-process XLA:CPU client is made."""
    return enabled() and _set({M_MMAP_MAX: 0, M_TRIM_THRESHOLD: RETAINED_BYTES}, "heap")


def applied() -> frozenset[str]:
    """Which settings this process made: "arena", "heap"."""
    return frozenset(_applied)
