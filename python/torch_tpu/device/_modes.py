"""Eager modes of the tpu device.

STRICT (default): ops are enqueued and the host runs ahead, as on CUDA; it waits only
where a value is needed on the host (`.cpu()`, `.item()`, `print`, `torch.tpu.synchronize()`).
DEBUG: every op waits for its results, so a failure is raised at the Python line of the
op that failed (`TPU_LAUNCH_BLOCKING=1`, or `set_eager_mode(EagerMode.DEBUG)`).
FUSED (`_fused.py`): ops are recorded and each flush point (a host read, `synchronize`,
leaving FUSED mode) runs the recorded ops as one fused program
(`TORCH_TPU_DEFER_AND_FUSE=1`, or `set_eager_mode(EagerMode.FUSED)`)."""

from __future__ import annotations

import contextlib
import enum
import threading

from torch_tpu.core import config

from . import _gc_policy


class EagerMode(enum.Enum):
    """How the eager tpu device runs ops: STRICT (asynchronous, the default), DEBUG (each
    op waits for its result), FUSED (recorded, run as one fused program at each flush)."""

    STRICT = "strict"
    DEBUG = "debug"
    FUSED = "fused"


class _ThreadState(threading.local):
    # A class-level default: reading an unset thread-local attribute with getattr(...,
    # None) builds and discards an AttributeError (~1 us on every op).
    mode: EagerMode | None = None


_state = _ThreadState()


def _default() -> EagerMode:
    if config.get("TORCH_TPU_DEFER_AND_FUSE"):
        return EagerMode.FUSED
    return EagerMode.DEBUG if config.get("TPU_LAUNCH_BLOCKING") else EagerMode.STRICT


_global: list[EagerMode | None] = [None]


def get_eager_mode() -> EagerMode:
    mode = getattr(_state, "mode", None)
    if mode is not None:
        return mode
    if _global[0] is None:
        _global[0] = _default()
        if _global[0] is EagerMode.FUSED:
            _gc_policy.fused_mode_entered()
    return _global[0]


def _switching(previous: EagerMode, new: EagerMode | None) -> None:
    """Leaving FUSED mode is a flush point: recorded ops run before ops of the new mode.
    While FUSED mode is on, the collector's young generation waits longer (`_gc_policy`)."""
    if previous is EagerMode.FUSED and new is not EagerMode.FUSED:
        from ._fused import flush_all

        flush_all()
        _gc_policy.fused_mode_left()
    elif new is EagerMode.FUSED:
        _gc_policy.fused_mode_entered()


class _ModeScope(contextlib.AbstractContextManager):
    """Returned by set_eager_mode: the mode is set already; used as a context manager it
    restores the previous mode on exit."""

    def __init__(self, previous_thread: EagerMode | None, previous_global: EagerMode | None) -> None:
        self._thread = previous_thread
        self._global = previous_global

    def __exit__(self, *exc) -> None:
        previous = get_eager_mode()
        restored = self._thread if self._thread is not None else (self._global or _default())
        _switching(previous, restored)
        _state.mode = self._thread
        _global[0] = self._global


def set_eager_mode(mode: EagerMode) -> _ModeScope:
    """Sets the eager mode of the process (`set_eager_mode(EagerMode.DEBUG)`), or of a
    block (`with set_eager_mode(EagerMode.DEBUG): ...`)."""
    mode = EagerMode(mode)
    _switching(get_eager_mode(), mode)
    scope = _ModeScope(getattr(_state, "mode", None), _global[0])
    _state.mode = None
    _global[0] = mode
    return scope


def is_blocking() -> bool:
    return get_eager_mode() is EagerMode.DEBUG


def check_alive(entry, *, name_line: bool = True) -> None:
    """Raises BufferDeletedError for a tensor whose buffer was freed or donated; an op's
    caller passes name_line=False (the op's error names the line)."""
    buffer = entry.buffer
    if buffer is not None and buffer.is_deleted:
        from torch_tpu.runtime.errors import BufferDeletedError

        from ._fallback import user_line

        where = f"at {user_line()}, " if name_line else ""
        raise BufferDeletedError(
            f"torch_tpu: {where}a tpu tensor's device buffer was deleted (freed or donated); "
            "recompute the tensor or keep a reference to the one the op returned"
        )
