"""torch_tpu: a PyTorch backend for XLA devices (TPU, and GPU/CPU through PjRT).

    model = torch.compile(model, backend="tpu")

The backend is found through the `torch_dynamo_backends` entry point, so importing
torch_tpu is optional. Importing it is cheap: submodules load on first use (the
runtime and compiler import this package as their parent).
"""

from __future__ import annotations

import importlib
from typing import Any

from torch_tpu.core import __version__

_LAZY = {
    "precision": ("torch_tpu.program.precision", "precision"),
    "export": ("torch_tpu.exported._export", "export"),
    "ExportedProgram": ("torch_tpu.exported._export", "ExportedProgram"),
    "load": ("torch_tpu.exported._saved_export", "load"),
    "is_saved_export": ("torch_tpu.exported._saved_export_format", "is_saved_export"),  # torch-free
    "SavedExportError": ("torch_tpu.exported._saved_export", "SavedExportError"),
    "tpu_backend": ("torch_tpu.backend", "tpu_backend"),
    "TorchTpuCompileError": ("torch_tpu.program.errors", "TorchTpuCompileError"),
    "spmd_safe": ("torch_tpu.spmd", "spmd_safe"),
    "mark_dynamic": ("torch_tpu.backend._dynamic", "mark_dynamic"),
    "register_lowering": ("torch_tpu.kernels._register_lowering", "register_lowering"),
    # The eager device's modes (python/torch_tpu/device/_modes.py; importing them does
    # not register the device).
    "EagerMode": ("torch_tpu.device._modes", "EagerMode"),
    "set_eager_mode": ("torch_tpu.device._modes", "set_eager_mode"),
    "get_eager_mode": ("torch_tpu.device._modes", "get_eager_mode"),
    # JAX functions and Pallas kernels as custom ops (kernels/_jax_op.py; jax loads on first call).
    "jax_op": ("torch_tpu.kernels._jax_op", "jax_op"),
    "JaxOpError": ("torch_tpu.kernels._jax_trace", "JaxOpError"),
}

# Public submodules, imported on first attribute access (`torch_tpu.spmd.compile_spmd`):
# the layers' packages (docs/explanation/architecture.md) and the public modules.
_SUBMODULES = (
    "backend", "exported", "spmd", "kernels", "distributed", "device", "program",
    "runtime", "compiler", "config", "core", "tools", "examples",
)

__all__ = ["__version__", *_LAZY, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"torch_tpu.{name}")
    else:
        raise AttributeError(f"module 'torch_tpu' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
