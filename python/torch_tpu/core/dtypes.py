"""The element types torch_tpu moves and compiles: one row per type, by name only.

Each layer builds its own mapping from these rows: the compiler and the frontend map
torch dtypes (`torch_tpu.compiler.dtypes`), the runtime maps NumPy dtypes
(`torch_tpu.runtime.dtypes`, torch-free), saved exports map safetensors names
(`torch_tpu.exported._safetensors`). Adding a type is one row here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DtypeRow:
    mlir: str  # StableHLO spelling: f32, bf16, i1, ui8, complex<f32>, f8E4M3FN ...
    name: str  # attribute of `torch` and of NumPy (or ml_dtypes, for bf16 and the f8 types)
    # The safetensors format's name (the Dtype enum of its reference implementation);
    # None: the format has no such type, so it cannot be saved.
    safetensors: str | None
    # Same-width integer type (a `name`) to view a tensor as, when torch.Tensor.numpy()
    # cannot produce this NumPy dtype itself (bf16, f8).
    view_as: str | None = None


ROWS: tuple[DtypeRow, ...] = (
    DtypeRow("f32", "float32", "F32"),
    DtypeRow("f64", "float64", "F64"),
    DtypeRow("f16", "float16", "F16"),
    DtypeRow("bf16", "bfloat16", "BF16", "int16"),
    DtypeRow("f8E4M3FN", "float8_e4m3fn", "F8_E4M3", "uint8"),
    DtypeRow("f8E5M2", "float8_e5m2", "F8_E5M2", "uint8"),
    DtypeRow("f8E4M3FNUZ", "float8_e4m3fnuz", None, "uint8"),
    DtypeRow("f8E5M2FNUZ", "float8_e5m2fnuz", None, "uint8"),
    DtypeRow("f8E8M0FNU", "float8_e8m0fnu", "F8_E8M0", "uint8"),
    DtypeRow("i1", "bool", "BOOL"),
    DtypeRow("i8", "int8", "I8"),
    DtypeRow("i16", "int16", "I16"),
    DtypeRow("i32", "int32", "I32"),
    DtypeRow("i64", "int64", "I64"),
    DtypeRow("ui8", "uint8", "U8"),
    DtypeRow("ui16", "uint16", "U16"),
    DtypeRow("ui32", "uint32", "U32"),
    DtypeRow("ui64", "uint64", "U64"),
    DtypeRow("complex<f32>", "complex64", "C64"),
    DtypeRow("complex<f64>", "complex128", None),
)

BY_MLIR: dict[str, DtypeRow] = {row.mlir: row for row in ROWS}
BY_NAME: dict[str, DtypeRow] = {row.name: row for row in ROWS}
