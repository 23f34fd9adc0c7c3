"""Dense linear algebra: Cholesky and triangular solves (native `stablehlo.cholesky` /
`stablehlo.triangular_solve`), LU with partial pivoting, Householder QR, LDL^T with
Bunch-Kaufman pivoting, symmetric eigendecomposition and SVD (Jacobi), and what PyTorch
builds on them (solve, inv, det, slogdet, lu_solve, lu_unpack, householder_product,
ormqr, ldl_solve, pinv, matrix_exp).

Algorithms without a StableHLO op are written as `stablehlo.while` loops over
elementwise, masked updates of the whole (batched) matrix, so every batch element
takes the same steps and no dynamic shapes appear:

* LU: LAPACK getrf's partial pivoting (the first row of largest |a| — |re|+|im| for
  complex — at or below the diagonal), 1-based int32 pivots, `info` = the first zero
  pivot, so pivots and factors equal eager's up to rounding.
* LDL^T: LAPACK sytf2's Bunch-Kaufman pivoting (uplo 'L'; negative pivots mark 2x2
  blocks), real and complex-symmetric; each matrix of a batch advances by 1 or 2
  columns per step. Complex Hermitian (hetrf) is not lowered.
* QR: LAPACK geqrf's Householder reflectors (beta = -sign(alpha) * norm, tau =
  (beta - alpha) / beta), so `geqrf`, `linalg_qr`, `householder_product` and `ormqr`
  equal eager's up to rounding.
* eigh: cyclic Jacobi with round-robin (parallel) ordering until the off-diagonal part
  is below eps relative to the matrix; eigenvalues ascending. SVD: one-sided (Hestenes)
  Jacobi, then a Householder QR of the rotated columns for U. Singular values and
  eigenvalues equal eager's; singular/eigen *vectors* are unique only up to sign
  (phase), which LAPACK fixes by its own algorithm's accident; ours may differ.
* matrix_exp: PyTorch's own algorithm (Bader-Blanes-Casas Taylor approximants chosen
  by the 1-norm, scaling and squaring), step by step.

Products inside these algorithms run at HIGHEST precision whatever
`torch.get_float32_matmul_precision()` says (PyTorch's linalg kernels never use TF32).

Errors: `info` outputs are computed as LAPACK defines them (cholesky: 1 + the first
non-positive pivot; LU: 1 + the first exactly-zero pivot; LDL: 1 + the first zero
column). The `_linalg_check_errors` that `torch.linalg.inv/solve/cholesky/lu_factor`
add to raise on a nonzero info is dropped (checks.py): a singular or non-positive-
definite input gives inf/NaN results instead of an error.

`_linalg_det` and `_linalg_slogdet` return the LU factorization of A^T instead of A
when A is real and contiguous (their backward formulas rely on it); the lowerings do
the same, reading contiguity from the FX node's metadata.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import (
    array_constant,
    broadcast_shapes,
    broadcast_to,
    compare,
    convert,
    dtype,
    full,
    reduce,
    reshape,
    select,
    shape_of,
    transpose,
)
from .registry import declare_padding, LoweringContext, lowers, Padding

aten = torch.ops.aten

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


def _add(a, b):
    return stablehlo.AddOp(a, b).result


def _sub(a, b):
    return stablehlo.SubtractOp(a, b).result


def _mul(a, b):
    return stablehlo.MulOp(a, b).result


def _div(a, b):
    return stablehlo.DivOp(a, b).result


def _neg(a):
    return stablehlo.NegOp(a).result


def _abs(a):
    return stablehlo.AbsOp(a).result


def _sqrt(a):
    return stablehlo.SqrtOp(a).result


def _and(a, b):
    return stablehlo.AndOp(a, b).result


def _or(a, b):
    return stablehlo.OrOp(a, b).result


def _not(a):
    return stablehlo.NotOp(a).result


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


def _iota(shape: Sequence[int], dim: int, dt: torch.dtype = torch.int32) -> ir.Value:
    return stablehlo.IotaOp(tensor_type(list(shape), dt), dim).result


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


def _slice(x: ir.Value, dim: int, start: int, limit: int, stride: int = 1) -> ir.Value:
    shape = shape_of(x)
    starts = [0] * len(shape)
    limits = list(shape)
    strides = [1] * len(shape)
    starts[dim], limits[dim], strides[dim] = start, limit, stride
    return stablehlo.SliceOp(x, starts, limits, strides).result


def _concat(values: Sequence[ir.Value], dim: int) -> ir.Value:
    return stablehlo.ConcatenateOp(list(values), dim).result


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
    return _iota(shape, rank - 2), _iota(shape, rank - 1)


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


def _dot_attr(lhs_batch, rhs_batch, lhs_contract, rhs_contract) -> ir.Attribute:
    def dims(d):
        return "[" + ", ".join(str(int(i)) for i in d) + "]"

    text = "#stablehlo.dot<"
    if lhs_batch:
        text += f"lhs_batching_dimensions = {dims(lhs_batch)}, rhs_batching_dimensions = {dims(rhs_batch)}, "
    text += f"lhs_contracting_dimensions = {dims(lhs_contract)}, rhs_contracting_dimensions = {dims(rhs_contract)}>"
    return ir.Attribute.parse(text)


def _matmul(a: ir.Value, b: ir.Value) -> ir.Value:
    """Batched a @ b (equal batch dims) at full precision: linear algebra never runs in
    a reduced-precision pass, whatever `torch.get_float32_matmul_precision()` says."""
    sa, sb = shape_of(a), shape_of(b)
    nb = len(sa) - 2
    batch = list(range(nb))
    out = sa[:-2] + [sa[-2], sb[-1]]
    precision = ir.Attribute.parse("#stablehlo<precision HIGHEST>")
    op = stablehlo.DotGeneralOp(
        tensor_type(out, dtype(a)), a, b, _dot_attr(batch, batch, [nb + 1], [nb]),
        precision_config=ir.ArrayAttr.get([precision, precision]),
    )
    # Keep HIGHEST through torchtpu-set-precision (passes/set_precision.py).
    op.operation.attributes["torchtpu.fixed_precision"] = ir.UnitAttr.get()
    return op.result


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


# -- Cholesky ----------------------------------------------------------------------------------------
def _cholesky_lower(a: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(L, info): the lower Cholesky factor (upper triangle zeroed) and LAPACK potrf's
    info (see `_cholesky_info`)."""
    shape = shape_of(a)
    if _is_empty(shape):
        return a, full(0, torch.int32, shape[:-2])
    factor = stablehlo.CholeskyOp(a, lower=ir.BoolAttr.get(True), results=[a.type]).result
    return _tril(factor), _cholesky_info(a)


@lowers(aten.linalg_cholesky_ex.default)
def _linalg_cholesky_ex(ctx, self, *, upper=False, check_errors=False):
    _check_dtype(ctx, dtype(self))
    factor, info = _cholesky_lower(self)
    return (_mH(factor) if upper else factor), info


@lowers(aten.cholesky.default)
def _cholesky(ctx, self, upper=False):
    return _linalg_cholesky_ex(ctx, self, upper=upper)[0]


# -- triangular solves --------------------------------------------------------------------------------
def _trsm(a: ir.Value, b: ir.Value, *, left: bool, lower: bool, unit: bool, op: str = "NO_TRANSPOSE") -> ir.Value:
    """stablehlo.triangular_solve on equal batch dims: op(a) x = b (left) or
    x op(a) = b; only the `lower`/upper triangle of a is read."""
    if _is_empty(shape_of(b)):  # (a 0x0 a means an empty b)
        return b
    attr = ir.Attribute.parse(f"#stablehlo<transpose {op}>")
    return stablehlo.TriangularSolveOp(a, b, left, lower, unit, attr, results=[b.type]).result


def _broadcast_pair(a: ir.Value, b: ir.Value, out_dtype: torch.dtype) -> tuple[ir.Value, ir.Value]:
    """Converts both to `out_dtype` and broadcasts their batch dims together."""
    a, b = convert(a, out_dtype), convert(b, out_dtype)
    batch = broadcast_shapes(shape_of(a)[:-2], shape_of(b)[:-2])
    return _batch_broadcast(a, batch), _batch_broadcast(b, batch)


@lowers(aten.linalg_solve_triangular.default)
def _linalg_solve_triangular(ctx, self, B, *, upper, left=True, unitriangular=False):
    out = ctx.result_dtype()
    _check_dtype(ctx, out)
    a, b = _broadcast_pair(self, B, out)
    return _trsm(a, b, left=left, lower=not upper, unit=unitriangular)


@lowers(aten.triangular_solve.default)
def _triangular_solve(ctx, self, A, upper=True, transpose=False, unitriangular=False):
    out = ctx.result_dtype(0)
    _check_dtype(ctx, out)
    a, b = _broadcast_pair(A, self, out)
    op = "TRANSPOSE" if transpose else "NO_TRANSPOSE"
    return _trsm(a, b, left=True, lower=not upper, unit=unitriangular, op=op), a


def _cholesky_solve_impl(b: ir.Value, factor: ir.Value, upper: bool) -> ir.Value:
    """A^-1 b with A = L L^H (lower) or U^H U (upper)."""
    if upper:
        y = _trsm(factor, b, left=True, lower=False, unit=False, op="ADJOINT")
        return _trsm(factor, y, left=True, lower=False, unit=False)
    y = _trsm(factor, b, left=True, lower=True, unit=False)
    return _trsm(factor, y, left=True, lower=True, unit=False, op="ADJOINT")


@lowers(aten.cholesky_solve.default)
def _cholesky_solve(ctx, self, input2, upper=False):
    out = ctx.result_dtype()
    _check_dtype(ctx, out)
    factor, b = _broadcast_pair(input2, self, out)
    return _cholesky_solve_impl(b, factor, upper)


@lowers(aten.cholesky_inverse.default)
def _cholesky_inverse(ctx, self, upper=False):
    out = ctx.result_dtype()
    _check_dtype(ctx, out)
    factor = convert(self, out)
    return _cholesky_solve_impl(_eye(shape_of(factor), out), factor, upper)


def _cholesky_info(a: ir.Value) -> ir.Value:
    """LAPACK potrf's info for each matrix of the batch: 1 + the first k whose pivot
    a_kk - sum_j |l_kj|^2 is not positive (or NaN), else 0. XLA's Cholesky fills a
    failed factor with NaN entirely, so the failure point is found by an unblocked
    right-looking factorization of its own (dead code, removed by XLA, when the info
    output is unused, as under `torch.linalg.cholesky`)."""
    shape = shape_of(a)
    batch, n = shape[:-2], shape[-1]
    real = _real_dtype(dtype(a))

    def body(k, vals):
        x, info = vals
        col = reshape(_dynamic_slice_last(x, k), batch + [n])
        d = _real(reshape(_dynamic_slice_last(_diagonal(x), k), batch))
        bad = _not(compare(d, full(0, real, batch), "GT"))
        kk = broadcast_to(k, batch)
        info = select(_and(bad, compare(info, full(0, torch.int32, batch), "EQ")), _add(kk, full(1, torch.int32, batch)), info)
        below = compare(_iota(batch + [n], len(batch)), broadcast_to(k, batch + [n]), "GT")
        l = select(below, _div(col, _to_complex(broadcast_to(reshape(_sqrt(d), batch + [1]), batch + [n]), dtype(a))), _like(0, col))
        outer = _mul(_expand_last(l, n, -1), _conj(_expand_last(l, n, -2)))
        x = _sub(x, outer)
        return [x, info]

    return _fori(0, n, [a, full(0, torch.int32, batch)], body)[1]


# -- LU with partial pivoting ----------------------------------------------------------------------
def _pivot_magnitude(x: ir.Value) -> ir.Value:
    """LAPACK i?amax's measure: |x| for real, |re| + |im| for complex."""
    if dtype(x).is_complex:
        return _add(_abs(_real(x)), _abs(_imag(x)))
    return _abs(x)


def _pick(x: ir.Value, index: ir.Value, dim: int) -> ir.Value:
    """x indexed by `index` (per batch element, shape = x's shape without `dim` and the
    dims after it) along `dim`, dropping `dim`; exact (a masked sum of zeros)."""
    shape = shape_of(x)
    idx = broadcast_to(index, shape[:dim]) if shape_of(index) != shape[:dim] else index
    dims = list(range(len(shape[:dim])))
    idx = stablehlo.BroadcastInDimOp(tensor_type(shape, torch.int32), idx, dims).result
    hit = compare(_iota(shape, dim), idx, "EQ")
    return _sum(select(hit, x, _like(0, x)), [dim])


def _lu_factor(a: ir.Value, pivot: bool = True) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """(LU, pivots, perm, info) of a batch of m x n matrices, as LAPACK getrf: pivots
    are 1-based int32 row interchanges, perm (..., m) the resulting row order (row i
    of L U is row perm[i] of a), info 1 + the first exactly-zero pivot (0 if none)."""
    shape = shape_of(a)
    batch, (m, n) = shape[:-2], shape[-2:]
    k = min(m, n)
    nb = len(batch)
    dt = dtype(a)
    i32 = torch.int32
    if _is_empty(batch):
        return a, full(0, i32, batch + [k]), full(0, i32, batch + [m]), full(0, i32, batch)
    rows, cols = _matrix_masks(shape)
    vrows = _iota(batch + [m], nb)

    def body(j, vals):
        x, perm, piv = vals
        jb = broadcast_to(j, batch)
        col = reshape(_dynamic_slice_last(x, j), batch + [m])
        if pivot:
            mag = _pivot_magnitude(col)
            rdt = dtype(mag)
            usable = _and(compare(vrows, broadcast_to(j, batch + [m]), "GE"), compare(mag, mag, "EQ"))
            mag = select(usable, mag, full(-1, rdt, batch + [m]))
            top = _max(mag, [nb])
            hit = compare(mag, broadcast_to(reshape(top, batch + [1]), batch + [m]), "EQ")
            p = _min(select(hit, vrows, full(m, i32, batch + [m])), [nb])
        else:
            p = jb
        row_j, row_p = _pick(x, jb, nb), _pick(x, p, nb)  # (..., n)
        is_j = compare(rows, broadcast_to(j, shape), "EQ")
        is_p = compare(rows, stablehlo.BroadcastInDimOp(tensor_type(shape, i32), p, list(range(nb))).result, "EQ")
        x = select(is_j, _expand_last(row_p, m, -2), select(is_p, _expand_last(row_j, m, -2), x))
        perm_j, perm_p = _pick(perm, jb, nb), _pick(perm, p, nb)
        vj = compare(vrows, broadcast_to(j, batch + [m]), "EQ")
        vp = compare(vrows, _expand_last(p, m, -1), "EQ")
        perm = select(vj, _expand_last(perm_p, m, -1), select(vp, _expand_last(perm_j, m, -1), perm))
        piv = select(compare(_iota(batch + [k], nb), broadcast_to(j, batch + [k]), "EQ"),
                     _expand_last(_add(p, full(1, i32, batch)), k, -1), piv)
        # Eliminate below the pivot (a zero pivot leaves the column, all zeros, as is).
        pv = reshape(_dynamic_slice_last(row_p, j), batch)
        col = reshape(_dynamic_slice_last(x, j), batch + [m])
        nonzero = compare(pv, _like(0, pv), "NE")
        below = compare(vrows, broadcast_to(j, batch + [m]), "GT")
        # LAPACK getrf2 scales by the reciprocal unless it would overflow.
        pvm = _expand_last(pv, m, -1)
        tiny = full(torch.finfo(_real_dtype(dt)).tiny, _real_dtype(dt), batch + [m])
        scaled = select(compare(_abs(pvm), tiny, "GE"), _mul(col, _div(_like(1, pvm), pvm)), _div(col, pvm))
        l = select(_and(below, _expand_last(nonzero, m, -1)), scaled, select(below, col, _like(0, col)))
        outer = _mul(_expand_last(l, n, -1), _expand_last(row_p, m, -2))
        trailing = _and(compare(rows, broadcast_to(j, shape), "GT"), compare(cols, broadcast_to(j, shape), "GT"))
        x = select(trailing, _sub(x, outer), x)
        x = select(_and(compare(rows, broadcast_to(j, shape), "GT"), compare(cols, broadcast_to(j, shape), "EQ")),
                   _expand_last(l, n, -1), x)
        return [x, perm, piv]

    lu, perm, piv = _fori(0, k, [a, vrows, full(0, i32, batch + [k])], body)
    return lu, piv, perm, _first_zero_pivot(lu)


def _first_zero_pivot(lu: ir.Value) -> ir.Value:
    diag = _diagonal(lu)
    shape = shape_of(diag)
    batch, k = shape[:-1], shape[-1]
    if k == 0:
        return full(0, torch.int32, batch)
    positions = _iota(shape, len(batch))
    zero = compare(diag, _like(0, diag), "EQ")
    first = _min(select(zero, positions, full(k, torch.int32, shape)), [len(batch)])
    return select(compare(first, full(k, torch.int32, batch), "EQ"), full(0, torch.int32, batch),
                  _add(first, full(1, torch.int32, batch)))


def _perm_from_pivots(piv: ir.Value, m: int) -> ir.Value:
    """The row order (..., m) int32 that LAPACK's sequential row interchanges
    (1-based pivots (..., k)) produce: row i of L U is row perm[i] of A."""
    shape = shape_of(piv)
    batch, k = shape[:-1], shape[-1]
    nb = len(batch)
    piv = convert(piv, torch.int32)
    vrows = _iota(batch + [m], nb)

    def body(j, vals):
        (perm,) = vals
        p = _sub(_pick(piv, broadcast_to(j, batch), nb), full(1, torch.int32, batch))
        perm_j, perm_p = _pick(perm, broadcast_to(j, batch), nb), _pick(perm, p, nb)
        vj = compare(vrows, broadcast_to(j, batch + [m]), "EQ")
        vp = compare(vrows, _expand_last(p, m, -1), "EQ")
        return [select(vj, _expand_last(perm_p, m, -1), select(vp, _expand_last(perm_j, m, -1), perm))]

    if _is_empty(batch):
        return vrows
    return _fori(0, k, [vrows], body)[0]


def _inverse_perm(perm: ir.Value) -> ir.Value:
    """inv[perm[i]] = i, exact (a masked integer sum)."""
    shape = shape_of(perm)
    batch, m = shape[:-1], shape[-1]
    nb = len(batch)
    square = batch + [m, m]
    # hit[r, i] = perm[i] == r ; inv[r] = sum_i hit * i
    hit = compare(_expand_last(perm, m, -2), _iota(square, nb), "EQ")
    return _sum(select(hit, _iota(square, nb + 1), full(0, torch.int32, square)), [nb + 1])


def _take_rows(x: ir.Value, idx: ir.Value) -> ir.Value:
    """out[..., i, :] = x[..., idx[..., i], :] (a batched gather; equal batch dims)."""
    shape = shape_of(x)
    nb = len(shape) - 2
    batch = list(range(nb))

    def dims(d):
        return "[" + ", ".join(str(i) for i in d) + "]"

    attr = ir.Attribute.parse(
        f"#stablehlo.gather<offset_dims = [{nb + 1}], collapsed_slice_dims = [{nb}], "
        f"operand_batching_dims = {dims(batch)}, start_indices_batching_dims = {dims(batch)}, "
        f"start_index_map = [{nb}], index_vector_dim = {nb + 1}>"
    )
    out = shape_of(idx) + [shape[-1]]
    return stablehlo.GatherOp(x, convert(idx, torch.int32), attr, [1] * nb + [1, shape[-1]],
                              results=[tensor_type(out, dtype(x))]).result


def _perm_matrix(perm: ir.Value, dt: torch.dtype) -> ir.Value:
    """P with A = P L U: P[perm[i], i] = 1."""
    shape = shape_of(perm)
    batch, m = shape[:-1], shape[-1]
    square = batch + [m, m]
    hit = compare(_iota(square, len(batch)), _expand_last(perm, m, -2), "EQ")
    return select(hit, _c(1, dt, square), _c(0, dt, square))


def _unit_lower(lu: ir.Value, cols: int) -> ir.Value:
    """L (..., m, cols) from packed LU: strictly-lower part plus a unit diagonal."""
    shape = shape_of(lu)
    lower = _slice(lu, len(shape) - 1, 0, cols)
    lshape = shape_of(lower)
    return select(_tri_mask(lshape, True, -1), lower, _eye(lshape, dtype(lu)))


def _upper(lu: ir.Value, rows: int) -> ir.Value:
    shape = shape_of(lu)
    return _triu(_slice(lu, len(shape) - 2, 0, rows))


def _lu_solve_impl(lu: ir.Value, perm: ir.Value, b: ir.Value, left: bool, adjoint: bool) -> ir.Value:
    """X with op(A) X = B (left) or X op(A) = B, A = P L U given as packed LU and the
    row order `perm`; all three share batch dims."""
    if not left:
        # X A = B <=> A^H X^H = B^H ;  X A^H = B <=> A X^H = B^H
        return _mH(_lu_solve_impl(lu, perm, _mH(b), True, not adjoint))
    if _is_empty(shape_of(b)):
        return b
    if not adjoint:
        y = _take_rows(b, perm)  # P^T B
        y = _trsm(lu, y, left=True, lower=True, unit=True)
        return _trsm(lu, y, left=True, lower=False, unit=False)
    # A^H = U^H L^H P^T: X = P L^-H U^-H B
    y = _trsm(lu, b, left=True, lower=False, unit=False, op="ADJOINT")
    y = _trsm(lu, y, left=True, lower=True, unit=True, op="ADJOINT")
    return _take_rows(y, _inverse_perm(perm))


@lowers(aten.linalg_lu_factor_ex.default)
def _linalg_lu_factor_ex(ctx, A, *, pivot=True, check_errors=False):
    _check_dtype(ctx, dtype(A))
    lu, piv, _, info = _lu_factor(A, pivot)
    if not pivot:
        # Without pivoting PyTorch (CUDA only) reports the identity interchanges 1..k.
        shape = shape_of(piv)
        piv = _add(_iota(shape, len(shape) - 1), full(1, torch.int32, shape))
    return lu, piv, info


@lowers(aten.linalg_lu.default)
def _linalg_lu(ctx, A, *, pivot=True):
    _check_dtype(ctx, dtype(A))
    shape = shape_of(A)
    m, n = shape[-2:]
    k = min(m, n)
    lu, _, perm, _ = _lu_factor(A, pivot)
    if pivot:
        p = _perm_matrix(perm, dtype(A))
    else:
        p = _zeros(ctx, 0)  # PyTorch returns an empty P without pivoting
    return p, _unit_lower(lu, k), _upper(lu, k)


@lowers(aten.lu_unpack.default)
def _lu_unpack(ctx, LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    shape = shape_of(LU_data)
    m, n = shape[-2:]
    k = min(m, n)
    if unpack_data:
        l, u = _unit_lower(LU_data, k), _upper(LU_data, k)
    else:
        l, u = _zeros(ctx, 1), _zeros(ctx, 2)
    if unpack_pivots:
        pshape = ctx.result_shape(0)
        piv = broadcast_to(LU_pivots, pshape[:-2] + shape_of(LU_pivots)[-1:])
        p = _perm_matrix(_perm_from_pivots(piv, m), ctx.result_dtype(0))
    else:
        p = _zeros(ctx, 0)
    return p, l, u


def _broadcast_lu(lu: ir.Value, piv: ir.Value, b: ir.Value, out_dtype: torch.dtype):
    lu, b = convert(lu, out_dtype), convert(b, out_dtype)
    batch = broadcast_shapes(shape_of(lu)[:-2], shape_of(b)[:-2], shape_of(piv)[:-1])
    lu, b = _batch_broadcast(lu, batch), _batch_broadcast(b, batch)
    piv = broadcast_to(convert(piv, torch.int32), batch + shape_of(piv)[-1:])
    return lu, piv, b


@lowers(aten.linalg_lu_solve.default)
def _linalg_lu_solve(ctx, LU, pivots, B, *, left=True, adjoint=False):
    out = ctx.result_dtype()
    _check_dtype(ctx, out)
    lu, piv, b = _broadcast_lu(LU, pivots, B, out)
    n = shape_of(lu)[-1]
    perm = _perm_from_pivots(piv, n)
    return _lu_solve_impl(lu, perm, b, left, adjoint)


def _uses_transpose(ctx: LoweringContext, A: ir.Value) -> bool:
    """PyTorch's det and slogdet factor A^T instead of A when A is real and contiguous;
    their backward formulas read the returned LU accordingly."""
    meta = ctx.arg_meta(0)
    return not dtype(A).is_complex and isinstance(meta, torch.Tensor) and meta.is_contiguous()


def _lu_det_sign(piv: ir.Value) -> ir.Value:
    """+1 / -1 (int32, batch-shaped): the parity of the row interchanges."""
    shape = shape_of(piv)
    nb = len(shape) - 1
    natural = _add(_iota(shape, nb), full(1, torch.int32, shape))
    swaps = _sum(select(compare(piv, natural, "NE"), full(1, torch.int32, shape), full(0, torch.int32, shape)), [nb])
    odd = compare(stablehlo.AndOp(swaps, full(1, torch.int32, shape[:-1])).result, full(1, torch.int32, shape[:-1]), "EQ")
    return select(odd, full(-1, torch.int32, shape[:-1]), full(1, torch.int32, shape[:-1]))


@lowers(aten._linalg_det.default)
def _linalg_det(ctx, A):
    dt = dtype(A)
    _check_dtype(ctx, dt)
    lu, piv, _, _ = _lu_factor(_mT(A) if _uses_transpose(ctx, A) else A)
    det = _prod(_diagonal(lu), [len(shape_of(lu)) - 2])
    sign = convert(convert(_lu_det_sign(piv), _real_dtype(dt)), dt) if dt.is_complex else convert(_lu_det_sign(piv), dt)
    return _mul(det, sign), lu, piv


def _sgn(x: ir.Value) -> ir.Value:
    """torch.sgn: x / |x| (0 for 0); sign for real."""
    if not dtype(x).is_complex:
        return stablehlo.SignOp(x).result
    mag = _abs(x)
    zero = compare(mag, full(0, dtype(mag), shape_of(mag)), "EQ")
    safe = select(zero, full(1, dtype(mag), shape_of(mag)), mag)
    q = _div(x, _to_complex(safe, dtype(x)))
    return select(zero, _like(0, x), q)


@lowers(aten._linalg_slogdet.default)
def _linalg_slogdet(ctx, A):
    dt = dtype(A)
    _check_dtype(ctx, dt)
    lu, piv, _, _ = _lu_factor(_mT(A) if _uses_transpose(ctx, A) else A)
    diag = _diagonal(lu)
    nb = len(shape_of(lu)) - 2
    perm_sign = convert(_lu_det_sign(piv), _real_dtype(dt))
    sign = _mul(_prod(_sgn(diag), [nb]), _to_complex(perm_sign, dt))
    logabs = _sum(stablehlo.LogOp(_abs(diag)).result, [nb])
    return sign, logabs, lu, piv


def _vector_rhs(A_shape: Sequence[int], B_shape: Sequence[int]) -> bool:
    """PyTorch's linalg_solve_is_vector_rhs."""
    return len(B_shape) == 1 or (len(A_shape) - 1 == len(B_shape) and list(B_shape) == list(A_shape[:-1]))


@lowers(aten._linalg_solve_ex.default)
def _linalg_solve_ex(ctx, A, B, *, left=True, check_errors=False):
    out = ctx.result_dtype(0)
    _check_dtype(ctx, out)
    A = convert(A, out)
    lu, piv, perm, info = _lu_factor(A)
    vector = _vector_rhs(shape_of(A), shape_of(B))
    b = convert(B, out)
    if vector:
        bs = shape_of(b)
        b = reshape(b, bs + [1] if left else bs[:-1] + [1, bs[-1]])
    batch = broadcast_shapes(shape_of(lu)[:-2], shape_of(b)[:-2])
    lub = _batch_broadcast(lu, batch)
    permb = broadcast_to(perm, batch + shape_of(perm)[-1:])
    x = _lu_solve_impl(lub, permb, _batch_broadcast(b, batch), left, False)
    return reshape(x, ctx.result_shape(0)), lu, piv, info


@lowers(aten.linalg_inv_ex.default)
def _linalg_inv_ex(ctx, A, *, check_errors=False):
    dt = dtype(A)
    _check_dtype(ctx, dt)
    lu, _, perm, info = _lu_factor(A)
    return _lu_solve_impl(lu, perm, _eye(shape_of(A), dt), True, False), info


# -- Householder QR ----------------------------------------------------------------------------------
def _column(x: ir.Value, j: ir.Value) -> ir.Value:
    """x[..., :, j] (dynamic j)."""
    shape = shape_of(x)
    return reshape(_dynamic_slice_last(x, j), shape[:-1])


def _entry(v: ir.Value, j: ir.Value) -> ir.Value:
    """v[..., j] (dynamic j)."""
    return reshape(_dynamic_slice_last(v, j), shape_of(v)[:-1])


def _vnorm(x: ir.Value, dim: int) -> ir.Value:
    """The 2-norm along `dim` (real result), scaled by the largest magnitude first so it
    neither overflows nor underflows (as LAPACK's nrm2)."""
    mag = _abs(x)
    rdt = dtype(mag)
    scale = _max(mag, [dim])
    safe = select(compare(scale, full(0, rdt, shape_of(scale)), "GT"), scale, full(1, rdt, shape_of(scale)))
    shape = shape_of(x)
    dims = [d for d in range(len(shape)) if d != dim]
    safe_b = stablehlo.BroadcastInDimOp(tensor_type(shape, rdt), safe, dims).result
    scaled = _div(mag, safe_b)
    return _mul(_sqrt(_sum(_mul(scaled, scaled), [dim])), safe)


def _householder_vector(col: ir.Value, j: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """LAPACK larfg on col[j:] of a batch of columns (..., m): (v, tau, beta), v (..., m)
    the reflector (zeros above j, 1 at j), tau (...) its scale factor, beta (...) the
    new col[j] (real), so (I - tau v v^H)^H col[j:] = beta e_j."""
    shape = shape_of(col)
    batch, m = shape[:-1], shape[-1]
    nb = len(batch)
    dt = dtype(col)
    rdt = _real_dtype(dt)
    rows = _iota(shape, nb)
    jm = broadcast_to(j, shape)
    below = compare(rows, jm, "GT")
    x = select(below, col, _like(0, col))
    alpha = _entry(col, j)
    xnorm = _vnorm(x, nb)
    re = _real(alpha)
    zero = full(0, rdt, batch)
    if dt.is_complex:
        im = _imag(alpha)
        trivial = _and(compare(xnorm, zero, "EQ"), compare(im, zero, "EQ"))
        norm = _vnorm(_concat([reshape(re, batch + [1]), reshape(im, batch + [1]), reshape(xnorm, batch + [1])], nb), nb)
    else:
        trivial = compare(xnorm, zero, "EQ")
        norm = _vnorm(_concat([reshape(re, batch + [1]), reshape(xnorm, batch + [1])], nb), nb)
    # beta = -sign(re(alpha)) * norm (Fortran SIGN: +0 counts as positive)
    negative = compare(re, zero, "LT")
    beta = select(negative, norm, _neg(norm))
    safe_beta = select(trivial, full(1, rdt, batch), beta)
    if dt.is_complex:
        tau = _complex(_div(_sub(safe_beta, re), safe_beta), _neg(_div(im, safe_beta)))
    else:
        tau = _div(_sub(safe_beta, re), safe_beta)
    tau = select(trivial, _like(0, tau), tau)
    denom = _sub(alpha, _to_complex(safe_beta, dt))
    denom = select(trivial, _like(1, denom), denom)
    scale = _div(_like(1, denom), denom)
    v = select(below, _mul(x, _expand_last(scale, m, -1)), _like(0, col))
    v = select(compare(rows, jm, "EQ"), _like(1, col), v)
    beta = select(trivial, re, beta)
    return v, tau, beta


def _reflect_left(c: ir.Value, v: ir.Value, tau: ir.Value) -> ir.Value:
    """(I - tau v v^H) c for a batch: c (..., m, n), v (..., m), tau (...)."""
    shape = shape_of(c)
    m, n = shape[-2:]
    nb = len(shape) - 2
    w = _sum(_mul(_expand_last(_conj(v), n, -1), c), [nb])  # v^H c: (..., n)
    tv = _mul(v, _expand_last(tau, m, -1))
    return _sub(c, _mul(_expand_last(tv, n, -1), _expand_last(w, m, -2)))


def _reflect_right(c: ir.Value, v: ir.Value, tau: ir.Value) -> ir.Value:
    """c (I - tau v v^H) for a batch: c (..., m, n), v (..., n), tau (...)."""
    shape = shape_of(c)
    m, n = shape[-2:]
    nb = len(shape) - 2
    w = _sum(_mul(c, _expand_last(v, m, -2)), [nb + 1])  # c v: (..., m)
    tw = _mul(w, _expand_last(tau, m, -1))
    return _sub(c, _mul(_expand_last(tw, n, -1), _expand_last(_conj(v), m, -2)))


def _geqrf(a: ir.Value) -> tuple[ir.Value, ir.Value]:
    """LAPACK geqrf: (R above the diagonal and the reflectors below it, tau)."""
    shape = shape_of(a)
    batch, (m, n) = shape[:-2], shape[-2:]
    k = min(m, n)
    nb = len(batch)
    dt = dtype(a)
    if _is_empty(batch) or k == 0:
        return a, _c(0, dt, batch + [k])
    rows, cols = _matrix_masks(shape)

    def body(j, vals):
        x, taus = vals
        v, tau, beta = _householder_vector(_column(x, j), j)
        jj = broadcast_to(j, shape)
        # H^H applied to the trailing columns (geqr2 applies conj(tau)).
        updated = _reflect_left(x, v, _conj(tau))
        x = select(compare(cols, jj, "GT"), updated, x)
        vrows = _iota(batch + [m], nb)
        vcol = select(compare(vrows, broadcast_to(j, batch + [m]), "EQ"), _expand_last(_to_complex(beta, dt), m, -1), v)
        x = select(_and(compare(cols, jj, "EQ"), compare(rows, jj, "GE")), _expand_last(vcol, n, -1), x)
        taus = select(compare(_iota(batch + [k], nb), broadcast_to(j, batch + [k]), "EQ"), _expand_last(tau, k, -1), taus)
        return [x, taus]

    x, taus = _fori(0, k, [a, _c(0, dt, batch + [k])], body)
    return x, taus


def _reflector(vs: ir.Value, j: ir.Value) -> ir.Value:
    """Reflector j of a packed matrix: column j with zeros above j and 1 at j."""
    col = _column(vs, j)
    shape = shape_of(col)
    rows = _iota(shape, len(shape) - 1)
    jm = broadcast_to(j, shape)
    v = select(compare(rows, jm, "GT"), col, _like(0, col))
    return select(compare(rows, jm, "EQ"), _like(1, col), v)


def _apply_q(vs: ir.Value, taus: ir.Value, c: ir.Value, *, left: bool, adjoint: bool) -> ir.Value:
    """Q c, Q^H c (left) or c Q, c Q^H with Q = H_0 ... H_{k-1} from packed reflectors
    `vs` (..., mn, >= k) and `taus` (..., k); all share batch dims."""
    k = shape_of(taus)[-1]
    forward = left == adjoint  # Q^H c and c Q apply H_0 first
    start, stop, step = (0, k, 1) if forward else (k - 1, -1, -1)

    def body(j, vals):
        (x,) = vals
        v = _reflector(vs, j)
        tau = _entry(taus, j)
        if adjoint:
            tau = _conj(tau)
        return [_reflect_left(x, v, tau) if left else _reflect_right(x, v, tau)]

    if _is_empty(shape_of(c)) or k == 0:
        return c
    return _fori(start, stop, [c], body, step)[0]


@lowers(aten.geqrf.default)
def _geqrf_rule(ctx, self):
    _check_dtype(ctx, dtype(self))
    return _geqrf(self)


def _householder_product(vs: ir.Value, taus: ir.Value, cols: int) -> ir.Value:
    """The first `cols` columns of H_0 ... H_{k-1} (orgqr)."""
    shape = shape_of(vs)
    m = shape[-2]
    eye = _eye(shape[:-2] + [m, cols], dtype(vs))
    return _apply_q(vs, taus, eye, left=True, adjoint=False)


@lowers(aten.linalg_householder_product.default)
def _linalg_householder_product(ctx, input, tau):
    dt = ctx.result_dtype()
    _check_dtype(ctx, dt)
    vs, taus = convert(input, dt), convert(tau, dt)
    batch = shape_of(vs)[:-2]
    taus = broadcast_to(taus, batch + shape_of(taus)[-1:])
    return _householder_product(vs, taus, shape_of(vs)[-1])


@lowers(aten.ormqr.default)
def _ormqr(ctx, self, input2, input3, left=True, transpose=False):
    dt = ctx.result_dtype()
    _check_dtype(ctx, dt)
    vs, taus, c = convert(self, dt), convert(input2, dt), convert(input3, dt)
    batch = broadcast_shapes(shape_of(vs)[:-2], shape_of(c)[:-2], shape_of(taus)[:-1])
    vs, c = _batch_broadcast(vs, batch), _batch_broadcast(c, batch)
    taus = broadcast_to(taus, batch + shape_of(taus)[-1:])
    return _apply_q(vs, taus, c, left=left, adjoint=transpose)


@lowers(aten.linalg_qr.default)
def _linalg_qr(ctx, A, mode="reduced"):
    dt = dtype(A)
    _check_dtype(ctx, dt)
    shape = shape_of(A)
    m, n = shape[-2:]
    k = min(m, n)
    packed, taus = _geqrf(A)
    rows = m if mode == "complete" else k
    r = _upper(packed, rows)
    if mode == "r":
        return _zeros(ctx, 0), r
    qcols = m if mode == "complete" else k
    return _householder_product(packed, taus, qcols), r


# -- Jacobi eigendecomposition and SVD -------------------------------------------------------------
_MAX_SWEEPS = 30


def _round_robin(n: int) -> list[int]:
    """The fixed permutation (new position -> old position) that advances a round-robin
    tournament by one round: pairs are the positions (2i, 2i+1); the player at position
    0 stays, the others circulate, so n - 1 rounds pair every two players once and
    restore the original order."""
    half = n // 2
    top = [2 * i for i in range(half)]
    bottom = [2 * i + 1 for i in range(half)]
    new_top = [top[0]] + ([bottom[0]] if half > 1 else []) + top[1:-1]
    new_bottom = bottom[1:] + [top[-1]] if half > 1 else bottom
    order = [0] * n
    for i in range(half):
        order[2 * i], order[2 * i + 1] = new_top[i], new_bottom[i]
    return order


def _permute_dim(x: ir.Value, order: Sequence[int], dim: int) -> ir.Value:
    """x with index i along `dim` taken from order[i] (a constant gather)."""
    shape = shape_of(x)
    rank = len(shape)
    offset = [d for d in range(rank) if d != dim]
    attr = ir.Attribute.parse(
        f"#stablehlo.gather<offset_dims = [{', '.join(map(str, offset))}], collapsed_slice_dims = [{dim}], "
        f"start_index_map = [{dim}], index_vector_dim = 1>"
    )
    idx = array_constant(np.asarray(order, dtype=np.int32).reshape(-1, 1), torch.int32)
    sizes = list(shape)
    sizes[dim] = 1
    out = list(shape)
    out[dim] = len(order)
    return stablehlo.GatherOp(x, idx, attr, sizes, results=[tensor_type(out, dtype(x))]).result


def _pairs(x: ir.Value, dim: int) -> tuple[ir.Value, ir.Value]:
    """(even, odd) entries along `dim`."""
    n = shape_of(x)[dim]
    return _slice(x, dim, 0, n, 2), _slice(x, dim, 1, n, 2)


def _interleave(even: ir.Value, odd: ir.Value, dim: int) -> ir.Value:
    shape = shape_of(even)
    out = shape[: dim + 1] + [1] + shape[dim + 1 :]
    both = _concat([reshape(even, out), reshape(odd, out)], dim + 1)
    final = list(shape)
    final[dim] *= 2
    return reshape(both, final)


def _rotation(app: ir.Value, aqq: ir.Value, apq: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value | None, ir.Value]:
    """(c, s, w, shift) of the Jacobi rotation that zeroes apq of
    [[app, apq], [conj(apq), aqq]] (app, aqq real): J = [[c, s], [-s w, c w]] with
    w = conj(apq)/|apq| (None for real); J^H A J has diagonal (app - shift, aqq + shift)."""
    rdt = dtype(app)
    shape = shape_of(app)
    complex_ = dtype(apq).is_complex
    mag = _abs(apq) if complex_ else apq
    zero = compare(mag, full(0, rdt, shape), "EQ")
    safe = select(zero, full(1, rdt, shape), mag)
    theta = _div(_sub(aqq, app), _mul(full(2, rdt, shape), safe))
    one = full(1, rdt, shape)
    sign = select(compare(theta, full(0, rdt, shape), "LT"), full(-1, rdt, shape), one)
    t = _div(sign, _add(_abs(theta), _sqrt(_add(_mul(theta, theta), one))))
    t = select(zero, full(0, rdt, shape), t)
    c = stablehlo.RsqrtOp(_add(_mul(t, t), one)).result
    s = _mul(t, c)
    shift = _mul(t, mag)
    if not complex_:
        return c, s, None, shift
    w = _div(_conj(apq), _to_complex(safe, dtype(apq)))
    w = select(zero, _like(1, w), w)
    return c, s, w, shift


def _rotate(x: ir.Value, c: ir.Value, s: ir.Value, w: ir.Value | None, dim: int, conj_w: bool = False) -> ir.Value:
    """Applies the pair rotations along `dim` (pairs (2i, 2i+1); c, s, w (..., n/2)
    broadcast over the other matrix dim): p' = c p - s w q ; q' = s p + c w q."""
    shape = shape_of(x)
    rank = len(shape)
    p, q = _pairs(x, dim)
    pshape = shape_of(p)
    nb = rank - 2
    dims = list(range(nb)) + [dim]

    def b(v):
        v = _to_complex(v, dtype(x))
        return stablehlo.BroadcastInDimOp(tensor_type(pshape, dtype(v)), v, dims).result

    cb, sb = b(c), b(s)
    wq = q
    if w is not None:
        wq = _mul(b(_conj(w) if conj_w else w), q)
    p2 = _sub(_mul(cb, p), _mul(sb, wq))
    q2 = _add(_mul(sb, p), _mul(cb, wq))
    return _interleave(p2, q2, dim)


def _pad_even(x: ir.Value, dims: Sequence[int]) -> ir.Value:
    shape = shape_of(x)
    high = [0] * len(shape)
    for d in dims:
        high[d] = shape[d] % 2
    if not any(high):
        return x
    return stablehlo.PadOp(x, _c(0, dtype(x)), [0] * len(shape), high, [0] * len(shape)).result


def _sort_with(keys: ir.Value, descending: bool) -> tuple[ir.Value, ir.Value]:
    """Sorts the last dim of real `keys`: (sorted keys, int32 source positions)."""
    shape = shape_of(keys)
    idx = _iota(shape, len(shape) - 1)
    op = stablehlo.SortOp([keys.type, idx.type], [keys, idx], dimension=len(shape) - 1, is_stable=True)
    block = op.comparator.blocks.append(*[tensor_type([], dtype(keys))] * 2 + [tensor_type([], torch.int32)] * 2)
    with ir.InsertionPoint(block):
        a, b = block.arguments[0], block.arguments[1]
        stablehlo.ReturnOp([compare(a, b, "GT" if descending else "LT")])
    return op.results[0], op.results[1]


def _take_cols(x: ir.Value, idx: ir.Value) -> ir.Value:
    return _mT(_take_rows(_mT(x), idx))


def _jacobi_eigh(a: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(eigenvalues (..., n) unsorted, eigenvectors (..., n, n)) of Hermitian `a` by
    cyclic two-sided Jacobi with round-robin ordering."""
    shape = shape_of(a)
    batch, n = shape[:-2], shape[-1]
    nb = len(batch)
    dt = dtype(a)
    rdt = _real_dtype(dt)
    x = _pad_even(a, [nb, nb + 1])
    size = shape_of(x)[-1]
    order = _round_robin(size)
    eps = torch.finfo(rdt).eps
    frob2 = _max(_sum(_abs2(x), [nb, nb + 1]), list(range(nb))) if nb else _sum(_abs2(x), [0, 1])
    rows, cols = _matrix_masks(shape_of(x))
    is_diag = compare(rows, cols, "EQ")
    off_mask = _not(is_diag)
    two = full(1, torch.int32, shape_of(x))
    in_pair = _and(off_mask, compare(stablehlo.ShiftRightLogicalOp(rows, two).result,
                                     stablehlo.ShiftRightLogicalOp(cols, two).result, "EQ"))

    def step(_, vals):
        x, v = vals
        flat = reshape(x, batch + [size * size])
        d = _real(_diagonal(x))
        app, aqq = _pairs(d, nb)
        apq = _slice(flat, nb, 1, size * size, 2 * size + 2)
        c, s, w, shift = _rotation(app, aqq, apq)
        x = _rotate(x, c, s, w, nb, conj_w=True)  # rows: J^H A
        x = _rotate(x, c, s, w, nb + 1)  # columns: (J^H A) J
        # The rotated 2x2 blocks exactly: diagonal from the shift, zeros off it (what
        # the rotation computes only up to rounding).
        diag = _to_complex(_interleave(_sub(app, shift), _add(aqq, shift), nb), dt)
        x = select(is_diag, _expand_last(diag, size, -1), select(in_pair, _like(0, x), x))
        v = _rotate(v, c, s, w, nb + 1)
        return [_permute_dim(_permute_dim(x, order, nb), order, nb + 1), _permute_dim(v, order, nb + 1)]

    def off_norm2(x):
        total = _sum(select(off_mask, _abs2(x), full(0, rdt, shape_of(x))), [nb, nb + 1])
        return _max(total, list(range(nb))) if nb else total

    def cond(vals):
        sweep, x = vals[0], vals[1]
        more = compare(sweep, _scalar_i32(_MAX_SWEEPS), "LT")
        limit = _mul(frob2, full(eps * eps, rdt, []))
        return _and(more, compare(off_norm2(x), limit, "GT"))

    def sweep(vals):
        sweep_i, x, v = vals
        x, v = _fori(0, size - 1, [x, v], step)
        return [_add(sweep_i, _scalar_i32(1)), x, v]

    eye = _eye(shape_of(x), dt)
    _, x, v = _while([_scalar_i32(0), x, eye], cond, sweep)
    values = _slice(_real(_diagonal(x)), nb, 0, n)
    vectors = _slice(_slice(v, nb, 0, n), nb + 1, 0, n)
    return values, vectors


def _hermitian_from(a: ir.Value, lower: bool) -> ir.Value:
    """The Hermitian matrix that a's lower (upper) triangle defines (real diagonal)."""
    tri = _tril(a, -1) if lower else _triu(a, 1)
    diag = _real(_diagonal(a))
    n = shape_of(a)[-1]
    return _add(_add(tri, _mH(tri)), _to_complex(_diag_embed(diag, n, n), dtype(a)))


@lowers(aten._linalg_eigh.default)
def _linalg_eigh(ctx, A, UPLO="L", compute_v=True):
    dt = dtype(A)
    _check_dtype(ctx, dt)
    shape = shape_of(A)
    if _is_empty(shape):
        values = full(0, _real_dtype(dt), ctx.result_shape(0))
        return values, (A if compute_v else _zeros(ctx, 1))
    values, vectors = _jacobi_eigh(_hermitian_from(A, UPLO.upper() == "L"))
    values, order = _sort_with(values, descending=False)
    if not compute_v:
        return values, _zeros(ctx, 1)
    return values, _take_cols(vectors, order)


def _jacobi_svd(a: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(W, sigma, V) with a V = W, W's columns orthogonal with norms sigma (unsorted),
    for m >= n, by one-sided (Hestenes) Jacobi with round-robin ordering."""
    shape = shape_of(a)
    batch, (m, n) = shape[:-2], shape[-2:]
    nb = len(batch)
    dt = dtype(a)
    rdt = _real_dtype(dt)
    w = _pad_even(a, [nb + 1])
    size = shape_of(w)[-1]
    order = _round_robin(size)
    tol = torch.finfo(rdt).eps * math.sqrt(m)

    def step(_, vals):
        w, v, worst = vals
        p, q = _pairs(w, nb + 1)
        alpha = _sum(_abs2(p), [nb])
        beta = _sum(_abs2(q), [nb])
        gamma = _sum(_mul(_conj(p), q), [nb])
        c, s, phase, _ = _rotation(alpha, beta, gamma)
        # convergence measure |gamma| / sqrt(alpha beta) (0 for zero columns)
        denom = _sqrt(_mul(alpha, beta))
        pos = compare(denom, full(0, rdt, shape_of(denom)), "GT")
        ratio = select(pos, _div(_abs(gamma), select(pos, denom, full(1, rdt, shape_of(denom)))), full(0, rdt, shape_of(denom)))
        worst = stablehlo.MaxOp(worst, _max(ratio, list(range(nb + 1)))).result
        w = _rotate(w, c, s, phase, nb + 1)
        v = _rotate(v, c, s, phase, nb + 1)
        return [_permute_dim(w, order, nb + 1), _permute_dim(v, order, nb + 1), worst]

    def cond(vals):
        sweep, worst = vals[0], vals[3]
        more = compare(sweep, _scalar_i32(_MAX_SWEEPS), "LT")
        return _and(more, compare(worst, full(tol, rdt, []), "GT"))

    def sweep(vals):
        sweep_i, w, v, _ = vals
        w, v, worst = _fori(0, size - 1, [w, v, full(0, rdt, [])], step)
        return [_add(sweep_i, _scalar_i32(1)), w, v, worst]

    eye = _eye(batch + [size, size], dt)
    _, w, v, _ = _while([_scalar_i32(0), w, eye, full(float("inf"), rdt, [])], cond, sweep)
    w = _slice(w, nb + 1, 0, n)
    v = _slice(_slice(v, nb, 0, n), nb + 1, 0, n)
    sigma = _vnorm(w, nb)
    return w, sigma, v


def _svd(a: ir.Value, full_matrices: bool, compute_uv: bool):
    """(U, S, Vh) as linalg.svd (U, Vh None without compute_uv), S descending."""
    shape = shape_of(a)
    m, n = shape[-2:]
    nb = len(shape) - 2
    if m < n:
        u, s, vh = _svd(_mH(a), full_matrices, compute_uv)
        return (_mH(vh) if compute_uv else None), s, (_mH(u) if compute_uv else None)
    w, sigma, v = _jacobi_svd(a)
    sigma, order = _sort_with(sigma, descending=True)
    if not compute_uv:
        return None, sigma, None
    w, v = _take_cols(w, order), _take_cols(v, order)
    # U: the orthonormal factor of W = U diag(sigma), completed to a basis by a QR.
    packed, taus = _geqrf(w)
    q = _householder_product(packed, taus, m if full_matrices else n)
    signs = select(compare(_real(_diagonal(packed)), full(0, _real_dtype(dtype(a)), shape[:-2] + [n]), "LT"),
                   full(-1, _real_dtype(dtype(a)), shape[:-2] + [n]), full(1, _real_dtype(dtype(a)), shape[:-2] + [n]))
    qcols = shape_of(q)[-1]
    if qcols > n:
        signs = _concat([signs, full(1, dtype(signs), shape[:-2] + [qcols - n])], nb)
    u = _mul(q, _to_complex(_expand_last(signs, m, -2), dtype(a)))
    return u, sigma, _mH(v)


@lowers(aten._linalg_svd.default)
def _linalg_svd(ctx, A, full_matrices=False, compute_uv=True, *, driver=None):
    dt = dtype(A)
    _check_dtype(ctx, dt)
    shape = shape_of(A)
    if _is_empty(shape):
        if not compute_uv:
            return _zeros(ctx, 0), _zeros(ctx, 1), _zeros(ctx, 2)
        # Empty matrices: U and Vh are identities where they are square and non-empty.
        u = _eye(ctx.result_shape(0), dt) if not _is_empty(ctx.result_shape(0)) else _zeros(ctx, 0)
        vh = _eye(ctx.result_shape(2), dt) if not _is_empty(ctx.result_shape(2)) else _zeros(ctx, 2)
        return u, _zeros(ctx, 1), vh
    u, s, vh = _svd(A, full_matrices, compute_uv)
    if not compute_uv:
        return _zeros(ctx, 0), s, _zeros(ctx, 2)
    return u, s, vh


# -- pseudo-inverse and matrix exponential -------------------------------------------------------------
@lowers(aten.linalg_pinv.atol_rtol_tensor)
def _linalg_pinv(ctx, self, *, atol=None, rtol=None, hermitian=False):
    """PyTorch's linalg_pinv: singular values (or |eigenvalues| when hermitian) above
    max(atol, rtol * largest) are inverted; the tolerance is compared in the dtype
    PyTorch promotes it to (float64 for its default tolerances)."""
    dt = dtype(self)
    _check_dtype(ctx, dt)
    shape = shape_of(self)
    m, n = shape[-2:]
    if _is_empty(shape):
        return _zeros(ctx)
    rdt = _real_dtype(dt)
    nb = len(shape) - 2
    if hermitian:
        values, vectors = _jacobi_eigh(_hermitian_from(self, True))
        values, order = _sort_with(values, descending=False)
        vectors = _take_cols(vectors, order)
        s_abs = _abs(values)
        largest = reshape(_max(s_abs, [nb]), shape[:-2] + [1])
        left, right, s = vectors, vectors, values
    else:
        u, s, vh = _svd(self, False, True)
        s_abs = s
        largest = _slice(s, nb, 0, 1)
        left, right = _mH(vh), u
    # PyTorch's get_atol_rtol: atol defaults to 0; rtol to eps * max(m, n), or to 0 when
    # a positive atol is given.
    default_rtol = torch.finfo(rdt).eps * max(m, n)
    if atol is not None and rtol is None:
        atol_positive = compare(atol, full(0, dtype(atol), shape_of(atol)), "GT")
        rtol = select(atol_positive, full(0, torch.float64, shape_of(atol)), full(default_rtol, torch.float64, shape_of(atol)))
    if rtol is None:
        rtol = full(default_rtol, torch.float64, [])
    if atol is None:
        atol = full(0, torch.float64, [])
    tol_dtype = torch.promote_types(dtype(atol), torch.promote_types(dtype(rtol), rdt))
    atol_u = reshape(atol, shape_of(atol) + [1])
    rtol_u = reshape(rtol, shape_of(rtol) + [1])
    scaled = _mul(*_bcast(convert(rtol_u, tol_dtype), convert(largest, tol_dtype)))
    tol = stablehlo.MaxOp(*_bcast(convert(atol_u, tol_dtype), scaled)).result
    keep_a, keep_b = _bcast(convert(s_abs, tol_dtype), tol)
    keep = compare(keep_a, keep_b, "GT")
    inv = _div(_like(1, s), s)
    s_inv = convert(select(keep, broadcast_to(inv, shape_of(keep)), full(0, rdt, shape_of(keep))), dt)
    batch = broadcast_shapes(shape_of(s_inv)[:-1], shape[:-2])
    s_inv = broadcast_to(s_inv, batch + shape_of(s_inv)[-1:])
    left = _batch_broadcast(left, batch)
    right = _batch_broadcast(right, batch)
    scaled_left = _mul(left, _expand_last(s_inv, shape_of(left)[-2], -2))
    return _matmul(scaled_left, _mH(right))


def _bcast(a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
    shape = broadcast_shapes(shape_of(a), shape_of(b))
    return broadcast_to(a, shape), broadcast_to(b, shape)


# PyTorch's matrix_exp (Bader, Blanes, Casas 2019): the optimized Taylor approximant of
# degree 1, 2, 4, 8, 12 or 18 chosen by the 1-norm, degree 18 with scaling and squaring
# above the last threshold. Reproduced step by step so results round like eager's.
_EXP_THETAS = {
    torch.float32: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                    5.800524627688768e-01, 1.461661507209034e00, 3.010066362817634e00),
    torch.float64: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                    4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e00),
}
_T12_B = (
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989),
    (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359),
)
_T18_B = (
    (0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.0),
    (0.0, 3.97849749499645077844e-01, 1.36783778460411720168e00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04),
    (-1.09676396052962061844e01, 1.68015813878906206114e00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05),
    (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05),
    (0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05),
)


def _combination(mats: Sequence[ir.Value], coefs: Sequence[float]) -> ir.Value:
    """sum_j coefs[j] * mats[j], accumulated in order (ATen's
    _compute_linear_combination)."""
    acc = None
    for mat, coef in zip(mats, coefs):
        term = _mul(mat, _like(coef, mat))
        acc = term if acc is None else _add(acc, term)
    return acc


def _exp_taylor(a: ir.Value, degree: int, powers: list[ir.Value]) -> ir.Value:
    """compute_T{degree} of ATen; powers = [I, A, A^2, A^3, A^6] (filled lazily)."""
    def power(i):
        while len(powers) <= i:
            j = len(powers)
            powers.append(_matmul(powers[1], powers[j - 1]) if j in (2, 3) else _matmul(powers[3], powers[3]))
        return powers[i]

    eye, a1 = power(0), power(1)
    if degree == 1:
        return _add(eye, a1)
    a2 = power(2)
    if degree == 2:
        return _add(_add(eye, a1), _mul(a2, _like(0.5, a2)))
    if degree == 4:
        inner = _combination([eye, a1, a2], [1 / 2.0, 1 / 6.0, 1 / 24.0])
        return _combination([eye, a1, a2, _matmul(a2, inner)], [1.0, 1.0, 0.0, 1.0])
    if degree == 8:
        sqrt_177 = 0.1330413469565007072504e2
        x3 = 2.0 / 3.0
        x1 = x3 * ((1.0 + sqrt_177) / 88.0)
        x2 = x3 * ((1.0 + sqrt_177) / 352.0)
        x4 = (-271.0 + 29.0 * sqrt_177) / (315.0 * x3)
        x5 = (-11.0 + 11.0 * sqrt_177) / (1260.0 * x3)
        x6 = (-99.0 + 11.0 * sqrt_177) / (5040.0 * x3)
        x7 = (89.0 - sqrt_177) / (5040.0 * x3)
        y2 = (857.0 - 58.0 * sqrt_177) / 630.0
        a4 = _matmul(a2, _combination([a1, a2], [x1, x2]))
        a8 = _matmul(_combination([a2, a4], [x3, 1.0]), _combination([eye, a1, a2, a4], [x4, x5, x6, x7]))
        return _combination([eye, a1, a2, a4, a8], [1.0, 1.0, y2, 0.0, 1.0])
    if degree == 12:
        mats = [power(i) for i in range(4)]
        bs = [_combination(mats, row) for row in _T12_B]
        bs[2] = _add(bs[2], _matmul(bs[3], bs[3]))
        return _add(bs[0], _matmul(_add(bs[1], bs[2]), bs[2]))
    mats = [power(i) for i in range(5)]
    bs = [_combination(mats, row) for row in _T18_B]
    bs[3] = _add(bs[3], _matmul(bs[0], bs[4]))
    return _add(bs[1], _matmul(_add(bs[2], bs[3]), bs[3]))


@lowers(aten.linalg_matrix_exp.default)
def _linalg_matrix_exp(ctx, self):
    dt = dtype(self)
    _check_dtype(ctx, dt)
    shape = shape_of(self)
    batch, n = shape[:-2], shape[-1]
    nb = len(batch)
    if _is_empty(shape):
        return self
    if n == 1:
        return stablehlo.ExpOp(self).result
    rdt = _real_dtype(dt)
    thetas = _EXP_THETAS[rdt]
    norm = _max(_sum(_abs(self), [nb]), [nb])  # the 1-norm: largest column sum

    def per_matrix(pred: ir.Value) -> ir.Value:
        return stablehlo.BroadcastInDimOp(tensor_type(shape, torch.bool), pred, list(range(nb))).result

    powers = [_eye(shape, dt), self]
    result = _c(0, dt, shape)
    lower = full(-1, rdt, batch)
    for degree, theta in zip((1, 2, 4, 8, 12), thetas):
        upper = full(theta, rdt, batch)
        inside = _and(compare(lower, norm, "LT"), compare(norm, upper, "LE"))
        result = select(per_matrix(inside), _exp_taylor(self, degree, powers), result)
        lower = upper
    # degree 18 on A / 2^s, squared s times
    s = stablehlo.CeilOp(_div(stablehlo.LogOp(_div(norm, full(thetas[-1], rdt, batch))).result,
                              full(math.log(2.0), rdt, batch))).result
    s = stablehlo.MaxOp(s, full(0, rdt, batch)).result
    s = select(compare(s, s, "EQ"), stablehlo.MinOp(s, full(2048, rdt, batch)).result, full(0, rdt, batch))
    squarings = convert(s, torch.int32)
    scale = _to_complex(stablehlo.PowOp(full(2, rdt, batch), s).result, dt)
    scaled = _div(self, stablehlo.BroadcastInDimOp(tensor_type(shape, dt), scale, list(range(nb))).result)
    p = _exp_taylor(scaled, 18, [powers[0], scaled])
    most = _max(squarings, list(range(nb))) if nb else squarings

    def cond(vals):
        return compare(vals[0], most, "LT")

    def loop(vals):
        i, x = vals
        more = compare(broadcast_to(i, batch), squarings, "LT")
        return [_add(i, _scalar_i32(1)), select(per_matrix(more), _matmul(x, x), x)]

    p = _while([_scalar_i32(0), p], cond, loop)[1]
    large = compare(norm, full(thetas[-2], rdt, batch), "GE")
    return select(per_matrix(large), p, result)


# -- LDL^T with Bunch-Kaufman pivoting ------------------------------------------------------------------
_BK_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0


def _per_batch(k: ir.Value, shape: Sequence[int]) -> ir.Value:
    """A per-matrix value k (batch-shaped) broadcast over the trailing dims of `shape`."""
    nb = len(shape_of(k))
    return stablehlo.BroadcastInDimOp(tensor_type(list(shape), dtype(k)), k, list(range(nb))).result


def _pick_vec(v: ir.Value, k: ir.Value) -> ir.Value:
    """v[..., k[...]] for v (..., n) and a batch-shaped index."""
    return _pick(v, k, len(shape_of(v)) - 1)


def _pick_col(w: ir.Value, k: ir.Value) -> ir.Value:
    """w[..., :, k[...]] (..., n)."""
    shape = shape_of(w)
    return _pick(w, _per_batch(k, shape[:-1]), len(shape) - 1)


def _pick_row(w: ir.Value, k: ir.Value) -> ir.Value:
    """w[..., k[...], :] (..., n)."""
    return _pick(w, k, len(shape_of(w)) - 2)


def _sym_swap(w: ir.Value, i: ir.Value, j: ir.Value) -> ir.Value:
    """Swaps rows and columns i and j (batch-shaped indices) of a batch of matrices."""
    shape = shape_of(w)
    m = shape[-2]
    rows, cols = _matrix_masks(shape)
    ib, jb = _per_batch(i, shape), _per_batch(j, shape)
    row_i, row_j = _expand_last(_pick_row(w, i), m, -2), _expand_last(_pick_row(w, j), m, -2)
    w = select(compare(rows, ib, "EQ"), row_j, select(compare(rows, jb, "EQ"), row_i, w))
    col_i, col_j = _expand_last(_pick_col(w, i), shape[-1], -1), _expand_last(_pick_col(w, j), shape[-1], -1)
    return select(compare(cols, ib, "EQ"), col_j, select(compare(cols, jb, "EQ"), col_i, w))


def _lower_mirrored(values: ir.Value) -> ir.Value:
    """The symmetric matrix whose lower triangle is `values`'."""
    return select(_tri_mask(shape_of(values), True), values, _mT(values))


def _sytf2(a: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """LAPACK sytf2 (uplo 'L', Bunch-Kaufman diagonal pivoting) on the lower triangle
    of a batch of real or complex-symmetric matrices: (LD, pivots, info) as sytrf
    returns them. Each matrix advances its own column index k by 1 or 2 per step;
    n steps finish every one."""
    shape = shape_of(a)
    batch, n = shape[:-2], shape[-1]
    nb = len(batch)
    dt = dtype(a)
    rdt = _real_dtype(dt)
    i32 = torch.int32
    vshape = batch + [n]
    rows, cols = _matrix_masks(shape)
    vrows = _iota(vshape, nb)
    w0 = _lower_mirrored(_tril(a))
    ld0 = _c(0, dt, shape)

    def rf(value):
        return full(value, rdt, batch)

    def ib(value):
        return full(value, i32, batch)

    def body(_, vals):
        w, ld, piv, k, info = vals
        active = compare(k, ib(n), "LT")
        kc = stablehlo.MinOp(k, ib(n - 1)).result
        kcv = _per_batch(kc, vshape)
        colk = _pick_col(w, kc)
        absakk = _pivot_magnitude(_pick_vec(colk, kc))
        below = compare(vrows, kcv, "GT")
        colmag = select(below, _pivot_magnitude(colk), full(-1, rdt, vshape))
        colmax = stablehlo.MaxOp(_max(colmag, [nb]), rf(0)).result
        hit = _and(below, compare(colmag, _per_batch(colmax, vshape), "EQ"))
        imax = _min(select(hit, vrows, full(n, i32, vshape)), [nb])
        imax = select(compare(imax, ib(n), "EQ"), kc, imax)
        zero_col = _or(compare(stablehlo.MaxOp(absakk, colmax).result, rf(0), "EQ"), compare(absakk, absakk, "NE"))
        row_imax = _pick_row(w, imax)
        others = _and(compare(vrows, kcv, "GE"), compare(vrows, _per_batch(imax, vshape), "NE"))
        rowmax = _max(select(others, _pivot_magnitude(row_imax), full(-1, rdt, vshape)), [nb])
        a_imax = _pivot_magnitude(_pick_vec(row_imax, imax))
        alpha_col = _mul(rf(_BK_ALPHA), colmax)
        keep = _or(compare(absakk, alpha_col, "GE"), compare(absakk, _mul(alpha_col, _div(colmax, rowmax)), "GE"))
        single = _or(keep, compare(a_imax, _mul(rf(_BK_ALPHA), rowmax), "GE"))
        kp = select(_or(keep, zero_col), kc, imax)
        two = _and(_not(single), _not(zero_col))
        kk = _add(kc, select(two, ib(1), ib(0)))
        kp = select(active, kp, kk)
        w = _sym_swap(w, kk, kp)
        # 1x1 pivot: A -= x (x / d)^T, L(:, k) = x / d
        kk1 = stablehlo.MinOp(_add(kc, ib(1)), ib(n - 1)).result
        colk = _pick_col(w, kc)
        colk1 = _pick_col(w, kk1)
        d = _pick_vec(colk, kc)
        x = select(below, colk, _like(0, colk))
        d11 = _div(_c(1, dt, batch), d)
        temp = _neg(_mul(_per_batch(d11, vshape), x))
        upd1 = _lower_mirrored(_add(w, _mul(_expand_last(x, n, -1), _expand_last(temp, n, -2))))
        trail1 = _and(compare(rows, _per_batch(kc, shape), "GT"), compare(cols, _per_batch(kc, shape), "GT"))
        l1 = _mul(x, _per_batch(d11, vshape))
        ldcol1 = select(compare(vrows, kcv, "EQ"), colk, l1)
        # 2x2 pivot on (k, k+1)
        e21 = _pick_vec(colk, kk1)
        e11 = _div(_pick_vec(colk1, kk1), e21)
        e22 = _div(d, e21)
        t = _div(_c(1, dt, batch), _sub(_mul(e11, e22), _c(1, dt, batch)))
        f21 = _div(t, e21)
        below2 = compare(vrows, _per_batch(kk1, vshape), "GT")
        f21v, e11v, e22v = (_per_batch(v, vshape) for v in (f21, e11, e22))
        wk = select(below2, _mul(f21v, _sub(_mul(e11v, colk), colk1)), _like(0, colk))
        wkp1 = select(below2, _mul(f21v, _sub(_mul(e22v, colk1), colk)), _like(0, colk))
        ck, ck1 = select(below2, colk, _like(0, colk)), select(below2, colk1, _like(0, colk))
        upd2 = _sub(_sub(w, _mul(_expand_last(ck, n, -1), _expand_last(wk, n, -2))),
                    _mul(_expand_last(ck1, n, -1), _expand_last(wkp1, n, -2)))
        upd2 = _lower_mirrored(upd2)
        trail2 = _and(compare(rows, _per_batch(kk1, shape), "GT"), compare(cols, _per_batch(kk1, shape), "GT"))
        ldcol2a = select(below2, wk, colk)  # rows k, k+1 keep D's entries
        ldcol2b = select(below2, wkp1, colk1)
        # combine per matrix
        do1 = _and(active, _and(_not(two), _not(zero_col)))
        do2 = _and(active, two)
        w = select(_and(_per_batch(do1, shape), trail1), upd1, w)
        w = select(_and(_per_batch(do2, shape), trail2), upd2, w)
        at_k = _and(compare(rows, _per_batch(kc, shape), "GE"), compare(cols, _per_batch(kc, shape), "EQ"))
        at_k1 = _and(compare(rows, _per_batch(kk1, shape), "GE"), compare(cols, _per_batch(kk1, shape), "EQ"))
        col_k = select(_per_batch(do2, vshape), ldcol2a, select(_per_batch(do1, vshape), ldcol1, colk))
        ld = select(_and(_per_batch(active, shape), at_k), _expand_last(col_k, n, -1), ld)
        ld = select(_and(_per_batch(do2, shape), at_k1), _expand_last(ldcol2b, n, -1), ld)
        pv = select(two, _neg(_add(kp, ib(1))), _add(kp, ib(1)))
        slot = _or(compare(vrows, kcv, "EQ"), _and(_per_batch(two, vshape), compare(vrows, _per_batch(kk1, vshape), "EQ")))
        piv = select(_and(_per_batch(active, vshape), slot), _per_batch(pv, vshape), piv)
        info = select(_and(_and(active, zero_col), compare(info, ib(0), "EQ")), _add(kc, ib(1)), info)
        k = select(active, _add(k, select(two, ib(2), ib(1))), k)
        return [w, ld, piv, k, info]

    _, ld, piv, _, info = _fori(0, n, [w0, ld0, full(0, i32, vshape), ib(0), ib(0)], body)
    return ld, piv, info


@lowers(aten.linalg_ldl_factor_ex.default)
def _linalg_ldl_factor_ex(ctx, self, *, hermitian=False, check_errors=False):
    dt = dtype(self)
    _check_dtype(ctx, dt)
    if hermitian and dt.is_complex:
        raise ctx.fail("ldl_factor with hermitian=True on complex input (LAPACK hetrf) is not supported")
    shape = shape_of(self)
    if _is_empty(shape):
        return self, _zeros(ctx, 1), _zeros(ctx, 2)
    return _sytf2(self)


def _swap_rows(b: ir.Value, i: ir.Value, j: ir.Value, when: ir.Value) -> ir.Value:
    """Swaps rows i and j (batch-shaped) of each matrix where `when` holds."""
    shape = shape_of(b)
    rows = _iota(shape, len(shape) - 2)
    row_i, row_j = _expand_last(_pick_row(b, i), shape[-2], -2), _expand_last(_pick_row(b, j), shape[-2], -2)
    swapped = select(compare(rows, _per_batch(i, shape), "EQ"), row_j,
                     select(compare(rows, _per_batch(j, shape), "EQ"), row_i, b))
    return select(_per_batch(when, shape), swapped, b)


def _sytrs(ld: ir.Value, piv: ir.Value, b: ir.Value) -> ir.Value:
    """LAPACK sytrs (uplo 'L'): solves A X = B from sytrf's factorization; all inputs
    share batch dims."""
    shape = shape_of(b)
    batch, (n, nrhs) = shape[:-2], shape[-2:]
    nb = len(batch)
    dt = dtype(b)
    i32 = torch.int32
    vshape = batch + [n]
    vrows = _iota(vshape, nb)
    rows = _iota(shape, nb)

    def ib(value):
        return full(value, i32, batch)

    def col_of(k):
        return _pick_col(ld, k)

    def row_of(x, k):
        return _pick_row(x, k)

    def set_row(x, k, row, when):
        hit = _and(compare(rows, _per_batch(k, shape), "EQ"), _per_batch(when, shape))
        return select(hit, _expand_last(row, n, -2), x)

    def forward(_, vals):
        x, k = vals
        active = compare(k, ib(n), "LT")
        kc = stablehlo.MinOp(k, ib(n - 1)).result
        kk1 = stablehlo.MinOp(_add(kc, ib(1)), ib(n - 1)).result
        p = _pick_vec(piv, kc)
        one = compare(p, ib(0), "GT")
        kp = select(one, _sub(p, ib(1)), _sub(_neg(p), ib(1)))
        x = _swap_rows(x, select(one, kc, kk1), kp, active)
        lk, lk1 = col_of(kc), col_of(kk1)
        bk, bk1 = row_of(x, kc), row_of(x, kk1)
        # 1x1: B[i] -= L[i,k] B[k] (i > k); B[k] *= 1 / D[k]
        below = compare(vrows, _per_batch(kc, vshape), "GT")
        l1 = select(below, lk, _like(0, lk))
        x1 = _sub(x, _mul(_expand_last(l1, nrhs, -1), _expand_last(bk, n, -2)))
        dk = _pick_vec(lk, kc)
        x1 = set_row(x1, kc, _mul(bk, _per_batch(_div(_c(1, dt, batch), dk), batch + [nrhs])), active)
        # 2x2: B[i] -= L[i,k] B[k] + L[i,k+1] B[k+1] (i > k+1); then D's 2x2 inverse
        below2 = compare(vrows, _per_batch(kk1, vshape), "GT")
        l2a = select(below2, lk, _like(0, lk))
        l2b = select(below2, lk1, _like(0, lk))
        x2 = _sub(_sub(x, _mul(_expand_last(l2a, nrhs, -1), _expand_last(bk, n, -2))),
                  _mul(_expand_last(l2b, nrhs, -1), _expand_last(bk1, n, -2)))
        akm1k = _pick_vec(lk, kk1)
        akm1 = _div(dk, akm1k)
        ak = _div(_pick_vec(lk1, kk1), akm1k)
        denom = _sub(_mul(akm1, ak), _c(1, dt, batch))
        r = batch + [nrhs]
        bkm1 = _div(bk, _per_batch(akm1k, r))
        bkk = _div(bk1, _per_batch(akm1k, r))
        new_k = _div(_sub(_mul(_per_batch(ak, r), bkm1), bkk), _per_batch(denom, r))
        new_k1 = _div(_sub(_mul(_per_batch(akm1, r), bkk), bkm1), _per_batch(denom, r))
        x2 = set_row(set_row(x2, kc, new_k, active), kk1, new_k1, active)
        x = select(_per_batch(_and(active, one), shape), x1, select(_per_batch(active, shape), x2, x))
        k = select(active, _add(k, select(one, ib(1), ib(2))), k)
        return [x, k]

    def backward(_, vals):
        x, k = vals
        active = compare(k, ib(0), "GE")
        kc = stablehlo.MaxOp(k, ib(0)).result
        km1 = stablehlo.MaxOp(_sub(kc, ib(1)), ib(0)).result
        p = _pick_vec(piv, kc)
        one = compare(p, ib(0), "GT")
        below = compare(vrows, _per_batch(kc, vshape), "GT")
        # B[k] -= sum_{i>k} B[i] L[i,k]   (and B[k-1] with L[:, k-1] for a 2x2 block)
        lk = select(below, col_of(kc), _c(0, dt, vshape))
        lkm1 = select(below, col_of(km1), _c(0, dt, vshape))
        dot_k = _sum(_mul(x, _expand_last(lk, nrhs, -1)), [nb])
        dot_km1 = _sum(_mul(x, _expand_last(lkm1, nrhs, -1)), [nb])
        x = set_row(x, kc, _sub(row_of(x, kc), dot_k), active)
        x = set_row(x, km1, _sub(row_of(x, km1), dot_km1), _and(active, _not(one)))
        kp = select(one, _sub(p, ib(1)), _sub(_neg(p), ib(1)))
        x = _swap_rows(x, kc, kp, active)
        k = select(active, _sub(k, select(one, ib(1), ib(2))), k)
        return [x, k]

    x, _ = _fori(0, n, [b, ib(0)], forward)
    x, _ = _fori(0, n, [x, ib(n - 1)], backward)
    return x


@lowers(aten.linalg_ldl_solve.default)
def _linalg_ldl_solve(ctx, LD, pivots, B, *, hermitian=False):
    dt = ctx.result_dtype()
    _check_dtype(ctx, dt)
    if hermitian and dt.is_complex:
        raise ctx.fail("ldl_solve with hermitian=True on complex input (LAPACK hetrs) is not supported")
    ld, piv, b = _broadcast_lu(LD, pivots, B, dt)
    if _is_empty(shape_of(b)):
        return b
    return _sytrs(ld, piv, b)


# Bounded dynamism: factorizations and solves over padded matrices are not masked.
declare_padding(Padding.EAGER, family="linalg")
