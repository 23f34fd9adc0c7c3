"""FUSED eager mode (DeferAndFuse): ops on tpu tensors are recorded into a trace instead
of run, and a flush runs the whole trace as ONE program.

Recording reuses the single-op plans (`_ops.py`): an op appends (plan, where each operand
comes from, the user's line) to the current trace, and its results -- new storages and
the new value of each written storage -- are `Pending` values held in the entries'
buffer slots (`_buffers.py`). Metadata comes from the plan, so pending tensors are
ordinary tpu tensors to PyTorch. Operands are *values*, not storages: an operand is a
previous op's result, or an external input of the trace (a storage's buffer as it was
when the op was recorded, a Python number, a 0-d CPU tensor, an RNG key), so a storage
rebound later (a host write, another in-place op) cannot change what a recorded op read.

A flush (reading `StorageEntry.buffer` of a pending storage: `.cpu()`, `.item()`, print,
a CPU fallback, a compiled graph's argument; or `torch.tpu.synchronize()`, leaving FUSED
mode, `TORCH_TPU_MAX_FUSED_OPS`) stitches the plans' lowered modules into one module:
each plan's function becomes a private function of it, `@main` takes the external inputs
and calls them in order (each call located at the user's line), and returns only the
values still held by a live storage (dead intermediates are not outputs: XLA removes
them), with those the same trace's last run returned (`_outputs_as_before`). Python
numbers stay operands (packed into one float64 and one int64 array: one
transfer each per run, none when they repeat the last run's), so the program's cache key
is the op sequence (plan fingerprints), the wiring of operands and which values are live
-- built at the flush, not per recorded op: a steady loop compiles its traces once. The
first time a key is seen, its ops run one by one through their own plans while the fused
program compiles (in the background, or before that run); later flushes run the program,
waiting for its compile if need be. The paths differ in the last bits, so the path
depends only on how often the key was seen: runs repeat bit for bit, whether or not the
compile is in the background (TORCH_TPU_FUSED_FIRST_RUN=1 runs the program from the first
run on).
The end of a `torch.optim` step ends a trace, so a training loop's traces repeat; it runs at
the next op recorded or the next read, so gradients dropped right after the step are not
outputs (`_step_ended`).

The fused program donates every external buffer a recorded op writes (the storage's
value before the trace; its new value is an output): XLA writes the new value over it, so
a FUSED `p.add_(g)` / optimizer step keeps the parameter's memory. At each run a buffer
that something else still reads (`_donation_safe`, the rule of op-by-op runs) is passed
as a copy, so the program -- and its cache key -- stays the same in a steady loop.
"""

from __future__ import annotations

import logging
import sys
import threading
from concurrent.futures import Future, wait
from typing import Any

import numpy as np
import torch

from torch_tpu.core import config
from torch_tpu.core.user_frames import innermost_user_frame
from torch_tpu.runtime.buffer import DeviceBuffer

from . import _early_launch, _ops, _storage  # (_ops, _early_launch import this module too: names read at call time)
from ._buffers import TABLE, Pending, StorageEntry
from ._modes import check_alive

log = logging.getLogger("torch_tpu")
# One trace for the process, not per thread: autograd runs backward on its own thread, and
# a trace per thread would flush the forward's trace when backward reads it (and the
# backward's when the optimizer reads the gradients) -- three programs per step, not one.
_current: list["Trace | None"] = [None]
_lock = threading.RLock()  # recording and flushing (a flush may start inside a recording)
# Trace key -> Future of the fused executable while it compiles, then its Invoker, or
# _INTERPRET when the fused program could not be built (its ops keep running one by one).
_PROGRAMS: dict = {}
_SEEN_ONCE: set = set()  # keys of Strict-mode deferred traces run once, uncompiled (`Trace._run`)
_INTERPRET = object()
_MAX_PROGRAMS = 512  # the compile cache (L1/L2) still holds the evicted executables
STATS = {"flushes": 0, "fused_runs": 0, "interpreted_runs": 0, "ops": 0}


class Trace:
    """The ops recorded on one device since the last flush."""

    def __init__(self, index: int) -> None:
        self.index = index
        # The recorded ops as three parallel lists (plan, operand refs, user line), not a
        # tuple per op: a trace holds its ops until its flush, and a tuple holding a plan
        # stays tracked by the cyclic garbage collector, which promotes it to its oldest
        # generation, bringing the next full collection nearer (~250 ms over the process's
        # ~600k objects: every 25 steps of bench/tpu.py case 7's FUSED training step on
        # XLA:CPU with a tuple per op, every 29 without). The refs and line tuples hold
        # only numbers and strings: the collector's first pass untracks them.
        self.plans: list = []
        self.refs: list[tuple] = []
        self.lines: list[tuple[str, int]] = []
        # External inputs, as two parallel lists (kind, value): "buffer" (a DeviceBuffer) |
        # "number" (a Python number) | "tensor" (a 0-d CPU tensor) | "key" (RNG key words).
        # A ref is an int (an external input) or (op, result). Not a tuple per external: one
        # holding a DeviceBuffer stays tracked by the garbage collector, as the ops' did.
        self.kinds: list[str] = []
        self.values: list[Any] = []
        self._buffer_ref: dict[int, int] = {}  # id(DeviceBuffer) -> its external position
        self.flushed = False
        self.error: BaseException | None = None
        self.cut_at_bound = False  # flushed because it reached TORCH_TPU_MAX_FUSED_OPS
        self.graphs: set[int] = set()  # id() of each compiled graph recorded (`record_graph`)
        # Opened in Strict mode by a compiled training step's graphs (`deferring`), not by
        # FUSED mode: its fused program compiles the second time its key is seen.
        self.strict_graphs = False
        # Opened by a compiled graph that starts a training step -- deferred in Strict mode, or
        # a training forward in FUSED mode: once it runs as one program, the next such step is
        # launched at that graph's call (`_early_launch`).
        self.launchable = False
        # A launchable step's externals first read after its first graph: external ->
        # a weak reference to the storage entry it was read from (`_early_launch.remember`).
        self.sources: dict[int, Any] = {}
        # (StepPlan, what it read, results) of the step's program launched at its first graph
        # (`_early_launch`), until the flush takes or drops them.
        self.launched: tuple | None = None
        # Ended by an optimizer step (`_step_ended`): flushed by the next op recorded or the
        # next read, so values the loop drops in between (zero_grad's gradients) are not outputs.
        self.ended = False
        # Read once per trace, not per recorded op (an environment lookup and parse).
        self.max_ops = config.get("TORCH_TPU_MAX_FUSED_OPS")

    def __hash__(self) -> int:
        return id(self)

    @property
    def ops(self) -> list[tuple[Any, tuple, tuple[str, int]]]:
        """(plan, operand refs, user line) per recorded op, in order (a new list: for readers
        off the recording path)."""
        return list(zip(self.plans, self.refs, self.lines))

    @property
    def externals(self) -> list[tuple[str, Any]]:
        """(kind, value) per external input, in order (a new list: for readers off the
        recording path)."""
        return list(zip(self.kinds, self.values))

    def external_buffer(self, buffer) -> int:
        ref = self._buffer_ref.get(id(buffer))
        if ref is None:
            ref = self._buffer_ref[id(buffer)] = self.external_value("buffer", buffer)
        return ref

    def external_value(self, kind: str, value) -> int:
        values = self.values
        self.kinds.append(kind)
        values.append(value)
        return len(values) - 1

    def structure_key(self) -> tuple:
        """The trace's key without its outputs: (device, per op (plan fingerprint, operand
        refs), each external's kind -- a number's type only: numbers are run-time operands,
        their values stay out of the key). The refs name external buffers by position, so
        the aliasing of operands is in the key. Built once per flush from what recording
        keeps anyway, not per recorded op."""
        ops = tuple([(plan.fingerprint, refs) for plan, refs in zip(self.plans, self.refs)])
        kinds = tuple([kind if kind != "number" else value.__class__.__name__
                       for kind, value in zip(self.kinds, self.values)])
        return (self.index, ops, kinds)

    @staticmethod
    def program_key(outputs: list[tuple[int, int]], structure: tuple) -> tuple:
        """The cache key of a trace's fused program: its `structure_key` and its outputs."""
        index, ops, kinds = structure
        return (index, ops, tuple(outputs), kinds)

    # -- flush ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Runs the trace: every live pending storage gets its buffer."""
        with _lock:
            self._flush()

    def _flush(self) -> None:
        if self.flushed:
            if self.error is not None:
                raise self.error
            return
        self.flushed = True
        if _current[0] is self:
            _current[0] = None
        live = [(e, b) for e in list(TABLE._entries.values())
                if (b := e._buffer).__class__ is Pending and b.trace is self]
        STATS["flushes"] += 1
        if not live:
            self.launched = None
            return  # nothing recorded is observable any more
        structure = self.structure_key()
        outputs = _outputs_as_before(structure, {(b.op, b.result) for _, b in live})
        try:
            buffers = self._run(outputs, structure)
        except BaseException as err:
            self.error = err
            failed = Pending(self, -1, -1)  # reading it raises the trace's error again
            for entry, _ in live:
                entry._buffer = failed
            raise
        position = {ref: i for i, ref in enumerate(outputs)}
        for entry, pending in live:
            entry._buffer = buffers[position[(pending.op, pending.result)]]
        STATS["ops"] += len(self.plans)
        # Nothing reads a flushed trace again: free the inputs it held.
        self.kinds.clear()
        self.values.clear()
        self._buffer_ref.clear()

    def written_externals(self) -> tuple[int, ...]:
        """The external buffers a recorded op writes (what the fused program donates);
        a function of the trace's key."""
        return tuple(sorted({refs[p] for plan, refs in zip(self.plans, self.refs)
                             for p in plan.written if type(refs[p]) is int}))

    def aliases(self, outputs: list[tuple[int, int]]) -> dict[int, int]:
        """{written external: output position}: each written external buffer's storage's
        value at the end of the trace (following its chain of recorded writes), where that
        value is an output. The fused program writes it over the external's memory (a
        storage keeps its address across steps); a function of the trace's key. Without
        an alias, XLA may give a donated buffer to any output of its shape."""
        position = {ref: i for i, ref in enumerate(outputs)}
        final: dict = {}  # a written value -> the value its storage holds next
        starts = []
        for i, (plan, refs) in enumerate(zip(self.plans, self.refs)):
            for k, p in enumerate(plan.written):
                new = (i, plan.n_results + k)
                if type(refs[p]) is int:
                    starts.append((refs[p], new))
                else:
                    final[refs[p]] = new
        aliases: dict[int, int] = {}
        for ref, value in starts:
            while value in final:
                value = final[value]
            if value in position and position[value] not in aliases.values() and ref not in aliases:
                aliases[ref] = position[value]
        return aliases

    def layout(self) -> tuple[list[int], list[int], list[int]]:
        """@main's arguments, a function of the trace's key: (the externals that are
        arguments of their own, in order; the float numbers' externals; the int numbers').
        The Python numbers come last as one float64 and one int64 array (when there are
        any): one host-to-device transfer each per run, not one per number."""
        own, floats, ints = [], [], []
        for ref, (kind, value) in enumerate(zip(self.kinds, self.values)):
            if kind != "number":
                own.append(ref)
            elif type(value) is float:
                floats.append(ref)
            else:
                ints.append(ref)
        return own, floats, ints

    def main_positions(self) -> dict[int, int]:
        """{external: its @main argument} for the externals that are arguments of their own."""
        return {ref: i for i, ref in enumerate(self.layout()[0])}

    def _arguments(self, donated: tuple[int, ...] = ()) -> list:
        """The fused program's arguments (`layout`); `donated`: externals it may write over."""
        own, floats, ints = self.layout()
        donated = frozenset(donated)  # (a tuple: a scan per argument, ~900 of them in a training step's trace)
        # The frame hook's references are the same for every argument of this call: counted
        # once, not once per donated buffer (~600 of them in a training step's trace).
        hooks = _ops.hook_references()
        args = [self._external_argument(ref, ref in donated, hooks) for ref in own]
        for packed in self.packed_numbers(floats, ints):
            if packed.size:
                args.append(_packed_numbers(packed, self.index))
        return args

    def packed_numbers(self, floats: list[int], ints: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The float and int numbers' values (`layout`'s last two lists) as the float64 and
        int64 arrays @main takes (`_arguments`; an early launch's, `_early_launch`)."""
        values = self.values
        return (np.array([values[r] for r in floats], dtype=np.float64),
                np.array([values[r] for r in ints], dtype=np.int64))

    def _external_argument(self, ref: int, donated: bool = False, hooks: int | None = None):
        """One external as a device buffer: a storage's buffer (a copy where the program may
        write over it and something else still reads it), a Python number (the op-by-op
        path's per-value buffer cache), a 0-d CPU tensor or an RNG key (uploaded). (No
        import statement here: one runs the import machinery, ~1 us, for each of a
        training step's ~900 externals.) `hooks`: `_ops.hook_references()`, when the caller
        counted it already."""
        kind, value = self.kinds[ref], self.values[ref]
        if kind == "buffer":
            if value.is_deleted:
                check_alive(StorageEntry(torch.uint8, 0, self.index, value))  # raises, naming the line
            if donated and not _donation_safe(value, hooks):
                value = value.copy()  # the program may write over what it is given
            return value
        if kind == "number":
            return _ops._scalar_buffer(value, self.index)
        return _storage.client().to_device(value, self.index, copy=True)  # a 0-d CPU tensor or an RNG key

    def _sole_holder(self, ref: int) -> bool:
        """Whether the trace holds external buffer `ref` alone (`_donation_safe`'s count:
        the trace's list, `value`, its parameter and `getrefcount`'s argument)."""
        value = self.values[ref]
        return _donation_safe(value)

    def _run(self, outputs: list[tuple[int, int]], structure: tuple) -> list:
        """Runs the trace: op by op the first time its key is seen (unless
        TORCH_TPU_FUSED_FIRST_RUN), else its fused program -- waiting for that compile when
        it is still under way. Which path a run takes depends on how often its key was
        seen, never on how fast the compile was nor on where it ran
        (TORCH_TPU_FUSED_BACKGROUND_COMPILE): the two paths' results can differ in the
        last bits (XLA fuses the ops), and runs must repeat bit for bit."""
        key = self.program_key(outputs, structure)
        if self.launched is not None:
            outs = _early_launch.take(self, key)
            if outs is not None:
                STATS["fused_runs"] += 1
                return outs
        program = _PROGRAMS.get(key)
        if program is None and self.strict_graphs and key not in _SEEN_ONCE:
            # Strict mode deferred these graphs to run them as one program; a key seen
            # once may never repeat (a step whose shapes change every time), so this run
            # goes graph by graph, as Strict mode without deferral would, and compiles
            # nothing. The second sighting compiles the program.
            if len(_SEEN_ONCE) >= 4 * _MAX_PROGRAMS:
                _SEEN_ONCE.clear()
            _SEEN_ONCE.add(key)
            return self._interpret(outputs)
        if program is None:
            if len(_PROGRAMS) >= _MAX_PROGRAMS:  # oldest first: a program of a loop is reused, others age out
                del _PROGRAMS[next(iter(_PROGRAMS))]
            program = _PROGRAMS[key] = self._compile(key, outputs)
            if not self.strict_graphs:  # (its advice is about FUSED mode)
                _ADVICE.new_trace(self)
            if isinstance(program, Future) and not config.get("TORCH_TPU_FUSED_BACKGROUND_COMPILE"):
                program = _PROGRAMS[key] = _loaded(program, len(self.plans))  # compiled before the first run
            if not config.get("TORCH_TPU_FUSED_FIRST_RUN"):
                return self._interpret(outputs)  # this time (while the program compiles, in the background)
        else:
            _ADVICE.known_trace()
        if isinstance(program, Future):
            program = _PROGRAMS[key] = _loaded(program, len(self.plans))
        if program is _INTERPRET:
            return self._interpret(outputs)
        args = self._arguments(self.written_externals())
        try:
            outs = program.buffers(*args)
        except RuntimeError as err:
            raise _program_failed(self, err) from err
        STATS["fused_runs"] += 1
        if self.launchable:
            _early_launch.remember(self, key, outputs)
        return outs

    def _compile(self, key, outputs, donate: bool = True):
        from torch_tpu.runtime import CompileSpec

        from ..program import ProgramKey, compile_module
        from ..program.pipelines import NO_PASSES

        try:
            text = _stitch(self, outputs, aliased=donate)
        except Exception as err:  # noqa: BLE001 - a plan the stitcher cannot take: run op by op
            log.warning("torch_tpu: FUSED: cannot build one program for a trace of %d ops (%s: %s); "
                        "its ops run one by one", len(self.plans), type(err).__name__, str(err))
            return _INTERPRET
        position = self.main_positions()
        donated = tuple(position[ref] for ref in self.written_externals()) if donate else ()
        # The plans' modules ran their pipeline already: the stitched text compiles as it is.
        program = compile_module(
            text, key=ProgramKey("fused", key, repr(self.plans[0].fingerprint[1]) + ("" if donate else " undonated")),
            name=f"fused trace of {len(self.plans)} ops" + ("" if donate else ", undonated"),
            pipeline=NO_PASSES, wait=False,
            options=CompileSpec(device_indices=(self.index,), donate_argnums=donated),
        )
        return program.executable

    def _interpret(self, outputs: list[tuple[int, int]]) -> list:
        """Runs the recorded ops one by one through their own plans."""
        # Written externals nothing else holds (their storages hold the trace's pending
        # values now: an optimizer step's parameters and states) are given up to the op
        # that writes them last, as the fused program's donation does; without it the
        # op-by-op run held a second copy of every parameter and state of the step.
        sole = {ref for ref in self.written_externals() if self._sole_holder(ref)}
        args = [self._external_argument(ref) for ref in range(len(self.values))]
        wanted = set(outputs)
        last_use: dict = {}
        for i, refs in enumerate(self.refs):
            for ref in refs:
                last_use[ref] = i
        values: dict[tuple[int, int], Any] = {}
        for i, (plan, refs, where) in enumerate(self.ops):
            operands = [args[r] if type(r) is int else values[r] for r in refs]
            for position in plan.written:
                # The plan donates the storages it writes (`_ops._build_plan`): only an
                # intermediate nothing else reads may be given up; an external buffer (the
                # storage's value before the trace, held by others too) is copied.
                ref = refs[position]
                if (ref not in sole if type(ref) is int else ref in wanted) or last_use[ref] != i or refs.count(ref) != 1:
                    operands[position] = operands[position].copy()
            try:
                outs = plan.invoker.buffers(*operands)
            except RuntimeError as err:
                raise _op_failed(plan, where, err) from err
            for j, out in enumerate(outs):
                if (i, j) in wanted or last_use.get((i, j), -1) > i:
                    values[(i, j)] = out
            for ref in refs:  # drop values no later op reads (device memory stays bounded)
                if type(ref) is tuple and last_use[ref] == i and ref not in wanted:
                    values.pop(ref, None)
        STATS["interpreted_runs"] += 1
        return [values[ref] for ref in outputs]


# Packed Python numbers (`Trace._arguments`) -> their device buffer, as the op-by-op path
# keeps one buffer per number (`_ops._scalar_buffer`): a steady loop passes the same
# numbers every run (`y + 1`, a constant learning rate), so its flush makes no transfer
# for them. Keyed by the bytes (floats by their bits: 0.0 and -0.0 differ). The buffers
# are only read: @main never donates its packs.
_PACKS: dict = {}
_PACKS_MAX = 256


def _packed_numbers(packed: np.ndarray, index: int):
    key = (packed.tobytes(), packed.dtype.char, index)
    buffer = _PACKS.get(key)
    if buffer is None:
        if len(_PACKS) >= _PACKS_MAX:
            _PACKS.clear()  # numbers that never repeat (a learning-rate schedule): keep it small
        buffer = _PACKS[key] = _storage.client().to_device(packed, index, copy=True)
    return buffer


# References to an external buffer in `Trace._arguments` when nothing else reads it: the
# trace's `externals` entry, the loop's `value`, `_donation_safe`'s parameter and
# `sys.getrefcount`'s argument (CPython's counts; test_device_fused checks both sides).
# A storage still holding it, another trace's operand list or a caller adds one.
_SOLE_REFERENCES = 4


def _donation_safe(buffer, hooks: int | None = None) -> bool:
    """Whether the fused program may write over `buffer` (`_ops._donation_safe`'s rule):
    no other reference to the DeviceBuffer and no host view of its memory. `hooks`:
    `_ops.hook_references()` when the caller counted it (once per flush)."""
    if hooks is None:
        hooks = _ops.hook_references()
    return sys.getrefcount(buffer) <= _SOLE_REFERENCES + hooks and not buffer._exported


class _Launch:
    """A fused program's run: its arguments (`Trace._arguments`) are live DeviceBuffers
    whose shapes and element types the trace's key fixes, so they go to PjRT as they are
    (`Executable.buffer_launcher`), without a converter per argument (a compiled training
    step's trace passes ~600: ~0.8 ms of a step on XLA:CPU)."""

    __slots__ = ("executable", "buffers")

    def __init__(self, executable) -> None:
        self.executable = executable
        launch = executable.buffer_launcher()
        self.buffers = lambda *args: launch(args)


def _loaded(future: Future, n_ops: int):
    try:
        executable = future.result()
    except Exception as err:  # noqa: BLE001 - XLA rejected the fused module: run op by op
        # (The text only: a record holding the exception would hold its frames' tensors.)
        log.warning("torch_tpu: FUSED: compiling a trace of %d ops failed (%s); its ops run one by one", n_ops, str(err))
        return _INTERPRET
    return _Launch(executable)


# -- recording ------------------------------------------------------------------------------------
def current_trace(index: int) -> Trace:
    trace = _current[0]
    if trace is not None and not trace.flushed:
        if trace.index == index and not trace.ended:
            if len(trace.plans) < trace.max_ops:
                return trace
            trace.cut_at_bound = True
        trace.flush()  # another device, or the bound on recorded ops
    else:
        _watch_steps()
    trace = _current[0] = Trace(index)
    return trace


# -- step boundaries ------------------------------------------------------------------------------
_STEP_HOOK: list = []


def _watch_steps() -> None:
    """The end of every `torch.optim` optimizer's `step()` is a flush point (a global
    post-hook, installed with the first trace). A training loop's traces then start at
    the same op every step, so they repeat -- and so do the cuts that
    TORCH_TPU_MAX_FUSED_OPS makes inside a long step -- whatever the loop reads and when.
    Without it, a loop that read its loss every 50 steps cut its traces only at the bound,
    at an offset that moved from step to step: no trace repeated, none ran fused."""
    if _STEP_HOOK:
        return
    with _lock:
        if not _STEP_HOOK:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _STEP_HOOK.append(register_optimizer_step_post_hook(_step_ended))


def wait_for_compiles() -> None:
    """Waits until no trace's program is compiling in the background (a new trace's first
    run starts its compile): for benchmarks and tests whose timings or compile counts must
    not include it. A compile that failed is reported where its trace runs next."""
    wait([program for program in list(_PROGRAMS.values()) if isinstance(program, Future)]
         + _early_launch.compiling())


def deferring() -> bool:
    """Whether a trace is waiting with recorded ops: in Strict mode, the graphs of a
    compiled training step deferred since its forward or backward (TORCH_TPU_FUSE_COMPILED_STEP,
    TORCH_TPU_COMPILED_STEP_START)."""
    trace = _current[0]
    return trace is not None and not trace.flushed and not trace.ended and bool(trace.plans)


def _step_ended(optimizer, args, kwargs) -> None:
    """The trace ends here, and runs at the next op recorded or the next read (`current_trace`,
    `Pending`): what the loop drops in between -- the gradients of
    `opt.step(); opt.zero_grad(set_to_none=True)` -- is not an output of its program, which
    then computes what a JAX step does (the gradients only feed the update). Flushed here, each
    step's program would write every gradient too, from the matrix products that compute them
    (on the v5e, 1.8 ms of a 16-layer Llama training step of 48.5 ms)."""
    trace = _current[0]
    if trace is not None and not trace.flushed and trace.plans:
        trace.ended = True


# Each trace's outputs at its last run, by its structure (`Trace.structure_key`).
_OUTPUTS_BEFORE: dict[tuple, frozenset] = {}


def _outputs_as_before(structure: tuple, live: set) -> list[tuple[int, int]]:
    """A trace's outputs: the results a storage holds now (`live`), and those its last run
    with the same structure had. A loop whose traces end at different points in its
    Python -- the next op in most steps, a read of the loss every n steps, while the
    gradients that `zero_grad()` drops at a step's start are still held -- would otherwise
    alternate between two programs (two compiles, and an early launch that misses every n
    steps); the union settles on one after the first runs. An output nothing holds is
    dropped when the run returns."""
    before = _OUTPUTS_BEFORE.get(structure)  # (one lookup a flush in a steady loop: the key is long)
    outputs = live if before is None else live | before
    if outputs != before:
        if before is None and len(_OUTPUTS_BEFORE) >= 4 * _MAX_PROGRAMS:
            _OUTPUTS_BEFORE.clear()
        _OUTPUTS_BEFORE[structure] = frozenset(outputs)
    return sorted(outputs)


# -- telling users why nothing fuses -------------------------------------------------------------
class _Advice:
    """Says once, with what to do, when FUSED runs trace after trace that was never seen
    before: each runs op by op while a program that nothing reuses compiles, slower than
    Strict mode."""

    STREAK = 16  # consecutive new traces before it says so

    def __init__(self) -> None:
        self.streak = 0
        self.at_bound = 0
        self.given = False

    def known_trace(self) -> None:
        self.streak = self.at_bound = 0

    def new_trace(self, trace: Trace) -> None:
        self.streak += 1
        self.at_bound += trace.cut_at_bound
        if self.streak < self.STREAK or self.given:
            return
        self.given = True
        bound = config.get("TORCH_TPU_MAX_FUSED_OPS")
        why = (f"{self.at_bound} of them were cut at TORCH_TPU_MAX_FUSED_OPS={bound} recorded ops, at points "
               "that move from one step to the next" if self.at_bound else
               "their flush points (reads of tpu values) come at different ops each time")
        log.warning(
            "torch_tpu: FUSED mode is not fusing: the last %d traces were each new (%s), so each ran op by op "
            "while a fused program nothing reuses compiled -- slower than Strict mode. Make each step end at the "
            "same op: step a torch.optim optimizer (its step() ends a trace), or call torch.tpu.synchronize() "
            "(or read a value, such as loss.item()) at the end of every step; or set TORCH_TPU_MAX_FUSED_OPS to "
            "a multiple of the ops one step records; or use EagerMode.STRICT. (Logged once.)",
            self.streak, why)


_ADVICE = _Advice()


def record(op, args, kwargs, plan, operands, index: int):
    """Records `op` (planned as `plan`, reading `operands`) on the current trace and
    returns what the op returns, its results and written storages holding pending values.
    Binding happens under the trace lock: a flush from another thread in between would
    take a result not yet bound to its storage for dead."""
    # The user's line, looked for from `run`'s caller on (`record` is called by `run`
    # only): the frames in between are ours, and each frame looked at costs a frame
    # object (Python 3.11 makes them on demand).
    where = user_frame(sys._getframe(2))
    with _lock:
        trace, position = _record(plan, operands, index, where)
        single = plan.single
        if single is not None:
            # One new tensor, nothing written (most ops): `bind_results`' own short path.
            return _storage.new_tensor(Pending(trace, position, 0), *single)
        pending = [Pending(trace, position, j) for j in range(plan.n_results + len(plan.written))]
        return _ops.bind_results(op, args, kwargs, plan, operands, index, pending)


class GraphPlan:
    """A compiled graph's program (`torch.compile` on tpu tensors) as one recorded op of a
    trace, with the fields of an op's `_ops.Plan` that recording, stitching and the
    op-by-op run read. Its results are the graph's new tensors, then the new values of the
    inputs it writes (`written`, in that order: an optimizer step's parameters and states,
    a KV cache): the trace stitches the whole program into the fused one, so the forward,
    the backward and the optimizer step of a compiled training step run as ONE program
    and XLA fuses across them (the AdamW update into the gradient's matmul, as in a JAX
    step). `results`: (numel, size, stride, dtype) of each new tensor, row-major. `needs_rng`:
    the program takes an RNG key last (a graph with dropout): recording draws the device
    generator's next key, as an eager random op's recording does (`_record`). `starts_step`:
    a training forward (AOTAutograd's forward of a graph with a backward), whose call in FUSED
    mode starts a step that may be launched early (`_early_launch`)."""

    single = None

    def __init__(self, executable, module, fingerprint, written: list[int], results: list[tuple],
                 needs_rng: bool = False, starts_step: bool = False) -> None:
        from ..program.invoker import Invoker

        self.needs_rng = needs_rng
        self.starts_step = starts_step
        self.executable = executable
        self.module = module
        self.fingerprint = ("graph", fingerprint)
        self.written = written
        self.results = results
        self.n_results = len(results)
        self.invoker = Invoker(executable, executable.signature.args)  # the op-by-op run
        # Where the arguments of the last launchable step this graph started came from
        # (`_early_launch.StepPlan`, `Trace.launchable`): the next such step is launched at
        # this graph's call.
        self.step_plan = None


def record_graph(plan: GraphPlan, operands: list, tensors, index: int, strict: bool = False) -> list:
    """Records one call of a compiled graph on the current trace: `operands` are the
    storage entries of its tensor arguments `tensors` (each its storage as it is). Returns
    its results as the graph's call does: new pending tensors, then each written input
    itself, its storage holding the pending new value (its version counter moved, as the
    `copy_` it stands for would). `strict`: recorded in Strict mode (deferred: see
    `deferring`)."""
    where = user_frame(sys._getframe(2))
    with _lock:
        trace = _current[0]
        if trace is not None and not trace.flushed and id(plan) in trace.graphs:
            # A trace holds each compiled graph once: a loop calling one graph (a decode
            # step per token) runs a program per call, as in Strict mode, instead of
            # stitching a program of up to TORCH_TPU_MAX_FUSED_OPS copies of the model.
            trace.flush()
        trace, position = _record(plan, operands, index, where)
        trace.graphs.add(id(plan))
        if position == 0 and (strict or plan.starts_step):
            trace.strict_graphs = strict
            trace.launchable = True
            if plan.step_plan is not None:
                _early_launch.launch(trace)  # the device starts while the host records the rest
        new_tensor = _storage.new_tensor
        out = [new_tensor(Pending(trace, position, j), numel, size, stride, dtype, index, True, tuple(size))
               for j, (numel, size, stride, dtype) in enumerate(plan.results)]
        written = []
        first = plan.n_results
        for k, p in enumerate(plan.written):
            # (The raw slot: the `buffer` setter's work is for DeviceBuffers; an optimizer
            # graph writes ~600 operands a step.)
            operands[p]._buffer = Pending(trace, position, first + k)
            written.append(tensors[p])
        if written:
            torch._C._increment_version(written)
            out.extend(written)
    return out


def _record(plan, operands, index: int, where: tuple[str, int]) -> tuple[Trace, int]:
    """Appends the op to the current trace; returns the trace and the op's position in it
    (its results' `Pending` values name the two). This runs for every op of every step, so it
    does only what the trace needs (the operands' refs, the user's line) in one pass: the
    trace's cache key is derived from the refs at the flush (`Trace.program_key`)."""
    trace = current_trace(index)
    refs = []
    known = trace._buffer_ref  # (looked up here: an optimizer graph has ~600 operands)
    for value in operands:
        if value.__class__ is StorageEntry:
            buffer = value._buffer
            if buffer.__class__ is Pending and buffer.trace is trace and buffer.op >= 0:
                refs.append((buffer.op, buffer.result))
                continue
            if buffer.__class__ is not DeviceBuffer:
                buffer = _storage.buffer_of(value)  # flushes another trace; zeros for `empty`
            ref = known.get(id(buffer))
            if ref is None:
                # A new external is checked here, so that the op's error names its line; one the
                # trace holds already was alive then, and the flush checks every external again
                # (`_external_argument`): a buffer deleted in between fails there.
                if buffer.is_deleted:
                    check_alive(value, name_line=False)  # raises; the op's error names the line
                ref = trace.external_buffer(buffer)
                if trace.launchable:
                    _early_launch.note_source(trace, ref, value)
            refs.append(ref)
        else:
            # A Python number (a run-time operand) or a 0-d CPU tensor (its value now).
            refs.append(trace.external_value("number", value) if value.__class__ is float or value.__class__ is int
                        else trace.external_value(*_external_value(value)))
    if plan.needs_rng:
        from ._random import generator

        refs.append(trace.external_value("key", generator(index).next_key()))
    plans = trace.plans
    plans.append(plan)
    trace.refs.append(tuple(refs))
    trace.lines.append(where)
    return trace, len(plans) - 1


def _external_value(value) -> tuple[str, Any]:
    """An operand that is neither a storage nor a float or int, as an external input."""
    if isinstance(value, torch.Tensor):  # a 0-d CPU tensor: its value now
        return ("tensor", value.detach().reshape(()).clone())
    return ("number", value)


def flush_all() -> None:
    """Flushes the trace being recorded, if any."""
    trace = _current[0]
    if trace is not None:
        trace.flush()


def user_frame(frame=None) -> tuple[str, int]:
    """(file, line) of the innermost user frame (`core/user_frames.py`, cached per file:
    this runs per op) from `frame` outwards (default: the caller's): the location of the
    op in the fused program."""
    return innermost_user_frame(frame or sys._getframe(1)) or ("<unknown>", 0)


# -- one module ------------------------------------------------------------------------------------
def _stitch(trace: Trace, outputs: list[tuple[int, int]], aliased: bool = True) -> str:
    """The fused module's text: each distinct plan's function as a private function, and
    @main calling them in order. `aliased`: each written external's argument names the
    output holding its new value (the donated program; not the early launch's)."""
    from torch_tpu.compiler import ir as hlo
    from torch_tpu.compiler.context import func, ir
    from torch_tpu.core.attributes import ALIASING_OUTPUT

    from ..program import shared_context

    context = shared_context()
    with context, ir.Location.unknown():
        module = ir.Module.create()
        symbols: dict[int, tuple[str, Any]] = {}  # id(plan) -> (symbol, function type)
        with ir.InsertionPoint(module.body):
            for plan in trace.plans:
                if id(plan) not in symbols:
                    symbols[id(plan)] = _add_plan(plan, f"op{len(symbols)}")
        # Each external's type where an op first reads it.
        types: list = [None] * len(trace.values)
        for plan, refs in zip(trace.plans, trace.refs):
            inputs = symbols[id(plan)][1].inputs
            for ref, t in zip(refs, inputs):
                if type(ref) is int and types[ref] is None:
                    types[ref] = t
        if any(t is None for t in types):
            raise ValueError("an external input no op reads")
        # @main's arguments (`Trace.layout`): the other externals, then the numbers packed.
        own, floats, ints = trace.layout()
        packs = [(refs, ir.F64Type.get() if refs is floats else ir.IntegerType.get_signless(64))
                 for refs in (floats, ints) if refs]
        arg_types = [types[ref] for ref in own] + [ir.RankedTensorType.get([len(refs)], element)
                                                   for refs, element in packs]
        with ir.InsertionPoint(module.body):
            main = func.FuncOp("main", ir.FunctionType.get(arg_types, []))
        block = main.body.blocks.append(*arg_types)
        values: dict[tuple[int, int], Any] = {}
        with ir.InsertionPoint(block):
            external = {ref: block.arguments[i] for i, ref in enumerate(own)}
            for k, (refs, _) in enumerate(packs):
                pack = block.arguments[len(own) + k]
                for i, ref in enumerate(refs):
                    external[ref] = hlo.reshape(hlo.slice_in_dim(pack, 0, i, i + 1), [])
            for i, (plan, refs, (filename, line)) in enumerate(trace.ops):
                symbol, ftype = symbols[id(plan)]
                operands = [external[r] if type(r) is int else values[r] for r in refs]
                with ir.Location.file(filename, line, 0):
                    call = func.CallOp(list(ftype.results), ir.FlatSymbolRefAttr.get(symbol), operands)
                for j, result in enumerate(call.results):
                    values[(i, j)] = result
            results = [values[ref] for ref in outputs]
            func.ReturnOp(results)
        main.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(arg_types, [r.type for r in results]))
        position = trace.main_positions()
        aliases = {position[ref]: o for ref, o in trace.aliases(outputs).items()
                   if arg_types[position[ref]] == results[o].type} if aliased else {}
        if aliases:
            i32 = ir.IntegerType.get_signless(32)
            main.attributes["arg_attrs"] = ir.ArrayAttr.get([
                ir.DictAttr.get({ALIASING_OUTPUT: ir.IntegerAttr.get(i32, aliases[i])} if i in aliases else {})
                for i in range(len(arg_types))])
        # With locations: XLA keeps them as op metadata (the user's lines in its errors).
        return module.operation.get_asm(enable_debug_info=True)


def _add_plan(plan, symbol: str):
    """Clones the plan's functions into the module being built (at the insertion point),
    renamed under `symbol` and private; returns (symbol, @main's function type)."""
    from torch_tpu.compiler.context import func, ir

    functions = [op for op in plan.module.body.operations if isinstance(op.opview, func.FuncOp)]
    renames = {}
    for fn in functions:
        name = ir.StringAttr(fn.attributes["sym_name"]).value
        renames[name] = symbol if name == "main" else f"{symbol}_{name}"
    main_type = None
    for fn in functions:
        clone = fn.operation.clone()
        name = ir.StringAttr(clone.attributes["sym_name"]).value
        for old, new in renames.items():
            ir.SymbolTable.replace_all_symbol_uses(old, new, clone)
        clone.attributes["sym_name"] = ir.StringAttr.get(renames[name])
        clone.attributes["sym_visibility"] = ir.StringAttr.get("private")
        for attr in ("arg_attrs", "res_attrs"):
            if attr in clone.attributes:
                del clone.attributes[attr]
        if name == "main":
            main_type = ir.FunctionType(ir.TypeAttr(clone.attributes["function_type"]).value)
    if main_type is None:
        raise ValueError(f"the plan module of {plan.executable} has no @main")
    return symbol, main_type


# -- errors -------------------------------------------------------------------------------------
def _op_failed(plan, where, err):
    from ._errors import is_runtime_error

    if not is_runtime_error(err):
        return err
    message = (f"torch_tpu: {getattr(plan.executable, 'name', 'an op')} recorded at {where[0]}:{where[1]} "
               f"failed in FUSED mode: {err}")
    try:
        return type(err)(message)
    except TypeError:
        return RuntimeError(message)


def _program_failed(trace: Trace, err):
    from ._errors import is_runtime_error

    if not is_runtime_error(err):
        return err
    lines = sorted({f"{f}:{n}" for f, n in trace.lines})
    shown = ", ".join(lines[:5]) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
    message = (f"torch_tpu: a fused program of {len(trace.plans)} ops recorded at {shown} failed: {err}; "
               "run in EagerMode.DEBUG (torch_tpu.set_eager_mode) to raise it at the op that failed")
    try:
        return type(err)(message)
    except TypeError:
        return RuntimeError(message)
