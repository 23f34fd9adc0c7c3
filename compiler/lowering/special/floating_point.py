"""Floating-point manipulation: fmax/fmin (NaN-ignoring), frexp, ldexp, signbit, nextafter
(CHLO), written on the bit patterns where PyTorch's kernels are."""

from __future__ import annotations

import torch

from ...context import chlo, stablehlo
from ..helpers import bitcast, broadcast_to, convert, dtype, full, is_value, shape_of
from ..registry import LoweringContext, lowers
from ._values import _T, _chain, _where

aten = torch.ops.aten


# -- fmax, fmin, frexp, ldexp, signbit, nextafter ------------------------------------------
def _nan_ignoring(op_class, ctx: LoweringContext, a, b):
    out = ctx.result_dtype()
    shape = ctx.result_shape()
    lhs, rhs = (
        _T(broadcast_to(convert(v, out), shape) if is_value(v) else full(v, out, shape))
        for v in (a, b)
    )
    result = _T(op_class(lhs.v, rhs.v).result)
    if out.is_floating_point:
        # fmax/fmin return the other operand where one is NaN (NaN only if both are).
        result = _chain(result, (lhs.isnan(), rhs), (rhs.isnan(), lhs))
    return result.v


@lowers(aten.fmax.default)
def _fmax(ctx, self, other):
    return _nan_ignoring(stablehlo.MaxOp, ctx, self, other)


@lowers(aten.fmin.default)
def _fmin(ctx, self, other):
    return _nan_ignoring(stablehlo.MinOp, ctx, self, other)


_FLOAT_BITS = {
    # dtype: (same-width int, mantissa bits, exponent field mask, exponent bias - 1)
    torch.float64: (torch.int64, 52, 0x7FF, 1022),
    torch.float32: (torch.int32, 23, 0xFF, 126),
    torch.float16: (torch.int16, 10, 0x1F, 14),
    torch.bfloat16: (torch.int16, 7, 0xFF, 126),
}


def _bitcast_t(x: _T, to: torch.dtype) -> _T:
    return _T(bitcast(x.v, to))


def _shift_right(x: _T, n) -> _T:
    return _T(stablehlo.ShiftRightLogicalOp(x.v, x._o(n)).result)


def _shift_left(x: _T, n) -> _T:
    return _T(stablehlo.ShiftLeftOp(x.v, x._o(n)).result)


@lowers(aten.frexp.Tensor)
def _frexp(ctx, self):
    """(mantissa, exponent) with x = mantissa * 2**exponent and 0.5 <= |mantissa| < 1, read
    off the bits (integer ops only, so subnormals survive flush-to-zero hardware);
    zero, inf and NaN give (x, 0) as C's frexp does."""
    out = ctx.result_dtype(0)
    if out not in _FLOAT_BITS:
        raise ctx.fail(f"frexp of {out} is not supported (PyTorch supports floating types only)")
    x = _T(convert(self, out))
    int_dt, mb, emask, bias = _FLOAT_BITS[out]
    width = torch.iinfo(int_dt).bits
    bits = _bitcast_t(x, int_dt)
    field = _shift_right(bits, mb) & emask
    mantissa = bits & ((1 << mb) - 1)
    subnormal = field.eq(0) & mantissa.ne(0)
    special = field.eq(emask) | (field.eq(0) & mantissa.eq(0))
    # A subnormal's leading one is bit h: normalise it to the implicit-bit position.
    h = (width - 1) - _T(stablehlo.ClzOp(mantissa.v).result)
    normalised = _shift_left(mantissa, _where(subnormal, mb - h, 0)) & ((1 << mb) - 1)
    exponent = _where(subnormal, h + (1 - bias - mb), field - bias)
    sign = bits & -(1 << (width - 1))
    mant = _bitcast_t(sign | (bias << mb) | normalised, out)
    mant = _where(special, x, mant)
    exponent = _where(special, 0, exponent)
    return mant.v, convert(exponent.v, ctx.result_dtype(1))


@lowers(aten.ldexp.Tensor)
def _ldexp(ctx, self, other):
    """PyTorch's ldexp is self * pow(2.0, other)."""
    from ..helpers import promote_dtypes

    out = ctx.result_dtype()
    shape = ctx.result_shape()
    pow_dt = promote_dtypes(2.0, other)
    power = stablehlo.PowOp(full(2.0, pow_dt, shape_of(other)), convert(other, pow_dt)).result
    lhs = broadcast_to(convert(self, out), shape)
    rhs = broadcast_to(convert(power, out), shape)
    return stablehlo.MulOp(lhs, rhs).result


@lowers(aten.signbit.default)
def _signbit(ctx, self):
    dt = dtype(self)
    x = _T(self)
    if dt is torch.bool or not (dt.is_floating_point or dt.is_signed):
        return full(False, torch.bool, x.shape)
    if not dt.is_floating_point:
        return (x < 0).v
    return (_bitcast_t(x, _FLOAT_BITS[dt][0]) < 0).v


@lowers(aten.nextafter.default)
def _nextafter(ctx, self, other):
    out = ctx.result_dtype()
    shape = ctx.result_shape()
    a, b = (broadcast_to(convert(v, out), shape) for v in (self, other))
    return chlo.NextAfterOp(a, b).result
