"""Pinned host memory for the tpu device: `tensor.pin_memory()`, `tensor.is_pinned()` and
`DataLoader(pin_memory=True)`.

PyTorch pins a CPU tensor for the current accelerator unless told another device; with the
tpu device registered that is tpu, and PyTorch asks the PrivateUse1 hooks for a page-locked
allocator, which a backend written in Python cannot give (torch 2.13's Python hooks take
`is_available`, `has_primary_context` and `is_built` only). So `pin_memory()` raised
NotImplementedError, and so did every `DataLoader(pin_memory=True)` in a process that
imported torch with torch_tpu installed -- a CPU-only script too.

PjRT copies to the chip from any host memory, so pinning for the tpu device is a copy of
the tensor into a storage of its own, which `is_pinned()` reports as pinned from then on
(the DataLoader asks, and does not copy a pinned batch again); copies from it to the device
are those of any host tensor. The two kernels sit on the CPU key, in front of PyTorch's
kernel for every device (CompositeExplicitAutograd), which they call for any other device
(a CUDA build's `pin_memory("cuda")`).
"""

from __future__ import annotations

import weakref

import torch

from ._accelerator_api import is_tpu

_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
_pinned: weakref.WeakSet = weakref.WeakSet()  # the storages pin_memory made for the device


def is_pinned(self, device=None) -> bool:
    if not is_tpu(device):
        return torch.ops.aten.is_pinned.default._op_dk(_COMPOSITE, self, device)
    return self.untyped_storage() in _pinned


def pin_memory(self, device=None):
    if not is_tpu(device):
        return torch.ops.aten._pin_memory.default._op_dk(_COMPOSITE, self, device)
    # The same sizes and strides, in a storage of its own (PyTorch's pinned copy does so).
    pinned = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype)
    pinned.copy_(self)
    _pinned.add(pinned.untyped_storage())
    return pinned


def install(library) -> None:
    """Registers the two kernels on the CPU key of `library` (an `aten` IMPL library)."""
    library.impl(torch.ops.aten.is_pinned.default, is_pinned, "CPU")
    library.impl(torch.ops.aten._pin_memory.default, pin_memory, "CPU")
