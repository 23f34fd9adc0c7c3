"""Device -> host copies with `non_blocking=True` (`x.to("cpu", non_blocking=True)`,
`cpu_t.copy_(x, non_blocking=True)`), asynchronous as on CUDA: the call returns a CPU tensor
(or the destination) at once, without waiting for the device; its data lands later, and is
valid after `torch.tpu.synchronize()`, an `Event`'s `synchronize()` (or a `query()` that
returns True) recorded after the copy, or any blocking read of a tpu value (`.cpu()`,
`.item()`, as CUDA's stream order gives). Reading it before that may see old data
(CUDA's contract) -- unless the source value was computed already when the copy was
called: such a copy lands at once, as a CUDA copy on an idle stream completes.

Each copy is a job holding the destination tensor and the source's DeviceBuffer -- the
value the source had when the copy was called: an in-place op on the source later rebinds
its storage to a new buffer (and cannot donate this one while the job holds it), so it
never changes what the copy reads. Jobs land, in order, at those synchronization points,
on the thread that synchronizes: no worker thread (a thread per copy cost ~1 ms of GIL
hand-offs per call on a loaded host, four times a blocking copy), and the device computes
the value meanwhile. At most `_MAX_PENDING` jobs wait: beyond, the oldest lands.

A copy *from* a CPU tensor still awaiting a job (`y.to("tpu")` right after
`y = x.to("cpu", non_blocking=True)`) lands the jobs first: CUDA's stream order."""

from __future__ import annotations

import threading
from typing import Any

import torch

_MAX_PENDING = 256
_lock = threading.RLock()


class _Job:
    """One copy: the destination, the source's buffer at the call and how to read the
    source's elements from it (dtype, sizes, strides, offset, lazy conj/neg bits)."""

    __slots__ = ("dst", "buffer", "storage_dtype", "layout", "address", "number")

    def __init__(self, dst: torch.Tensor, buffer: Any, storage_dtype: torch.dtype, layout: tuple) -> None:
        global _enqueued
        self.dst = dst
        self.buffer = buffer
        self.storage_dtype = storage_dtype
        self.layout = layout
        self.address = dst.untyped_storage().data_ptr()
        _enqueued += 1
        self.number = _enqueued


_pending: list[_Job] = []
# Jobs are numbered as enqueued and land in that order, so a synchronization point is one
# number (`snapshot`): an Event holds no job, hence no destination and no device buffer
# (which would keep the source's old buffer from being donated while the Event lives).
_enqueued = 0


def _land(job: _Job) -> None:
    """Waits for the job's source value and copies it into the destination."""
    from ._storage import bytes_as

    dtype, size, stride, offset, conj, neg = job.layout
    job.buffer.synchronize()
    flat = job.buffer.to_torch().reshape(-1)  # (a shaped storage's buffer: dense, so a view)
    if dtype != job.storage_dtype:
        flat = bytes_as(flat, dtype)
    value = flat.as_strided(size, stride, offset)
    if conj:
        value = value.conj()
    if neg:
        value = torch._neg_view(value)
    with torch.no_grad():  # the user's copy_ went through autograd already
        job.dst.copy_(value)


def enqueue(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copies the tpu tensor `src` into the CPU tensor `dst` (same shape) without waiting:
    the source's current buffer is taken now (a FUSED trace pending on it is flushed, so
    its program is enqueued)."""
    from ._modes import check_alive
    from ._storage import entry_of

    entry = entry_of(src)
    buffer = entry.buffer
    if buffer is None:  # never written: zeros (PyTorch's uninitialised memory)
        with torch.no_grad():
            dst.copy_(torch.zeros((), dtype=src.dtype).expand(src.shape))
        return
    check_alive(entry)
    # On a TPU the copy to host memory starts now, behind the work computing the value,
    # so landing finds it done or under way (a no-op on XLA:CPU, which shares memory).
    buffer.start_host_copy()
    layout = (src.dtype, tuple(src.shape), tuple(src.stride()), src.storage_offset(), src.is_conj(), src.is_neg())
    with _lock:
        _pending.append(_Job(dst, buffer, entry.dtype, layout))
        if len(_pending) > _MAX_PENDING:
            _land_first()
        # A value the device has computed already lands now, as a CUDA copy on an idle
        # stream completes at once: only copies of values still being computed wait for a
        # synchronization point (reading one before that is the caller's race, as on CUDA).
        while _pending and _computed(_pending[0]):
            _land_first()


def _computed(job: _Job) -> bool:
    """Whether the device has computed the job's source value (never waits)."""
    return job.buffer.is_ready()


def snapshot() -> int:
    """The number of the last job enqueued so far (what an Event recorded now waits for)."""
    return _enqueued


def land(upto: int | None = None) -> None:
    """Lands the jobs numbered up to `upto` (every pending job when None), in order; a
    device failure is raised here, as CUDA reports an asynchronous error at the
    synchronization point."""
    if not _pending:
        return
    with _lock:
        last = sum(1 for job in _pending if upto is None or job.number <= upto)
        batch = _pending[:last]
        del _pending[:last]
        for k, job in enumerate(batch):
            try:
                _land(job)
            except Exception as err:
                _pending[:0] = batch[k + 1:]  # the rest still land at the next point
                raise _failed(err) from err


def _land_first() -> None:
    job = _pending.pop(0)
    try:
        _land(job)
    except Exception as err:
        raise _failed(err) from err


def _failed(err: Exception) -> RuntimeError:
    return RuntimeError(
        f"torch_tpu: a non_blocking copy to the host failed, reported at this synchronization point: {err} "
        "-- run in Debug mode (TPU_LAUNCH_BLOCKING=1) to raise it at the op that computed the value")


def land_ready(upto: int) -> bool:
    """Lands, in order, the leading jobs whose values the device has computed (never
    waits); whether every job numbered up to `upto` has landed (Event.query)."""
    with _lock:
        while _pending and _computed(_pending[0]):
            _land_first()
        return not _pending or _pending[0].number > upto


def land_into(t: torch.Tensor) -> None:
    """Before a copy reads the CPU tensor `t`: lands the jobs writing its memory."""
    if not _pending:
        return
    address = t.untyped_storage().data_ptr()
    with _lock:
        writing = [job.number for job in _pending if job.address == address]
        if writing:
            land(max(writing))
