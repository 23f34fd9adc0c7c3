"""Autograd on `tpu:1`, `tpu:2`, ... in one process.

PyTorch's engine runs the backward of a device's nodes on a worker thread of that device,
one per index below the device guard's `deviceCount()`. A Python backend's device guard
(`torch._C._acc.DeviceGuard`) cannot override `deviceCount()`, which is fixed at 1, so a
node on tpu:1 asks for worker 1 of 1 and the engine fails an internal assert
(`device_ready_queues_.size()`). With multithreading disabled the engine runs every node
on the thread that called `backward()` -- the queue CPU nodes always use -- which needs
no per-device worker at all.

So, once the process has a tensor on a device index above 0, every backward runs that
way: the engine object behind `torch.autograd.backward` / `torch.autograd.grad`
(`Variable._execution_engine`, which both call) is replaced by a subclass that disables
multithreading for the call (a thread-local setting, so it holds in whichever thread
calls `backward()`). Results are the same; nodes no longer hop to a device thread."""

from __future__ import annotations

import threading

import torch
from torch.autograd.variable import Variable

_lock = threading.Lock()


class _SameThreadEngine(type(Variable._execution_engine)):
    """PyTorch's engine, running each backward on the calling thread."""

    def run_backward(self, *args, **kwargs):
        with torch.autograd.set_multithreading_enabled(False):
            return super().run_backward(*args, **kwargs)


def install_same_thread_backward() -> None:
    """Idempotent: called when the first tensor on a device index above 0 is made."""
    if isinstance(Variable._execution_engine, _SameThreadEngine):
        return
    with _lock:
        if not isinstance(Variable._execution_engine, _SameThreadEngine):
            Variable._execution_engine = _SameThreadEngine()
