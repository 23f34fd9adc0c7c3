"""Compiling FX graphs for the backend (`compile_fx`, through `program.compile_module`) and
choosing a graph's program by the precision mode at call time (`PrecisionKeyed`). The
invoker that runs every program is `program/invoker.py`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from torch_tpu.compiler.diagnostics import DiagnosticEngine

from ..program.errors import TorchTpuCompileError
from ..program.fingerprint import FxGraphFingerprint
from ..program.precision import current_mode, warn_cost
from ..program import Lowered, Program, ProgramKey, client, compile_module, shared_context
from ..program.protocols import FastPathProgram, PendingProgram, precision_sensitive

_log = logging.getLogger(__name__)


# -- compiling ----------------------------------------------------------------------------------


def compile_fx(
    gm: torch.fx.GraphModule,
    *,
    name: str,
    settings: str,
    pipeline: Callable[[str, str], str],
    import_options: dict[str, Any],
    dump_name: Callable[[FxGraphFingerprint], str],
    sources: dict[str, str] | None = None,
    what_failed: str = "the compiler pipeline",
    before_xla: Callable[[Any], None] | None = None,
    wait: bool = True,
    device_index: int = 0,
    donate: tuple[int, ...] = (),
) -> Program:
    """Imports `gm`, runs `pipeline(mode, platform)` on it and compiles it through
    `program.compile_module` (dumped, keyed, timed). The precision mode in force is part
    of the key (with `settings`, this graph's other choices); `Program.lowered` is the
    importer's `ImportedGraph`. Raises LoweringError (the import rejected a node; dumped
    to error.txt) or TorchTpuCompileError (a pass failed, located). `wait=False`: XLA
    compiles on the compile cache's thread (it releases the GIL) while the caller goes on
    tracing; `Program.resolve()` waits for it and raises its error. `device_index`: the
    device the program runs on (a graph of tensors on `tpu:1`). `donate`: the program's
    arguments XLA may reuse for results (`CompileSpec.donate_argnums`)."""
    from torch_tpu.compiler.importer import import_graph
    from torch_tpu.runtime import CompileSpec

    from ..program.process_groups import process_groups_of

    runtime = client()
    mode = current_mode()
    warn_cost(mode, runtime.platform)
    fingerprint = FxGraphFingerprint(gm, f"precision={mode}" + (f";{settings}" if settings else ""))
    def build() -> Lowered:
        graph = import_graph(gm, context=shared_context(), process_groups=process_groups_of(gm), **import_options)
        return Lowered(graph.module, graph)

    def rejected(engine: DiagnosticEngine) -> Exception:
        return TorchTpuCompileError(
            f"torch_tpu: {what_failed} failed on graph {name}:\n{engine.format()}\n"
            "Set TORCH_TPU_DUMP_DIR to get the module and reproduce with torchtpu-opt.",
            engine.diagnostics,
        )

    # Not reused from the program cache: a Dynamo graph's import (its input names, its
    # locations, a module `before_xla` edits) is its own; Dynamo caches the compiled graph
    # and the runtime's cache the executable.
    return compile_module(
        build, key=ProgramKey("fx_graph", fingerprint), name=name, pipeline=pipeline(mode, runtime.platform),
        options=(CompileSpec(device_indices=(device_index,) if device_index else None, donate_argnums=donate)
                 if device_index or donate else None),
        dump_name=dump_name(fingerprint), dump_files={"fx_graph.py": lambda: gm.print_readable(print_output=False)},
        input_specs=lambda graph: graph.inputs, sources=sources, rejected=rejected,
        before_compile=before_xla, wait=wait, reuse=False, building="importing the graph",
    )


class PrecisionKeyed:
    """A compiled graph per matmul precision mode, chosen when called: Dynamo guards
    `torch.set_float32_matmul_precision` but not `torch_tpu.precision`, so the mode in
    force at call time picks (and on first use compiles) the program. A graph without
    matrix ops (`is_sensitive(first) == False`) has one program for every mode. Reading
    the mode costs a thread-local lookup and `torch.get_float32_matmul_precision()`:
    ~1.4 us measured, against ~28 us for the smallest compiled call.

    `first` builds the first program instead of `build`; it may return a pending one (with
    `resolve()`, still compiling in the background), resolved by the first call: later
    calls go straight to the program, or to its `fast_path()` once it ran (`_entry`)."""

    def __init__(self, build: Callable[[], Callable[..., Any]],
                 is_sensitive: Callable[[Any], bool] = precision_sensitive,
                 first: Callable[[], Any] | None = None) -> None:
        self._build = build
        mode = current_mode()
        program = (first or build)()
        self._pending = program if isinstance(program, PendingProgram) else None
        # Guards the slot table's writers (a new mode's build, a first call's fast path, the
        # pending program's resolution); readers take the table as it is. Re-entrant: the
        # resolution replaces its slot while holding it.
        self._lock = threading.RLock()
        if self._pending is not None:
            self._resolving = self._resolve_first
            entry = self._resolving
        else:
            entry = self._entry(program)
        self._by_mode: dict[str, Callable[..., Any]] = {mode: entry}
        self._any_mode = None if is_sensitive(program) else entry

    @property
    def single_program(self) -> Callable[..., Any] | None:
        """The one program used for every mode, or None when the mode picks it."""
        return self._any_mode

    def __call__(self, *args):
        if self._any_mode is not None:
            return self._any_mode(*args)
        mode = current_mode()
        fn = self._by_mode.get(mode)
        if fn is None:
            with self._lock:
                # Another thread may have built this mode meanwhile: keep its slot (it may
                # already be a fast path) rather than compile again. A new dict, assigned
                # whole, as in `_replace`.
                fn = self._by_mode.get(mode)
                if fn is None:
                    fn = self._entry(self._build())
                    self._by_mode = {**self._by_mode, mode: fn}
        return fn(*args)

    def _entry(self, program: Callable[..., Any]) -> Callable[..., Any]:
        """What a mode's slot holds for `program`: a program that offers a `fast_path()`
        (a `CompiledGraph`) is called through it from its second call on. The first call
        runs the program itself: its argument plan is decided by that call's arguments."""
        if not isinstance(program, FastPathProgram):
            return program
        fast_path = program.fast_path

        def first_call(*args):
            result = program(*args)
            try:
                faster = fast_path()
            except Exception:  # the fast path is an optimisation: the program stays correct
                _log.debug("no fast path for %r", program, exc_info=True)
                faster = None
            self._replace(first_call, faster or program)
            return result

        return first_call

    def _replace(self, old: Callable[..., Any], new: Callable[..., Any]) -> None:
        # A new dict, assigned whole: a call on another thread reads the old or the new one.
        with self._lock:
            self._by_mode = {m: new if f is old else f for m, f in self._by_mode.items()}
            if self._any_mode is old:
                self._any_mode = new

    def _resolve_first(self, *args):
        with self._lock:
            if self._pending is not None:
                # Raises a compile error the pending program cannot recover from: the next
                # call then tries again, as a failed synchronous build would.
                self._replace(self._resolving, self._entry(self._pending.resolve()))
                self._pending = None
        return self(*args)


