"""LDL^T with LAPACK sytf2's Bunch-Kaufman pivoting and its solve: `linalg_ldl_factor_ex`,
`linalg_ldl_solve`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...context import ir, stablehlo
from ... import ir as hlo
from ...dtypes import tensor_type
from ..helpers import compare, dtype, full, iota, select, shape_of
from ..registry import lowers
from ..reduction import reduce_max, reduce_min, reduce_sum
from ._builders import (
    _check_dtype,
    _expand_last,
    _is_empty,
    _matrix_masks,
    _mT,
    _real_dtype,
    _tri_mask,
    _tril,
    _zeros,
    real_splat,
    real_splat_like,
)
from .lu import _broadcast_lu, _pick, _pivot_magnitude

aten = torch.ops.aten


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
    vrows = iota(vshape, nb, torch.int32)
    w0 = _lower_mirrored(_tril(a))
    ld0 = real_splat(0, dt, shape)

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
        colmax = stablehlo.MaxOp(reduce_max(colmag, [nb]), rf(0)).result
        hit = hlo.logical_and(below, compare(colmag, _per_batch(colmax, vshape), "EQ"))
        imax = reduce_min(select(hit, vrows, full(n, i32, vshape)), [nb])
        imax = select(compare(imax, ib(n), "EQ"), kc, imax)
        zero_col = hlo.logical_or(compare(stablehlo.MaxOp(absakk, colmax).result, rf(0), "EQ"), compare(absakk, absakk, "NE"))
        row_imax = _pick_row(w, imax)
        others = hlo.logical_and(compare(vrows, kcv, "GE"), compare(vrows, _per_batch(imax, vshape), "NE"))
        rowmax = reduce_max(select(others, _pivot_magnitude(row_imax), full(-1, rdt, vshape)), [nb])
        a_imax = _pivot_magnitude(_pick_vec(row_imax, imax))
        alpha_col = hlo.mul(rf(_BK_ALPHA), colmax)
        keep = hlo.logical_or(compare(absakk, alpha_col, "GE"), compare(absakk, hlo.mul(alpha_col, hlo.div(colmax, rowmax)), "GE"))
        single = hlo.logical_or(keep, compare(a_imax, hlo.mul(rf(_BK_ALPHA), rowmax), "GE"))
        kp = select(hlo.logical_or(keep, zero_col), kc, imax)
        two = hlo.logical_and(hlo.logical_not(single), hlo.logical_not(zero_col))
        kk = hlo.add(kc, select(two, ib(1), ib(0)))
        kp = select(active, kp, kk)
        w = _sym_swap(w, kk, kp)
        # 1x1 pivot: A -= x (x / d)^T, L(:, k) = x / d
        kk1 = stablehlo.MinOp(hlo.add(kc, ib(1)), ib(n - 1)).result
        colk = _pick_col(w, kc)
        colk1 = _pick_col(w, kk1)
        d = _pick_vec(colk, kc)
        x = select(below, colk, real_splat_like(0, colk))
        d11 = hlo.div(real_splat(1, dt, batch), d)
        temp = hlo.neg(hlo.mul(_per_batch(d11, vshape), x))
        upd1 = _lower_mirrored(hlo.add(w, hlo.mul(_expand_last(x, n, -1), _expand_last(temp, n, -2))))
        trail1 = hlo.logical_and(compare(rows, _per_batch(kc, shape), "GT"), compare(cols, _per_batch(kc, shape), "GT"))
        l1 = hlo.mul(x, _per_batch(d11, vshape))
        ldcol1 = select(compare(vrows, kcv, "EQ"), colk, l1)
        # 2x2 pivot on (k, k+1)
        e21 = _pick_vec(colk, kk1)
        e11 = hlo.div(_pick_vec(colk1, kk1), e21)
        e22 = hlo.div(d, e21)
        t = hlo.div(real_splat(1, dt, batch), hlo.sub(hlo.mul(e11, e22), real_splat(1, dt, batch)))
        f21 = hlo.div(t, e21)
        below2 = compare(vrows, _per_batch(kk1, vshape), "GT")
        f21v, e11v, e22v = (_per_batch(v, vshape) for v in (f21, e11, e22))
        wk = select(below2, hlo.mul(f21v, hlo.sub(hlo.mul(e11v, colk), colk1)), real_splat_like(0, colk))
        wkp1 = select(below2, hlo.mul(f21v, hlo.sub(hlo.mul(e22v, colk1), colk)), real_splat_like(0, colk))
        ck, ck1 = select(below2, colk, real_splat_like(0, colk)), select(below2, colk1, real_splat_like(0, colk))
        upd2 = hlo.sub(hlo.sub(w, hlo.mul(_expand_last(ck, n, -1), _expand_last(wk, n, -2))),
                    hlo.mul(_expand_last(ck1, n, -1), _expand_last(wkp1, n, -2)))
        upd2 = _lower_mirrored(upd2)
        trail2 = hlo.logical_and(compare(rows, _per_batch(kk1, shape), "GT"), compare(cols, _per_batch(kk1, shape), "GT"))
        ldcol2a = select(below2, wk, colk)  # rows k, k+1 keep D's entries
        ldcol2b = select(below2, wkp1, colk1)
        # combine per matrix
        do1 = hlo.logical_and(active, hlo.logical_and(hlo.logical_not(two), hlo.logical_not(zero_col)))
        do2 = hlo.logical_and(active, two)
        w = select(hlo.logical_and(_per_batch(do1, shape), trail1), upd1, w)
        w = select(hlo.logical_and(_per_batch(do2, shape), trail2), upd2, w)
        at_k = hlo.logical_and(compare(rows, _per_batch(kc, shape), "GE"), compare(cols, _per_batch(kc, shape), "EQ"))
        at_k1 = hlo.logical_and(compare(rows, _per_batch(kk1, shape), "GE"), compare(cols, _per_batch(kk1, shape), "EQ"))
        col_k = select(_per_batch(do2, vshape), ldcol2a, select(_per_batch(do1, vshape), ldcol1, colk))
        ld = select(hlo.logical_and(_per_batch(active, shape), at_k), _expand_last(col_k, n, -1), ld)
        ld = select(hlo.logical_and(_per_batch(do2, shape), at_k1), _expand_last(ldcol2b, n, -1), ld)
        pv = select(two, hlo.neg(hlo.add(kp, ib(1))), hlo.add(kp, ib(1)))
        slot = hlo.logical_or(compare(vrows, kcv, "EQ"), hlo.logical_and(_per_batch(two, vshape), compare(vrows, _per_batch(kk1, vshape), "EQ")))
        piv = select(hlo.logical_and(_per_batch(active, vshape), slot), _per_batch(pv, vshape), piv)
        info = select(hlo.logical_and(hlo.logical_and(active, zero_col), compare(info, ib(0), "EQ")), hlo.add(kc, ib(1)), info)
        k = select(active, hlo.add(k, select(two, ib(2), ib(1))), k)
        return [w, ld, piv, k, info]

    _, ld, piv, _, info = hlo.fori_loop(0, n, [w0, ld0, full(0, i32, vshape), ib(0), ib(0)], body)
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
    rows = iota(shape, len(shape) - 2, torch.int32)
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
    vrows = iota(vshape, nb, torch.int32)
    rows = iota(shape, nb, torch.int32)

    def ib(value):
        return full(value, i32, batch)

    def col_of(k):
        return _pick_col(ld, k)

    def row_of(x, k):
        return _pick_row(x, k)

    def set_row(x, k, row, when):
        hit = hlo.logical_and(compare(rows, _per_batch(k, shape), "EQ"), _per_batch(when, shape))
        return select(hit, _expand_last(row, n, -2), x)

    def forward(_, vals):
        x, k = vals
        active = compare(k, ib(n), "LT")
        kc = stablehlo.MinOp(k, ib(n - 1)).result
        kk1 = stablehlo.MinOp(hlo.add(kc, ib(1)), ib(n - 1)).result
        p = _pick_vec(piv, kc)
        one = compare(p, ib(0), "GT")
        kp = select(one, hlo.sub(p, ib(1)), hlo.sub(hlo.neg(p), ib(1)))
        x = _swap_rows(x, select(one, kc, kk1), kp, active)
        lk, lk1 = col_of(kc), col_of(kk1)
        bk, bk1 = row_of(x, kc), row_of(x, kk1)
        # 1x1: B[i] -= L[i,k] B[k] (i > k); B[k] *= 1 / D[k]
        below = compare(vrows, _per_batch(kc, vshape), "GT")
        l1 = select(below, lk, real_splat_like(0, lk))
        x1 = hlo.sub(x, hlo.mul(_expand_last(l1, nrhs, -1), _expand_last(bk, n, -2)))
        dk = _pick_vec(lk, kc)
        x1 = set_row(x1, kc, hlo.mul(bk, _per_batch(hlo.div(real_splat(1, dt, batch), dk), batch + [nrhs])), active)
        # 2x2: B[i] -= L[i,k] B[k] + L[i,k+1] B[k+1] (i > k+1); then D's 2x2 inverse
        below2 = compare(vrows, _per_batch(kk1, vshape), "GT")
        l2a = select(below2, lk, real_splat_like(0, lk))
        l2b = select(below2, lk1, real_splat_like(0, lk))
        x2 = hlo.sub(hlo.sub(x, hlo.mul(_expand_last(l2a, nrhs, -1), _expand_last(bk, n, -2))),
                  hlo.mul(_expand_last(l2b, nrhs, -1), _expand_last(bk1, n, -2)))
        akm1k = _pick_vec(lk, kk1)
        akm1 = hlo.div(dk, akm1k)
        ak = hlo.div(_pick_vec(lk1, kk1), akm1k)
        denom = hlo.sub(hlo.mul(akm1, ak), real_splat(1, dt, batch))
        r = batch + [nrhs]
        bkm1 = hlo.div(bk, _per_batch(akm1k, r))
        bkk = hlo.div(bk1, _per_batch(akm1k, r))
        new_k = hlo.div(hlo.sub(hlo.mul(_per_batch(ak, r), bkm1), bkk), _per_batch(denom, r))
        new_k1 = hlo.div(hlo.sub(hlo.mul(_per_batch(akm1, r), bkk), bkm1), _per_batch(denom, r))
        x2 = set_row(set_row(x2, kc, new_k, active), kk1, new_k1, active)
        x = select(_per_batch(hlo.logical_and(active, one), shape), x1, select(_per_batch(active, shape), x2, x))
        k = select(active, hlo.add(k, select(one, ib(1), ib(2))), k)
        return [x, k]

    def backward(_, vals):
        x, k = vals
        active = compare(k, ib(0), "GE")
        kc = stablehlo.MaxOp(k, ib(0)).result
        km1 = stablehlo.MaxOp(hlo.sub(kc, ib(1)), ib(0)).result
        p = _pick_vec(piv, kc)
        one = compare(p, ib(0), "GT")
        below = compare(vrows, _per_batch(kc, vshape), "GT")
        # B[k] -= sum_{i>k} B[i] L[i,k]   (and B[k-1] with L[:, k-1] for a 2x2 block)
        lk = select(below, col_of(kc), real_splat(0, dt, vshape))
        lkm1 = select(below, col_of(km1), real_splat(0, dt, vshape))
        dot_k = reduce_sum(hlo.mul(x, _expand_last(lk, nrhs, -1)), [nb])
        dot_km1 = reduce_sum(hlo.mul(x, _expand_last(lkm1, nrhs, -1)), [nb])
        x = set_row(x, kc, hlo.sub(row_of(x, kc), dot_k), active)
        x = set_row(x, km1, hlo.sub(row_of(x, km1), dot_km1), hlo.logical_and(active, hlo.logical_not(one)))
        kp = select(one, hlo.sub(p, ib(1)), hlo.sub(hlo.neg(p), ib(1)))
        x = _swap_rows(x, kc, kp, active)
        k = select(active, hlo.sub(k, select(one, ib(1), ib(2))), k)
        return [x, k]

    x, _ = hlo.fori_loop(0, n, [b, ib(0)], forward)
    x, _ = hlo.fori_loop(0, n, [x, ib(n - 1)], backward)
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
