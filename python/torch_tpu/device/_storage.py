"""tpu tensors over buffer-table storages, and their values on the host.

A tensor is `(storage, offset, size, stride)` like any PyTorch tensor; the view kernels
are PyTorch's own CPU kernels run over our non-owning storages (_registration.py), so
aliasing is exactly PyTorch's. Host transfers move whole storages: a view's value is
read from (or written into) its storage's host copy with `as_strided`."""

from __future__ import annotations

import math

import numpy as np
import torch

from ._buffers import TABLE, StorageEntry, entry_of
from ._device_index import empty_tensor

_SET = torch.ops.aten.set_.source_Storage_storage_offset
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_create_empty = torch._C._acc.create_empty_tensor


def client():
    from torch_tpu.runtime import get_client

    return get_client()


def device_index(device: torch.device | str | int | None) -> int:
    if device is None:
        from .module import current_device

        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.index is not None:
        return device.index
    from .module import current_device

    return current_device()


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


def wrap(entry: StorageEntry, size, stride, offset: int = 0) -> torch.Tensor:
    """A tpu tensor viewing `entry`'s storage."""
    from ._registration import ensure_op_kernels

    ensure_op_kernels()
    storage = TABLE.new_storage(entry)
    return tensor_on(storage, entry.dtype, size, stride, offset)


def tensor_on(storage: torch.UntypedStorage, dtype: torch.dtype, size, stride, offset: int = 0) -> torch.Tensor:
    t = empty_tensor(dtype, storage.device.index)
    # Straight to the CPU kernel of set_ (what our PrivateUse1 kernel for it does): the
    # tensor is new, so the autograd and version-counter keys above have nothing to do,
    # and the Python kernel hop costs ~20 us per op result.
    return _SET.redispatch(_CPU, t, storage, int(offset), list(size), list(stride))


def empty(size, stride, dtype: torch.dtype, index: int) -> torch.Tensor:
    entry = StorageEntry(dtype, storage_numel(size, stride), index)
    return wrap(entry, size, stride)


def from_buffer(buffer, size, stride, dtype: torch.dtype, index: int) -> torch.Tensor:
    entry = StorageEntry(dtype, math.prod(buffer.shape), index, buffer)
    return wrap(entry, size, stride)


def new_tensor(buffer, numel: int, size: list, stride: list, dtype: torch.dtype, index: int,
               contiguous: bool | None = None) -> torch.Tensor:
    """An op's result: a tpu tensor over a new storage holding `buffer` (dense, `numel`
    elements), the op kernels being registered already (the hot path of every op).
    `contiguous`: whether `stride` is `size`'s row-major stride (computed when None)."""
    entry = StorageEntry(dtype, numel, index, buffer)
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
    return _SET.redispatch(_CPU, t, storage, 0, size, stride)


def buffer_of(entry: StorageEntry):
    """The entry's buffer; zeros for a storage never written (`empty` is uninitialised
    memory in PyTorch: zeros are one valid content)."""
    if entry.buffer is None:
        entry.buffer = client().to_device(torch.zeros(entry.numel, dtype=entry.dtype), entry.device_index, copy=True)
    return entry.buffer


def storage_to_host(entry: StorageEntry) -> torch.Tensor:
    """The storage's elements as a new flat CPU tensor (waits for the value)."""
    from ._host_copies import land

    land()  # a blocking read comes after earlier non_blocking ones, as in CUDA's stream order
    if entry.buffer is None:
        return torch.zeros(entry.numel, dtype=entry.dtype)
    from ._modes import check_alive

    check_alive(entry)
    return entry.buffer.copy_to_host()


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


def upload(host: torch.Tensor, index: int, wait: bool = True):
    """A flat device buffer with `host`'s elements (a copy: the host tensor stays free).
    `wait=False` (a non_blocking copy): off XLA:CPU, the bytes are staged during the call
    and the transfer is not waited for; else the transfer reads `host` directly and is
    done on return (Client.to_device)."""
    flat = host.detach().contiguous().reshape(-1)
    return client().to_device(flat, index, copy=True, wait=wait)


def write_host_value(t: torch.Tensor, value: torch.Tensor) -> None:
    """Writes `value` (CPU) into the tpu tensor `t`, which may be any view: the storage
    is rebound to a new buffer holding its old elements with `t`'s replaced."""
    entry = entry_of(t)
    covers = (
        t.dtype == entry.dtype and t.storage_offset() == 0 and t.numel() == entry.numel
        and t.is_contiguous()
    )
    if covers:
        flat = value.to(t.dtype).expand(t.shape).contiguous().reshape(-1)
    else:
        flat = storage_to_host(entry)
        target = flat if t.dtype == entry.dtype else bytes_as(flat, t.dtype)
        target.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(value)
    entry.buffer = upload(flat, entry.device_index)


def from_host(host: torch.Tensor, index: int, wait: bool = True) -> torch.Tensor:
    """A new tpu tensor with `host`'s value, sizes and (dense) strides."""
    host = host.detach()
    size, stride = tuple(host.shape), tuple(host.stride())
    from torch_tpu.compiler.lowering.storage_layout import dense_order

    if dense_order(size, stride) is None or host.storage_offset() != 0 or host.is_neg() or host.is_conj():
        host = host.resolve_conj().resolve_neg().contiguous()
        stride = contiguous_stride(size)
    # Storage order of a dense layout: permute to memory order, then flatten.
    order = dense_order(size, stride) if size else []
    flat = host.permute(order).reshape(-1) if order else host.reshape(-1)
    return from_buffer(upload(flat, index, wait), size, stride, host.dtype, index)
