"""`UntypedStorage.resize_` for tpu storages (FSDP2 frees and re-allocates its unsharded
parameters with `storage.resize_(0)` / `storage.resize_(nbytes)`).

PyTorch 2.13 sends a PrivateUse1 storage resize to the C++ hook
`PrivateUse1HooksInterface::resizePrivateUse1Bytes` (THPStorage_resize_ in
torch/csrc/StorageMethods.cpp); the Python hooks class `torch._C._acc.PrivateUse1Hooks`
exposes only is_available / has_primary_context / is_built, so from Python that call
always fails (NotImplementedError: "... implement `resizePrivateUse1Bytes` at the same
time for PrivateUse1"). No aten op sits on that
path (it is a Python method of the storage object, not a dispatcher op), so the one
place to intercept it is the method itself: `install()` puts a Python `resize_` on
`torch.UntypedStorage` that handles tpu storages and hands every other device to
PyTorch's own method unchanged.

The resize itself keeps the storage object (every tensor viewing it keeps viewing it,
as FSDP2 needs) and swaps in a new data pointer of the new size with
`StorageBase._swap_data_ptr_` (which moves data pointer and byte count between two
storages when one of them is empty); the buffer table rebinds the storage to a new
entry of the new size (_buffers.BufferTable.resize)."""

from __future__ import annotations

import torch

_pytorch_resize = torch.UntypedStorage.resize_


def resize_(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
    if self.device.type != "tpu":
        return _pytorch_resize(self, size)
    resize_tpu_storage(self, int(size))
    return self


def resize_tpu_storage(storage: torch.UntypedStorage, nbytes: int) -> None:
    """Resizes `storage` in place to `nbytes` bytes, like PyTorch's CPU storage resize: the
    first min(old, new) bytes keep their value, the rest are uninitialised (zeros here),
    and size 0 frees the device buffer."""
    from ._buffers import TABLE, StorageEntry
    from ._storage import storage_to_host, upload

    if nbytes < 0:
        raise RuntimeError(f"torch_tpu: UntypedStorage.resize_({nbytes}): the size must be non-negative")
    old = TABLE.entry(storage.data_ptr())
    if nbytes == old.nbytes:
        return
    dtype = old.dtype
    if nbytes % dtype.itemsize:
        # The buffer table keeps a storage's elements in the dtype it was created with.
        dtype = torch.uint8
    numel = nbytes // dtype.itemsize
    buffer = None  # an uninitialised storage: zeros when first read
    keep = min(old.nbytes, nbytes)
    if keep and old._buffer is not None:
        host = storage_to_host(old).view(torch.uint8)[:keep]
        grown = torch.zeros(nbytes, dtype=torch.uint8)
        grown[:keep] = host
        buffer = upload(grown.view(dtype), old.device_index)
    TABLE.resize(storage, StorageEntry(dtype, numel, old.device_index, buffer))


def install() -> None:
    torch.UntypedStorage.resize_ = resize_
