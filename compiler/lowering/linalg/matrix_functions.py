"""Functions of a matrix built on the factorizations: the pseudo-inverse (`linalg_pinv`,
through the SVD or eigh) and the matrix exponential (PyTorch's own algorithm)."""

from __future__ import annotations

import math
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
    reshape,
    select,
    shape_of,
)
from ..registry import lowers
from ..reduction import reduce_max, reduce_sum
from ._builders import (
    _batch_broadcast,
    _check_dtype,
    _expand_last,
    _eye,
    _is_empty,
    _matmul,
    _mH,
    _real_dtype,
    _scalar_i32,
    _to_complex,
    _zeros,
    real_splat,
    real_splat_like,
)
from .spectral import _hermitian_from, _jacobi_eigh, _sort_with, _svd, _take_cols

aten = torch.ops.aten


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
        s_abs = hlo.absolute(values)
        largest = reshape(reduce_max(s_abs, [nb]), shape[:-2] + [1])
        left, right, s = vectors, vectors, values
    else:
        u, s, vh = _svd(self, False, True)
        s_abs = s
        largest = hlo.slice_in_dim(s, nb, 0, 1)
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
    scaled = hlo.mul(*_bcast(convert(rtol_u, tol_dtype), convert(largest, tol_dtype)))
    tol = stablehlo.MaxOp(*_bcast(convert(atol_u, tol_dtype), scaled)).result
    keep_a, keep_b = _bcast(convert(s_abs, tol_dtype), tol)
    keep = compare(keep_a, keep_b, "GT")
    inv = hlo.div(real_splat_like(1, s), s)
    s_inv = convert(select(keep, broadcast_to(inv, shape_of(keep)), full(0, rdt, shape_of(keep))), dt)
    batch = broadcast_shapes(shape_of(s_inv)[:-1], shape[:-2])
    s_inv = broadcast_to(s_inv, batch + shape_of(s_inv)[-1:])
    left = _batch_broadcast(left, batch)
    right = _batch_broadcast(right, batch)
    scaled_left = hlo.mul(left, _expand_last(s_inv, shape_of(left)[-2], -2))
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
        term = hlo.mul(mat, real_splat_like(coef, mat))
        acc = term if acc is None else hlo.add(acc, term)
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
        return hlo.add(eye, a1)
    a2 = power(2)
    if degree == 2:
        return hlo.add(hlo.add(eye, a1), hlo.mul(a2, real_splat_like(0.5, a2)))
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
        bs[2] = hlo.add(bs[2], _matmul(bs[3], bs[3]))
        return hlo.add(bs[0], _matmul(hlo.add(bs[1], bs[2]), bs[2]))
    mats = [power(i) for i in range(5)]
    bs = [_combination(mats, row) for row in _T18_B]
    bs[3] = hlo.add(bs[3], _matmul(bs[0], bs[4]))
    return hlo.add(bs[1], _matmul(hlo.add(bs[2], bs[3]), bs[3]))


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
    norm = reduce_max(reduce_sum(hlo.absolute(self), [nb]), [nb])  # the 1-norm: largest column sum

    def per_matrix(pred: ir.Value) -> ir.Value:
        return stablehlo.BroadcastInDimOp(tensor_type(shape, torch.bool), pred, list(range(nb))).result

    powers = [_eye(shape, dt), self]
    result = real_splat(0, dt, shape)
    lower = full(-1, rdt, batch)
    for degree, theta in zip((1, 2, 4, 8, 12), thetas):
        upper = full(theta, rdt, batch)
        inside = hlo.logical_and(compare(lower, norm, "LT"), compare(norm, upper, "LE"))
        result = select(per_matrix(inside), _exp_taylor(self, degree, powers), result)
        lower = upper
    # degree 18 on A / 2^s, squared s times
    s = stablehlo.CeilOp(hlo.div(stablehlo.LogOp(hlo.div(norm, full(thetas[-1], rdt, batch))).result,
                              full(math.log(2.0), rdt, batch))).result
    s = stablehlo.MaxOp(s, full(0, rdt, batch)).result
    s = select(compare(s, s, "EQ"), stablehlo.MinOp(s, full(2048, rdt, batch)).result, full(0, rdt, batch))
    squarings = convert(s, torch.int32)
    scale = _to_complex(stablehlo.PowOp(full(2, rdt, batch), s).result, dt)
    scaled = hlo.div(self, stablehlo.BroadcastInDimOp(tensor_type(shape, dt), scale, list(range(nb))).result)
    p = _exp_taylor(scaled, 18, [powers[0], scaled])
    most = reduce_max(squarings, list(range(nb))) if nb else squarings

    def cond(vals):
        return compare(vals[0], most, "LT")

    def loop(vals):
        i, x = vals
        more = compare(broadcast_to(i, batch), squarings, "LT")
        return [hlo.add(i, _scalar_i32(1)), select(per_matrix(more), _matmul(x, x), x)]

    p = hlo.while_loop([_scalar_i32(0), p], cond, loop)[1]
    large = compare(norm, full(thetas[-2], rdt, batch), "GE")
    return select(per_matrix(large), p, result)
