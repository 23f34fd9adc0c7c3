"""Every environment variable torch_tpu reads, with its default and meaning, in one
table. `docs/reference/env.md` is generated from `ENV_VARS`.

This module imports nothing but the standard library, so every layer (compiler tools,
runtime, frontend) may read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None
    help: str
    layer: str  # "runtime", "frontend", "compiler", "tools"

    def raw(self) -> str | None:
        return os.environ.get(self.name, self.default)


ENV_VARS: dict[str, EnvVar] = {}


def declare(name: str, default: str | None, help: str, layer: str) -> EnvVar:
    if name in ENV_VARS:
        raise ValueError(f"environment variable {name} declared twice")
    var = EnvVar(name, default, help, layer)
    ENV_VARS[name] = var
    return var


def get_str(name: str) -> str | None:
    return ENV_VARS[name].raw()


def get_bool(name: str) -> bool:
    value = ENV_VARS[name].raw()
    return value is not None and value.strip().lower() in {"1", "true", "yes", "on"}


def get_int(name: str) -> int | None:
    value = ENV_VARS[name].raw()
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def get_parsed(name: str, parse: Callable[[str], object]) -> object:
    value = ENV_VARS[name].raw()
    return None if value is None else parse(value)


# -- the table ------------------------------------------------------------------------
# Keep entries grouped by layer; each helper module reads its variables through get_*.
declare("TORCH_TPU_DEBUG", None, "Show Python tracebacks for internal errors in the command-line tools.", "tools")

# runtime (torch_tpu.runtime: PjRT client, buffers, compile cache)
declare(
    "TORCH_TPU_PLATFORM", None,
    "Force the PjRT platform: `cpu`, `cuda` (alias `gpu`) or `tpu`. Unset: `tpu` when the libtpu "
    "plugin is found (`TPU_LIBRARY_PATH` or the `libtpu` package) and initializes, else `cuda` "
    "when the jax CUDA PjRT plugin is installed, else XLA:CPU. A forced platform that cannot "
    "start is an error, never a silent fallback.",
    "runtime",
)
declare(
    "TORCH_TPU_NUM_CPU_DEVICES", "1",
    "Number of virtual XLA:CPU devices, so multi-device and replicated programs run on a "
    "machine without accelerators. Read when the CPU client is created.",
    "runtime",
)
declare(
    "TORCH_TPU_CUDA_PLUGIN_PATH", None,
    "Path of the CUDA PjRT plugin library (`xla_cuda_plugin.so`). Unset: looked up in the "
    "installed `jax_cuda13_plugin` / `jax_cuda12_plugin` package.",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_L1_ENTRIES", "1024",
    "Capacity of the in-process (L1) compile cache, in executables; least recently used "
    "ones are dropped first. `0` turns L1 off.",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_L2", None,
    "Machine-local (L2) compile cache shared by the processes of one host: `1` on, `0` off. "
    "Unset: on when `WORLD_SIZE` > 1 (a multi-process job), off otherwise.",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_DIR", None,
    "Directory of the L2 compile cache. Unset: `$XDG_CACHE_HOME/torch_tpu/executables` "
    "(`~/.cache/torch_tpu/executables`). Created with mode 0700; a directory that another "
    "user can write is refused.",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_URL", None,
    "Persistent (L3) compile cache on any fsspec URL: a local path, `file://`, `gs://`, "
    "`s3://`, ... Unset: L3 off. Credentials and endpoints come from the filesystem's own "
    "configuration (for example `FSSPEC_S3_ENDPOINT_URL`, `AWS_*`, gcloud credentials).",
    "runtime",
)
declare(
    "TORCH_TPU_COMPILE_THREADS", None,
    "Threads that compile (and load cache entries) in the background. Unset: "
    "min(4, number of CPUs).",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_LOCK_TIMEOUT", "600",
    "Seconds a process waits for another process on the same host that is compiling the "
    "same key (through the L2 lock) before compiling it itself.",
    "runtime",
)
declare(
    "TORCH_TPU_STRICT", "0",
    "1: an op the converter cannot lower, or a graph the pass pipeline or XLA rejects, is an "
    "error naming the op and the user's source line, instead of a logged fallback (PyTorch "
    "eager; for a graph with dynamic sizes, a compile per concrete size).",
    "frontend",
)
declare("TORCH_TPU_DUMP_DIR", None, "Directory where every compiled graph writes a replayable record (one folder per graph and cache key): its FX graph, pipeline.txt (the exact pipeline), the module before the first pass and after each one, final.mlir, inputs.json (the module's arguments, parameter names) and README.txt with the torchtpu-opt and torchtpu-run commands; error.txt when it failed to import or in a pass.", "frontend")
declare("TORCH_TPU_SLOW_COMPILE_S", "3.0", "A graph whose compile takes longer than this many seconds logs a WARNING with its size and phase timings (faster compiles log them at DEBUG).", "frontend")

# bounded dynamism (docs/explanation/bounded-dynamism.md)
declare(
    "TORCH_TPU_DYNAMIC_BOUND", "pow2",
    "Bound of a dynamic dimension whose maximum PyTorch does not know (`torch.compile(..., "
    "dynamic=True)` or a dimension marked without `max=`): `pow2` (the next power of two at or "
    "above the size seen at compile time, at least 16) or a fixed positive integer. A size above "
    "the bound recompiles once with the next power of two at or above it (logged).",
    "frontend",
)
# -- functionalize="torchtpu" (view passes) --------------------------------------------
declare(
    "TORCH_TPU_DONATE_WRITTEN_INPUTS", "1",
    "functionalize='torchtpu': 1 donates the inputs a graph writes in place to the compiled "
    "program (tf.aliasing_output: XLA updates their buffers in place instead of copying them); "
    "0 returns their new values without donation. The caller's tensors are updated either way "
    "(on XLA:CPU a donated torch tensor is copied into a private buffer first: PjRT cannot "
    "reuse memory a torch tensor owns).",
    "frontend",
)

# -- the eager tpu device (python/torch_tpu/device/) ------------------------------------
declare(
    "TPU_LAUNCH_BLOCKING", "0",
    "1: the eager `tpu` device runs in Debug mode — every op waits for its result, so an error "
    "is raised at the Python line of the op that failed (TorchTPU's name; like "
    "CUDA_LAUNCH_BLOCKING). 0: Strict mode, ops run asynchronously. "
    "`torch_tpu.set_eager_mode` overrides it.",
    "frontend",
)
