"""`torch.accelerator.synchronize()` on the tpu device.

PyTorch's device-generic call asks the device guard to synchronize the device, and the
guard a backend written in Python registers takes `type_` only (torch 2.13): the call
raised "Backend doesn't support synchronizing all streams on device". With the tpu device
as the current accelerator it now runs `torch.tpu.synchronize` (the recorded FUSED ops
run, every enqueued op and copy is waited for); for any other device, PyTorch's function.
Installed the way `Module._apply`'s hook is (`_module_apply.py`): the function in
`torch.accelerator` is replaced once, the original kept for other devices.
"""

from __future__ import annotations

import functools

import torch

_original = None


def is_tpu(device) -> bool:
    """Whether `device` names the tpu device (None or an index: the current accelerator)."""
    if device is None or isinstance(device, int):
        accelerator = torch.accelerator.current_accelerator()
        return accelerator is not None and accelerator.type == "tpu"
    return torch.device(device).type == "tpu"


def synchronize(device=None, /) -> None:
    if is_tpu(device):
        from . import module

        return module.synchronize(device)
    return _original(device)


def install() -> None:
    """Idempotent."""
    global _original
    if torch.accelerator.synchronize is synchronize:
        return
    _original = torch.accelerator.synchronize
    functools.update_wrapper(synchronize, _original)
    torch.accelerator.synchronize = synchronize
