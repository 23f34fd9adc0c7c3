"""Pointwise math composed of several StableHLO ops: `lerp`, `addcmul`, `addcdiv`, `hypot`,
`logit`, `xlogy`, `sinc`, `nan_to_num`, `heaviside`, `copysign`, `frac` (the ops that map to
one StableHLO op are in elementwise.py).

Formulas follow ATen's CPU kernels operation by operation (the order of multiplications
and the comparisons at boundaries), so results match eager bit for bit or to rounding.
Like ATen's `opmath`, float16/bfloat16 compute in float32 and round once at the end."""

from __future__ import annotations

import math

import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import convert, dtype, full, select, shape_of
from .registry import declare_padding, lowers, Padding
from ._opmath import (
    _abs,
    _add,
    _c,
    _cmp,
    _div,
    _inputs,
    _isnan,
    _log,
    _max,
    _min,
    _mul,
    _or,
    _sign,
    _sub,
)

aten = torch.ops.aten


# -- pointwise math -------------------------------------------------------------------------------------
@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx, self, end, weight):
    (a, b, w), out = _inputs(ctx, self, end, weight)
    diff = _sub(b, a)
    magnitude = _abs(w)
    small = _cmp(magnitude, _c(0.5, magnitude), "LT")
    low = _add(a, _mul(w, diff))
    high = _sub(b, _mul(diff, _sub(_c(1, w), w)))
    return convert(select(small, low, high), out)


@lowers(aten.addcmul.default)
def _addcmul(ctx, self, tensor1, tensor2, *, value=1):
    (s, t1, t2, v), out = _inputs(ctx, self, tensor1, tensor2, value)
    return convert(_add(s, _mul(_mul(v, t1), t2)), out)


@lowers(aten.addcdiv.default)
def _addcdiv(ctx, self, tensor1, tensor2, *, value=1):
    (s, t1, t2, v), out = _inputs(ctx, self, tensor1, tensor2, value)
    return convert(_add(s, _div(_mul(v, t1), t2)), out)


@lowers(aten.hypot.default)
def _hypot(ctx, self, other):
    """std::hypot without overflow: m * sqrt(1 + (n/m)^2), inf if either is inf."""
    (a, b), out = _inputs(ctx, self, other)
    a, b = _abs(a), _abs(b)
    big, small = _max(a, b), _min(a, b)
    zero = _cmp(big, _c(0, big), "EQ")
    ratio = _div(small, select(zero, _c(1, big), big))
    result = _mul(big, stablehlo.SqrtOp(_add(_c(1, ratio), _mul(ratio, ratio))).result)
    inf = _c(float("inf"), a)
    any_inf = _or(_cmp(a, inf, "EQ"), _cmp(b, inf, "EQ"))
    return convert(select(any_inf, inf, select(zero, _c(0, big), result)), out)


@lowers(aten.logit.default)
def _logit(ctx, self, eps=None):
    (x,), out = _inputs(ctx, self)
    if eps is not None:
        lo, hi = _c(eps, x), _c(1.0 - eps, x)
        x = select(_cmp(x, lo, "LT"), lo, select(_cmp(x, hi, "GT"), hi, x))
    return convert(_log(_div(x, _sub(_c(1, x), x))), out)


@lowers(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)
def _xlogy(ctx, self, other):
    (x, y), out = _inputs(ctx, self, other)
    product = _mul(x, _log(y))
    result = select(_cmp(x, _c(0, x), "EQ"), _c(0, x), product)
    return convert(select(_isnan(y), y, result), out)


@lowers(aten.sinc.default)
def _sinc(ctx, self):
    (x,), out = _inputs(ctx, self)
    product = _mul(_c(math.pi, x), x)
    ratio = _div(stablehlo.SineOp(product).result, product)
    return convert(select(_cmp(x, _c(0, x), "EQ"), _c(1, x), ratio), out)


def _nan_to_num_real(x: ir.Value, nan, posinf, neginf) -> ir.Value:
    dt = dtype(x)
    info = torch.finfo(dt)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    x = select(_isnan(x), _c(nan, x), x)
    x = select(_cmp(x, _c(float("inf"), x), "EQ"), _c(posinf, x), x)
    return select(_cmp(x, _c(float("-inf"), x), "EQ"), _c(neginf, x), x)


@lowers(aten.nan_to_num.default)
def _nan_to_num(ctx, self, nan=None, posinf=None, neginf=None):
    dt = dtype(self)
    if dt.is_complex:
        re = _nan_to_num_real(stablehlo.RealOp(self).result, nan, posinf, neginf)
        im = _nan_to_num_real(stablehlo.ImagOp(self).result, nan, posinf, neginf)
        return stablehlo.ComplexOp(re, im).result
    if not dt.is_floating_point:
        return self
    return _nan_to_num_real(self, nan, posinf, neginf)


@lowers(aten.heaviside.default)
def _heaviside(ctx, self, values):
    (x, v), out = _inputs(ctx, self, values, compute=ctx.result_dtype())
    positive = convert(_cmp(x, _c(0, x), "GT"), out)
    return select(_cmp(x, _c(0, x), "EQ"), v, positive)


_SIGN_BIT = {torch.float64: (torch.int64, 63), torch.float32: (torch.int32, 31), torch.float16: (torch.int16, 15), torch.bfloat16: (torch.int16, 15)}


@lowers(aten.copysign.Tensor, aten.copysign.Scalar)
def _copysign(ctx, self, other):
    """|self| with the sign bit of `other` (bitwise, so -0.0 and NaN signs count)."""
    (a, b), out = _inputs(ctx, self, other, compute=ctx.result_dtype())
    bits_dt, bit = _SIGN_BIT[out]
    shape = shape_of(a)
    bits = tensor_type(shape, bits_dt)
    ia = stablehlo.BitcastConvertOp(bits, a).result
    ib = stablehlo.BitcastConvertOp(bits, b).result
    sign_mask = full(-(1 << bit), bits_dt, shape)  # only the top bit set
    magnitude = stablehlo.AndOp(ia, stablehlo.NotOp(sign_mask).result).result
    combined = _or(magnitude, stablehlo.AndOp(ib, sign_mask).result)
    return stablehlo.BitcastConvertOp(ir.RankedTensorType(a.type), combined).result


@lowers(aten.frac.default)
def _frac(ctx, self):
    x = self
    truncated = _mul(_sign(x), stablehlo.FloorOp(_abs(x)).result)
    return _sub(x, truncated)


# Bounded dynamism (registry.Padding): every op of this family is elementwise.
declare_padding(Padding.SAFE, family="pointwise")
