"""torch dtypes <-> MLIR element types (StableHLO's spelling)."""

from __future__ import annotations

import torch

from torch_tpu.core import dtypes as core_dtypes

from .context import ir

# torch dtype -> MLIR type string, from the core rows (unsigned types are StableHLO's
# `ui*`; bool is i1). A type this torch build lacks is left out.
_DTYPE_TO_MLIR: dict[torch.dtype, str] = {
    getattr(torch, row.name): row.mlir for row in core_dtypes.ROWS if hasattr(torch, row.name)
}

_MLIR_TO_DTYPE = {v: k for k, v in _DTYPE_TO_MLIR.items()}


class UnsupportedDtypeError(TypeError):
    pass


def supported_dtypes() -> list[torch.dtype]:
    return list(_DTYPE_TO_MLIR)


def mlir_type_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_TO_MLIR[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"dtype {dtype} has no StableHLO element type; supported: "
            + ", ".join(str(d).replace("torch.", "") for d in _DTYPE_TO_MLIR)
        ) from None


def element_type(dtype: torch.dtype) -> ir.Type:
    """The MLIR element type of `dtype` (needs an active context)."""
    return ir.Type.parse(mlir_type_name(dtype))


def tensor_type(shape, dtype: torch.dtype) -> ir.RankedTensorType:
    return ir.RankedTensorType.get([int(s) for s in shape], element_type(dtype))


def dtype_of(t: ir.Type) -> torch.dtype:
    """The torch dtype of an MLIR element or tensor type."""
    if isinstance(t, ir.ShapedType):
        t = t.element_type
    name = str(t)
    try:
        return _MLIR_TO_DTYPE[name]
    except KeyError:
        raise UnsupportedDtypeError(f"MLIR element type {name} has no torch dtype") from None


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_complex(dtype: torch.dtype) -> bool:
    return dtype.is_complex


def is_unsigned(dtype: torch.dtype) -> bool:
    return _DTYPE_TO_MLIR.get(dtype, "").startswith("ui")


def is_integer(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype is not torch.bool
