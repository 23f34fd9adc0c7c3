"""Element types the runtime moves between PyTorch, NumPy and XLA.

One table row per type: the StableHLO element type spelling (as in `tensor<2x3xbf16>`),
the NumPy dtype (ml_dtypes for bf16 and the f8 types) and the `torch` dtype attribute
name. torch is imported only when a torch dtype is asked for, so tools that work on
NumPy arrays start without it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .errors import UnsupportedDtypeError


@dataclass(frozen=True)
class ElementType:
    mlir: str  # StableHLO spelling: f32, bf16, i1, ui8, complex<f32>, f8E4M3FN ...
    numpy: np.dtype
    torch_name: str  # attribute of the torch module: "float32", "bool", ...
    # Same-width integer type to view a tensor as, when torch.Tensor.numpy() cannot
    # produce this NumPy dtype itself (bf16, f8).
    torch_view_as: str | None = None

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


_ROWS = [
    ElementType("f32", np.dtype(np.float32), "float32"),
    ElementType("f64", np.dtype(np.float64), "float64"),
    ElementType("f16", np.dtype(np.float16), "float16"),
    ElementType("bf16", np.dtype(ml_dtypes.bfloat16), "bfloat16", "int16"),
    ElementType("f8E4M3FN", np.dtype(ml_dtypes.float8_e4m3fn), "float8_e4m3fn", "uint8"),
    ElementType("f8E5M2", np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2", "uint8"),
    ElementType("f8E4M3FNUZ", np.dtype(ml_dtypes.float8_e4m3fnuz), "float8_e4m3fnuz", "uint8"),
    ElementType("f8E5M2FNUZ", np.dtype(ml_dtypes.float8_e5m2fnuz), "float8_e5m2fnuz", "uint8"),
    ElementType("f8E8M0FNU", np.dtype(ml_dtypes.float8_e8m0fnu), "float8_e8m0fnu", "uint8"),
    ElementType("i1", np.dtype(np.bool_), "bool"),
    ElementType("i8", np.dtype(np.int8), "int8"),
    ElementType("i16", np.dtype(np.int16), "int16"),
    ElementType("i32", np.dtype(np.int32), "int32"),
    ElementType("i64", np.dtype(np.int64), "int64"),
    ElementType("ui8", np.dtype(np.uint8), "uint8"),
    ElementType("ui16", np.dtype(np.uint16), "uint16"),
    ElementType("ui32", np.dtype(np.uint32), "uint32"),
    ElementType("ui64", np.dtype(np.uint64), "uint64"),
    ElementType("complex<f32>", np.dtype(np.complex64), "complex64"),
    ElementType("complex<f64>", np.dtype(np.complex128), "complex128"),
]

BY_MLIR: dict[str, ElementType] = {row.mlir: row for row in _ROWS}
BY_NUMPY: dict[np.dtype, ElementType] = {row.numpy: row for row in _ROWS}
_BY_TORCH: dict[Any, ElementType] = {}

ALL: tuple[ElementType, ...] = tuple(_ROWS)


def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    return torch


def _torch_table() -> dict[Any, ElementType]:
    if not _BY_TORCH:
        torch = _torch()
        for row in _ROWS:
            dtype = getattr(torch, row.torch_name, None)
            if dtype is not None:
                _BY_TORCH[dtype] = row
    return _BY_TORCH


def supported_names() -> str:
    return ", ".join(row.mlir for row in _ROWS)


def from_numpy(dtype: Any) -> ElementType:
    try:
        return BY_NUMPY[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise UnsupportedDtypeError(
            f"NumPy dtype {dtype} has no XLA element type in torch_tpu; supported: "
            f"{', '.join(str(r.numpy) for r in _ROWS)}"
        ) from None


def from_torch(dtype: Any) -> ElementType:
    row = _torch_table().get(dtype)
    if row is None:
        raise UnsupportedDtypeError(
            f"{dtype} cannot be moved to an XLA device: StableHLO has no such element type "
            f"(supported: {', '.join('torch.' + r.torch_name for r in _ROWS)}); convert the "
            f"tensor first, e.g. .to(torch.float32)"
        )
    return row


def from_mlir(name: str) -> ElementType:
    row = BY_MLIR.get(name)
    if row is None:
        raise UnsupportedDtypeError(f"unknown element type '{name}'; supported: {supported_names()}")
    return row


def torch_dtype(row: ElementType) -> Any:
    return getattr(_torch(), row.torch_name)


def type_string(shape: tuple[int, ...], dtype: np.dtype) -> str:
    """`tensor<2x3xf32>`: how the runtime names an argument or result type in messages."""
    row = BY_NUMPY.get(np.dtype(dtype))
    name = row.mlir if row else str(dtype)
    return "tensor<" + "".join(f"{d}x" for d in shape) + name + ">"
