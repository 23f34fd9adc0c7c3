"""The MLIR context factory of the compiler and the runtime.

jaxlib is imported inside `make_context` (importing jaxlib.mlir costs ~0.6 s), so
importing this module is free for a process that never builds or edits MLIR.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_passes_registered = False
_registration_lock = threading.Lock()


def _register_upstream_passes_once(stablehlo: Any) -> None:
    # stablehlo's passes must be registered once per process before a pipeline string
    # can name them (JAXLIB_NOTES.md: Passes).
    global _passes_registered
    with _registration_lock:
        if not _passes_registered:
            stablehlo.register_stablehlo_passes()
            _passes_registered = True


def make_context() -> Any:
    """A new `jaxlib.mlir.ir.Context` with func, arith, stablehlo, chlo, sdy (and the
    rest of jax's dialect set) loaded, stablehlo's passes registered, and the `torchtpu`
    dialect allowed as an unregistered dialect (our own verifier, `torchtpu-verify`,
    checks its ops; MLIR only parses and prints them generically)."""
    # XLA logs INFO lines to stderr on first use unless told otherwise (jax sets the same
    # default); a user's own setting wins. Read when jaxlib's library loads.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir.dialects import chlo, sdy, stablehlo

    _register_upstream_passes_once(stablehlo)
    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    ctx = ir.Context()
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    sdy.register_dialect(ctx)
    chlo.register_dialect(ctx)
    stablehlo.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    return ctx
