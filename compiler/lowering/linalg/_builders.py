"""The linalg family's small builders: scalar and elementwise shorthands, matrix masks and
products, and the `stablehlo.while` loops the factorizations are written as."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...context import ir, stablehlo
from ...dtypes import tensor_type
from ..helpers import (
    broadcast_to,
    compare,
    dtype,
    full,
    iota,
    reduce,
    reshape,
    select,
    shape_of,
    transpose,
)
from ..registry import LoweringContext
from ...ir import (
    absolute,
    add,
    concatenate,
    div,
    dot_general,
    logical_and,
    logical_not,
    logical_or,
    mul,
    neg,
    slice_in_dim,
    sqrt,
    sub,
)


_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_LINALG_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


# -- small builders ------------------------------------------------------------------------------
def _real_dtype(dt: torch.dtype) -> torch.dtype:
    return _REAL_OF.get(dt, dt)


def _check_dtype(ctx: LoweringContext, dt: torch.dtype) -> None:
    if dt not in _LINALG_DTYPES:
        raise ctx.fail(f"linear algebra in {dt} is not supported (PyTorch supports float32/64, complex64/128)")


def _c(value, dt: torch.dtype, shape: Sequence[int] = ()) -> ir.Value:
    """A splat of `value` (real scalar; complex dtypes get a zero imaginary part)."""
    if dt.is_complex:
        part = _REAL_OF[dt]
        return stablehlo.ComplexOp(full(value, part, shape), full(0, part, shape)).result
    return full(value, dt, shape)


def _like(value, x: ir.Value) -> ir.Value:
    return _c(value, dtype(x), shape_of(x))


# Formula shorthands: compiler.ir's builders (operands already share type and shape).
_add, _sub, _mul, _div = add, sub, mul, div
_neg, _abs, _sqrt = neg, absolute, sqrt
_and, _or, _not = logical_and, logical_or, logical_not


def _real(x: ir.Value) -> ir.Value:
    return stablehlo.RealOp(x).result if dtype(x).is_complex else x


def _imag(x: ir.Value) -> ir.Value:
    return stablehlo.ImagOp(x).result


def _complex(re: ir.Value, im: ir.Value) -> ir.Value:
    return stablehlo.ComplexOp(re, im).result


def _conj(x: ir.Value) -> ir.Value:
    if not dtype(x).is_complex:
        return x
    return _complex(_real(x), _neg(_imag(x)))


def _to_complex(x: ir.Value, like: torch.dtype) -> ir.Value:
    """A real value as `like` (complex) with zero imaginary part; a no-op for real `like`."""
    if not like.is_complex or dtype(x).is_complex:
        return x
    return _complex(x, full(0, dtype(x), shape_of(x)))


def _scalar_i32(value: int) -> ir.Value:
    return full(value, torch.int32, [])


def _sum(x: ir.Value, dims: Sequence[int]) -> ir.Value:
    dt = dtype(x)
    return reduce([x], [_c(0, dt)], dims, lambda a, b: [_add(a[0], b[0])])[0]


def _max(x: ir.Value, dims: Sequence[int]) -> ir.Value:
    dt = dtype(x)
    init = full(float("-inf") if dt.is_floating_point else torch.iinfo(dt).min, dt, [])
    return reduce([x], [init], dims, lambda a, b: [stablehlo.MaxOp(a[0], b[0]).result])[0]


def _min(x: ir.Value, dims: Sequence[int]) -> ir.Value:
    dt = dtype(x)
    init = full(float("inf") if dt.is_floating_point else torch.iinfo(dt).max, dt, [])
    return reduce([x], [init], dims, lambda a, b: [stablehlo.MinOp(a[0], b[0]).result])[0]


def _prod(x: ir.Value, dims: Sequence[int]) -> ir.Value:
    dt = dtype(x)
    return reduce([x], [_c(1, dt)], dims, lambda a, b: [_mul(a[0], b[0])])[0]


def _abs2(x: ir.Value) -> ir.Value:
    """|x|^2 (real)."""
    if dtype(x).is_complex:
        re, im = _real(x), _imag(x)
        return _add(_mul(re, re), _mul(im, im))
    return _mul(x, x)


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
    return _conj(_mT(x))


_slice, _concat = slice_in_dim, concatenate


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
    diff = _sub(cols, rows)  # col - row
    return compare(diff, full(k, torch.int32, shape), "LE" if lower else "GE")


def _tril(x: ir.Value, k: int = 0) -> ir.Value:
    return select(_tri_mask(shape_of(x), True, k), x, _like(0, x))


def _triu(x: ir.Value, k: int = 0) -> ir.Value:
    return select(_tri_mask(shape_of(x), False, k), x, _like(0, x))


def _eye(shape: Sequence[int], dt: torch.dtype) -> ir.Value:
    """A batch of identity matrices (ones on the main diagonal) of `shape`."""
    rows, cols = _matrix_masks(shape)
    return select(compare(rows, cols, "EQ"), _c(1, dt, shape), _c(0, dt, shape))


def _diagonal(x: ir.Value) -> ir.Value:
    """The main diagonal of the last two dims: (..., min(m, n)), by a strided slice of
    the flattened matrices (exact: no arithmetic)."""
    shape = shape_of(x)
    batch, (m, n) = shape[:-2], shape[-2:]
    k = min(m, n)
    if k == 0:
        return full(0, dtype(x), batch + [0]) if not dtype(x).is_complex else _c(0, dtype(x), batch + [0])
    flat = reshape(x, batch + [m * n])
    return _slice(flat, len(batch), 0, (k - 1) * (n + 1) + 1, n + 1)


def _diag_embed(v: ir.Value, m: int, n: int) -> ir.Value:
    """(..., k) -> (..., m, n) with v on the main diagonal (k = min(m, n))."""
    shape = shape_of(v)
    batch = shape[:-1]
    out = batch + [m, n]
    k = shape[-1]
    if k < n:
        v = stablehlo.PadOp(v, _c(0, dtype(v)), [0] * len(shape), [0] * (len(shape) - 1) + [n - k], [0] * len(shape)).result
    cols = _expand_last(v, m, -2)
    rows, colsi = _matrix_masks(out)
    return select(compare(rows, colsi, "EQ"), cols, _c(0, dtype(v), out))


def _matmul(a: ir.Value, b: ir.Value) -> ir.Value:
    """Batched a @ b (equal batch dims) at full precision: linear algebra never runs in
    a reduced-precision pass, whatever `torch.get_float32_matmul_precision()` says."""
    sa, sb = shape_of(a), shape_of(b)
    nb = len(sa) - 2
    batch = list(range(nb))
    del sb
    product = dot_general(a, b, batch=(batch, batch), contract=([nb + 1], [nb]), precision="HIGHEST")
    # Keep HIGHEST through torchtpu-set-precision (passes/set_precision.py).
    product.owner.attributes["torchtpu.fixed_precision"] = ir.UnitAttr.get()
    return product


def _batch_broadcast(x: ir.Value, batch: Sequence[int]) -> ir.Value:
    shape = shape_of(x)
    return broadcast_to(x, list(batch) + shape[-2:])


# -- loops -----------------------------------------------------------------------------------------
def _while(init: Sequence[ir.Value], cond: Callable, body: Callable) -> list[ir.Value]:
    """`stablehlo.while`: `cond(values) -> 0-d i1`, `body(values) -> values`."""
    types = [v.type for v in init]
    op = stablehlo.WhileOp(types, list(init))
    cond_block = op.cond.blocks.append(*types)
    with ir.InsertionPoint(cond_block):
        stablehlo.ReturnOp([cond(list(cond_block.arguments))])
    body_block = op.body.blocks.append(*types)
    with ir.InsertionPoint(body_block):
        stablehlo.ReturnOp(list(body(list(body_block.arguments))))
    return list(op.results)


def _fori(start: int, stop: int, init: Sequence[ir.Value], body: Callable, step: int = 1) -> list[ir.Value]:
    """for i in range(start, stop, step): values = body(i, values), with i a 0-d int32."""
    if (stop - start) * step <= 0:
        return list(init)

    def cond(vals):
        return compare(vals[0], _scalar_i32(stop), "LT" if step > 0 else "GT")

    def loop(vals):
        i, rest = vals[0], vals[1:]
        new = body(i, rest)
        return [_add(i, _scalar_i32(step))] + list(new)

    return _while([_scalar_i32(start)] + list(init), cond, loop)[1:]


def _is_empty(shape: Sequence[int]) -> bool:
    return any(int(s) == 0 for s in shape)


def _zeros(ctx: LoweringContext, index: int | None = None) -> ir.Value:
    return _c(0, ctx.result_dtype(index), ctx.result_shape(index))
