"""ATen -> StableHLO lowering rules, one module per op family. Importing this package
fills `LOWERINGS` by importing every family module in this folder."""

import importlib
import pkgutil

from .registry import LOWERINGS, Lowering, LoweringContext, LoweringError, UnsupportedOpError, lookup, lowers

_NOT_FAMILIES = {"registry", "helpers", "decompositions", "docs"}

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in _NOT_FAMILIES and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")

__all__ = ["LOWERINGS", "Lowering", "LoweringContext", "LoweringError", "UnsupportedOpError", "lookup", "lowers"]
