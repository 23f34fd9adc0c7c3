"""Element types the runtime moves between PyTorch, NumPy and XLA.

One row per type of `torch_tpu.core.dtypes`: the StableHLO element type spelling (as in
`tensor<2x3xbf16>`), the NumPy dtype (ml_dtypes for bf16 and the f8 types) and the
`torch` dtype attribute name. torch is imported only when a torch dtype is asked for, so tools that work on
NumPy arrays start without it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from torch_tpu.core import dtypes as core_dtypes

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


def _numpy_dtype(name: str) -> np.dtype:
    # bf16 and the f8 types are ml_dtypes' extension types; the rest are NumPy's own.
    return np.dtype(getattr(ml_dtypes, name, None) or name)


_ROWS = [ElementType(row.mlir, _numpy_dtype(row.name), row.name, row.view_as) for row in core_dtypes.ROWS]

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
