"""Errors the frontend raises to PyTorch users."""

from __future__ import annotations


class TorchTpuCompileError(RuntimeError):
    """A graph could not be compiled for the device (strict mode, or a failure in the
    compiler). The message names the op and the user's source line. `diagnostics` holds
    the located diagnostics of a failed pass pipeline (empty otherwise), so the failure
    can be traced back to the FX node that made the failing op (`backend/_recovery.py`)."""

    def __init__(self, message: str, diagnostics=()) -> None:
        super().__init__(message)
        self.diagnostics = list(diagnostics)
