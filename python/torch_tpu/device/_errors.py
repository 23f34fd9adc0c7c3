"""Errors of device ops: a runtime failure (out of memory, an execution error, a deleted
buffer) raised while an op runs is re-raised as the same runtime class, naming the op,
its arguments' dtypes and sizes, and the user's Python line. In Strict mode a failure
the device reports later (when a value is read) can only name the read: the message
says how to get the op's line (Debug mode)."""

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
    return isinstance(err, TorchTPURuntimeError)


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
