"""Moving values between CPU and tpu tensors: `copy_` (both directions, one
PrivateUse1 kernel: PyTorch dispatches a copy with any tpu argument here), `_to_copy`
(which receives the CPU tensor of `.to("tpu")`), `_local_scalar_dense` (`.item()`) and
`equal` (a comparison on the device whose one boolean is read like `.item()`).

`non_blocking=True`: host -> device copies never wait for the device (the source is read
during the call, so changing it afterwards is safe; the transfer and the write are
enqueued); device -> host copies return at once and land later (`_host_copies.py`)."""

from __future__ import annotations

import math

import torch

from torch_tpu.runtime.buffer import DeviceBuffer

from . import _host_copies, _ops, _storage
from ._modes import EagerMode, get_eager_mode, is_blocking
from ._storage import from_host, to_host, write_host_value

aten = torch.ops.aten


def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if self.device.type == "tpu" and src.device.type == "tpu":
        if self.device.index == src.device.index and not (src.is_conj() or src.is_neg()):
            if _shares_buffer(self, src):
                return self
            try:
                return _ops.run(aten.copy_.default, (self, src), {})
            except _ops.Unlowerable:
                pass
        _from_host_into(self, to_host(src))  # another device, or lazy conj/neg bits
        return self
    if self.device.type == "tpu":
        _from_host_into(self, src)
        return self
    if non_blocking and not is_blocking():
        _host_copies.enqueue(self, src)
        return self
    self.copy_(to_host(src))
    return self


def _shares_buffer(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """A copy of a whole dense value onto a tensor that covers its storage (same dtype and
    shape, no broadcast): `dst`'s storage takes `src`'s buffer, with no program. This is
    how a compiled graph's updated inputs come back (aot_autograd's epilogue `copy_`s
    each new parameter, optimizer state or KV cache into its input), so a training step
    or a decode step is one program, not one more per updated tensor.

    Device buffers are values (a write rebinds a storage to a new buffer), and an
    in-place op donates a buffer only when nothing else holds it (`_ops._donation_safe`),
    so the two storages stay independent after sharing one buffer. Not in FUSED mode,
    where the copy is recorded in order with the trace's other ops, nor while either
    value is a trace's pending one."""
    # The cheapest checks first: aot_autograd's epilogue makes one such copy per updated
    # input on every call of a compiled step.
    if dst.dtype != src.dtype or dst.shape != src.shape:
        return False
    target, source = _storage.entry_of(dst), _storage.entry_of(src)
    value = source._buffer
    if value.__class__ is not DeviceBuffer or (target._buffer is not None
                                              and target._buffer.__class__ is not DeviceBuffer):
        return False
    # `src` is its storage's buffer as it is (`_storage.layout_passes_as_is`); `dst` covers
    # its storage row-major, so the buffer, of `dst`'s shape, can be its storage's.
    if (src.dtype != source.dtype or src.storage_offset() != 0 or src.shape != source.shape
            or not src.is_contiguous() or dst.dtype != target.dtype or dst.storage_offset() != 0
            or dst.numel() != target.numel or not dst.is_contiguous() or dst.is_conj() or dst.is_neg()
            or value.is_deleted or get_eager_mode() is EagerMode.FUSED):
        return False
    if target is not source:
        target.buffer = value
    return True


def _from_host_into(self: torch.Tensor, src: torch.Tensor) -> None:
    """Host -> device, blocking or not: `src` is read during the call (so it may change
    right after), the transfer and the write are enqueued. A tensor covering its whole
    storage gets a new buffer; any other view is written on the device by the copy_ op
    (reading the storage back to the host would wait for the device's pending work)."""
    _host_copies.land_into(src)
    entry = _storage.entry_of(self)
    covers = (self.dtype == entry.dtype and self.storage_offset() == 0 and self.numel() == entry.numel
              and self.is_contiguous())
    if not covers and not (self.is_conj() or self.is_neg()):
        staged = from_host(src, entry.device_index)
        try:
            _ops.run(aten.copy_.default, (self, staged), {})
            return
        except _ops.Unlowerable:
            pass
    write_host_value(self, src)


def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    target = self.device if device is None else device if device.__class__ is torch.device else torch.device(device)
    if (dtype is None or dtype == self.dtype) and (memory_format is None or memory_format is torch.preserve_format):
        # The common transfers, value and layout as they are: `.to("tpu")` uploads the
        # host memory itself, and `.cpu()` of a tensor that is its storage's buffer is
        # that buffer's host copy.
        here, there = self.device.type, target.type
        if here == "cpu" and there == "tpu":
            _host_copies.land_into(self)
            return from_host(self, _storage.device_index(target), wait=not non_blocking)
        if here == "tpu" and there == "cpu" and not (non_blocking and not is_blocking()):
            host = _storage.host_copy_as_is(self)
            if host is not None:
                return host
    dtype = dtype or self.dtype
    memory_format = memory_format or torch.preserve_format
    if target.type == "tpu" and self.device.type == "tpu" and _storage.device_index(target) == self.device.index:
        try:
            return _ops.run(aten._to_copy.default, (self,), {"dtype": dtype, "memory_format": memory_format})
        except _ops.Unlowerable:
            pass
    if self.device.type == "tpu" and target.type == "cpu" and non_blocking and not is_blocking():
        host = _host_like(self, dtype, memory_format)
        _host_copies.enqueue(host, self)
        return host
    if self.device.type == "tpu":
        host = to_host(self)
        # The storage's host copy is new memory: a view covering all of it is returned as
        # it is (one transfer, no second copy), unless the dtype or layout changes.
        fresh = _storage.is_whole_storage(self)
    else:
        _host_copies.land_into(self)
        host = self
        fresh = False
    # Towards the device no host copy is needed: the upload reads `host` during the call
    # (or until its transfer is done, before returning), so the source may change afterwards.
    host = host.to(dtype=dtype, memory_format=memory_format, copy=target.type == "cpu" and not fresh)
    if target.type == "tpu":
        return from_host(host, _storage.device_index(target), wait=not non_blocking)
    return host.to(target)


def _host_like(t: torch.Tensor, dtype: torch.dtype, memory_format) -> torch.Tensor:
    """An uninitialised CPU tensor laid out as `t.to("cpu", dtype, memory_format=...)`'s
    result: preserve_format keeps a dense tensor's strides, and an empty tensor's (as
    CPU's copy does)."""
    from torch_tpu.compiler.lowering.storage_layout import dense_order

    if memory_format is torch.preserve_format and (
            t.numel() == 0 or dense_order(tuple(t.shape), t.stride()) is not None):
        return torch.empty_strided(t.shape, t.stride(), dtype=dtype)
    like = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="meta")  # PyTorch's rule for the rest
    return torch.empty_like(like, device="cpu", memory_format=memory_format)


def _copy_from_and_resize(self, dst):
    dst.resize_(self.shape)
    return dst.copy_(self)


def _local_scalar_dense(self):
    return to_host(self).item()


def equal(self, other) -> bool:
    """torch.equal: the comparison runs on the device; only its one boolean crosses to the
    host, as `.item()` does. Sizes must match exactly (no broadcasting); the dtypes promote
    and NaN equals nothing, as on CPU."""
    if self.shape != other.shape:
        return False
    return bool(_local_scalar_dense(torch.eq(self, other).all()))


def resize_(self, size, memory_format=None):
    size = [int(s) for s in size]
    stride = _storage.contiguous_stride(size)
    needed = _storage.storage_numel(size, stride, self.storage_offset())
    entry = _storage.entry_of(self)
    if needed <= entry.numel and self.dtype == entry.dtype:
        return aten.set_.source_Storage_storage_offset(self, self.untyped_storage(), self.storage_offset(), size, stride)
    old = _storage.storage_to_host(entry)
    grown = torch.zeros(needed, dtype=entry.dtype)
    grown[: old.numel()] = old[:needed]
    # The new storage takes the tensor's shape when the tensor covers it (then it passes as is).
    covers = self.storage_offset() == 0 and needed == math.prod(size)
    buffer = _storage.upload(grown, entry.device_index, shape=tuple(size) if covers else None)
    new = _storage.from_buffer(buffer, (needed,), (1,), entry.dtype, entry.device_index)
    return aten.set_.source_Storage_storage_offset(self, new.untyped_storage(), self.storage_offset(), size, stride)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    size = [int(s) for s in size]
    stride = _storage.contiguous_stride(size)
    if memory_format is not None and memory_format not in (torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
    return _storage.empty(size, stride, dtype, _storage.device_index(device))


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    return _storage.empty([int(s) for s in size], [int(s) for s in stride], dtype, _storage.device_index(device))
