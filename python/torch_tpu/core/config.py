"""Every environment variable torch_tpu reads, with its type, default and meaning, in one
table (`ENV_VARS`); `docs/reference/env.md` is generated from it.

Code reads a variable with `get(name)`, which parses the raw text with the entry's type
and returns the entry's default when the variable is unset or empty: defaults live in
the table, never at call sites. A value the type cannot parse is an `EnvVarError`
naming the variable, the value and what is expected.

Standard library only, so every layer may import it (the public name for users is
`torch_tpu.config`, which re-exports this module).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["ENV_VARS", "EnvVar", "EnvVarError", "EnvType", "declare", "get", "one_of", "BOOL", "INT", "FLOAT", "STR", "PATH"]


class EnvVarError(ValueError):
    """An environment variable whose value its type cannot parse."""


@dataclass(frozen=True)
class EnvType:
    """How the text of a variable becomes a value: `parse` returns the value or raises
    ValueError; `expected` completes the error message ("NAME='x': <expected>")."""

    name: str  # shown in the generated docs table
    parse: Callable[[str], Any]
    expected: str


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _parse_pow2_or_positive_int(text: str) -> str | int:
    low = text.strip().lower()
    if low == "pow2":
        return low
    value = int(low)
    if value <= 0:
        raise ValueError(text)
    return value


BOOL = EnvType("bool", _parse_bool, "expected 1 or 0")
INT = EnvType("int", lambda text: int(text.strip()), "expected an integer")
FLOAT = EnvType("float", lambda text: float(text.strip()), "expected a number")
SECONDS = EnvType("seconds", lambda text: float(text.strip()), "expected a number of seconds")
STR = EnvType("str", lambda text: text, "expected a string")
PATH = EnvType("path", lambda text: text, "expected a path")


def one_of(*choices: str) -> EnvType:
    """A variable that takes one of `choices` (any case)."""

    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in choices:
            raise ValueError(text)
        return low

    names = [f"`{c}`" for c in choices]
    return EnvType(f"{', '.join(names[:-1])} or {names[-1]}", parse, f"use {', '.join(choices[:-1])} or {choices[-1]}")
POW2_OR_INT = EnvType("`pow2` or int", _parse_pow2_or_positive_int, "use 'pow2' or a positive integer")


@dataclass(frozen=True)
class EnvVar:
    name: str
    type: EnvType
    default: Any  # a value of `type` (not text); None: unset
    help: str
    layer: str  # "runtime", "frontend", "compiler", "tools"

    def raw(self) -> str | None:
        """The variable's text, None when unset or empty."""
        value = os.environ.get(self.name)
        return None if value is None or value.strip() == "" else value

    def value(self) -> Any:
        raw = self.raw()
        if raw is None:
            return self.default
        try:
            return self.type.parse(raw)
        except ValueError:
            raise EnvVarError(f"{self.name}={raw!r}: {self.type.expected}") from None


ENV_VARS: dict[str, EnvVar] = {}


def declare(name: str, type: EnvType, default: Any, help: str, layer: str) -> EnvVar:
    if name in ENV_VARS:
        raise ValueError(f"environment variable {name} declared twice")
    var = EnvVar(name, type, default, help, layer)
    ENV_VARS[name] = var
    return var


def get(name: str) -> Any:
    """The typed value of the declared variable `name` (its default when unset or empty)."""
    return ENV_VARS[name].value()


# -- the table ------------------------------------------------------------------------
# Keep entries grouped by layer; code reads them with `get(name)`.
declare("TORCH_TPU_DEBUG", BOOL, False, "Show Python tracebacks for internal errors in the command-line tools.", "tools")

# runtime (torch_tpu.runtime: PjRT client, buffers, compile cache)
declare(
    "TORCH_TPU_PLATFORM", STR, None,
    "Force the PjRT platform: `cpu`, `cuda` (alias `gpu`) or `tpu`. Unset: `tpu` when the libtpu "
    "plugin is found (`TPU_LIBRARY_PATH` or the `libtpu` package) and initializes, else `cuda` "
    "when the jax CUDA PjRT plugin is installed, else XLA:CPU. A forced platform that cannot "
    "start is an error, never a silent fallback.",
    "runtime",
)
declare(
    "TORCH_TPU_NUM_CPU_DEVICES", INT, 1,
    "Number of virtual XLA:CPU devices, so multi-device and replicated programs run on a "
    "machine without accelerators. Read when the CPU client is created.",
    "runtime",
)
declare(
    "TORCH_TPU_CUDA_PLUGIN_PATH", PATH, None,
    "Path of the CUDA PjRT plugin library (`xla_cuda_plugin.so`). Unset: looked up in the "
    "installed `jax_cuda13_plugin` / `jax_cuda12_plugin` package.",
    "runtime",
)
declare(
    "TPU_LIBRARY_PATH", PATH, None,
    "Path of the libtpu PjRT plugin (`libtpu.so`). Unset: looked up in the installed `libtpu` "
    "package. A path that does not exist is an error when `TORCH_TPU_PLATFORM=tpu`, else a "
    "logged warning and the package is looked up instead.",
    "runtime",
)
declare(
    "WORLD_SIZE", INT, 1,
    "Set by `torchrun` and other launchers, not by users: the number of processes of a job. "
    "torch_tpu reads it to turn the L2 compile cache on by default in multi-process jobs, and "
    "to apply `TORCH_TPU_DIST_REUSE_HOST_MEMORY` at `import torch`.",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_L1_ENTRIES", INT, 1024,
    "Capacity of the in-process (L1) compile cache, in executables; least recently used "
    "ones are dropped first. `0` turns L1 off.",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_L2", BOOL, None,
    "Machine-local (L2) compile cache shared by the processes of one host: `1` on, `0` off. "
    "Unset: on when `WORLD_SIZE` > 1 (a multi-process job) or `TORCH_TPU_CACHE_DIR` is set, "
    "off otherwise.",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_DIR", PATH, None,
    "Directory of the L2 compile cache; setting it turns L2 on (unless `TORCH_TPU_CACHE_L2=0`), "
    "in a single process too. Unset: `$XDG_CACHE_HOME/torch_tpu/executables` "
    "(`~/.cache/torch_tpu/executables`). Created with mode 0700; a directory that another "
    "user can write is refused.",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_URL", STR, None,
    "Persistent (L3) compile cache on any fsspec URL: a local path, `file://`, `gs://`, "
    "`s3://`, ... Unset: L3 off. Credentials and endpoints come from the filesystem's own "
    "configuration (for example `FSSPEC_S3_ENDPOINT_URL`, `AWS_*`, gcloud credentials).",
    "runtime",
)
declare(
    "TORCH_TPU_COMPILE_THREADS", INT, 0,
    "Threads that compile (and load cache entries) in the background. `0`: "
    "min(4, number of CPUs).",
    "runtime",
)
declare(
    "TORCH_TPU_CACHE_LOCK_TIMEOUT", SECONDS, 600.0,
    "Seconds a process waits for another process on the same host that is compiling the "
    "same key (through the L2 lock) before compiling it itself.",
    "runtime",
)
declare(
    "TORCH_TPU_STRICT", BOOL, False,
    "1: an op the converter cannot lower, or a graph the pass pipeline or XLA rejects, is an "
    "error naming the op and the user's source line, instead of a logged fallback (PyTorch "
    "eager; for a graph with dynamic sizes, a compile per concrete size).",
    "frontend",
)
declare("TORCH_TPU_DUMP_DIR", PATH, None, "Directory where every compiled program writes a replayable record, one folder per program and cache key: compiled FX graphs (named after the graph), eager single ops, graph arguments and results of tpu tensors, fused traces, jax_ops, exports, spmd programs, tpu_dist graphs and collectives (named <kind>-<what>-<hash>). Each holds its FX graph where there is one (fx_graph.py), pipeline.txt (the exact textual pipeline that ran), 00-input.mlir (the module before the first pass), one file after each top-level step of that pipeline, named pipelines expanded (01-torchtpu-verify.mlir, 02-torchtpu-unflatten-dots.mlir, 03-torchtpu-set-precision.mlir, ...: one per pass; a nest such as func.func(...) is one step), final.mlir (what XLA compiles), inputs.json (the module's arguments, parameter names, which are donated) and README.txt with the torchtpu-opt and torchtpu-run commands (torchtpu-run --donate for a program compiled with donated arguments); error.txt when the module could not be built, a pass rejected it or XLA did.", "frontend")
declare("TORCH_TPU_SLOW_COMPILE_S", SECONDS, 3.0, "A graph whose compile takes longer than this many seconds logs a WARNING with its size and phase timings (faster compiles log them at DEBUG).", "frontend")

# bounded dynamism (docs/explanation/bounded-dynamism.md)
declare(
    "TORCH_TPU_DYNAMIC_BOUND", POW2_OR_INT, "pow2",
    "Bound of a dynamic dimension whose maximum PyTorch does not know (`torch.compile(..., "
    "dynamic=True)` or a dimension marked without `max=`): `pow2` (the next power of two at or "
    "above the size seen at compile time, at least 16) or a fixed positive integer. A size above "
    "the bound recompiles once with the next power of two at or above it (logged).",
    "frontend",
)
# -- functionalize="torchtpu" (view passes) --------------------------------------------
declare(
    "TORCH_TPU_DONATE_WRITTEN_INPUTS", BOOL, True,
    "functionalize='torchtpu': 1 donates the inputs a graph writes in place to the compiled "
    "program (tf.aliasing_output: XLA updates their buffers in place instead of copying them); "
    "0 returns their new values without donation. The caller's tensors are updated either way "
    "(on XLA:CPU a donated torch tensor is copied into a private buffer first: PjRT cannot "
    "reuse memory a torch tensor owns).",
    "frontend",
)

# -- the eager tpu device (python/torch_tpu/device/) ------------------------------------
declare(
    "TPU_LAUNCH_BLOCKING", BOOL, False,
    "1: the eager `tpu` device runs in Debug mode — every op waits for its result, so an error "
    "is raised at the Python line of the op that failed (TorchTPU's name; like "
    "CUDA_LAUNCH_BLOCKING). 0: Strict mode, ops run asynchronously. "
    "`torch_tpu.set_eager_mode` overrides it.",
    "frontend",
)
declare(
    "TORCH_TPU_DEFER_AND_FUSE", BOOL, False,
    "1: the eager `tpu` device starts in FUSED mode — ops are recorded and run as one fused "
    "program at each flush point (`.cpu()`, `.item()`, print, `torch.tpu.synchronize()`, ...). "
    "Overrides `TPU_LAUNCH_BLOCKING`; `torch_tpu.set_eager_mode` overrides both.",
    "frontend",
)
declare(
    "TORCH_TPU_MAX_FUSED_OPS", INT, 1000,
    "FUSED mode: a trace holding this many recorded ops is flushed before the next op is "
    "recorded (bounds host memory and the size of one program). Traces also end at every "
    "`torch.optim` optimizer's `step()`, so in a training loop these cuts fall at the same "
    "ops every step.",
    "frontend",
)
declare(
    "TORCH_TPU_FUSED_GC_THRESHOLD", INT, 10000,
    "While FUSED mode is on, Python's cyclic garbage collector runs a young-generation "
    "collection every this many allocations instead of Python's default 700 (put back when "
    "FUSED mode is left): a FUSED step makes thousands of short-lived objects the collector "
    "tracks, and with the default their collections and the full ones they bring on took ~13 % "
    "of a 16-layer training step. Only the default is replaced: a threshold the application "
    "set itself (`gc.set_threshold`) is kept. 0: leave the collector as it is.",
    "frontend",
)
declare(
    "TORCH_TPU_FUSE_COMPILED_STEP", BOOL, True,
    "Strict mode: the compiled graphs of a training step run as ONE program. A compiled "
    "training forward (one with a backward) on tpu tensors is recorded instead of run, and so "
    "is every compiled graph called while it waits (its backward, the optimizer step's graph); "
    "they run together, stitched as FUSED mode stitches a trace: the optimizer's `step()` ends "
    "the trace, which runs at the next graph or eager op that reads its results (the next "
    "step's forward), or earlier where anything reads one (an eager op, `.item()`, a graph that "
    "cannot be recorded) or `torch.tpu.synchronize()` is called -- so gradients dropped right "
    "after `step()` are not written. Eager ops still run one by one. 0: each graph runs when it "
    "is called.",
    "frontend",
)
declare(
    "TORCH_TPU_COMPILED_STEP_START", one_of("forward", "backward"), "forward",
    "Strict mode with TORCH_TPU_FUSE_COMPILED_STEP=1: the compiled graph whose call starts the "
    "deferred step. `forward`: the training forward, so forward, backward and optimizer step are "
    "one program. `backward`: the forward runs when it is called (the device starts on it while "
    "the host records the rest of the step) and the backward and the optimizer step are one "
    "program.",
    "frontend",
)
declare(
    "TORCH_TPU_EARLY_STEP_LAUNCH", BOOL, True,
    "A compiled training step deferred into one program (Strict mode with "
    "TORCH_TPU_FUSE_COMPILED_STEP=1, or FUSED mode when the training forward is its trace's first "
    "op) that ran as one program is launched again at the next call of its first graph, on the buffers its storages "
    "(parameters, optimizer states, the graph's inputs) hold then, so that the device runs the "
    "step while the host records it. At the step's end the launched results are kept when the "
    "step turned out to be that program reading those very buffers, else dropped and the step "
    "runs as recorded. The launch does not donate (a second compile of the step, without "
    "donation): it is made only where the memory the device holds at the launch plus what that "
    "program allocates (its outputs and temporaries, from XLA's memory analysis) stays under 90 % "
    "of the device's memory, checked at each launch, and a step that turns out different twice "
    "in a row is no longer launched early. 0: the step runs at its end only.",
    "frontend",
)
declare(
    "TORCH_TPU_FUSED_BACKGROUND_COMPILE", BOOL, True,
    "FUSED mode: where a new trace's fused program compiles. 1: on a background thread while "
    "the trace's first run goes op by op; 0: the flush waits for the compile before that first "
    "run (timings without a compile running beside the trace's ops). Results never depend on "
    "it: which path a run takes depends only on how often its trace was seen "
    "(`TORCH_TPU_FUSED_FIRST_RUN`), and a later run waits for a compile still under way, so "
    "runs repeat bit for bit with either value.",
    "frontend",
)
declare(
    "TORCH_TPU_FUSED_FIRST_RUN", BOOL, False,
    "FUSED mode: 1 runs a trace's fused program from its first run on, waiting for its compile "
    "(every flush runs one program: slower first steps, and the first run's results have the "
    "fused program's roundings, as every later run's). 0: a trace's first run goes op by op "
    "through the ops' own programs (their roundings: XLA fuses the ops of the fused program and "
    "may round differently in the last bits, up to 9.5e-7 measured on float32 tanh/exp chains).",
    "frontend",
)

# -- kernels (python/torch_tpu/kernels/) ------------------------------------------------
declare(
    "TORCH_TPU_ATTENTION_KERNEL", one_of("auto", "pallas", "xla"), "auto",
    "`F.scaled_dot_product_attention` (bf16/f16, no mask or a causal one, no dropout, static "
    "shapes): `auto` runs its forward and backward as Pallas flash kernels on a TPU where they "
    "were measured faster (query and key lengths of at least 1024) and jax is installed, else as "
    "StableHLO (the f32 scores materialised); `pallas` always as the Pallas kernels where they "
    "apply (any float dtype; through Pallas's interpreter off a TPU, for tests); `xla` never. "
    "Read when a graph or an eager op is lowered. A program whose kernel XLA rejects is compiled "
    "again with the StableHLO lowering, with a warning.",
    "frontend",
)

# -- tpu_dist (python/torch_tpu/distributed/) --------------------------------------------
declare(
    "TORCH_TPU_SPMD_HANDSHAKE_STAGE", one_of("first_call", "every_call", "off"), "first_call",
    "tpu_dist: when the ranks of a group compare a collective before running it, through the "
    "coordination service (the collective's kind, element count, dtype, reduce op, root and group; "
    "the torch.distributed call and its tensors' shapes; its call site, the user's file:line -- "
    "except for broadcast/scatter/gather/reduce and send/recv, whose ranks may call from "
    "different lines): `first_call` at the first run of each (collective, call, call site) in "
    "the group (an extra or missing collective under a rank-dependent branch is caught where it "
    "pairs); `every_call` before every run (also a rank that skips or adds a collective through "
    "a line it ran before); `off` never. A mismatch, or a rank that does not arrive within the "
    "process group's timeout, raises on every rank instead of hanging or summing the wrong "
    "buffers.",
    "frontend",
)
declare(
    "TORCH_TPU_DIST_REUSE_HOST_MEMORY", BOOL, True,
    "tpu_dist on XLA:CPU: glibc's malloc keeps freed buffers for reuse (`M_ARENA_MAX=1` at "
    "`import torch` in a launcher's worker with `WORLD_SIZE` > 1 -- not where PyTorch is a "
    "CUDA/ROCm build or a TPU/CUDA PjRT plugin is installed, unless `TORCH_TPU_PLATFORM=cpu` -- "
    "`M_MMAP_MAX=0` and a 1 GiB "
    "`M_TRIM_THRESHOLD` when the multi-process client starts), so each collective's fresh "
    "output buffer is the previous one's memory instead of new pages (16,385 page faults per "
    "64 MB all-reduce without it). `0` leaves glibc's defaults. No effect on other platforms "
    "or C libraries.",
    "runtime",
)
