"""Errors the frontend raises to PyTorch users."""


class TorchTpuCompileError(RuntimeError):
    """A graph could not be compiled for the device (strict mode, or a failure in the
    compiler). The message names the op and the user's source line."""
