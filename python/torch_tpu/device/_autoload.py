"""The `torch.backends` entry point: PyTorch calls `autoload()` at the end of
`import torch` (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)."""

from __future__ import annotations

import sys


def autoload() -> None:
    registration = sys.modules.get("torch_tpu.device._registration")
    if registration is not None and not hasattr(registration, "register"):
        # `import torch` started inside our own import of _registration (someone imported
        # torch_tpu.device first): the package registers when that import finishes.
        return
    from torch_tpu.device._registration import register

    register()
