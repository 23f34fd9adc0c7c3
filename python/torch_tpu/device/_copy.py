"""Moving values between CPU and tpu tensors: `copy_` (both directions, one
PrivateUse1 kernel: PyTorch dispatches a copy with any tpu argument here), `_to_copy`
(which receives the CPU tensor of `.to("tpu")`), `_local_scalar_dense` (`.item()`)."""

from __future__ import annotations

import torch

from . import _ops, _storage
from ._storage import from_host, to_host, write_host_value

aten = torch.ops.aten


def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    # non_blocking: host->device copies are already enqueued asynchronously and
    # device->host copies must wait for the value; the flag changes nothing observable.
    if self.device.type == "tpu" and src.device.type == "tpu":
        if (self.device.index or 0) == (src.device.index or 0) and not (src.is_conj() or src.is_neg()):
            try:
                return _ops.run(aten.copy_.default, (self, src), {})
            except _ops.Unlowerable:
                pass
        write_host_value(self, to_host(src))
        return self
    if self.device.type == "tpu":
        write_host_value(self, src)
        return self
    self.copy_(to_host(src))
    return self


def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    dtype = dtype or self.dtype
    target = torch.device(device) if device is not None else self.device
    memory_format = memory_format or torch.preserve_format
    if target.type == "tpu" and self.device.type == "tpu" and _storage.device_index(target) == self.device.index:
        try:
            return _ops.run(aten._to_copy.default, (self,), {"dtype": dtype, "memory_format": memory_format})
        except _ops.Unlowerable:
            pass
    host = to_host(self) if self.device.type == "tpu" else self
    host = host.to(dtype=dtype, memory_format=memory_format, copy=True)
    if target.type == "tpu":
        return from_host(host, _storage.device_index(target))
    return host.to(target)


def _copy_from_and_resize(self, dst):
    dst.resize_(self.shape)
    return dst.copy_(self)


def _local_scalar_dense(self):
    return to_host(self).item()


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
    new = _storage.from_buffer(_storage.upload(grown, entry.device_index), (needed,), (1,), entry.dtype, entry.device_index)
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
