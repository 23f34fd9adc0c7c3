"""Activations and their backward ops (what aot_autograd puts in backward graphs:
`gelu_backward`, `threshold_backward`, ...): hardsigmoid, hardswish, softplus, mish,
threshold, log_sigmoid, glu, prelu, soft/hard shrink, celu.

Formulas follow ATen's CPU kernels operation by operation (the order of multiplications
and the comparisons at boundaries), so results match eager bit for bit or to rounding.
Like ATen's `opmath`, float16/bfloat16 compute in float32 and round once at the end."""

from __future__ import annotations

import math

import torch

from ..context import chlo, ir, stablehlo
from .helpers import (
    sign,
    broadcast_shapes,
    broadcast_to,
    convert,
    dtype,
    full,
    normalize_dim,
    rank_of,
    reshape,
    select,
    shape_of,
)
from .padded import dynamic_dims
from .registry import declare_padding, LoweringContext, lowers, Padding
from ._opmath import (
    _abs,
    _add,
    _and,
    _c,
    _cmp,
    _conj,
    _div,
    _exp,
    _inputs,
    _log1p,
    _log_sigmoid,
    _max,
    _min,
    _mul,
    _neg,
    _opmath,
    _or,
    _sub,
)

aten = torch.ops.aten


# -- activations ------------------------------------------------------------------------------------------
def _relu6_shifted(x: ir.Value) -> ir.Value:
    """min(max(x + 3, 0), 6)"""
    return _min(_max(_add(x, _c(3, x)), _c(0, x)), _c(6, x))


@lowers(aten.hardsigmoid.default)
def _hardsigmoid(ctx, self):
    (x,), out = _inputs(ctx, self)
    return convert(_div(_relu6_shifted(x), _c(6, x)), out)


@lowers(aten.hardswish.default)
def _hardswish(ctx, self):
    (x,), out = _inputs(ctx, self)
    return convert(_div(_mul(x, _relu6_shifted(x)), _c(6, x)), out)


def _softplus_value(x: ir.Value, beta, threshold) -> ir.Value:
    scaled = _mul(x, _c(beta, x))
    soft = _div(_log1p(_exp(scaled)), _c(beta, x))
    return select(_cmp(scaled, _c(threshold, x), "GT"), x, soft)


@lowers(aten.softplus.default)
def _softplus(ctx, self, beta=1, threshold=20):
    (x,), out = _inputs(ctx, self)
    return convert(_softplus_value(x, beta, threshold), out)


@lowers(aten.mish.default)
def _mish(ctx, self):
    (x,), out = _inputs(ctx, self)
    return convert(_mul(x, stablehlo.TanhOp(_log1p(_exp(x))).result), out)


@lowers(aten.threshold.default)
def _threshold(ctx, self, threshold, value):
    out = ctx.result_dtype()
    x = convert(self, out)
    return select(_cmp(x, full(threshold, out, shape_of(x)), "LE"), full(value, out, shape_of(x)), x)


@lowers(aten.log_sigmoid_forward.default)
def _log_sigmoid_forward(ctx, self):
    out = ctx.result_dtype(0)
    x = convert(self, _opmath(out))
    value, buffer = _log_sigmoid(x)
    buffer_shape = ctx.result_shape(1)
    buffer = convert(buffer, ctx.result_dtype(1))
    if buffer_shape != shape_of(buffer):
        buffer = full(0, ctx.result_dtype(1), buffer_shape)  # an empty buffer (CUDA's choice)
    return convert(value, out), buffer


def _halves(x: ir.Value, dim: int) -> tuple[ir.Value, ir.Value]:
    shape = shape_of(x)
    rank = len(shape)
    half = shape[dim] // 2
    first_limit = list(shape)
    first_limit[dim] = half
    second_start = [0] * rank
    second_start[dim] = half
    first = stablehlo.SliceOp(x, [0] * rank, first_limit, [1] * rank).result
    second = stablehlo.SliceOp(x, second_start, shape, [1] * rank).result
    return first, second


# glu splits its dim in halves: along a dynamic dim the halves are at run-time positions.
def _reject_glu_along_dynamic(ctx: LoweringContext, x, dim=-1):
    """glu halves its dim: along a dynamic one the halves are at run-time positions."""
    if dim % len(ctx.arg_meta(0).shape) in dynamic_dims(ctx, 0):
        raise ctx.dynamic_limit("glu along a dynamic (padded) dimension")
    return NotImplemented


@lowers(aten.glu.default, dynamic=Padding.MOVEMENT, dynamic_rule=_reject_glu_along_dynamic)
def _glu(ctx, self, dim=-1):
    out = ctx.result_dtype()
    x = convert(self, _opmath(out))
    a, b = _halves(x, normalize_dim(dim, rank_of(x)))
    return convert(_mul(a, stablehlo.LogisticOp(b).result), out)


def _reject_glu_backward_along_dynamic(ctx: LoweringContext, grad, x, dim):
    """glu's backward halves its dim: along a dynamic one it runs in eager."""
    if dim % len(ctx.arg_meta(1).shape) in dynamic_dims(ctx, 1):
        raise ctx.dynamic_limit("glu along a dynamic (padded) dimension")
    return NotImplemented


@lowers(aten.glu_backward.default, dynamic=Padding.MOVEMENT, dynamic_rule=_reject_glu_backward_along_dynamic)
def _glu_backward(ctx, grad_output, self, dim):
    out = ctx.result_dtype()
    cdt = _opmath(out)
    x = convert(self, cdt)
    d = normalize_dim(dim, rank_of(x))
    g = convert(grad_output, cdt)
    a, b = _halves(x, d)
    s = stablehlo.LogisticOp(b).result
    second = _mul(_mul(_mul(_sub(_c(1.0, s), s), s), a), g)
    return convert(stablehlo.ConcatenateOp([_mul(s, g), second], d).result, out)


@lowers(aten._prelu_kernel.default)
def _prelu_kernel(ctx, self, weight):
    (x, w), out = _inputs(ctx, self, weight)
    return convert(select(_cmp(x, _c(0, x), "GT"), x, _mul(w, x)), out)


@lowers(aten._prelu_kernel_backward.default)
def _prelu_kernel_backward(ctx, grad_output, self, weight):
    out = ctx.result_dtype(0)
    shape = broadcast_shapes(shape_of(grad_output), shape_of(self), shape_of(weight))
    cdt = _opmath(out)
    g, x, w = (broadcast_to(convert(v, cdt), shape) for v in (grad_output, self, weight))
    positive = _cmp(x, _c(0, x), "GT")
    input_grad = select(positive, g, _mul(w, g))
    weight_grad = select(positive, _c(0, x), _mul(x, g))
    return (
        reshape(convert(input_grad, out), ctx.result_shape(0)),
        reshape(convert(weight_grad, ctx.result_dtype(1)), ctx.result_shape(1)),
    )


def _in_band(x: ir.Value, lambd) -> ir.Value:
    """-lambd <= x <= lambd"""
    return _and(_cmp(x, _c(-lambd, x), "GE"), _cmp(x, _c(lambd, x), "LE"))


@lowers(aten.softshrink.default)
def _softshrink(ctx, self, lambd=0.5):
    (x,), out = _inputs(ctx, self)
    result = select(
        _cmp(x, _c(lambd, x), "GT"), _sub(x, _c(lambd, x)),
        select(_cmp(x, _c(-lambd, x), "LT"), _add(x, _c(lambd, x)), _mul(x, _c(0, x))),
    )
    return convert(result, out)


@lowers(aten.hardshrink.default)
def _hardshrink(ctx, self, lambd=0.5):
    (x,), out = _inputs(ctx, self)
    return convert(select(_in_band(x, lambd), _c(0, x), x), out)


@lowers(aten.softshrink_backward.default, aten.hardshrink_backward.default)
def _shrink_backward(ctx, grad_output, self, lambd):
    (g, x), out = _inputs(ctx, grad_output, self)
    return convert(select(_in_band(x, lambd), _c(0, g), g), out)


@lowers(aten.celu.default)
def _celu(ctx, self, alpha=1.0):
    """elu(x, alpha, scale=1, input_scale=1/alpha), as ATen computes celu."""
    (x,), out = _inputs(ctx, self)
    negative = _mul(_c(alpha, x), stablehlo.Expm1Op(_mul(x, _c(1.0 / alpha, x))).result)
    return convert(select(_cmp(x, _c(0, x), "GT"), x, negative), out)


# -- activation backward ops ---------------------------------------------------------------------------------
@lowers(aten.threshold_backward.default)
def _threshold_backward(ctx, grad_output, self, threshold):
    out = ctx.result_dtype()
    shape = ctx.result_shape()
    g = broadcast_to(convert(grad_output, out), shape)
    x = broadcast_to(self, shape)
    return select(_cmp(x, full(threshold, dtype(x), shape), "LE"), full(0, out, shape), g)


@lowers(aten.sigmoid_backward.default)
def _sigmoid_backward(ctx, grad_output, output):
    (g, y), out = _inputs(ctx, grad_output, output)
    if dtype(y).is_complex:
        return convert(_mul(g, _conj(_mul(_sub(_c(1, y), y), y))), out)
    return convert(_mul(_mul(g, _sub(_c(1, y), y)), y), out)


@lowers(aten.tanh_backward.default)
def _tanh_backward(ctx, grad_output, output):
    (g, y), out = _inputs(ctx, grad_output, output)
    return convert(_mul(g, _conj(_sub(_c(1, y), _mul(y, y)))), out)


@lowers(aten.gelu_backward.default)
def _gelu_backward(ctx, grad_output, self, *, approximate="none"):
    (g, x), out = _inputs(ctx, grad_output, self)
    sqrt2, sqrt1_2, two_sqrtpi = 1.41421356237309504880, 0.70710678118654752440, 1.12837916709551257390
    if approximate == "tanh":
        beta, kappa = sqrt2 * two_sqrtpi * 0.5, 0.044715
        x_sq = _mul(x, x)
        x_cube = _mul(x_sq, x)
        inner = _mul(_c(beta, x), _add(x, _mul(_c(kappa, x), x_cube)))
        t = stablehlo.TanhOp(inner).result
        left = _mul(_c(0.5, x), x)
        right = _add(_c(1, x), t)
        left_derivative = _mul(_c(0.5, x), right)
        tanh_derivative = _sub(_c(1, x), _mul(t, t))
        inner_derivative = _mul(_c(beta, x), _add(_c(1, x), _mul(_c(3 * kappa, x), x_sq)))
        right_derivative = _mul(_mul(left, tanh_derivative), inner_derivative)
        return convert(_mul(g, _add(left_derivative, right_derivative)), out)
    beta = two_sqrtpi * sqrt1_2 * 0.5
    cdf = _mul(_c(0.5, x), _add(_c(1, x), chlo.ErfOp(_mul(x, _c(sqrt1_2, x))).result))
    pdf = _mul(_c(beta, x), _exp(_mul(_mul(x, x), _c(-0.5, x))))
    return convert(_mul(g, _add(cdf, _mul(x, pdf))), out)


@lowers(aten.silu_backward.default)
def _silu_backward(ctx, grad_output, self):
    (g, x), out = _inputs(ctx, grad_output, self)
    s = stablehlo.LogisticOp(x).result
    return convert(_mul(_mul(g, s), _add(_c(1, x), _mul(x, _sub(_c(1, s), s)))), out)


@lowers(aten.hardtanh_backward.default)
def _hardtanh_backward(ctx, grad_output, self, min_val, max_val):
    (g, x), out = _inputs(ctx, grad_output, self)
    outside = _or(_cmp(x, _c(min_val, x), "LE"), _cmp(x, _c(max_val, x), "GE"))
    return convert(select(outside, _c(0, g), g), out)


@lowers(aten.leaky_relu_backward.default)
def _leaky_relu_backward(ctx, grad_output, self, negative_slope, self_is_result):
    (g, x), out = _inputs(ctx, grad_output, self)
    return convert(select(_cmp(x, _c(0, x), "GT"), g, _mul(g, _c(negative_slope, g))), out)


@lowers(aten.elu_backward.default)
def _elu_backward(ctx, grad_output, alpha, scale, input_scale, is_result, self_or_result):
    (g, y), out = _inputs(ctx, grad_output, self_or_result)
    negcoef, poscoef, negiptcoef = alpha * scale, scale, input_scale
    if is_result:
        negative = _mul(_mul(g, _c(negiptcoef, g)), _add(y, _c(negcoef, y)))
    else:
        negative = _mul(_mul(_mul(g, _c(negiptcoef, g)), _c(negcoef, g)), _exp(_mul(y, _c(negiptcoef, y))))
    return convert(select(_cmp(y, _c(0, y), "LE"), negative, _mul(g, _c(poscoef, g))), out)


@lowers(aten.rrelu_with_noise_backward.default)
def _rrelu_with_noise_backward(ctx, grad_output, self, noise, lower, upper, training, self_is_result):
    (g, x, n), out = _inputs(ctx, grad_output, self, noise)
    if training:
        return convert(_mul(g, n), out)
    slope = (lower + upper) / 2
    return convert(select(_cmp(x, _c(0, x), "GT"), g, _mul(g, _c(slope, g))), out)


@lowers(aten.hardsigmoid_backward.default)
def _hardsigmoid_backward(ctx, grad_output, self):
    (g, x), out = _inputs(ctx, grad_output, self)
    inside = _and(_cmp(x, _c(-3.0, x), "GT"), _cmp(x, _c(3.0, x), "LT"))
    return convert(select(inside, _mul(g, _c(1.0 / 6.0, g)), _c(0, g)), out)


@lowers(aten.hardswish_backward.default)
def _hardswish_backward(ctx, grad_output, self):
    (g, x), out = _inputs(ctx, grad_output, self)
    middle = _mul(g, _add(_div(x, _c(3, x)), _c(0.5, x)))
    result = select(_cmp(x, _c(-3, x), "LE"), _c(0, g), select(_cmp(x, _c(3, x), "LT"), middle, g))
    return convert(result, out)


@lowers(aten.mish_backward.default)
def _mish_backward(ctx, grad_output, self):
    (g, x), out = _inputs(ctx, grad_output, self)
    t = stablehlo.TanhOp(_log1p(_exp(x))).result  # the kernel's tanh(log1p(exp(x)))
    s = stablehlo.LogisticOp(x).result
    rest = _mul(_mul(x, s), _sub(_c(1, t), _mul(t, t)))
    return convert(_mul(g, _add(t, rest)), out)


@lowers(aten.softplus_backward.default)
def _softplus_backward(ctx, grad_output, self, beta, threshold):
    (g, x), out = _inputs(ctx, grad_output, self)
    scaled = _mul(x, _c(beta, x))
    z = _exp(scaled)
    soft = _div(_mul(g, z), _add(z, _c(1.0, z)))
    return convert(select(_cmp(scaled, _c(threshold, x), "GT"), g, soft), out)


@lowers(aten.logit_backward.default)
def _logit_backward(ctx, grad_output, self, eps=None):
    (g, x), out = _inputs(ctx, grad_output, self)
    lo, hi = (eps, 1.0 - eps) if eps is not None else (0.0, 1.0)
    inside = _and(_cmp(x, _c(lo, x), "GE"), _cmp(x, _c(hi, x), "LE"))
    grad = _div(g, _mul(x, _sub(_c(1.0, x), x)))
    return convert(select(inside, grad, _c(0.0 if eps is not None else float("nan"), x)), out)


@lowers(aten.log_sigmoid_backward.default)
def _log_sigmoid_backward(ctx, grad_output, self, buffer):
    (g, x), out = _inputs(ctx, grad_output, self)
    if math.prod(shape_of(buffer)) > 0:
        z = broadcast_to(convert(buffer, dtype(x)), shape_of(x))
    else:
        z = _exp(_neg(_abs(x)))
    negative = _cmp(x, _c(0, x), "LT")
    max_deriv = select(negative, _c(1, x), _c(0, x))
    sign = select(negative, _c(1, x), _c(-1, x))
    return convert(_mul(g, _sub(max_deriv, _mul(sign, _div(z, _add(_c(1, z), z))))), out)


# Bounded dynamism (registry.Padding): every activation but glu is elementwise.
declare_padding(Padding.SAFE, family="activations")
