"""The process's MLIR context and runtime client, shared by every program kind.

One MLIR context per process: creating one costs ~0.2 s, and modules built in it are
independent of each other. The backend, the eager device, exports, jax_ops and the
collective programs of `tpu_dist` all build their modules here, so a module of one kind
(a single op's plan) can be cloned into a module of another (a fused trace).
"""

from __future__ import annotations

import threading
from typing import Any

_context: Any = None
_lock = threading.Lock()


def shared_context() -> Any:
    """The MLIR context every program of this process is built in."""
    global _context
    if _context is None:
        with _lock:
            if _context is None:
                from torch_tpu.compiler.context import make_context

                _context = make_context()
    return _context


def client() -> Any:
    """The runtime client programs are compiled for and run on (`runtime.get_client`)."""
    from torch_tpu.runtime import get_client

    return get_client()
