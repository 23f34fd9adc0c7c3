"""Untyped tpu storages: `torch.UntypedStorage(n, device="tpu")` and `torch.load` of
tensors saved from tpu (no `map_location`).

PyTorch builds such a storage through the device's C++ allocator, which a Python
backend does not have (the constructor would crash). The constructor is intercepted
for tpu: the storage is a buffer-table entry of `n` bytes (uint8 elements). `torch.load`
then copies the file's bytes into it and views it with the saved dtype through `set_`;
the first typed view *retypes* the entry (same bytes, elements of the viewed dtype), so
the loaded tensor's ops run on the device rather than as byte reinterpretations."""

from __future__ import annotations

import weakref

import torch

from ._buffers import TABLE, StorageEntry

# Entries created untyped (bytes) and not yet viewed with a dtype.
_UNTYPED: "weakref.WeakSet[StorageEntry]" = weakref.WeakSet()
_construct = torch.UntypedStorage.__new__


def _new_untyped_storage(cls, *args, device=None, **kwargs):
    if device is None or torch.device(device).type != "tpu":
        if device is not None:
            kwargs["device"] = device
        return _construct(cls, *args, **kwargs)
    from . import _storage

    index = _storage.device_index(device)
    if kwargs or len(args) > 1:
        raise TypeError(f"torch_tpu: torch.UntypedStorage(..., device='tpu') takes a size or a sequence of "
                        f"bytes, got arguments {args} {kwargs}")
    if not args:
        data = torch.empty(0, dtype=torch.uint8)
    elif isinstance(args[0], int):
        data = None
        nbytes = args[0]
    else:
        data = torch.tensor(list(args[0]), dtype=torch.uint8)
    entry = StorageEntry(torch.uint8, nbytes if data is None else data.numel(), index)
    if data is not None:
        entry.buffer = _storage.upload(data, index)
    _UNTYPED.add(entry)
    return TABLE.new_storage(entry)


def install() -> None:
    """Routes tpu UntypedStorage construction here (idempotent)."""
    if torch.UntypedStorage.__new__ is not _new_untyped_storage:
        torch.UntypedStorage.__new__ = _new_untyped_storage


def retype(storage: torch.UntypedStorage, dtype: torch.dtype) -> None:
    """Before a tensor of `dtype` views an untyped tpu storage: its entry becomes one of
    `dtype` elements (the same bytes)."""
    try:
        entry = TABLE.entry(storage.data_ptr())
    except RuntimeError:  # not a buffer-table storage: PyTorch's set_ reports it
        return
    if entry not in _UNTYPED or dtype == torch.uint8 or entry.nbytes % dtype.itemsize:
        return
    from . import _storage

    _UNTYPED.discard(entry)
    host = _storage.storage_to_host(entry).view(dtype)
    entry.dtype, entry.numel = dtype, host.numel()
    entry.buffer = _storage.upload(host, entry.device_index)
