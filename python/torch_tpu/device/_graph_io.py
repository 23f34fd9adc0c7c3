"""tpu tensors in and out of compiled graphs (`torch.compile(model, backend="tpu")` on
tpu tensors), without a host round trip.

A compiled graph's program takes each input as an array of the tensor's shape and
returns arrays of its results' shapes; the buffer table holds each storage in the shape
of the dense tensor that produced it (`_buffers.py`). So:

* `argument(t)`: a tensor that passes as is (`_storage.passes_as_is`: parameters,
  activations, earlier results) is its storage's buffer, no program run; any other view
  (a slice, a transpose, a dtype view...) is read by one small program per signature
  (`_stored.read_stored`: offset, strides, non-dense views) -> an array of `t`'s shape;
* `result(buffer)`: a graph result becomes a new storage of its own shape, no program.

On a TPU, where arrays have tiled layouts and a reshape is a copy, this is what makes a
compiled call ONE program (a flat storage would cost a relayout program per argument and
per result on every call). The argument programs are enqueued without waiting, like
every device op. Module state on the device is
already a device buffer, so it never enters the host-side resident-parameter cache
(`program.invoker.ResidentParameters`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable

import torch

from torch_tpu.core import config
from torch_tpu.runtime import dtypes
from torch_tpu.runtime.buffer import DeviceBuffer

from . import _storage
from ._buffers import TABLE, entry_of
from ._fused import deferring
from ._graph_args import argument_reader
from ._modes import EagerMode, get_eager_mode, is_blocking
from ._ops import TensorArg, _donation_safe as donation_safe
from ._random import key_buffer
from ._storage import buffer_of, contiguous_stride, layout_passes_as_is

aten = torch.ops.aten


def _program(key: tuple, name: str, operand: tuple, result_val: torch.Tensor,
             body: Callable[[Any], Any], index: int):
    """The executable `@main(operand) -> body(operand)`, compiled once per key through
    `compile_module` (its program cache answers later calls). Built with the single-op
    lowering of `aten.alias` (the identity) around `body`, so it goes through the same
    pipeline as the device's ops."""
    from torch_tpu.compiler.importer.single_op import lower_op
    from torch_tpu.compiler.lowering.registry import OpRecord
    from torch_tpu.runtime import CompileSpec

    from ..program.precision import current_mode
    from ..program import ProgramKey, compile_module, shared_context
    from ..program.pipelines import compile_pipeline

    def build():
        meta = torch.empty(result_val.shape, dtype=result_val.dtype, device="meta")
        record = OpRecord(aten.alias.default, (meta,), {}, meta, name)
        return lower_op(record, [operand], lambda block: ((body(block[0]),), {}),
                        lambda value, block: [value], context=shared_context())

    def rejected(engine) -> Exception:
        return RuntimeError(f"torch_tpu: {name}: the pass pipeline rejected the module: {engine.format()}")

    mode = current_mode()
    return compile_module(build, key=ProgramKey("graph_io", key, mode), name=name, pipeline=compile_pipeline(mode),
                          options=CompileSpec(device_indices=(index,)), rejected=rejected).executable


def argument(t: torch.Tensor, shared: bool = False):
    """The DeviceBuffer of `t`'s value with `t`'s shape (what a compiled graph takes).
    A tensor that passes as is gives its storage's own buffer (`shared`: the program
    does not write it) or a device copy of it (a donated argument: the storage keeps its
    value until the graph's epilogue writes the new one in)."""
    entry = entry_of(t)
    buffer = entry._buffer
    if (buffer.__class__ is DeviceBuffer and t.dtype == entry.dtype and t.shape == entry.shape
            and t.storage_offset() == 0 and t.is_contiguous() and not t.is_conj() and not t.is_neg()
            and not buffer.is_deleted):
        # The common case, in the cheapest checks (a compiled call passes every parameter and
        # cache through here): `layout_passes_as_is` for a written storage.
        return buffer if shared else buffer.copy()
    from ._modes import check_alive

    if t.is_conj() or t.is_neg():
        # Lazy bits are not in the storage: resolve them on the device first.
        t = t.resolve_conj().resolve_neg()
    entry = entry_of(t)
    if t.dtype != entry.dtype:
        t = t.clone()  # a dtype view of a storage: its own storage, by the device's kernel
        entry = entry_of(t)
    check_alive(entry)
    if layout_passes_as_is(t.dtype, t.shape, t.stride(), t.storage_offset(), entry.dtype, entry.shape):
        buffer = buffer_of(entry)
        return buffer if shared else buffer.copy()
    from ._stored import read_stored

    arg = TensorArg(t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), entry.dtype, entry.numel,
                    storage_shape=entry.shape)
    index = entry.device_index
    executable = _program(("argument", arg, index), "tpu graph argument", (entry.shape, entry.dtype),
                          torch.empty(arg.size, dtype=arg.dtype, device="meta"),
                          lambda storage: read_stored(storage, arg), index)
    value = executable.execute([buffer_of(entry)])[0]
    if t.numel() == entry.numel and t.storage_offset() == 0 and t.is_contiguous():
        # The tensor covers its storage row-major but the buffer has another shape (a
        # storage loaded, resized or written from the host flat): the storage adopts the
        # tensor's shape -- the same elements in the same order -- so later calls pass it
        # as it is instead of running this program again.
        entry.buffer = value
        return value if shared else value.copy()
    return value


def flat_buffer(entry):
    """The storage's value as a 1-D DeviceBuffer (its element order), for the readers
    that need it flat (a collective's operand): the buffer itself when flat, else one
    reshape program per (shape, dtype), its output cached on the entry while the buffer
    stays the same (a parameter all-reduced every step reshapes once per new value)."""
    buffer = buffer_of(entry)
    if len(entry.shape) == 1:
        return buffer
    cached = entry._flat
    if cached is not None and cached[0] is buffer:
        return cached[1]
    from torch_tpu.compiler.lowering.helpers import reshape

    shape, dtype, index, numel = tuple(entry.shape), entry.dtype, entry.device_index, entry.numel
    executable = _program(("flat", shape, dtype, index), "tpu storage flat view", (shape, dtype),
                          torch.empty(numel, dtype=dtype, device="meta"),
                          lambda value: reshape(value, [numel]), index)
    flat = executable.execute([buffer])[0]
    entry._flat = (buffer, flat)
    return flat


def result(buffer, index: int) -> torch.Tensor:
    """A new tpu tensor (row-major) over a new storage that is the graph result's
    DeviceBuffer, in its shape (no relayout): the constructor every op result takes."""
    size = [int(s) for s in buffer.shape]
    if is_blocking():
        buffer.synchronize()
    return _storage.new_tensor(buffer, math.prod(size), size, contiguous_stride(size),
                               dtypes.torch_dtype(buffer._row), index, contiguous=True)


def graph_caller(args: Sequence[tuple[tuple[int, ...], torch.dtype, Any]],
                 results: Sequence[tuple[tuple[int, ...], torch.dtype]], device: Any, index: int,
                 launch: Callable[[list], list], host: frozenset[int] = frozenset(),
                 writes: dict[int, int] | None = None,
                 donated: Sequence[int] = (), fusable: tuple | None = None,
                 rng: bool = False) -> Callable[[Sequence[Any]], list | None]:
    """`call(tensors)`: one call of a compiled graph's program on tpu tensors, for a
    program that takes `args` `(shape, torch dtype, element type)` on the runtime `device`
    and returns `results` `(shape, torch dtype)`; `launch(buffers)` runs it
    (`Executable.buffer_launcher`). Returns the results as `result` makes them (CPU
    tensors at `host`), or None when a tensor is not what this path reads (the caller
    then takes the per-argument path: `argument`, the converters, which handle it or
    raise their errors).

    What the per-argument path does for each of a decode step's ~180 parameters and
    caches (~1.3 us each, measured), for all of them at once (`_graph_args`: PyTorch's
    C++ tensor check and an identity test per position on a repeated call): a tensor
    passes when it is its storage's buffer as it is (`argument`'s common case: same dtype,
    offset 0, row-major, the buffer's shape) and the buffer is what the converter accepts
    without a word (the parameter's shape and element type, this device). A deleted
    buffer is seen when the launch fails, and the per-argument path then raises its error.

    `writes` maps results that are new values of the call's inputs to those inputs'
    positions (a compiled graph's writes into its inputs, `backend/_input_writes.py`).
    Where `dst.copy_(result)` would only give `dst`'s storage the result's buffer
    (`_copy._shares_buffer`: here the input passed the loop above, so it covers its
    storage, and the result has its shape and dtype), that is done here, `dst`'s version
    counter records the write, and the input itself stands at that result's place (the
    caller skips copying a tensor onto itself): no result tensor, no `copy_`. Not in FUSED
    mode (the copy is recorded in the trace) nor while a dispatch or function mode is
    active (those see the `copy_` calls).

    `donated`: positions the program consumes (`backend/_compile.donated_writes`). One
    that is written here gets its storage's own buffer when nothing else holds it
    (`_ops._donation_safe`, eager in-place ops' rule: another storage sharing it after a
    `copy_`, a pending host copy, its flat copy, a second argument position, a DLPack
    export each hold it): the program writes the new value into the same memory and the
    storage takes the result. Otherwise, or when the write is not done here, the program
    gets a copy.

    `fusable`: (executable, module, fingerprint, role in a training step: "forward",
    "backward" or None) of the program: in FUSED mode the call is then recorded in the trace
    as one op (`_fused.record_graph`) instead of run, where its writes are its last results
    and cover what it donates (else it runs, as in Strict). In Strict mode
    (TORCH_TPU_FUSE_COMPILED_STEP) the call of a training forward (or, with
    TORCH_TPU_COMPILED_STEP_START=backward, of a backward) is recorded the same way, and so
    is every graph called while its trace waits (`_fused.deferring`: the backward, the
    optimizer's graph): a compiled training step is one program, run at the optimizer
    step's end or at the first read of a result; a call the recorder does not take runs
    here, as without deferral.

    `rng`: the program takes an RNG key after its tensors (dropout in a training step): a
    call here draws the device generator's next key (`_random.key_buffer`, as eager random
    ops do), a recorded call draws it when recorded (`GraphPlan.needs_rng`)."""
    read_arguments = argument_reader(args, device, TABLE._entries)
    plan = []
    direct = {}
    for k, (shape, dtype) in enumerate(results):
        size = [int(s) for s in shape]
        written = (writes or {}).get(k)
        if written is not None and tuple(args[written][0]) == tuple(shape) and args[written][1] is dtype:
            direct[k] = written
        plan.append((k in host, math.prod(size), size, contiguous_stride(size), dtype, direct.get(k)))
    plan = tuple(plan)
    new_tensor = _storage.new_tensor
    dispatch_modes = torch._C._len_torch_dispatch_stack
    function_modes = torch._C._is_torch_function_mode_enabled
    increment_version = torch._C._increment_version
    fused, strict = EagerMode.FUSED, EagerMode.STRICT
    in_place = frozenset(direct.values())
    donors = tuple((p, p in in_place) for p in sorted(donated))
    record = _fused_recorder(fusable, args, results, direct, donated, host, index, rng)
    # A training step's forward or backward (the role TORCH_TPU_COMPILED_STEP_START names)
    # opens a deferred trace in Strict mode (`_fused.deferring`).
    step_role = _step_role(fusable) if record is not None else None

    def call(tensors: Sequence[Any]) -> list | None:
        if record is not None and not dispatch_modes() and not function_modes():
            mode = get_eager_mode()
            if mode is fused:
                return record(tensors)
            if (mode is strict and (deferring() or (step_role is not None
                                                    and step_role == config.get("TORCH_TPU_COMPILED_STEP_START")))
                    and config.get("TORCH_TPU_FUSE_COMPILED_STEP")):
                out = record(tensors, True)
                if out is not None:
                    return out
        got = read_arguments(tensors)
        if got is None:
            return None
        buffers, read = got
        writing = bool(direct) and get_eager_mode() is not fused and not dispatch_modes() and not function_modes()
        consumed = []  # inputs whose own buffer the program takes
        if donors:
            for position, written_here in donors:
                # Held by its storage's entry and `buffers` alone: eager in-place ops' rule.
                if writing and written_here and donation_safe(buffers[position]):
                    consumed.append(position)
                else:
                    buffers[position] = buffers[position].copy()
        if rng:  # the program's random ops draw from the device's generator, as eager ones do
            buffers.append(key_buffer(index))
        try:
            outs = launch(buffers)
        except Exception as err:
            lost = [p for p in consumed if buffers[p].is_deleted]
            if lost:
                err.add_note(f"torch_tpu: the failed program had taken the buffers of the inputs it writes in "
                             f"place (argument positions {lost}); their values are lost: recreate those tensors")
                raise
            if any(b.is_deleted for b in buffers):
                return None  # the per-argument path names the deleted argument
            raise
        blocking = is_blocking()
        out = []
        written = []
        for buffer, (on_host, numel, size, stride, dtype, position) in zip(outs, plan):
            if on_host:
                out.append(buffer.to_torch())
                continue
            if blocking:
                buffer.synchronize()
            if position is not None and writing:
                read[position].buffer = buffer
                dst = tensors[position]
                written.append(dst)
                out.append(dst)
                continue
            out.append(new_tensor(buffer, numel, size, stride, dtype, index, contiguous=True))
        if written:
            increment_version(written)
        return out

    return call


def _step_role(fusable: tuple) -> str | None:
    """The graph's role in a training step (`fusable`'s fourth field: "forward",
    "backward"), None for a graph outside one."""
    return fusable[3] if len(fusable) > 3 else None


def _fused_recorder(fusable: tuple | None, args, results, direct: dict[int, int], donated: Sequence[int],
                    host: frozenset[int], index: int, rng: bool = False) -> Callable[[Sequence[Any]], list | None] | None:
    """`graph_caller`'s FUSED path: `record(tensors)` records the call on the trace
    (`_fused.record_graph`), or returns None for tensors it does not take (as the Strict
    loop does; the per-argument path then flushes what they hold). None when the program
    cannot be one op of a trace: no module to stitch, CPU results (a download flushes
    anyway), or writes that are not its last results (a trace's op returns its new
    tensors first, then the written values) or that leave a donated input out (only a
    written operand is copied for the op-by-op run)."""
    if fusable is None or host:
        return None
    count = len(direct)
    written = [direct.get(k) for k in range(len(results) - count, len(results))]
    if None in written or not set(donated) <= set(written):
        return None
    plan: list = []  # the GraphPlan, built at the first recorded call
    checks = tuple((tuple(shape), dtype, dtype.is_complex) for shape, dtype, _ in args)
    entries = TABLE._entries

    def record(tensors: Sequence[Any], strict: bool = False) -> list | None:
        from . import _fused

        operands = []
        for t, (shape, dtype, complex_) in zip(tensors, checks):
            entry = entries.get(t.data_ptr())  # a hit means offset 0 (see `graph_caller`)
            if (entry is None or t.dtype is not dtype or entry.dtype is not dtype or entry.shape != shape
                    or entry.device_index != index or t.shape != shape
                    or not t.is_contiguous() or t.is_neg() or (complex_ and t.is_conj())):
                return None
            operands.append(entry)
        if not plan:
            executable, module, fingerprint = fusable[:3]
            new = [(math.prod(shape), [int(s) for s in shape], contiguous_stride([int(s) for s in shape]), dtype)
                   for shape, dtype in results[: len(results) - count]]
            plan.append(_fused.GraphPlan(executable, module, fingerprint, written, new, rng,
                                         starts_step=_step_role(fusable) == "forward"))
        return _fused.record_graph(plan[0], operands, tensors, index, strict)

    return record


def device_of(args) -> int | None:
    """The tpu device index of a graph's tensor arguments, None when none is a tpu
    tensor. Other tensors may be mixed in where PyTorch allows it (0-d CPU tensors, or a
    CPU tensor no op combines with a tpu one: Dynamo's fake tensors raise PyTorch's
    device-mismatch error for the rest while tracing); they are uploaded as arguments."""
    index = None
    for value in args:
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            this = value.device.index or 0
            if index is not None and this != index:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{index} and tpu:{this}! (a torch.compile'd graph runs on one tpu device: "
                    "move its inputs to one device)"
                )
            index = this
    return index
