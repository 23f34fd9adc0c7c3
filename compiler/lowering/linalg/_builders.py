"""The linalg family's small builders: real splats (complex ones built from parts), complex
parts, matrix masks, triangles, diagonals and products. Elementwise arithmetic, slices and
the `stablehlo.while` loops the factorizations are written as are compiler.ir's
(`hlo.add`, `hlo.while_loop`, `hlo.fori_loop`); reductions are reduction.py's."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...context import ir, stablehlo
from ... import ir as hlo
from ...dtypes import tensor_type
from ..helpers import (
    broadcast_to,
    compare,
    conj,
    dtype,
    full,
    iota,
    reshape,
    select,
    shape_of,
    transpose,
)
from ..registry import LoweringContext


_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_LINALG_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


# -- small builders ------------------------------------------------------------------------------
def _real_dtype(dt: torch.dtype) -> torch.dtype:
    return _REAL_OF.get(dt, dt)


def _check_dtype(ctx: LoweringContext, dt: torch.dtype) -> None:
    if dt not in _LINALG_DTYPES:
        raise ctx.fail(f"linear algebra in {dt} is not supported (PyTorch supports float32/64, complex64/128)")


def real_splat(value, dt: torch.dtype, shape: Sequence[int] = ()) -> ir.Value:
    """A splat of the real scalar `value` as `dt`: a complex dtype is built from a real
    part and a zero imaginary part (helpers.full builds complex splats from a complex
    array constant instead)."""
    if dt.is_complex:
        part = _REAL_OF[dt]
        return stablehlo.ComplexOp(full(value, part, shape), full(0, part, shape)).result
    return full(value, dt, shape)


def real_splat_like(value, x: ir.Value) -> ir.Value:
    """`real_splat` with the dtype and shape of `x`."""
    return real_splat(value, dtype(x), shape_of(x))


def _real(x: ir.Value) -> ir.Value:
    return stablehlo.RealOp(x).result if dtype(x).is_complex else x


def _imag(x: ir.Value) -> ir.Value:
    return stablehlo.ImagOp(x).result


def _complex(re: ir.Value, im: ir.Value) -> ir.Value:
    return stablehlo.ComplexOp(re, im).result


def _to_complex(x: ir.Value, like: torch.dtype) -> ir.Value:
    """A real value as `like` (complex) with zero imaginary part; a no-op for real `like`."""
    if not like.is_complex or dtype(x).is_complex:
        return x
    return _complex(x, full(0, dtype(x), shape_of(x)))


def _scalar_i32(value: int) -> ir.Value:
    return full(value, torch.int32, [])


def _abs2(x: ir.Value) -> ir.Value:
    """|x|^2 (real)."""
    if dtype(x).is_complex:
        re, im = _real(x), _imag(x)
        return hlo.add(hlo.mul(re, re), hlo.mul(im, im))
    return hlo.mul(x, x)


def _expand_last(x: ir.Value, size: int, axis: int) -> ir.Value:
    """Inserts a dim of `size` at `axis` (negative: from the end of the result) by
    broadcasting."""
    shape = shape_of(x)
    rank = len(shape) + 1
    axis = axis % rank
    out = shape[:axis] + [size] + shape[axis:]
    dims = [d for d in range(rank) if d != axis]
    return stablehlo.BroadcastInDimOp(tensor_type(out, dtype(x)), x, dims).result


def _mT(x: ir.Value) -> ir.Value:
    rank = len(shape_of(x))
    return transpose(x, list(range(rank - 2)) + [rank - 1, rank - 2])


def _mH(x: ir.Value) -> ir.Value:
    return conj(_mT(x))


def _dynamic_slice_last(x: ir.Value, index: ir.Value, size: int = 1) -> ir.Value:
    """x[..., index:index+size] along the last dim (index: 0-d int32)."""
    shape = shape_of(x)
    zero = _scalar_i32(0)
    starts = [zero] * (len(shape) - 1) + [index]
    sizes = shape[:-1] + [size]
    return stablehlo.DynamicSliceOp(x, starts, sizes).result


def _matrix_masks(shape: Sequence[int]) -> tuple[ir.Value, ir.Value]:
    """(row index, column index) int32 iotas of `shape` (a batch of matrices)."""
    rank = len(shape)
    return iota(shape, rank - 2, torch.int32), iota(shape, rank - 1, torch.int32)


def _tri_mask(shape: Sequence[int], lower: bool, k: int = 0) -> ir.Value:
    """True on and below (lower) / above (upper) diagonal k."""
    rows, cols = _matrix_masks(shape)
    diff = hlo.sub(cols, rows)  # col - row
    return compare(diff, full(k, torch.int32, shape), "LE" if lower else "GE")


def _tril(x: ir.Value, k: int = 0) -> ir.Value:
    return select(_tri_mask(shape_of(x), True, k), x, real_splat_like(0, x))


def _triu(x: ir.Value, k: int = 0) -> ir.Value:
    return select(_tri_mask(shape_of(x), False, k), x, real_splat_like(0, x))


def _eye(shape: Sequence[int], dt: torch.dtype) -> ir.Value:
    """A batch of identity matrices (ones on the main diagonal) of `shape`."""
    rows, cols = _matrix_masks(shape)
    return select(compare(rows, cols, "EQ"), real_splat(1, dt, shape), real_splat(0, dt, shape))


def _diagonal(x: ir.Value) -> ir.Value:
    """The main diagonal of the last two dims: (..., min(m, n)), by a strided slice of
    the flattened matrices (exact: no arithmetic)."""
    shape = shape_of(x)
    batch, (m, n) = shape[:-2], shape[-2:]
    k = min(m, n)
    if k == 0:
        return full(0, dtype(x), batch + [0]) if not dtype(x).is_complex else real_splat(0, dtype(x), batch + [0])
    flat = reshape(x, batch + [m * n])
    return hlo.slice_in_dim(flat, len(batch), 0, (k - 1) * (n + 1) + 1, n + 1)


def _diag_embed(v: ir.Value, m: int, n: int) -> ir.Value:
    """(..., k) -> (..., m, n) with v on the main diagonal (k = min(m, n))."""
    shape = shape_of(v)
    batch = shape[:-1]
    out = batch + [m, n]
    k = shape[-1]
    if k < n:
        v = stablehlo.PadOp(v, real_splat(0, dtype(v)), [0] * len(shape), [0] * (len(shape) - 1) + [n - k], [0] * len(shape)).result
    cols = _expand_last(v, m, -2)
    rows, colsi = _matrix_masks(out)
    return select(compare(rows, colsi, "EQ"), cols, real_splat(0, dtype(v), out))


def _matmul(a: ir.Value, b: ir.Value) -> ir.Value:
    """Batched a @ b (equal batch dims) at full precision: linear algebra never runs in
    a reduced-precision pass, whatever `torch.get_float32_matmul_precision()` says."""
    sa, sb = shape_of(a), shape_of(b)
    nb = len(sa) - 2
    batch = list(range(nb))
    del sb
    product = hlo.dot_general(a, b, batch=(batch, batch), contract=([nb + 1], [nb]), precision="HIGHEST")
    # Keep HIGHEST through torchtpu-set-precision (passes/set_precision.py).
    product.owner.attributes["torchtpu.fixed_precision"] = ir.UnitAttr.get()
    return product


def _batch_broadcast(x: ir.Value, batch: Sequence[int]) -> ir.Value:
    shape = shape_of(x)
    return broadcast_to(x, list(batch) + shape[-2:])


def _is_empty(shape: Sequence[int]) -> bool:
    return any(int(s) == 0 for s in shape)


def _zeros(ctx: LoweringContext, index: int | None = None) -> ir.Value:
    return real_splat(0, ctx.result_dtype(index), ctx.result_shape(index))
