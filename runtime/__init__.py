"""torch_tpu.runtime: PjRT clients, buffers, executables and the compile cache.

    client = get_client()                      # tpu, else cuda, else XLA:CPU
    exe = client.compile(mlir_text)            # through the L1/L2/L3 compile cache
    outs = exe(torch_a, torch_b)               # torch in, torch out (zero-copy on CPU)
    bufs = exe.execute([client.to_device(a)])  # asynchronous, stays on the device
    transfer_stats()                           # uploads/downloads (count, bytes), programs run

Never imports `jax`; jaxlib is reached only through `_jaxlib`.
"""

from .buffer import DeviceBuffer
from .cache import CacheConfig, CacheStats, CompileCache
from .client import Client, Device, get_client, synchronize
from .errors import (
    ArgumentError,
    BufferDeletedError,
    CacheError,
    CompileError,
    DeviceOutOfMemoryError,
    ExecutionError,
    PlatformError,
    TorchTPURuntimeError,
    UnsafeCacheDirError,
    UnsupportedDtypeError,
)
from .executable import CompileSpec, Executable, Signature, TensorSpec
from .fingerprint import CacheKey, Fingerprintable, fingerprint
from .transfers import TransferStats, reset_transfer_stats, transfer_stats

__all__ = [
    "ArgumentError",
    "BufferDeletedError",
    "CacheConfig",
    "CacheError",
    "CacheKey",
    "CacheStats",
    "Client",
    "CompileCache",
    "CompileError",
    "CompileSpec",
    "Device",
    "DeviceBuffer",
    "DeviceOutOfMemoryError",
    "Executable",
    "ExecutionError",
    "Fingerprintable",
    "PlatformError",
    "Signature",
    "TensorSpec",
    "TorchTPURuntimeError",
    "TransferStats",
    "UnsafeCacheDirError",
    "UnsupportedDtypeError",
    "fingerprint",
    "get_client",
    "reset_transfer_stats",
    "synchronize",
    "transfer_stats",
]
