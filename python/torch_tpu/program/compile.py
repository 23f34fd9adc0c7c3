"""`compile_module`: the one compile spine of every program kind.

    source (a module, its text, or a function building it)
      -> the named pipeline (`program/pipelines.py`), dumped step by step (`program/dump.py`)
      -> the key (`ProgramKey`) -> the program cache (`program/cache.py`)
      -> the runtime's compile cache and XLA, timed (`timing`) and logged

Callers differ only in what they build, the key they describe it with and what they do
with the executable; how a failure is reported stays theirs (`rejected`: the eager
device falls back to the CPU, a jax_op raises its own error).
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch_tpu.core import kernel_slots

from . import timing
from .errors import TorchTpuCompileError
from .cache import PROGRAMS
from .context import client, shared_context
from .dump import GraphDump
from .key import ProgramKey
from .pipelines import NO_PASSES

if TYPE_CHECKING:
    from torch_tpu.compiler.diagnostics import DiagnosticEngine

log = logging.getLogger("torch_tpu")


@dataclass
class Lowered:
    """What a build function returns: the module, and what else the build learnt that the
    caller needs back (an FX graph's `ImportedGraph`: its inputs and outputs)."""

    module: Any
    extra: Any = None


@dataclass
class Program:
    """One compiled program: the executable (a future while XLA compiles in the background:
    `resolve()` waits), the module after its pipeline (None for text compiled as is), what
    the build returned beside it, and how long each phase took."""

    key: ProgramKey
    name: str
    executable: Any
    module: Any
    lowered: Any
    timings: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    _submitted: float | None = None
    options: Any = None
    _finished: float | None = None  # when the background compile finished (its own time)
    # For a module holding kernels (`kernel_slots`): `retry(err)` builds and compiles it
    # without them when XLA rejects it in the background.
    _retry: Callable[[Exception], "Program"] | None = None

    def load(self) -> Any:
        """The executable; a program built with `defer=True` is compiled now (once)."""
        if self.executable is None:
            try:
                _submit(self, self.module, self.options, None, wait=True)
            except Exception as err:
                if self._retry is None:
                    raise
                self._take_rebuilt(err)
        return self.resolve().executable

    def _take_rebuilt(self, err: Exception) -> None:
        """After XLA rejected this program's module (`err`): the executable and module of
        the same program built again with its kernels declined (`_retry`, set by
        `compile_module`), compiled and waited for."""
        retry, self._retry = self._retry, None
        other = retry(err)
        self.executable, self.module, self._submitted = other.executable, other.module, None

    def resolve(self) -> "Program":
        """Waits for an executable compiling in the background (raising its compile error
        here); `timings` then hold the compile's own time ("xla_compile") and the time
        spent waiting for it ("xla_wait")."""
        if self._submitted is None:
            return self
        future = self.executable
        with timing.phase("xla_wait", self.timings):
            try:
                executable = future.result()  # a failed compile raises again if resolved again
            except Exception as err:
                if self._retry is None:
                    raise
                self._take_rebuilt(err)
                return self
        done = self._finished or time.perf_counter()
        timing.record("xla_compile", done - self._submitted, self.timings)
        self.seconds += done - self._submitted
        self.executable, self._submitted = executable, None
        return self


def compile_module(
    source: Any,
    *,
    key: ProgramKey,
    name: str,
    pipeline: str,
    options: Any = None,
    dump_name: str | None = None,
    dump_files: dict[str, Callable[[], str]] | None = None,
    input_specs: Callable[[Any], Sequence[Any]] | None = None,
    sources: dict[str, str] | None = None,
    rejected: Callable[[DiagnosticEngine], Exception] | None = None,
    before_compile: Callable[[Any], None] | None = None,
    compiler: Callable[[Any], Any] | None = None,
    wait: bool = True,
    reuse: bool = True,
    defer: bool = False,
    building: str = "building the module",
) -> Program:
    """Compiles one program. `source`: an `ir.Module`, module text, or a function returning
    either (or a `Lowered`), called only when the program cache misses. `pipeline`: the
    textual pipeline (a named one; `NO_PASSES` compiles the module as it is). `options`:
    the runtime's `CompileSpec`. `dump_name`: the dump folder (default
    `<kind>-<name>-<hash>`), `dump_files`: extra files written first (an FX graph's
    source), `input_specs(extra)`/`sources`: what `inputs.json` says of the arguments
    (`extra`: what the build returned beside the module).
    `rejected(engine)`: the exception a pipeline failure raises. `before_compile(module)`:
    reads or edits the final module (after it was dumped). `compiler(module)`: compiles
    instead of the runtime client (a tpu_dist group program). `wait=False`: XLA compiles
    on the compile cache's thread; `Program.resolve()` waits. `reuse=False`: the caller
    keeps what it compiled (a Dynamo graph's import is its own), so the program cache is
    not consulted; the runtime's cache still is. `defer=True`: built, passed and dumped
    now, compiled by XLA at `Program.load()` (an export that may only be saved).
    `building`: what error.txt says failed when the build raises ("importing the graph")."""
    memo = (key.memo(), options)
    if reuse:
        hit = PROGRAMS.get(memo)
        if hit is not None:
            return hit

    def without_kernels(err: Exception, kernels: list[str], failed: Program | None = None) -> Program:
        """This program built again, kernels declined, after XLA rejected the kernels it
        held (a Mosaic kernel this chip or libtpu does not take): what the op lowers to
        without them, compiled and waited for here (`failed`: the program whose background
        compile failed, which the program cache then no longer answers with)."""
        if failed is not None:
            PROGRAMS.forget(memo, failed)
        log.warning("torch_tpu: XLA rejected the %s kernel(s) in program %s (%s); compiling its StableHLO "
                    "lowering instead (TORCH_TPU_ATTENTION_KERNEL=xla skips the kernel)",
                    ", ".join(sorted(set(kernels))), name, _first_line(err))
        with kernel_slots.declined():
            return compile_module(
                source, key=key, name=name, pipeline=pipeline, options=options, dump_name=dump_name,
                dump_files=dump_files, input_specs=input_specs, sources=sources, rejected=rejected,
                before_compile=before_compile, compiler=compiler, wait=True, reuse=reuse, defer=defer,
                building=building)
    start = time.perf_counter()
    timings: dict[str, float] = {}
    dump = GraphDump(dump_name or f"{key.kind}-{_slug(name)}-{key.short_hash()}",
                     donated=getattr(options, "donate_argnums", None) or ())
    if dump.enabled:
        for filename, text in (dump_files or {}).items():
            dump.write(filename, text())
    with timing.phase("convert", timings), kernel_slots.recording() as kernels:
        try:
            lowered = _lowered(source)
        except Exception as err:
            dump.write_error(building, str(err))
            raise
    # A module with kernels that XLA may reject is built again without them (`callable`:
    # a module given as such cannot be).
    rebuildable = bool(kernels) and callable(source)
    module = lowered.module
    if isinstance(module, str) and pipeline == NO_PASSES:
        # Text compiled as it is (a fused trace): parsed by XLA alone, as before dumps existed.
        _dump_text(dump, module)
    else:
        if isinstance(module, str):
            from torch_tpu.compiler.context import ir

            with shared_context(), ir.Location.unknown():
                module = ir.Module.parse(module)
        from torch_tpu.compiler.diagnostics import DiagnosticEngine

        with timing.phase("passes", timings):
            engine = DiagnosticEngine()
            with module.context:
                ok = dump.run_pipeline(module.operation, pipeline, engine)
            if not ok:
                raise (rejected or _default_rejection(name))(engine)
        if dump.enabled:
            specs = input_specs(lowered.extra) if input_specs is not None else ()
            dump.write_inputs(module.operation, specs, sources)
        if before_compile is not None:
            before_compile(module)
        _name_module(module, key.kind, name)
    program = Program(key, name, None, None if isinstance(module, str) else module, lowered.extra, timings,
                      options=options)
    try:
        if not defer:
            _submit(program, module, options, compiler, wait)
    except Exception as err:
        dump.write_error("compiling with XLA", str(err))
        if rebuildable:
            return without_kernels(err, kernels)
        raise
    if rebuildable:
        program._retry = lambda err: without_kernels(err, kernels, program)
    program.seconds += (program._submitted or time.perf_counter()) - start
    log.debug("torch_tpu: %s program %s compiled in %.3fs (%s)", key.kind, name, program.seconds,
              ", ".join(f"{k} {v:.3f}s" for k, v in timings.items()))
    if reuse:
        PROGRAMS.put(memo, program)
        if program._submitted is not None:
            program.executable.add_done_callback(
                lambda f: PROGRAMS.forget(memo, program) if f.exception() is not None else None)
    return program


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def _lowered(source: Any) -> Lowered:
    if callable(source):  # a build function (modules and text are not callable)
        source = source()
    return source if isinstance(source, Lowered) else Lowered(source)


def _submit(program: Program, module: Any, options: Any, compiler: Callable[[Any], Any] | None,
            wait: bool) -> None:
    fingerprint = program.key.fingerprint()
    if compiler is not None:
        with timing.phase("xla_compile", program.timings):
            program.executable = compiler(module)
    elif wait:
        with timing.phase("xla_compile", program.timings):
            program.executable = client().compile(module, options=options, fingerprint=fingerprint,
                                                  name=program.name)
    else:
        # XLA gets bytecode (or text), parsed in a context of its own: the shared MLIR
        # context and this module stay with this thread (the next graph builds in it).
        payload = module if isinstance(module, str) else _bytecode(module)
        program._submitted = time.perf_counter()
        future = client().compile_async(payload, options=options, fingerprint=fingerprint, name=program.name)
        future.add_done_callback(lambda _: _note_finish_time(program))
        program.executable = future


def _default_rejection(name: str) -> Callable[[DiagnosticEngine], Exception]:
    def rejected(engine: DiagnosticEngine) -> Exception:
        return TorchTpuCompileError(
            f"torch_tpu: the compiler pipeline failed on {name}:\n{engine.format()}\n"
            "Set TORCH_TPU_DUMP_DIR to get the module and reproduce with torchtpu-opt.",
            engine.diagnostics,
        )

    return rejected


def _dump_text(dump: GraphDump, text: str) -> None:
    if not dump.enabled:
        return
    dump.write("pipeline.txt", NO_PASSES)
    dump.write("00-input.mlir", text)
    dump.write("final.mlir", text)
    dump.write_readme(True)


def _name_module(module: Any, kind: str, name: str) -> None:
    """Gives an unnamed module its program's name (`module @<kind>.<name>`): XLA names the
    HLO module after it, and that is the name the chip's profiler, XLA's dumps and its
    error messages show (every unnamed module is `main`). Named after the dump, which stays
    the pipeline's output as it was."""
    from torch_tpu.compiler.context import ir

    attributes = module.operation.attributes
    if "sym_name" not in attributes:
        with module.context:
            attributes["sym_name"] = ir.StringAttr.get(f"{kind}.{_slug(name, 200)}")


def _slug(name: str, limit: int = 60) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:limit] or "program"


def _bytecode(module: Any) -> bytes:
    buffer = io.BytesIO()
    module.operation.write_bytecode(buffer)
    return buffer.getvalue()


def _note_finish_time(program: Program) -> None:
    program._finished = time.perf_counter()
