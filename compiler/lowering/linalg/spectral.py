"""Symmetric (Hermitian) eigendecomposition by cyclic Jacobi rotations and SVD by one-sided
(Hestenes) Jacobi: `_linalg_eigh`, `_linalg_svd`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ...context import ir, stablehlo
from ... import ir as hlo
from ...dtypes import tensor_type
from ..helpers import array_constant, compare, conj, dtype, full, iota, reshape, select, shape_of
from ..registry import lowers
from ..reduction import reduce_max, reduce_sum
from ._builders import (
    _abs2,
    _check_dtype,
    _diag_embed,
    _diagonal,
    _expand_last,
    _eye,
    _is_empty,
    _matrix_masks,
    _mH,
    _mT,
    _real,
    _real_dtype,
    _scalar_i32,
    _to_complex,
    _tril,
    _triu,
    _zeros,
    real_splat,
    real_splat_like,
)
from .qr import _geqrf, _householder_product, _vnorm
from .lu import _take_rows

aten = torch.ops.aten


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
    return hlo.slice_in_dim(x, dim, 0, n, 2), hlo.slice_in_dim(x, dim, 1, n, 2)


def _interleave(even: ir.Value, odd: ir.Value, dim: int) -> ir.Value:
    shape = shape_of(even)
    out = shape[: dim + 1] + [1] + shape[dim + 1 :]
    both = hlo.concatenate([reshape(even, out), reshape(odd, out)], dim + 1)
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
    mag = hlo.absolute(apq) if complex_ else apq
    zero = compare(mag, full(0, rdt, shape), "EQ")
    safe = select(zero, full(1, rdt, shape), mag)
    theta = hlo.div(hlo.sub(aqq, app), hlo.mul(full(2, rdt, shape), safe))
    one = full(1, rdt, shape)
    sign = select(compare(theta, full(0, rdt, shape), "LT"), full(-1, rdt, shape), one)
    t = hlo.div(sign, hlo.add(hlo.absolute(theta), hlo.sqrt(hlo.add(hlo.mul(theta, theta), one))))
    t = select(zero, full(0, rdt, shape), t)
    c = stablehlo.RsqrtOp(hlo.add(hlo.mul(t, t), one)).result
    s = hlo.mul(t, c)
    shift = hlo.mul(t, mag)
    if not complex_:
        return c, s, None, shift
    w = hlo.div(conj(apq), _to_complex(safe, dtype(apq)))
    w = select(zero, real_splat_like(1, w), w)
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
        wq = hlo.mul(b(conj(w) if conj_w else w), q)
    p2 = hlo.sub(hlo.mul(cb, p), hlo.mul(sb, wq))
    q2 = hlo.add(hlo.mul(sb, p), hlo.mul(cb, wq))
    return _interleave(p2, q2, dim)


def _pad_even(x: ir.Value, dims: Sequence[int]) -> ir.Value:
    shape = shape_of(x)
    high = [0] * len(shape)
    for d in dims:
        high[d] = shape[d] % 2
    if not any(high):
        return x
    return stablehlo.PadOp(x, real_splat(0, dtype(x)), [0] * len(shape), high, [0] * len(shape)).result


def _sort_with(keys: ir.Value, descending: bool) -> tuple[ir.Value, ir.Value]:
    """Sorts the last dim of real `keys`: (sorted keys, int32 source positions)."""
    shape = shape_of(keys)
    idx = iota(shape, len(shape) - 1, torch.int32)
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
    frob2 = reduce_max(reduce_sum(_abs2(x), [nb, nb + 1]), list(range(nb))) if nb else reduce_sum(_abs2(x), [0, 1])
    rows, cols = _matrix_masks(shape_of(x))
    is_diag = compare(rows, cols, "EQ")
    off_mask = hlo.logical_not(is_diag)
    two = full(1, torch.int32, shape_of(x))
    in_pair = hlo.logical_and(off_mask, compare(stablehlo.ShiftRightLogicalOp(rows, two).result,
                                     stablehlo.ShiftRightLogicalOp(cols, two).result, "EQ"))

    def step(_, vals):
        x, v = vals
        flat = reshape(x, batch + [size * size])
        d = _real(_diagonal(x))
        app, aqq = _pairs(d, nb)
        apq = hlo.slice_in_dim(flat, nb, 1, size * size, 2 * size + 2)
        c, s, w, shift = _rotation(app, aqq, apq)
        x = _rotate(x, c, s, w, nb, conj_w=True)  # rows: J^H A
        x = _rotate(x, c, s, w, nb + 1)  # columns: (J^H A) J
        # The rotated 2x2 blocks exactly: diagonal from the shift, zeros off it (what
        # the rotation computes only up to rounding).
        diag = _to_complex(_interleave(hlo.sub(app, shift), hlo.add(aqq, shift), nb), dt)
        x = select(is_diag, _expand_last(diag, size, -1), select(in_pair, real_splat_like(0, x), x))
        v = _rotate(v, c, s, w, nb + 1)
        return [_permute_dim(_permute_dim(x, order, nb), order, nb + 1), _permute_dim(v, order, nb + 1)]

    def off_norm2(x):
        total = reduce_sum(select(off_mask, _abs2(x), full(0, rdt, shape_of(x))), [nb, nb + 1])
        return reduce_max(total, list(range(nb))) if nb else total

    def cond(vals):
        sweep, x = vals[0], vals[1]
        more = compare(sweep, _scalar_i32(_MAX_SWEEPS), "LT")
        limit = hlo.mul(frob2, full(eps * eps, rdt, []))
        return hlo.logical_and(more, compare(off_norm2(x), limit, "GT"))

    def sweep(vals):
        sweep_i, x, v = vals
        x, v = hlo.fori_loop(0, size - 1, [x, v], step)
        return [hlo.add(sweep_i, _scalar_i32(1)), x, v]

    eye = _eye(shape_of(x), dt)
    _, x, v = hlo.while_loop([_scalar_i32(0), x, eye], cond, sweep)
    values = hlo.slice_in_dim(_real(_diagonal(x)), nb, 0, n)
    vectors = hlo.slice_in_dim(hlo.slice_in_dim(v, nb, 0, n), nb + 1, 0, n)
    return values, vectors


def _hermitian_from(a: ir.Value, lower: bool) -> ir.Value:
    """The Hermitian matrix that a's lower (upper) triangle defines (real diagonal)."""
    tri = _tril(a, -1) if lower else _triu(a, 1)
    diag = _real(_diagonal(a))
    n = shape_of(a)[-1]
    return hlo.add(hlo.add(tri, _mH(tri)), _to_complex(_diag_embed(diag, n, n), dtype(a)))


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
        alpha = reduce_sum(_abs2(p), [nb])
        beta = reduce_sum(_abs2(q), [nb])
        gamma = reduce_sum(hlo.mul(conj(p), q), [nb])
        c, s, phase, _ = _rotation(alpha, beta, gamma)
        # convergence measure |gamma| / sqrt(alpha beta) (0 for zero columns)
        denom = hlo.sqrt(hlo.mul(alpha, beta))
        pos = compare(denom, full(0, rdt, shape_of(denom)), "GT")
        ratio = select(pos, hlo.div(hlo.absolute(gamma), select(pos, denom, full(1, rdt, shape_of(denom)))), full(0, rdt, shape_of(denom)))
        worst = stablehlo.MaxOp(worst, reduce_max(ratio, list(range(nb + 1)))).result
        w = _rotate(w, c, s, phase, nb + 1)
        v = _rotate(v, c, s, phase, nb + 1)
        return [_permute_dim(w, order, nb + 1), _permute_dim(v, order, nb + 1), worst]

    def cond(vals):
        sweep, worst = vals[0], vals[3]
        more = compare(sweep, _scalar_i32(_MAX_SWEEPS), "LT")
        return hlo.logical_and(more, compare(worst, full(tol, rdt, []), "GT"))

    def sweep(vals):
        sweep_i, w, v, _ = vals
        w, v, worst = hlo.fori_loop(0, size - 1, [w, v, full(0, rdt, [])], step)
        return [hlo.add(sweep_i, _scalar_i32(1)), w, v, worst]

    eye = _eye(batch + [size, size], dt)
    _, w, v, _ = hlo.while_loop([_scalar_i32(0), w, eye, full(float("inf"), rdt, [])], cond, sweep)
    w = hlo.slice_in_dim(w, nb + 1, 0, n)
    v = hlo.slice_in_dim(hlo.slice_in_dim(v, nb, 0, n), nb + 1, 0, n)
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
        signs = hlo.concatenate([signs, full(1, dtype(signs), shape[:-2] + [qcols - n])], nb)
    u = hlo.mul(q, _to_complex(_expand_last(signs, m, -2), dtype(a)))
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
