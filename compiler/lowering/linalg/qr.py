"""Householder QR (LAPACK geqrf's reflectors) and what PyTorch builds on it: geqrf,
householder_product, ormqr and linalg_qr."""

from __future__ import annotations

import torch

from ...context import ir, stablehlo
from ... import ir as hlo
from ...dtypes import tensor_type
from ..helpers import (
    broadcast_shapes,
    broadcast_to,
    compare,
    conj,
    convert,
    dtype,
    full,
    iota,
    reshape,
    select,
    shape_of,
    transpose,
)
from ..registry import lowers
from ..reduction import reduce_max, reduce_sum
from ._builders import (
    _batch_broadcast,
    _check_dtype,
    _complex,
    _dynamic_slice_last,
    _expand_last,
    _eye,
    _imag,
    _is_empty,
    _matrix_masks,
    _real,
    _real_dtype,
    _to_complex,
    _zeros,
    real_splat,
    real_splat_like,
)
from .lu import _upper

aten = torch.ops.aten


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
    mag = hlo.absolute(x)
    rdt = dtype(mag)
    scale = reduce_max(mag, [dim])
    safe = select(compare(scale, full(0, rdt, shape_of(scale)), "GT"), scale, full(1, rdt, shape_of(scale)))
    shape = shape_of(x)
    dims = [d for d in range(len(shape)) if d != dim]
    safe_b = stablehlo.BroadcastInDimOp(tensor_type(shape, rdt), safe, dims).result
    scaled = hlo.div(mag, safe_b)
    return hlo.mul(hlo.sqrt(reduce_sum(hlo.mul(scaled, scaled), [dim])), safe)


def _householder_vector(col: ir.Value, j: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """LAPACK larfg on col[j:] of a batch of columns (..., m): (v, tau, beta), v (..., m)
    the reflector (zeros above j, 1 at j), tau (...) its scale factor, beta (...) the
    new col[j] (real), so (I - tau v v^H)^H col[j:] = beta e_j."""
    shape = shape_of(col)
    batch, m = shape[:-1], shape[-1]
    nb = len(batch)
    dt = dtype(col)
    rdt = _real_dtype(dt)
    rows = iota(shape, nb, torch.int32)
    jm = broadcast_to(j, shape)
    below = compare(rows, jm, "GT")
    x = select(below, col, real_splat_like(0, col))
    alpha = _entry(col, j)
    xnorm = _vnorm(x, nb)
    re = _real(alpha)
    zero = full(0, rdt, batch)
    if dt.is_complex:
        im = _imag(alpha)
        trivial = hlo.logical_and(compare(xnorm, zero, "EQ"), compare(im, zero, "EQ"))
        norm = _vnorm(hlo.concatenate([reshape(re, batch + [1]), reshape(im, batch + [1]), reshape(xnorm, batch + [1])], nb), nb)
    else:
        trivial = compare(xnorm, zero, "EQ")
        norm = _vnorm(hlo.concatenate([reshape(re, batch + [1]), reshape(xnorm, batch + [1])], nb), nb)
    # beta = -sign(re(alpha)) * norm (Fortran SIGN: +0 counts as positive)
    negative = compare(re, zero, "LT")
    beta = select(negative, norm, hlo.neg(norm))
    safe_beta = select(trivial, full(1, rdt, batch), beta)
    if dt.is_complex:
        tau = _complex(hlo.div(hlo.sub(safe_beta, re), safe_beta), hlo.neg(hlo.div(im, safe_beta)))
    else:
        tau = hlo.div(hlo.sub(safe_beta, re), safe_beta)
    tau = select(trivial, real_splat_like(0, tau), tau)
    denom = hlo.sub(alpha, _to_complex(safe_beta, dt))
    denom = select(trivial, real_splat_like(1, denom), denom)
    scale = hlo.div(real_splat_like(1, denom), denom)
    v = select(below, hlo.mul(x, _expand_last(scale, m, -1)), real_splat_like(0, col))
    v = select(compare(rows, jm, "EQ"), real_splat_like(1, col), v)
    beta = select(trivial, re, beta)
    return v, tau, beta


def _reflect_left(c: ir.Value, v: ir.Value, tau: ir.Value) -> ir.Value:
    """(I - tau v v^H) c for a batch: c (..., m, n), v (..., m), tau (...)."""
    shape = shape_of(c)
    m, n = shape[-2:]
    nb = len(shape) - 2
    w = reduce_sum(hlo.mul(_expand_last(conj(v), n, -1), c), [nb])  # v^H c: (..., n)
    tv = hlo.mul(v, _expand_last(tau, m, -1))
    return hlo.sub(c, hlo.mul(_expand_last(tv, n, -1), _expand_last(w, m, -2)))


def _reflect_right(c: ir.Value, v: ir.Value, tau: ir.Value) -> ir.Value:
    """c (I - tau v v^H) for a batch: c (..., m, n), v (..., n), tau (...)."""
    shape = shape_of(c)
    m, n = shape[-2:]
    nb = len(shape) - 2
    w = reduce_sum(hlo.mul(c, _expand_last(v, m, -2)), [nb + 1])  # c v: (..., m)
    tw = hlo.mul(w, _expand_last(tau, m, -1))
    return hlo.sub(c, hlo.mul(_expand_last(tw, n, -1), _expand_last(conj(v), m, -2)))


def _geqrf(a: ir.Value) -> tuple[ir.Value, ir.Value]:
    """LAPACK geqrf: (R above the diagonal and the reflectors below it, tau)."""
    shape = shape_of(a)
    batch, (m, n) = shape[:-2], shape[-2:]
    k = min(m, n)
    nb = len(batch)
    dt = dtype(a)
    if _is_empty(batch) or k == 0:
        return a, real_splat(0, dt, batch + [k])
    rows, cols = _matrix_masks(shape)

    def body(j, vals):
        x, taus = vals
        v, tau, beta = _householder_vector(_column(x, j), j)
        jj = broadcast_to(j, shape)
        # H^H applied to the trailing columns (geqr2 applies conj(tau)).
        updated = _reflect_left(x, v, conj(tau))
        x = select(compare(cols, jj, "GT"), updated, x)
        vrows = iota(batch + [m], nb, torch.int32)
        vcol = select(compare(vrows, broadcast_to(j, batch + [m]), "EQ"), _expand_last(_to_complex(beta, dt), m, -1), v)
        x = select(hlo.logical_and(compare(cols, jj, "EQ"), compare(rows, jj, "GE")), _expand_last(vcol, n, -1), x)
        taus = select(compare(iota(batch + [k], nb, torch.int32), broadcast_to(j, batch + [k]), "EQ"), _expand_last(tau, k, -1), taus)
        return [x, taus]

    x, taus = hlo.fori_loop(0, k, [a, real_splat(0, dt, batch + [k])], body)
    return x, taus


def _reflector(vs: ir.Value, j: ir.Value) -> ir.Value:
    """Reflector j of a packed matrix: column j with zeros above j and 1 at j."""
    col = _column(vs, j)
    shape = shape_of(col)
    rows = iota(shape, len(shape) - 1, torch.int32)
    jm = broadcast_to(j, shape)
    v = select(compare(rows, jm, "GT"), col, real_splat_like(0, col))
    return select(compare(rows, jm, "EQ"), real_splat_like(1, col), v)


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
            tau = conj(tau)
        return [_reflect_left(x, v, tau) if left else _reflect_right(x, v, tau)]

    if _is_empty(shape_of(c)) or k == 0:
        return c
    return hlo.fori_loop(start, stop, [c], body, step)[0]


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
