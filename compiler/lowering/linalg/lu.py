"""LU with LAPACK getrf's partial pivoting and what PyTorch builds on it: lu_factor, lu,
lu_unpack, lu_solve, det, slogdet, solve and inv."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...context import ir, stablehlo
from ... import ir as hlo
from ...dtypes import tensor_type
from ..helpers import (
    broadcast_shapes,
    broadcast_to,
    compare,
    convert,
    dtype,
    full,
    iota,
    reshape,
    select,
    shape_of,
)
from ..registry import LoweringContext, lowers
from ..reduction import reduce_max, reduce_min, reduce_prod, reduce_sum
from ._builders import (
    _batch_broadcast,
    _check_dtype,
    _diagonal,
    _dynamic_slice_last,
    _expand_last,
    _eye,
    _imag,
    _is_empty,
    _matrix_masks,
    _mH,
    _mT,
    _real,
    _real_dtype,
    _to_complex,
    _tri_mask,
    _triu,
    _zeros,
    real_splat,
    real_splat_like,
)
from .cholesky import _trsm

aten = torch.ops.aten


# -- LU with partial pivoting ----------------------------------------------------------------------
def _pivot_magnitude(x: ir.Value) -> ir.Value:
    """LAPACK i?amax's measure: |x| for real, |re| + |im| for complex."""
    if dtype(x).is_complex:
        return hlo.add(hlo.absolute(_real(x)), hlo.absolute(_imag(x)))
    return hlo.absolute(x)


def _pick(x: ir.Value, index: ir.Value, dim: int) -> ir.Value:
    """x indexed by `index` (per batch element, shape = x's shape without `dim` and the
    dims after it) along `dim`, dropping `dim`; exact (a masked sum of zeros)."""
    shape = shape_of(x)
    idx = broadcast_to(index, shape[:dim]) if shape_of(index) != shape[:dim] else index
    dims = list(range(len(shape[:dim])))
    idx = stablehlo.BroadcastInDimOp(tensor_type(shape, torch.int32), idx, dims).result
    hit = compare(iota(shape, dim, torch.int32), idx, "EQ")
    return reduce_sum(select(hit, x, real_splat_like(0, x)), [dim])


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
    vrows = iota(batch + [m], nb, torch.int32)

    def body(j, vals):
        x, perm, piv = vals
        jb = broadcast_to(j, batch)
        col = reshape(_dynamic_slice_last(x, j), batch + [m])
        if pivot:
            mag = _pivot_magnitude(col)
            rdt = dtype(mag)
            usable = hlo.logical_and(compare(vrows, broadcast_to(j, batch + [m]), "GE"), compare(mag, mag, "EQ"))
            mag = select(usable, mag, full(-1, rdt, batch + [m]))
            top = reduce_max(mag, [nb])
            hit = compare(mag, broadcast_to(reshape(top, batch + [1]), batch + [m]), "EQ")
            p = reduce_min(select(hit, vrows, full(m, i32, batch + [m])), [nb])
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
        piv = select(compare(iota(batch + [k], nb, torch.int32), broadcast_to(j, batch + [k]), "EQ"),
                     _expand_last(hlo.add(p, full(1, i32, batch)), k, -1), piv)
        # Eliminate below the pivot (a zero pivot leaves the column, all zeros, as is).
        pv = reshape(_dynamic_slice_last(row_p, j), batch)
        col = reshape(_dynamic_slice_last(x, j), batch + [m])
        nonzero = compare(pv, real_splat_like(0, pv), "NE")
        below = compare(vrows, broadcast_to(j, batch + [m]), "GT")
        # LAPACK getrf2 scales by the reciprocal unless it would overflow.
        pvm = _expand_last(pv, m, -1)
        tiny = full(torch.finfo(_real_dtype(dt)).tiny, _real_dtype(dt), batch + [m])
        scaled = select(compare(hlo.absolute(pvm), tiny, "GE"), hlo.mul(col, hlo.div(real_splat_like(1, pvm), pvm)), hlo.div(col, pvm))
        l = select(hlo.logical_and(below, _expand_last(nonzero, m, -1)), scaled, select(below, col, real_splat_like(0, col)))
        outer = hlo.mul(_expand_last(l, n, -1), _expand_last(row_p, m, -2))
        trailing = hlo.logical_and(compare(rows, broadcast_to(j, shape), "GT"), compare(cols, broadcast_to(j, shape), "GT"))
        x = select(trailing, hlo.sub(x, outer), x)
        x = select(hlo.logical_and(compare(rows, broadcast_to(j, shape), "GT"), compare(cols, broadcast_to(j, shape), "EQ")),
                   _expand_last(l, n, -1), x)
        return [x, perm, piv]

    lu, perm, piv = hlo.fori_loop(0, k, [a, vrows, full(0, i32, batch + [k])], body)
    return lu, piv, perm, _first_zero_pivot(lu)


def _first_zero_pivot(lu: ir.Value) -> ir.Value:
    diag = _diagonal(lu)
    shape = shape_of(diag)
    batch, k = shape[:-1], shape[-1]
    if k == 0:
        return full(0, torch.int32, batch)
    positions = iota(shape, len(batch), torch.int32)
    zero = compare(diag, real_splat_like(0, diag), "EQ")
    first = reduce_min(select(zero, positions, full(k, torch.int32, shape)), [len(batch)])
    return select(compare(first, full(k, torch.int32, batch), "EQ"), full(0, torch.int32, batch),
                  hlo.add(first, full(1, torch.int32, batch)))


def _perm_from_pivots(piv: ir.Value, m: int) -> ir.Value:
    """The row order (..., m) int32 that LAPACK's sequential row interchanges
    (1-based pivots (..., k)) produce: row i of L U is row perm[i] of A."""
    shape = shape_of(piv)
    batch, k = shape[:-1], shape[-1]
    nb = len(batch)
    piv = convert(piv, torch.int32)
    vrows = iota(batch + [m], nb, torch.int32)

    def body(j, vals):
        (perm,) = vals
        p = hlo.sub(_pick(piv, broadcast_to(j, batch), nb), full(1, torch.int32, batch))
        perm_j, perm_p = _pick(perm, broadcast_to(j, batch), nb), _pick(perm, p, nb)
        vj = compare(vrows, broadcast_to(j, batch + [m]), "EQ")
        vp = compare(vrows, _expand_last(p, m, -1), "EQ")
        return [select(vj, _expand_last(perm_p, m, -1), select(vp, _expand_last(perm_j, m, -1), perm))]

    if _is_empty(batch):
        return vrows
    return hlo.fori_loop(0, k, [vrows], body)[0]


def _inverse_perm(perm: ir.Value) -> ir.Value:
    """inv[perm[i]] = i, exact (a masked integer sum)."""
    shape = shape_of(perm)
    batch, m = shape[:-1], shape[-1]
    nb = len(batch)
    square = batch + [m, m]
    # hit[r, i] = perm[i] == r ; inv[r] = sum_i hit * i
    hit = compare(_expand_last(perm, m, -2), iota(square, nb, torch.int32), "EQ")
    return reduce_sum(select(hit, iota(square, nb + 1, torch.int32), full(0, torch.int32, square)), [nb + 1])


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
    hit = compare(iota(square, len(batch), torch.int32), _expand_last(perm, m, -2), "EQ")
    return select(hit, real_splat(1, dt, square), real_splat(0, dt, square))


def _unit_lower(lu: ir.Value, cols: int) -> ir.Value:
    """L (..., m, cols) from packed LU: strictly-lower part plus a unit diagonal."""
    shape = shape_of(lu)
    lower = hlo.slice_in_dim(lu, len(shape) - 1, 0, cols)
    lshape = shape_of(lower)
    return select(_tri_mask(lshape, True, -1), lower, _eye(lshape, dtype(lu)))


def _upper(lu: ir.Value, rows: int) -> ir.Value:
    shape = shape_of(lu)
    return _triu(hlo.slice_in_dim(lu, len(shape) - 2, 0, rows))


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
        piv = hlo.add(iota(shape, len(shape) - 1, torch.int32), full(1, torch.int32, shape))
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
    natural = hlo.add(iota(shape, nb, torch.int32), full(1, torch.int32, shape))
    swaps = reduce_sum(select(compare(piv, natural, "NE"), full(1, torch.int32, shape), full(0, torch.int32, shape)), [nb])
    odd = compare(stablehlo.AndOp(swaps, full(1, torch.int32, shape[:-1])).result, full(1, torch.int32, shape[:-1]), "EQ")
    return select(odd, full(-1, torch.int32, shape[:-1]), full(1, torch.int32, shape[:-1]))


@lowers(aten._linalg_det.default)
def _linalg_det(ctx, A):
    dt = dtype(A)
    _check_dtype(ctx, dt)
    lu, piv, _, _ = _lu_factor(_mT(A) if _uses_transpose(ctx, A) else A)
    det = reduce_prod(_diagonal(lu), [len(shape_of(lu)) - 2])
    sign = convert(convert(_lu_det_sign(piv), _real_dtype(dt)), dt) if dt.is_complex else convert(_lu_det_sign(piv), dt)
    return hlo.mul(det, sign), lu, piv


def _sgn(x: ir.Value) -> ir.Value:
    """torch.sgn: x / |x| (0 for 0); sign for real."""
    if not dtype(x).is_complex:
        return stablehlo.SignOp(x).result
    mag = hlo.absolute(x)
    zero = compare(mag, full(0, dtype(mag), shape_of(mag)), "EQ")
    safe = select(zero, full(1, dtype(mag), shape_of(mag)), mag)
    q = hlo.div(x, _to_complex(safe, dtype(x)))
    return select(zero, real_splat_like(0, x), q)


@lowers(aten._linalg_slogdet.default)
def _linalg_slogdet(ctx, A):
    dt = dtype(A)
    _check_dtype(ctx, dt)
    lu, piv, _, _ = _lu_factor(_mT(A) if _uses_transpose(ctx, A) else A)
    diag = _diagonal(lu)
    nb = len(shape_of(lu)) - 2
    perm_sign = convert(_lu_det_sign(piv), _real_dtype(dt))
    sign = hlo.mul(reduce_prod(_sgn(diag), [nb]), _to_complex(perm_sign, dt))
    logabs = reduce_sum(stablehlo.LogOp(hlo.absolute(diag)).result, [nb])
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
