"""Device buffers and the host <-> device rules.

Host -> device (`host_array`): a torch tensor is viewed as a NumPy array (no copy) and
handed to PjRT with an explicit abstract value (see `_jaxlib` for why not DLPack
import: that entry point makes jaxlib import jax). On XLA:CPU the device buffer then
*aliases* the tensor's memory when the rule allows it, else PjRT copies:

    zero-copy  iff  platform is cpu, the tensor is contiguous, its data is 64-byte
                    aligned, and the argument is not donated
    otherwise       one copy (a non-contiguous tensor is made contiguous first, and that
                    fresh, aligned copy is the one aliased)

Device -> host (`DeviceBuffer.to_torch` / `to_numpy`):

    XLA:CPU         DLPack, zero-copy: the tensor shares the buffer's memory and keeps it alive
    TPU, GPU        PjRT's host copy (`host_tensor`): a TPU buffer has no host memory to
                    share, so DLPack export is a CPU-only shortcut, never a transfer.
                    `start_host_copy()` enqueues the copy early (non_blocking copies, the
                    outputs of a call read later); the read waits for it.
"""

from __future__ import annotations

import ctypes
import sys
import warnings
from typing import Any

import numpy as np

from . import _jaxlib, dtypes
from .errors import ArgumentError, BufferDeletedError

ALIGNMENT = 64


def _torch_module() -> Any:
    return sys.modules.get("torch")


def is_torch_tensor(value: Any) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(value, torch.Tensor)


def torch_to_numpy(t: Any, row: dtypes.ElementType) -> tuple[np.ndarray, bool]:
    """A NumPy view of a torch tensor's data (copying only when the tensor is not a plain
    contiguous CPU tensor), and whether that memory may be aliased (64-byte aligned)."""
    if not t.is_cpu or t.requires_grad or not t.is_contiguous() or t.is_neg() or t.is_conj():
        t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    view = row.torch_view_as
    host = t.numpy() if view is None else t.view(getattr(_torch_module(), view)).numpy().view(row.numpy)
    return host, (t.data_ptr() & (ALIGNMENT - 1)) == 0


def numpy_host(a: np.ndarray) -> tuple[np.ndarray, bool]:
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a, (a.__array_interface__["data"][0] & (ALIGNMENT - 1)) == 0


def host_view(value: Any) -> tuple[np.ndarray, bool, dtypes.ElementType]:
    """(host array, may alias, element type) of a torch tensor, NumPy array or scalar."""
    if is_torch_tensor(value):
        row = dtypes.from_torch(value.dtype)
        host, aligned = torch_to_numpy(value, row)
        return host, aligned, row
    if isinstance(value, np.ndarray):
        row = dtypes.from_numpy(value.dtype)
        host, aligned = numpy_host(value)
        return host, aligned, row
    if isinstance(value, np.generic):
        a = np.asarray(value)
        return a, False, dtypes.from_numpy(a.dtype)
    raise ArgumentError(
        f"cannot move a {type(value).__module__}.{type(value).__qualname__} to a device: pass a "
        "torch.Tensor, a numpy.ndarray (or NumPy scalar) or a DeviceBuffer; a Python number has "
        "no dtype, wrap it as torch.tensor(x, dtype=...)"
    )


def host_tensor(array: Any, row: dtypes.ElementType, fresh: bool = False) -> Any:
    """A torch tensor over the host copy of a single-device array (TPU, GPU: the copy
    jaxlib made, or makes now, waiting for the value). bf16 and the f8 types come from
    NumPy as ml_dtypes arrays, which torch cannot import: they cross as same-width integers
    and are viewed back (bit-identical). `fresh`: `array` is a handle of its own, read
    this once (`copy_to_host`), so its copy is counted without remembering the array."""
    torch = _torch_module() or __import__("torch")
    host = _jaxlib.host_value(array, fresh)
    view = row.torch_view_as
    if view is not None:
        host = host.view(np.dtype(view))
    if not host.flags.writeable and not _read_only_warned:
        t = _from_read_only(torch, host)
    else:
        t = torch.from_numpy(host)
    return t if view is None else t.view(getattr(torch, row.torch_name))


# Whether PyTorch's warning about a read-only NumPy array was given (silenced) already.
_read_only_warned = False


def _from_read_only(torch: Any, host: np.ndarray) -> Any:
    """`torch.from_numpy` of a host copy jaxlib marks read-only (it caches it on its
    array). Torch tensors have no read-only flag, and its warning about that would only
    confuse (whoever must not share the copy clones it): it is silenced. PyTorch gives it
    once per process (TORCH_WARN_ONCE), so only the first call needs the filter, which
    costs more than the rest of a small read (~4 us)."""
    global _read_only_warned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(host)
    _read_only_warned = True
    return t


def _own_copy(shared: Any) -> Any:
    """A copy of a contiguous CPU tensor in memory of its own, made by one thread (one
    memmove of its bytes, the GIL released). `Tensor.clone()` splits a copy of a few MB
    across PyTorch's OpenMP threads: on a 2-core machine shared with other processes,
    `.cpu()` of a 4 MB result took 27 ms of wall and 11 ms of CPU time that way (threads
    waiting for each other at the region's end), 0.8 ms with one thread -- more than the
    fused program that made the value (bench/fused.py, (a)). (A NumPy copy through uint8
    views of both tensors cost ~10 us more per call than the memmove.)"""
    torch = _torch_module() or __import__("torch")
    # PyTorch's allocator: 64-byte aligned, as a clone's memory.
    own = torch.empty_like(shared, memory_format=torch.contiguous_format)
    if shared.numel():
        ctypes.memmove(own.data_ptr(), shared.data_ptr(), shared.nbytes)
    return own


class DeviceBuffer:
    """One array on one device. Execution is asynchronous: a buffer returned by
    `Executable.execute` may still be being computed; `synchronize()` waits for it,
    `to_torch()` / `to_numpy()` wait implicitly."""

    __slots__ = ("__weakref__", "_array", "_exported", "_row", "device", "shape")

    def __init__(self, array: Any, shape: tuple[int, ...], row: dtypes.ElementType, device: Any) -> None:
        self._array = array
        self.shape = shape
        self._row = row
        self.device = device
        self._exported = False

    # -- description ------------------------------------------------------------------------

    @property
    def dtype(self) -> Any:
        """The torch dtype (imports torch)."""
        return dtypes.torch_dtype(self._row)

    @property
    def np_dtype(self) -> np.dtype:
        return self._row.numpy

    @property
    def element_type(self) -> str:
        """StableHLO spelling of the element type (`f32`, `bf16`, `i1` ...)."""
        return self._row.mlir

    @property
    def type_string(self) -> str:
        return dtypes.type_string(self.shape, self._row.numpy)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self._row.itemsize

    def __repr__(self) -> str:
        state = "deleted" if self.is_deleted else ("ready" if _jaxlib.array_is_ready(self._array) else "pending")
        return f"DeviceBuffer({self.type_string}, device={self.device}, {state})"

    # -- state ------------------------------------------------------------------------------

    @property
    def is_deleted(self) -> bool:
        return _jaxlib.array_is_deleted(self._array)

    def _check_alive(self, what: str) -> None:
        if _jaxlib.array_is_deleted(self._array):
            raise BufferDeletedError(
                f"cannot {what} {self.type_string} on {self.device}: the buffer was deleted, or "
                "donated to an executable that reused its memory for an output; use that "
                "output instead, or compile without donating this argument"
            )

    def is_ready(self) -> bool:
        self._check_alive("query")
        return _jaxlib.array_is_ready(self._array)

    def synchronize(self) -> DeviceBuffer:
        """Blocks until the buffer's value is computed; raises if its computation failed."""
        self._check_alive("synchronize")
        try:
            _jaxlib.array_block_until_ready(self._array)
        except _jaxlib.JaxRuntimeError as err:
            from .errors import classify_jaxlib_error

            raise classify_jaxlib_error(err, f"computing {self.type_string} on {self.device}", "see the error above") from None
        return self

    def copy(self) -> DeviceBuffer:
        """A new buffer with this one's value, on the same device (a device-side copy,
        enqueued without waiting): what to pass where a program donates its argument and
        this buffer must survive the call."""
        self._check_alive("copy")
        copied = _jaxlib.array_copy(self._array, self.device._raw, self.device._sharding)
        return DeviceBuffer(copied, self.shape, self._row, self.device)

    def unsafe_data_pointer(self) -> int:
        """The address of the buffer's memory on its device (waits for the value); for
        checking that a donated buffer's memory was reused, never for reading it."""
        self._check_alive("query")
        return _jaxlib.data_pointer(self._array)

    def delete(self) -> None:
        """Frees the device memory now (tensors already made by to_torch keep theirs alive)."""
        if not _jaxlib.array_is_deleted(self._array):
            _jaxlib.array_delete(self._array)

    # -- to host ----------------------------------------------------------------------------

    @property
    def shares_host_memory(self) -> bool:
        """Whether `to_torch` / `to_numpy` alias this buffer (XLA:CPU) instead of copying."""
        return self.device.platform == "cpu"

    def start_host_copy(self) -> DeviceBuffer:
        """Enqueues the copy of the value to the host without waiting (TPU, GPU; nothing
        to do on XLA:CPU, whose buffers are host memory): a later `to_torch` / `to_numpy`
        then finds it done or under way."""
        self._check_alive("read")
        if self.device.platform != "cpu":
            try:
                _jaxlib.start_host_copy(self._array)
            except _jaxlib.JaxRuntimeError as err:
                raise self._read_failed(err) from None
        return self

    def _read_failed(self, err: Exception) -> Exception:
        from .errors import classify_jaxlib_error

        return classify_jaxlib_error(err, f"copying {self.type_string} from {self.device} to the host",
                                     "see the error above")

    def to_torch(self) -> Any:
        """A torch tensor of the value. XLA:CPU: by DLPack, zero-copy (it shares this
        buffer's memory and keeps it alive); TPU, GPU: a host copy (made once per buffer
        and shared by later reads: clone it before writing into it where that matters).
        Waits for the value."""
        self._check_alive("read")
        import torch

        try:
            if self.device.platform == "cpu":
                self._exported = True  # shares the memory: a donation must copy it first
                return torch.from_dlpack(_jaxlib.buffer_to_dlpack(self._array))
            return host_tensor(self._array, self._row)
        except _jaxlib.JaxRuntimeError as err:
            raise self._read_failed(err) from None

    def copy_to_host(self) -> Any:
        """A torch tensor with the value in host memory of its own, which the caller may
        write: one copy on every platform (XLA:CPU: a clone of the shared memory; TPU, GPU:
        the transfer itself, read through a fresh handle of the buffer so that no other
        reader shares that host copy). Waits for the value."""
        self._check_alive("read")
        if self.device.platform == "cpu":
            return _own_copy(self.to_torch())
        try:
            return host_tensor(_jaxlib.array_clone(self._array), self._row, fresh=True)
        except _jaxlib.JaxRuntimeError as err:
            raise self._read_failed(err) from None

    def to_numpy(self) -> np.ndarray:
        """A read-only NumPy array of the value (zero-copy on CPU, a host copy elsewhere).
        Waits for the value."""
        self._check_alive("read")
        try:
            if self.device.platform == "cpu":
                self._exported = True
                return _jaxlib.to_numpy(self._array, self._row.numpy)
            return _jaxlib.host_value(self._array)
        except _jaxlib.JaxRuntimeError as err:
            raise self._read_failed(err) from None
