"""Errors of device ops: a runtime failure (out of memory, an execution error, a deleted
buffer) raised while an op runs is re-raised as the same runtime class, naming the op,
its arguments' dtypes and sizes, and the user's Python line.

In Strict mode an op's launch runs on the launch thread (`runtime/launch_queue.py`): a
launch that fails there is described by `launch_failed` -- the op, the user's line
captured when the op was called, the program's argument types -- and raised at the next
point that waits (a host read, `torch.tpu.synchronize()`, the next op), as it is: no
later op claims it. A failure the device itself reports later (when a value is read)
can only name the read: the message says how to get the op's line (Debug mode)."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from torch_tpu.runtime.errors import DeviceOutOfMemoryError, TorchTPURuntimeError

from ._fallback import user_line


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        nbytes = value.numel() * value.element_size()
        return f"{dtype}{list(value.shape)} on {value.device} ({nbytes} bytes)"
    return repr(value)


def describe_arguments(args, kwargs) -> str:
    tensors = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
    return ", ".join(_describe(t) for t in tensors) or "no tensors"


def is_runtime_error(err: BaseException) -> bool:
    """A runtime failure of the op being run (an earlier op's reported launch failure is not)."""
    return isinstance(err, TorchTPURuntimeError) and not getattr(err, "launch_failure", False)


def launch_failed(err: BaseException, context) -> BaseException:
    """The exception a failed queued launch raises where the caller next waits: `context`
    is (op, (file, line) of the user's frame, plan) taken when the op was called. Runs on
    the launch thread: reads nothing that the caller's thread changes."""
    op, where, plan = context
    line = f"{where[0]}:{where[1]}" if where is not None else "<unknown>"
    oom = isinstance(err, DeviceOutOfMemoryError)
    what = "ran out of device memory" if oom else "failed"
    message = (f"torch_tpu: {op} at {line} {what} (program arguments: "
               f"{plan.executable.signature.describe_args()}): {err}; it was launched asynchronously (Strict "
               "mode) and is reported at the first point that waited after it")
    if not oom:
        message += ("; set TPU_LAUNCH_BLOCKING=1 (or torch_tpu.device.set_eager_mode(EagerMode.DEBUG)) to "
                    "raise it at the op itself")
    try:
        error = type(err)(message) if isinstance(err, TorchTPURuntimeError) else TorchTPURuntimeError(message)
    except TypeError:  # a class whose constructor takes other arguments
        error = TorchTPURuntimeError(message)
    error.launch_failure = True
    return error


def op_failed(op, args, kwargs, err: TorchTPURuntimeError) -> TorchTPURuntimeError:
    """`err` (a runtime error raised while `op` ran) with the op, its arguments and the
    user's line; the same class, so `except DeviceOutOfMemoryError` still catches it."""
    from ._modes import is_blocking

    what = "ran out of device memory" if isinstance(err, DeviceOutOfMemoryError) else "failed"
    message = f"torch_tpu: {op} at {user_line()} {what} (arguments: {describe_arguments(args, kwargs)}): {err}"
    if not is_blocking() and not isinstance(err, DeviceOutOfMemoryError):
        message += ("; in Strict mode a failure may belong to an earlier op: set TPU_LAUNCH_BLOCKING=1 "
                    "(or torch_tpu.device.set_eager_mode(EagerMode.DEBUG)) to raise it at the op that failed")
    try:
        return type(err)(message)
    except TypeError:  # a class whose constructor takes other arguments
        return TorchTPURuntimeError(message)
