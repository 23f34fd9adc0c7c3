"""The buffer table: a tpu tensor's storage is a non-owning PyTorch storage whose
address is a key into this table; the entry holds the runtime `DeviceBuffer` that is the
storage's value, and that buffer's shape (`StorageEntry.shape`).

A storage's buffer is *shaped*: it has the shape of the dense tensor that produced it (an
upload of a [4096, 4096] parameter, an op's or a compiled graph's result), its elements
in the storage's order (a row-major tensor: its own shape; a dense permuted one: its
dimensions in memory order). On a TPU an array has a tiled layout, so a reshape is a copy
in device memory, not a free relabelling: a storage kept flat (1-D) would cost a relayout
program per argument and per result on every call. The tensor that covers its storage in
that shape passes the buffer to programs as it is (`_storage.passes_as_is`); views of any
other shape or stride read it through the flat storage order, inside the program that
uses them. Storages written from the host elsewhere (a resize, a CPU fallback's write
back) may hold a flat buffer: the shape is always the buffer's own.

Addresses are virtual (never dereferenced: every tpu kernel is ours), unique per
storage, 64-byte aligned. Views share the storage, hence the entry; an in-place op
*rebinds* the entry to its result buffer, so every view sees the write. A storage's
finalizer frees its buffer."""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

import torch

from torch_tpu.runtime.buffer import DeviceBuffer

_ALIGN = 64
# Far above any host allocation: a stray dereference faults instead of reading memory.
_BASE = 1 << 46


class Pending:
    """The value of a storage that a recorded op of a FUSED trace (`_fused.py`) will
    compute: it stands in an entry's buffer until the trace is flushed."""

    __slots__ = ("trace", "op", "result")

    def __init__(self, trace: Any, op: int, result: int) -> None:
        self.trace = trace
        self.op = op  # the recorded op's position in the trace
        self.result = result  # which result of its plan


class StorageEntry:
    """One storage: its element dtype, element count, device index, buffer (None until
    first written: `empty` allocates nothing) and the buffer's shape (`shape`: its
    product is `numel`; `(numel,)` for a flat buffer).

    `buffer` is the one way to read the value: while a FUSED trace holds it as `Pending`,
    reading `buffer` flushes the trace first, so no reader can see a stale buffer. Only
    the recorder (`_fused.py`) reads `_buffer`, the raw slot. Setting `buffer` to a
    DeviceBuffer sets `shape` to the buffer's: the two never disagree. A `Pending` value
    has no shape of its own: its entry keeps the shape the recorded op gives it."""

    __slots__ = ("_buffer", "device_index", "dtype", "numel", "nbytes", "shape", "_flat", "__weakref__")

    def __init__(self, dtype: torch.dtype, numel: int, device_index: int, buffer: Any = None,
                 shape: tuple[int, ...] | None = None) -> None:
        self.dtype = dtype
        self.numel = numel
        self.nbytes = numel * dtype.itemsize
        self.device_index = device_index
        self._buffer = buffer
        if shape is None:
            shape = buffer.shape if buffer.__class__ is DeviceBuffer else (numel,)
        self.shape = shape
        # (buffer, its flat 1-D copy) for the readers that need the storage order
        # (`_graph_io.flat_buffer`); valid while `_buffer` is that buffer.
        self._flat: tuple | None = None

    @property
    def buffer(self) -> Any:
        buffer = self._buffer
        if buffer.__class__ is Pending:
            buffer.trace.flush()
            buffer = self._buffer
            if buffer.__class__ is Pending:
                raise RuntimeError(
                    "torch_tpu: internal error: a FUSED-mode value was not computed by its trace's flush; "
                    "run in EagerMode.STRICT and report this to torch_tpu")
        return buffer

    @buffer.setter
    def buffer(self, value: Any) -> None:
        self._buffer = value
        if value.__class__ is DeviceBuffer:
            self.shape = value.shape


class _Watch(weakref.ref):
    """A weak reference to a storage that knows the storage's address: its callback (the
    table's one bound method) frees the address's entry when the storage dies."""

    __slots__ = ("address",)  # set where it is made (no Python __init__: ~0.3 us)


class BufferTable:
    def __init__(self) -> None:
        self._entries: dict[int, StorageEntry] = {}
        self._watch: dict[int, _Watch] = {}  # address -> weak reference to its storage
        # One bound method for every watch (a closure per storage costs an allocation per op).
        self._on_dead = self._free
        self._devices: dict[int, torch.device] = {}
        self._lock = threading.Lock()
        self._next = itertools.count()
        self._cursor = _BASE
        self.allocated_bytes: dict[int, int] = {}
        self.peak_bytes: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def new_storage(self, entry: StorageEntry, into: torch.UntypedStorage | None = None) -> torch.UntypedStorage:
        """A storage at a new address for `entry`. `into`: a new tensor's own storage,
        still empty (no data pointer), that takes the address and size instead (cheaper
        than a `set_` of the tensor onto a new storage: see `_storage.new_tensor`).
        Runs for every op result: one function, no method calls besides PyTorch's."""
        nbytes = entry.nbytes
        index = entry.device_index
        lock = self._lock
        lock.acquire()  # (acquire/release in try/finally: ~2x cheaper than `with`)
        try:
            address = self._cursor
            self._cursor = address + (-(-nbytes // _ALIGN) * _ALIGN or _ALIGN)
            self._entries[address] = entry
            allocated = self.allocated_bytes[index] = self.allocated_bytes.get(index, 0) + nbytes
            if allocated > self.peak_bytes.get(index, 0):
                self.peak_bytes[index] = allocated
        finally:
            lock.release()
        device = self._devices.get(index) or self._device(index)
        storage = torch._C._construct_storage_from_data_pointer(address, device, nbytes)
        if into is not None:
            # Moves the pointer and byte count into `into`; the constructed storage is left
            # empty and dies here. `into` is the one watched.
            into._swap_data_ptr_(storage)
            storage = into
        watch = self._watch[address] = _Watch(storage, self._on_dead)
        watch.address = address
        return storage

    def resize(self, storage: torch.UntypedStorage, entry: StorageEntry) -> None:
        """Rebinds `storage` (kept as an object: its views stay its views) to `entry`, of
        another size, at a new address of that size; the old entry's buffer is freed."""
        old_address = storage.data_ptr()
        with self._lock:
            address = self._cursor
            self._cursor += max(_ALIGN, -(-entry.nbytes // _ALIGN) * _ALIGN)
            old = self._entries.pop(old_address)
            self._watch.pop(old_address, None)  # dropping the reference drops its callback
            self._entries[address] = entry
            index = entry.device_index
            self.allocated_bytes[index] += entry.nbytes - old.nbytes
            self.peak_bytes[index] = max(self.peak_bytes.get(index, 0), self.allocated_bytes[index])
        device = self._device(entry.device_index)
        # _swap_data_ptr_ moves the data pointer and byte count between two storages when
        # one is empty: empty the storage first, then give it the new pointer and size.
        if storage.nbytes():
            storage._swap_data_ptr_(torch._C._construct_storage_from_data_pointer(address, device, 0))
        storage._swap_data_ptr_(torch._C._construct_storage_from_data_pointer(address, device, entry.nbytes))
        watch = self._watch[address] = _Watch(storage, self._on_dead)
        watch.address = address
        # The old buffer goes with its last reference (a FUSED trace may still read it).

    def _device(self, index: int) -> torch.device:
        device = self._devices.get(index)
        if device is None:
            device = self._devices[index] = torch.device("tpu", index)
        return device

    def _free(self, watch: _Watch) -> None:
        """A watched storage died: its entry goes, and its buffer with it."""
        address = watch.address
        lock = self._lock
        lock.acquire()
        try:
            self._watch.pop(address, None)
            entry = self._entries.pop(address, None)
            if entry is not None:
                self.allocated_bytes[entry.device_index] -= entry.nbytes
        finally:
            lock.release()
        if entry is not None and entry._buffer is not None:
            entry._buffer = None  # the runtime frees the array with its last reference

    def entry(self, address: int) -> StorageEntry:
        entry = self._entries.get(address)
        if entry is None:
            raise RuntimeError(
                "torch_tpu: this tpu tensor's storage is not in the buffer table (it was freed, or "
                "the tensor was built on a storage torch_tpu did not allocate); recreate the tensor"
            )
        return entry

    def reset_peak(self, index: int) -> None:
        with self._lock:
            self.peak_bytes[index] = self.allocated_bytes.get(index, 0)


TABLE = BufferTable()


def entry_of(tensor: torch.Tensor) -> StorageEntry:
    return TABLE.entry(tensor.untyped_storage().data_ptr())
