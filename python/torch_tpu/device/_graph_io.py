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
from typing import Any, Callable

import torch

from torch_tpu.runtime.buffer import DeviceBuffer

from . import _storage
from ._buffers import entry_of
from ._ops import TensorArg
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
    from ._modes import is_blocking
    from torch_tpu.runtime import dtypes

    size = [int(s) for s in buffer.shape]
    if is_blocking():
        buffer.synchronize()
    return _storage.new_tensor(buffer, math.prod(size), size, contiguous_stride(size),
                               dtypes.torch_dtype(buffer._row), index, contiguous=True)


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
