"""Errors the runtime raises. Each message says what failed and what to do next."""

from __future__ import annotations


class TorchTPURuntimeError(RuntimeError):
    """Base class of every error raised by torch_tpu.runtime."""


class PlatformError(TorchTPURuntimeError):
    """A PjRT platform could not be found or started (missing or broken plugin)."""


class UnsupportedDtypeError(TorchTPURuntimeError, TypeError):
    """A dtype that has no XLA element type."""


class ArgumentError(TorchTPURuntimeError, ValueError):
    """Arguments that do not match an executable's signature (count, dtype, shape, device)."""


class CompileError(TorchTPURuntimeError):
    """XLA rejected a module, or the module could not be read."""


class ExecutionError(TorchTPURuntimeError):
    """A compiled program failed while running."""


class DeviceOutOfMemoryError(ExecutionError, MemoryError):
    """The device ran out of memory (PjRT status RESOURCE_EXHAUSTED)."""


class BufferDeletedError(TorchTPURuntimeError):
    """A DeviceBuffer was used after it was deleted or donated to an executable."""


class CacheError(TorchTPURuntimeError):
    """The compile cache is misconfigured or unsafe to use."""


class UnsafeCacheDirError(CacheError, PermissionError):
    """A cache directory that another user can write: loading native code from it is refused."""


class CacheEntryError(Exception):
    """A cache entry that fails validation (corrupt, truncated, foreign version, other
    key). Internal: the cache logs it once, recompiles and rewrites the entry."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_out_of_memory(text: str) -> bool:
    """Whether a jaxlib/XLA error text reports exhausted device memory (at run time:
    RESOURCE_EXHAUSTED; at compile time XLA:TPU's "Ran out of memory in memory space hbm")."""
    status = text.strip().partition(":")[0].strip()
    low = text.lower()
    return status == "RESOURCE_EXHAUSTED" or "out of memory" in low or "ran out of memory" in low


def out_of_memory(what: str, detail: str, figures: str = "") -> DeviceOutOfMemoryError:
    return DeviceOutOfMemoryError(
        f"{what}: the device ran out of memory ({detail.strip()}){'; ' + figures if figures else ''}; "
        "free device buffers you no longer need (drop references to outputs, DeviceBuffer.delete()), "
        "use smaller batches, or donate arguments that the program overwrites"
    )


def classify_jaxlib_error(err: BaseException, what: str, hint: str, figures: str = "") -> TorchTPURuntimeError:
    """Turns a jaxlib runtime error into ours: out-of-memory gets its own class, the
    device's memory figures (`figures`, e.g. Device.memory_figures()) and advice."""
    text = str(err).strip()
    if is_out_of_memory(text):
        status, _, detail = text.partition(":")
        return out_of_memory(what, detail if status.strip() == "RESOURCE_EXHAUSTED" else text, figures)
    return ExecutionError(f"{what}: {text}; {hint}")
