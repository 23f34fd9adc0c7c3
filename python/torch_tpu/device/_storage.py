"""tpu tensors over buffer-table storages, and their values on the host.

A tensor is `(storage, offset, size, stride)` like any PyTorch tensor; the view kernels
are PyTorch's own CPU kernels run over our non-owning storages (_registration.py), so
aliasing is exactly PyTorch's. Host transfers move whole storages: a view's value is
read from (or written into) its storage's host copy with `as_strided`.

A storage's device buffer has the shape of the dense tensor that produced it
(`_buffers.py`); `passes_as_is` is the one rule deciding when a tensor is that buffer
as it is, so programs take it and give it back without a relayout."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ._buffers import TABLE, StorageEntry, entry_of
from ._device_index import empty_tensor
from ._host_copies import land
from ._modes import check_alive
from .module import current_device

_SET = torch.ops.aten.set_.source_Storage_storage_offset
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
# `_SET.redispatch` without `OpOverload.redispatch`'s Python frame (every strided op result).
_SET_ON_CPU = functools.partial(_SET._handle.redispatch_boxed, _CPU)
_create_empty = torch._C._acc.create_empty_tensor


def client():
    from torch_tpu.runtime import get_client

    return get_client()


def device_index(device: torch.device | str | int | None) -> int:
    if device is None:
        return current_device()
    if device.__class__ is not torch.device:
        if isinstance(device, int):
            return device
        device = torch.device(device)
    index = device.index
    return current_device() if index is None else index


def storage_numel(size, stride, offset: int = 0) -> int:
    if any(int(s) == 0 for s in size):
        return int(offset)
    return int(offset) + 1 + sum((int(s) - 1) * int(st) for s, st in zip(size, stride))


def contiguous_stride(size) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(list(size)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))


def row_major(size, stride) -> bool:
    """Whether a layout is row-major dense (PyTorch's `is_contiguous`: the stride of a
    size-1 dimension does not matter, nor any stride of a tensor without elements)."""
    expected = 1
    for s, st in zip(reversed(size), reversed(stride)):
        s = int(s)
        if s == 0:
            return True
        if s != 1 and int(st) != expected:
            return False
        expected *= s
    return True


def stored_shape(size, stride) -> tuple[int, ...] | None:
    """The buffer shape of the storage of a dense tensor that covers it: its sizes in
    memory order (a row-major tensor: its own sizes; a channels-last one: N, H, W, C);
    None for a layout that is not dense (its storage stays flat)."""
    size = tuple(int(s) for s in size)
    if row_major(size, stride):
        return size
    from torch_tpu.compiler.lowering.storage_layout import dense_order

    order = dense_order(size, stride)
    return None if order is None else tuple(size[d] for d in order)


def layout_passes_as_is(dtype: torch.dtype, size, stride, offset: int, storage_dtype: torch.dtype,
                        storage_shape) -> bool:
    """THE rule of shaped storages: a tensor is its storage's buffer as it is -- a program
    takes the buffer for it, and a result buffer becomes its storage, with no relayout --
    when it reads the storage in its own dtype, from offset 0, row-major, with the
    buffer's shape (so it covers every element). The common tensors do (parameters,
    activations, op and graph results); views of another shape, stride, offset or dtype
    (slices, transposes, `as_strided`, dtype views, storages from `set_`/`resize_`) are
    read and written through the storage's flat order inside the program using them."""
    return (dtype == storage_dtype and offset == 0 and tuple(size) == tuple(storage_shape)
            and row_major(size, stride))


def passes_as_is(t: torch.Tensor) -> bool:
    """`layout_passes_as_is` for a tpu tensor (lazy conj/neg bits are not in the storage:
    such a tensor never does)."""
    entry = entry_of(t)
    return (not t.is_conj() and not t.is_neg()
            and layout_passes_as_is(t.dtype, t.shape, t.stride(), t.storage_offset(), entry.dtype, entry.shape))


# Set once the op kernels are registered (`_registration.ensure_op_kernels`, on the first
# tpu tensor): the paths that make tensors from the host check it without an import.
_op_kernels_ready = False


def ensure_op_kernels() -> None:
    global _op_kernels_ready
    if not _op_kernels_ready:
        from ._registration import ensure_op_kernels as register

        register()
        _op_kernels_ready = True


def wrap(entry: StorageEntry, size, stride, offset: int = 0) -> torch.Tensor:
    """A tpu tensor viewing `entry`'s storage."""
    ensure_op_kernels()
    storage = TABLE.new_storage(entry)
    return tensor_on(storage, entry.dtype, size, stride, offset)


def tensor_on(storage: torch.UntypedStorage, dtype: torch.dtype, size, stride, offset: int = 0) -> torch.Tensor:
    t = empty_tensor(dtype, storage.device.index)
    # Straight to the CPU kernel of set_ (what our PrivateUse1 kernel for it does): the
    # tensor is new, so the autograd and version-counter keys above have nothing to do,
    # and the Python kernel hop costs ~20 us per op result.
    return _SET_ON_CPU(t, storage, int(offset), list(size), list(stride))


def empty(size, stride, dtype: torch.dtype, index: int) -> torch.Tensor:
    numel = storage_numel(size, stride)
    # A dense tensor's storage gets its shape from the start: the first write of it (an
    # in-place init, `out=`, a copy) keeps that shape, so the tensor then passes as is.
    shape = stored_shape(size, stride) if numel == math.prod(int(s) for s in size) else None
    entry = StorageEntry(dtype, numel, index, shape=shape)
    return wrap(entry, size, stride)


def from_buffer(buffer, size, stride, dtype: torch.dtype, index: int) -> torch.Tensor:
    entry = StorageEntry(dtype, math.prod(buffer.shape), index, buffer)
    return wrap(entry, size, stride)


def new_tensor(buffer, numel: int, size: list, stride: list, dtype: torch.dtype, index: int,
               contiguous: bool | None = None, shape: tuple | None = None) -> torch.Tensor:
    """An op's result: a tpu tensor over a new storage holding `buffer` (dense, `numel`
    elements), the op kernels being registered already (the hot path of every op).
    `contiguous`: whether `stride` is `size`'s row-major stride (computed when None).
    `shape`: the buffer's shape, needed when `buffer` is a FUSED trace's pending value
    (a DeviceBuffer carries its own)."""
    entry = StorageEntry(dtype, numel, index, buffer, shape)
    if contiguous is None:
        contiguous = tuple(stride) == contiguous_stride(size)
    if contiguous and numel and not index:
        # (Not for no elements: create_empty_tensor gives a size-0 dim stride 0, where
        # PyTorch's row-major stride counts it as 1.)
        # The tensor is made with its sizes (row-major strides) and an empty storage on
        # tpu:0 (create_empty_tensor's only device, _device_index.py), which then takes the
        # new address: ~4 us, where the set_ below costs ~10 (a boxed call parsing its
        # arguments by schema).
        t = _create_empty(size, dtype)
        TABLE.new_storage(entry, into=t.untyped_storage())
        return t
    storage = TABLE.new_storage(entry)
    t = empty_tensor(dtype, index)
    return _SET_ON_CPU(t, storage, 0, size, stride)


def buffer_of(entry: StorageEntry):
    """The entry's buffer; zeros for a storage never written (`empty` is uninitialised
    memory in PyTorch: zeros are one valid content)."""
    if entry.buffer is None:
        entry.buffer = client().to_device(torch.zeros(entry.shape, dtype=entry.dtype), entry.device_index, copy=True)
    return entry.buffer


def storage_to_host(entry: StorageEntry) -> torch.Tensor:
    """The storage's elements as a new flat CPU tensor (waits for the value)."""
    return _buffer_to_host(entry).reshape(-1)  # (a shaped buffer's host copy is dense)


def _buffer_to_host(entry: StorageEntry) -> torch.Tensor:
    """The storage's buffer as a new CPU tensor of the buffer's shape (waits for the
    value; zeros for a storage never written)."""
    land()  # a blocking read comes after earlier non_blocking ones, as in CUDA's stream order
    buffer = entry.buffer  # (flushes a FUSED trace computing it)
    if buffer is None:
        return torch.zeros(entry.shape, dtype=entry.dtype)
    if buffer.is_deleted:
        check_alive(entry)  # raises, naming the user's line
    return buffer.copy_to_host()


def host_copy_as_is(t: torch.Tensor) -> torch.Tensor | None:
    """`to_host(t)` for a tensor that passes as is (`passes_as_is`: the common `.cpu()`):
    the buffer's host copy itself, with no view or reshape on the way; None for any other
    tensor (`to_host` reads it through its storage)."""
    entry = entry_of(t)
    if (t.is_conj() or t.is_neg()
            or not layout_passes_as_is(t.dtype, t.shape, t.stride(), t.storage_offset(), entry.dtype, entry.shape)):
        return None
    host = _buffer_to_host(entry)
    if not host.is_contiguous():
        # A TPU array's host copy may come in the memory order of its device layout (a
        # compiled program's result): the tensor's strides describe row-major memory.
        host = host.contiguous()
    stride = t.stride()
    # (A row-major tensor's strides of size-1 dimensions are free: keep the tensor's.)
    return host if host.stride() == stride else host.as_strided(t.shape, stride)


def bytes_as(flat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A flat host storage's bytes as `dtype` elements (a dtype view's reading of it); a
    tail too short for one element (3 bytes under an int32 view) is no part of any."""
    data = flat.view(torch.uint8)
    return data[: data.numel() - data.numel() % dtype.itemsize].view(dtype)


def is_whole_storage(t: torch.Tensor) -> bool:
    """Whether `t` is its storage's only view, element for element: `to_host(t)` is then
    a tensor of its own (no larger storage behind it), which `.cpu()` may return as is."""
    entry = entry_of(t)
    return (t.dtype == entry.dtype and t.storage_offset() == 0 and t.numel() == entry.numel
            and not t.is_conj() and not t.is_neg())


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with `t`'s value, sizes and strides."""
    entry = entry_of(t)
    flat = storage_to_host(entry)
    if t.dtype != entry.dtype:
        flat = bytes_as(flat, t.dtype)
    host = flat.as_strided(t.shape, t.stride(), t.storage_offset())
    # Lazy conjugation and negation are bits of the tensor, not of its storage.
    if t.is_conj():
        host = host.conj()
    if t.is_neg():
        host = torch._neg_view(host)
    return host


def upload(host: torch.Tensor, index: int, wait: bool = True, shape: tuple | None = None):
    """A device buffer with `host`'s elements in row-major order, of `shape` (flat when
    None), a copy: the host tensor stays free.
    Off XLA:CPU the bytes are staged during the call and the transfer is not waited for,
    except that with `wait=True` (not a non_blocking copy) more than 64 MB are read by the
    transfer from `host` directly and are on the device on return (Client.to_device)."""
    flat = host.detach().contiguous().reshape(-1 if shape is None else shape)
    return client().to_device(flat, index, copy=True, wait=wait)


def write_host_value(t: torch.Tensor, value: torch.Tensor) -> None:
    """Writes `value` (CPU) into the tpu tensor `t`, which may be any view: the storage
    is rebound to a new buffer holding its old elements with `t`'s replaced. A tensor
    covering its storage row-major gives the buffer its shape; any other write keeps the
    storage's shape."""
    entry = entry_of(t)
    covers = (
        t.dtype == entry.dtype and t.storage_offset() == 0 and t.numel() == entry.numel
        and t.is_contiguous()
    )
    if covers:
        flat = value.to(t.dtype).expand(t.shape).contiguous().reshape(-1)
        shape = tuple(t.shape)
    else:
        flat = storage_to_host(entry)
        target = flat if t.dtype == entry.dtype else bytes_as(flat, t.dtype)
        target.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(value)
        shape = entry.shape
    entry.buffer = upload(flat, entry.device_index, shape=shape)


def from_host(host: torch.Tensor, index: int, wait: bool = True) -> torch.Tensor:
    """A new tpu tensor with `host`'s value, sizes and (dense) strides."""
    if host.is_contiguous() and not host.is_conj() and not host.is_neg():
        # Row-major (most uploads): the host memory as it is is the buffer, of the
        # tensor's shape -- one transfer, no view or reshape on the way.
        if not _op_kernels_ready:
            ensure_op_kernels()
        buffer = client().to_device(host, index, copy=True, wait=wait)
        return new_tensor(buffer, host.numel(), list(host.shape), list(host.stride()), host.dtype, index,
                          shape=buffer.shape)
    host = host.detach()
    size, stride = tuple(host.shape), tuple(host.stride())
    from torch_tpu.compiler.lowering.storage_layout import dense_order

    if dense_order(size, stride) is None or host.storage_offset() != 0 or host.is_neg() or host.is_conj():
        host = host.resolve_conj().resolve_neg().contiguous()
        stride = contiguous_stride(size)
    # Storage order of a dense layout: permute to memory order; the buffer has that shape.
    order = dense_order(size, stride) if size else []
    flat = host.permute(order).reshape(-1) if order else host.reshape(-1)
    return from_buffer(upload(flat, index, wait, stored_shape(size, stride)), size, stride, host.dtype, index)
