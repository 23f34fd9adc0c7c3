"""`torch.accelerator`'s device-generic calls on the tpu device: `synchronize()` and the
memory figures (`memory_stats()`, `memory_allocated()`, `max_memory_allocated()`,
`memory_reserved()`, `max_memory_reserved()`, `reset_peak_memory_stats()`,
`reset_accumulated_memory_stats()`, `empty_cache()`, `get_memory_info()`).

PyTorch's functions ask C++ objects a backend written in Python cannot register: the device
guard, which in torch 2.13 takes `type_` only (synchronize raised "Backend doesn't support
synchronizing all streams on device"), and a `DeviceAllocator` (every memory call failed an
INTERNAL ASSERT: "Allocator for tpu is not a DeviceAllocator"). With the tpu device as the
current accelerator they run `torch.tpu`'s functions instead; for any other device,
PyTorch's. Installed the way `Module._apply`'s hook is (`_module_apply.py`): each function
in `torch.accelerator` (and `torch.accelerator.memory`, whose functions call each other) is
replaced once, the original kept for other devices.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import torch

_originals: dict[str, Callable] = {}


def is_tpu(device) -> bool:
    """Whether `device` names the tpu device (None or an index: the current accelerator)."""
    if device is None or isinstance(device, int):
        accelerator = torch.accelerator.current_accelerator()
        return accelerator is not None and accelerator.type == "tpu"
    return torch.device(device).type == "tpu"


def _module():
    from . import module

    return module


def _memory_stats(device) -> collections.OrderedDict:
    # PyTorch's returns its flattened keys sorted.
    return collections.OrderedDict(sorted(_module().memory_stats(device).items()))


def _reset_accumulated(device) -> None:
    """The tpu device's figures are current and peak values (allocated, reserved) and PjRT's
    own counters, which a process cannot reset: nothing accumulates that could be reset."""
    _module()._index(device)  # an unknown device is still an error


# name -> what it runs for the tpu device (given the device argument as PyTorch's took it)
_TPU: dict[str, Callable[[Any], Any]] = {
    "synchronize": lambda device: _module().synchronize(device),
    "memory_stats": _memory_stats,
    "memory_allocated": lambda device: _module().memory_allocated(device),
    "max_memory_allocated": lambda device: _module().max_memory_allocated(device),
    "memory_reserved": lambda device: _module().memory_reserved(device),
    "max_memory_reserved": lambda device: _module().max_memory_reserved(device),
    "reset_peak_memory_stats": lambda device: _module().reset_peak_memory_stats(device),
    "reset_accumulated_memory_stats": _reset_accumulated,
    "empty_cache": lambda device: _module().empty_cache(),
    "get_memory_info": lambda device: _module().mem_get_info(device),
}
_TAKES_NO_DEVICE = {"empty_cache"}


def _dispatching(name: str) -> Callable:
    original = _originals[name]
    tpu = _TPU[name]
    if name in _TAKES_NO_DEVICE:
        def call():
            return tpu(None) if is_tpu(None) else original()
    else:
        def call(device=None, /):
            return tpu(device) if is_tpu(device) else original(device)
    functools.update_wrapper(call, original)
    call._torch_tpu_dispatching = True
    return call


def install() -> None:
    """Idempotent."""
    import torch.accelerator.memory as memory_module

    for name in _TPU:
        current = getattr(torch.accelerator, name)
        if getattr(current, "_torch_tpu_dispatching", False):
            continue
        _originals[name] = current
        replacement = _dispatching(name)
        setattr(torch.accelerator, name, replacement)
        if getattr(memory_module, name, None) is current:
            setattr(memory_module, name, replacement)
