"""The normal distribution's functions: erfc (CHLO), erfcx (Faddeeva's algorithm), ndtri and
log_ndtr, after PyTorch's Math.h."""

from __future__ import annotations

import math

import numpy as np
import torch

from ...context import ir, stablehlo
from ...dtypes import tensor_type
from ..helpers import array_constant, convert, dtype, shape_of
from ..registry import lowers
from . import _tables as tables
from ._values import _NP, _T, _chain, _gt, _horner, _lit, _lt, _unary_rule, _where

aten = torch.ops.aten


# -- normal distribution: ndtri, erfcx -----------------------------------------------------
def _ndtri(y0: _T) -> _T:
    s2pi = 2.50662827463100050242e0
    exp_m2 = _lit(y0, 0.13533528323661269189)
    upper = y0 > _NP[y0.dtype](1.0) - exp_m2
    y = _where(upper, 1.0 - y0, y0)

    # 0 <= |y - 0.5| <= 3/8
    yc = y - 0.5
    y2 = yc * yc
    central = (yc + yc * (y2 * _horner(y2, tables.NDTRI_P0) / _horner(y2, tables.NDTRI_Q0))) * s2pi

    yt = _where(y > exp_m2, 0.5, y)  # keeps the tail branch finite where it is not used
    x = (-2.0 * yt.log()).sqrt()
    x0 = x - x.log() / x
    z = 1.0 / x
    x1 = _where(
        x < 8.0,
        z * _horner(z, tables.NDTRI_P1) / _horner(z, tables.NDTRI_Q1),
        z * _horner(z, tables.NDTRI_P2) / _horner(z, tables.NDTRI_Q2),
    )
    tail = x0 - x1
    tail = _where(upper, tail, -tail)
    return _chain(
        tail,
        (y0.eq(0.0), -math.inf),
        (y0.eq(1.0), math.inf),
        ((y0 < 0.0) | (y0 > 1.0), math.nan),
        (y > exp_m2, central),
    )


def _erfcx_y100(y100: _T) -> _T:
    """Faddeeva's erfcx_y100: a degree-6 polynomial per interval [k/100, (k+1)/100) of
    y = 4/(4+|x|), in t = 2*y100 - (2k+1). The polynomial's literals are doubles, so
    the kernel evaluates it in double even for float (t itself is computed in T); we
    evaluate it in T, which stays within an ulp of that. y100 == 100 (x == 0) gives 1."""
    index = _T(convert(y100.v, torch.int32))  # static_cast<int>: truncation
    safe = _where(index < 0, 0, _where(index < 100, index, 99))
    t = 2.0 * y100 - (safe * 2 + 1).to(y100.dtype)
    coeffs = np.asarray(tables.ERFCX_Y100, dtype=_NP[y100.dtype])
    r = None
    for j in reversed(range(7)):
        c = _T(_lookup(coeffs[:, j], safe.v))
        r = c if r is None else c + r * t
    return _where(index < 100, r, 1.0)


def _lookup(table: np.ndarray, index: ir.Value) -> ir.Value:
    """table[index] elementwise: a gather from a 1-D constant."""
    dt = torch.float64 if table.dtype == np.float64 else torch.float32
    operand = array_constant(table, dt)
    shape = shape_of(index)
    rank = len(shape)
    idx = stablehlo.ReshapeOp(tensor_type(shape + [1], dtype(index)), index).result
    attr = ir.Attribute.parse(
        "#stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
        f"index_vector_dim = {rank}>"
    )
    return stablehlo.GatherOp(operand, idx, attr, [1], results=[tensor_type(shape, dt)]).result


def _erfcx(x: _T) -> _T:
    ispi = 0.56418958354775628694807945156  # 1/sqrt(pi)
    f = _NP[x.dtype]
    xx = x * x
    # x > 50: a 5-term continued fraction; the kernel mixes T and double literals here,
    # computed in T.
    cf = f(ispi) * (xx * (xx + 4.5) + 2.0) / (x * (xx * (xx + 5.0) + 3.75))
    huge = f(ispi) / x
    positive = _chain(_erfcx_y100(400.0 / (4.0 + x)), (_gt(x, 5e7), huge), (x > 50.0, cf))
    two_exp = 2.0 * (x * x).exp()
    negative = _chain(
        two_exp - _erfcx_y100(400.0 / (4.0 - x)), (_lt(x, -26.7), math.inf), (_lt(x, -6.1), two_exp)
    )
    return _chain(negative, (x.isnan(), x), (x >= 0.0, positive))


def _log_ndtr(x: _T) -> _T:
    """calc_log_ndtr: log of the normal CDF, through erfcx in the lower tail."""
    t = x * _lit(x, 1.0 / math.sqrt(2.0))
    lower = (_erfcx(-t) / 2.0).log() - t * t
    upper = (-(t.erfc() / 2.0)).log1p()
    return _where(x < -1.0, lower, upper)



# -- registrations ---------------------------------------------------------------------------
_UNARY = {
    aten.special_ndtri.default: _ndtri,
    aten.special_erfcx.default: _erfcx,
    aten.erfc.default: _T.erfc,
}
for _op, _fn in _UNARY.items():
    lowers(_op)(_unary_rule(_fn))
lowers(aten.special_log_ndtr.default)(_unary_rule(_log_ndtr))
