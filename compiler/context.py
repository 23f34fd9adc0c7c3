"""The one place in the compiler that touches jaxlib's MLIR internals.

Everything else imports `ir`, `passmanager` and the dialect modules from here, so a
jaxlib upgrade that moves them is a one-file change. `jax` itself is never imported.
"""

from __future__ import annotations

import os
import threading

# XLA logs INFO lines to stderr on first use unless told otherwise (jax sets the same
# default); a user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from jaxlib.mlir import ir, passmanager  # noqa: F401  (re-exported)
from jaxlib.mlir._mlir_libs import _jax_mlir_ext
from jaxlib.mlir.dialects import arith, chlo, func, sdy, stablehlo  # noqa: F401

__all__ = ["ir", "passmanager", "arith", "chlo", "func", "sdy", "stablehlo", "make_context", "inline_call"]

_passes_registered = False
_registration_lock = threading.Lock()


def _register_upstream_passes_once() -> None:
    # stablehlo's passes must be registered once per process before a pipeline
    # string can name them (JAXLIB_NOTES.md: Passes).
    global _passes_registered
    with _registration_lock:
        if not _passes_registered:
            stablehlo.register_stablehlo_passes()
            _passes_registered = True


def make_context() -> ir.Context:
    """A context with func, arith, stablehlo, chlo, sdy (and the rest of jax's dialect
    set) loaded, and the `torchtpu` dialect allowed as an unregistered dialect.

    Our own verifier (`torchtpu-verify`) checks `torchtpu` ops; MLIR only parses and
    prints them generically.
    """
    _register_upstream_passes_once()
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


def inline_call(callee: ir.Operation, operands: list[ir.Value], location: ir.Location) -> list[ir.Value]:
    """Clones `callee`'s single block at the current insertion point with its arguments
    bound to `operands`; returns the values its return op yields. jaxlib's helper
    segfaults without an active Location, so one is entered here."""
    with location:
        return list(_jax_mlir_ext.inlined_func_call(callee, operands, location))
