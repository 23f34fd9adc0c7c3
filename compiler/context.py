"""The one place in the compiler that touches jaxlib's MLIR internals.

Everything else imports `ir`, `passmanager` and the dialect modules from here, so a
jaxlib upgrade that moves them is a one-file change. `jax` itself is never imported.
"""

from __future__ import annotations

import os

# XLA logs INFO lines to stderr on first use unless told otherwise (jax sets the same
# default); a user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from jaxlib.mlir import ir, passmanager  # noqa: F401  (re-exported)
from jaxlib.mlir._mlir_libs import _jax_mlir_ext
from jaxlib.mlir.dialects import arith, chlo, func, sdy, stablehlo  # noqa: F401

from torch_tpu.core import mlir_context

__all__ = ["ir", "passmanager", "arith", "chlo", "func", "sdy", "stablehlo", "make_context", "inline_call"]


def make_context() -> ir.Context:
    """A context with func, arith, stablehlo, chlo, sdy (and the rest of jax's dialect
    set) loaded, and the `torchtpu` dialect allowed as an unregistered dialect (the one
    factory is `torch_tpu.core.mlir_context`, shared with the runtime)."""
    return mlir_context.make_context()


def inline_call(callee: ir.Operation, operands: list[ir.Value], location: ir.Location) -> list[ir.Value]:
    """Clones `callee`'s single block at the current insertion point with its arguments
    bound to `operands`; returns the values its return op yields. jaxlib's helper
    segfaults without an active Location, so one is entered here."""
    with location:
        return list(_jax_mlir_ext.inlined_func_call(callee, operands, location))
