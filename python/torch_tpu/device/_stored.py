"""Tensor values <-> shaped storage buffers, inside a program (the IR a module builds
around an op, a compiled graph's argument, a collective's operand).

A storage's buffer has the shape of the dense tensor that produced it (`_buffers.py`).
A tensor that passes as is (`_storage.layout_passes_as_is`) *is* that buffer: it is read
and written with no op at all, so on a TPU no relayout is ever paid for it. Any other
view is read and written through the storage's flat element order, the device's strided
read/write path (`_ops._read_view`, `_ops._write_into`): the buffer is reshaped to 1-D
first and, when written, back to its shape after, inside the same program (XLA fuses the
reshapes with the view's own gather or slice)."""

from __future__ import annotations

from typing import Any

from torch_tpu.compiler.lowering.storage_layout import dense_order

from ._ops import TensorArg, _read_view, _write_into
from ._storage import row_major


def _flat(stored: Any, arg: TensorArg) -> Any:
    """The storage's value as a 1-D array (its element order)."""
    from torch_tpu.compiler.lowering.helpers import reshape

    if len(arg.stored_shape) == 1:
        return stored
    return reshape(stored, [arg.storage_numel])


def read_stored(stored: Any, arg: TensorArg) -> Any:
    """The value of the tensor `arg` describes, from its storage's buffer value `stored`."""
    if arg.as_is:
        return stored
    return _read_view(_flat(stored, arg), arg)


def write_stored(stored: Any, value: Any, arg: TensorArg) -> Any:
    """The storage's new buffer value (its shape kept) after writing `value` into the
    tensor `arg` describes."""
    from torch_tpu.compiler.lowering.helpers import broadcast_to, convert, reshape

    if arg.as_is:
        return broadcast_to(convert(value, arg.dtype), list(arg.size))
    written = _write_into(_flat(stored, arg), value, arg)
    if len(arg.stored_shape) == 1:
        return written
    return reshape(written, list(arg.stored_shape))


def store_result(value: Any, size, stride) -> Any:
    """A result `value` of sizes `size` as the buffer of a new storage with the dense
    `stride`: the value itself for a row-major result, else its dimensions permuted to
    memory order (`_storage.stored_shape`)."""
    from torch_tpu.compiler.lowering.helpers import transpose

    if row_major(size, stride):
        return value
    return transpose(value, dense_order(size, stride))
