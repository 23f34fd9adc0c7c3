"""tpu tensors in and out of compiled graphs (`torch.compile(model, backend="tpu")` on
tpu tensors), without a host round trip.

A compiled graph's program takes each input as an array of the tensor's shape and
returns arrays of its results' shapes; the buffer table holds every storage as a flat
1-D array (`_buffers.py`). Two small programs per signature bridge them, on the device:

* `argument(t)`: the storage's flat buffer read as `t` (the device's own read path,
  `_ops._read_view`: offset, strides, non-dense views) -> an array of `t`'s shape;
* `result(buffer)`: a graph result laid out as a new storage (row-major) -> a tpu tensor.

Both are enqueued without waiting, like every device op. Module state on the device is
already a device buffer, so it never enters the host-side resident-parameter cache
(`program.invoker.ResidentParameters`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from . import _storage
from ._buffers import entry_of
from ._ops import TensorArg, _as_storage, _read_view
from ._storage import buffer_of, contiguous_stride

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

    from .._precision import current_mode
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
    `shared`: the program does not write (donate) it, so a 1-D tensor covering its whole
    storage passes the storage's own buffer (same shape: no program to run)."""
    from ._modes import check_alive

    if t.is_conj() or t.is_neg():
        # Lazy bits are not in the storage: resolve them on the device first.
        t = t.resolve_conj().resolve_neg()
    entry = entry_of(t)
    if t.dtype != entry.dtype:
        t = t.clone()  # a dtype view of a storage: its own storage, by the device's kernel
        entry = entry_of(t)
    check_alive(entry)
    if shared and t.dim() == 1 and t.stride(0) == 1 and t.storage_offset() == 0 and t.numel() == entry.numel:
        return buffer_of(entry)
    arg = TensorArg(t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), entry.dtype, entry.numel)
    index = entry.device_index
    executable = _program(("argument", arg, index), "tpu graph argument", ((entry.numel,), entry.dtype),
                          torch.empty(arg.size, dtype=arg.dtype, device="meta"),
                          lambda storage: _read_view(storage, arg), index)
    return executable.execute([buffer_of(entry)])[0]


def result(buffer, index: int) -> torch.Tensor:
    """A new tpu tensor (row-major) holding a graph result's DeviceBuffer."""
    from ._modes import is_blocking
    from torch_tpu.runtime import dtypes

    size = tuple(int(s) for s in buffer.shape)
    dtype = dtypes.torch_dtype(buffer._row)
    stride = contiguous_stride(size)
    if len(size) == 1:  # already laid out as its storage
        return _storage.from_buffer(buffer, size, stride, dtype, index)
    numel = int(np.prod(size, dtype=np.int64)) if size else 1
    executable = _program(("result", size, dtype, index), "tpu graph result", (size, dtype),
                          torch.empty(numel, dtype=dtype, device="meta"),
                          lambda value: _as_storage(value, size, stride), index)
    flat = executable.execute([buffer])[0]
    if is_blocking():
        flat.synchronize()
    return _storage.from_buffer(flat, size, stride, dtype, index)


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
