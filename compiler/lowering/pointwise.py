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
from .. import ir as hlo
from ..dtypes import tensor_type
from .helpers import constant_like, convert, dtype, full, select, shape_of
from .registry import declare_padding, lowers, Padding
from .opmath import opmath_operands

aten = torch.ops.aten


def _isnan(x: ir.Value) -> ir.Value:
    return hlo.compare(x, x, "NE")


# -- pointwise math -------------------------------------------------------------------------------------
@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx, self, end, weight):
    (a, b, w), out = opmath_operands(ctx, self, end, weight)
    diff = hlo.sub(b, a)
    magnitude = hlo.absolute(w)
    small = hlo.compare(magnitude, constant_like(0.5, magnitude), "LT")
    low = hlo.add(a, hlo.mul(w, diff))
    high = hlo.sub(b, hlo.mul(diff, hlo.sub(constant_like(1, w), w)))
    return convert(select(small, low, high), out)


@lowers(aten.addcmul.default)
def _addcmul(ctx, self, tensor1, tensor2, *, value=1):
    (s, t1, t2, v), out = opmath_operands(ctx, self, tensor1, tensor2, value)
    return convert(hlo.add(s, hlo.mul(hlo.mul(v, t1), t2)), out)


@lowers(aten.addcdiv.default)
def _addcdiv(ctx, self, tensor1, tensor2, *, value=1):
    (s, t1, t2, v), out = opmath_operands(ctx, self, tensor1, tensor2, value)
    return convert(hlo.add(s, hlo.div(hlo.mul(v, t1), t2)), out)


@lowers(aten.hypot.default)
def _hypot(ctx, self, other):
    """std::hypot without overflow: m * sqrt(1 + (n/m)^2), inf if either is inf."""
    (a, b), out = opmath_operands(ctx, self, other)
    a, b = hlo.absolute(a), hlo.absolute(b)
    big, small = hlo.maximum(a, b), hlo.minimum(a, b)
    zero = hlo.compare(big, constant_like(0, big), "EQ")
    ratio = hlo.div(small, select(zero, constant_like(1, big), big))
    result = hlo.mul(big, stablehlo.SqrtOp(hlo.add(constant_like(1, ratio), hlo.mul(ratio, ratio))).result)
    inf = constant_like(float("inf"), a)
    any_inf = hlo.logical_or(hlo.compare(a, inf, "EQ"), hlo.compare(b, inf, "EQ"))
    return convert(select(any_inf, inf, select(zero, constant_like(0, big), result)), out)


@lowers(aten.logit.default)
def _logit(ctx, self, eps=None):
    (x,), out = opmath_operands(ctx, self)
    if eps is not None:
        lo, hi = constant_like(eps, x), constant_like(1.0 - eps, x)
        x = select(hlo.compare(x, lo, "LT"), lo, select(hlo.compare(x, hi, "GT"), hi, x))
    return convert(hlo.log(hlo.div(x, hlo.sub(constant_like(1, x), x))), out)


@lowers(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)
def _xlogy(ctx, self, other):
    (x, y), out = opmath_operands(ctx, self, other)
    product = hlo.mul(x, hlo.log(y))
    result = select(hlo.compare(x, constant_like(0, x), "EQ"), constant_like(0, x), product)
    return convert(select(_isnan(y), y, result), out)


@lowers(aten.sinc.default)
def _sinc(ctx, self):
    (x,), out = opmath_operands(ctx, self)
    product = hlo.mul(constant_like(math.pi, x), x)
    ratio = hlo.div(stablehlo.SineOp(product).result, product)
    return convert(select(hlo.compare(x, constant_like(0, x), "EQ"), constant_like(1, x), ratio), out)


def _nan_to_num_real(x: ir.Value, nan, posinf, neginf) -> ir.Value:
    dt = dtype(x)
    info = torch.finfo(dt)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    x = select(_isnan(x), constant_like(nan, x), x)
    x = select(hlo.compare(x, constant_like(float("inf"), x), "EQ"), constant_like(posinf, x), x)
    return select(hlo.compare(x, constant_like(float("-inf"), x), "EQ"), constant_like(neginf, x), x)


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
    (x, v), out = opmath_operands(ctx, self, values, compute=ctx.result_dtype())
    positive = convert(hlo.compare(x, constant_like(0, x), "GT"), out)
    return select(hlo.compare(x, constant_like(0, x), "EQ"), v, positive)


_SIGN_BIT = {torch.float64: (torch.int64, 63), torch.float32: (torch.int32, 31), torch.float16: (torch.int16, 15), torch.bfloat16: (torch.int16, 15)}


@lowers(aten.copysign.Tensor, aten.copysign.Scalar)
def _copysign(ctx, self, other):
    """|self| with the sign bit of `other` (bitwise, so -0.0 and NaN signs count)."""
    (a, b), out = opmath_operands(ctx, self, other, compute=ctx.result_dtype())
    bits_dt, bit = _SIGN_BIT[out]
    shape = shape_of(a)
    bits = tensor_type(shape, bits_dt)
    ia = stablehlo.BitcastConvertOp(bits, a).result
    ib = stablehlo.BitcastConvertOp(bits, b).result
    sign_mask = full(-(1 << bit), bits_dt, shape)  # only the top bit set
    magnitude = stablehlo.AndOp(ia, stablehlo.NotOp(sign_mask).result).result
    combined = hlo.logical_or(magnitude, stablehlo.AndOp(ib, sign_mask).result)
    return stablehlo.BitcastConvertOp(ir.RankedTensorType(a.type), combined).result


@lowers(aten.frac.default)
def _frac(ctx, self):
    x = self
    truncated = hlo.mul(hlo.sign(x), stablehlo.FloorOp(hlo.absolute(x)).result)
    return hlo.sub(x, truncated)


# Bounded dynamism (registry.Padding): every op of this family is elementwise.
declare_padding(Padding.SAFE, family="pointwise")
