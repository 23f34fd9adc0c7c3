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
    # Kernels offered to the compiler's lowerings (the Pallas attention forward on a TPU):
    # offered before the first op is lowered; importing them loads neither jax nor the
    # compiler.
    import torch_tpu.kernels  # noqa: F401
    # The `tpu_dist` process-group backend, so `init_process_group("tpu_dist")` needs no
    # import of ours (torchrun scripts stay plain PyTorch).
    import torch.distributed

    if torch.distributed.is_available():
        import torch_tpu.distributed  # noqa: F401  (registers on import)
