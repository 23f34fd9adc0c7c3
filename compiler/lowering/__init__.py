"""ATen -> StableHLO lowering rules, one module per op family, or one package for a family
large enough to be split by algorithm (`linalg/`, `special/`: a family's name is its module's
or package's, `registry.family_of`). Importing this package fills `LOWERINGS` by importing
every family module and package in this folder. Each lowering declares its padding class
and dynamic rule (bounded dynamism) at its registration; the rules' shared helpers are in
`padded.py`."""

import importlib
import pkgutil

from .registry import (
    LOWERINGS,
    DynamicFallback,
    Lowering,
    LoweringContext,
    LoweringError,
    Padding,
    UnsupportedOpError,
    dynamic_lowering,
    lookup,
    lowers,
)

_NOT_FAMILIES = {"registry", "helpers", "decompositions", "docs", "padded", "storage_layout", "opmath", "static_gather"}

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in _NOT_FAMILIES and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")

__all__ = [
    "LOWERINGS",
    "DynamicFallback",
    "Lowering",
    "LoweringContext",
    "LoweringError",
    "Padding",
    "UnsupportedOpError",
    "dynamic_lowering",
    "lookup",
    "lowers",
]
