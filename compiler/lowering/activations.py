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
from .. import ir as hlo
from .helpers import (
    broadcast_shapes,
    broadcast_to,
    conj,
    constant_like,
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
from .opmath import log_sigmoid_parts, opmath_dtype, opmath_operands

aten = torch.ops.aten


# -- activations ------------------------------------------------------------------------------------------
def _relu6_shifted(x: ir.Value) -> ir.Value:
    """min(max(x + 3, 0), 6)"""
    return hlo.minimum(hlo.maximum(hlo.add(x, constant_like(3, x)), constant_like(0, x)), constant_like(6, x))


@lowers(aten.hardsigmoid.default)
def _hardsigmoid(ctx, self):
    (x,), out = opmath_operands(ctx, self)
    return convert(hlo.div(_relu6_shifted(x), constant_like(6, x)), out)


@lowers(aten.hardswish.default)
def _hardswish(ctx, self):
    (x,), out = opmath_operands(ctx, self)
    return convert(hlo.div(hlo.mul(x, _relu6_shifted(x)), constant_like(6, x)), out)


def _softplus_value(x: ir.Value, beta, threshold) -> ir.Value:
    scaled = hlo.mul(x, constant_like(beta, x))
    soft = hlo.div(hlo.log1p(hlo.exp(scaled)), constant_like(beta, x))
    return select(hlo.compare(scaled, constant_like(threshold, x), "GT"), x, soft)


@lowers(aten.softplus.default)
def _softplus(ctx, self, beta=1, threshold=20):
    (x,), out = opmath_operands(ctx, self)
    return convert(_softplus_value(x, beta, threshold), out)


@lowers(aten.mish.default)
def _mish(ctx, self):
    (x,), out = opmath_operands(ctx, self)
    return convert(hlo.mul(x, stablehlo.TanhOp(hlo.log1p(hlo.exp(x))).result), out)


@lowers(aten.threshold.default)
def _threshold(ctx, self, threshold, value):
    """x where x > threshold, else value. The comparison is in the opmath dtype, as the
    kernel's: a bfloat16 x of bfloat16(0.2) is above a threshold of 0.2 (rounding the
    threshold to bfloat16 first made them equal and replaced x)."""
    out = ctx.result_dtype()
    x = convert(self, out)
    wide = convert(x, opmath_dtype(out))
    below = hlo.compare(wide, full(threshold, dtype(wide), shape_of(x)), "LE")
    return select(below, full(value, out, shape_of(x)), x)


@lowers(aten.log_sigmoid_forward.default)
def _log_sigmoid_forward(ctx, self):
    out = ctx.result_dtype(0)
    x = convert(self, opmath_dtype(out))
    value, buffer = log_sigmoid_parts(x)
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
    x = convert(self, opmath_dtype(out))
    a, b = _halves(x, normalize_dim(dim, rank_of(x)))
    return convert(hlo.mul(a, hlo.logistic(b)), out)


def _reject_glu_backward_along_dynamic(ctx: LoweringContext, grad, x, dim):
    """glu's backward halves its dim: along a dynamic one it runs in eager."""
    if dim % len(ctx.arg_meta(1).shape) in dynamic_dims(ctx, 1):
        raise ctx.dynamic_limit("glu along a dynamic (padded) dimension")
    return NotImplemented


@lowers(aten.glu_backward.default, dynamic=Padding.MOVEMENT, dynamic_rule=_reject_glu_backward_along_dynamic)
def _glu_backward(ctx, grad_output, self, dim):
    out = ctx.result_dtype()
    cdt = opmath_dtype(out)
    x = convert(self, cdt)
    d = normalize_dim(dim, rank_of(x))
    g = convert(grad_output, cdt)
    a, b = _halves(x, d)
    s = hlo.logistic(b)
    second = hlo.mul(hlo.mul(hlo.mul(hlo.sub(constant_like(1.0, s), s), s), a), g)
    return convert(stablehlo.ConcatenateOp([hlo.mul(s, g), second], d).result, out)


@lowers(aten._prelu_kernel.default)
def _prelu_kernel(ctx, self, weight):
    (x, w), out = opmath_operands(ctx, self, weight)
    return convert(select(hlo.compare(x, constant_like(0, x), "GT"), x, hlo.mul(w, x)), out)


@lowers(aten._prelu_kernel_backward.default)
def _prelu_kernel_backward(ctx, grad_output, self, weight):
    out = ctx.result_dtype(0)
    shape = broadcast_shapes(shape_of(grad_output), shape_of(self), shape_of(weight))
    cdt = opmath_dtype(out)
    g, x, w = (broadcast_to(convert(v, cdt), shape) for v in (grad_output, self, weight))
    positive = hlo.compare(x, constant_like(0, x), "GT")
    input_grad = select(positive, g, hlo.mul(w, g))
    weight_grad = select(positive, constant_like(0, x), hlo.mul(x, g))
    return (
        reshape(convert(input_grad, out), ctx.result_shape(0)),
        reshape(convert(weight_grad, ctx.result_dtype(1)), ctx.result_shape(1)),
    )


def _in_band(x: ir.Value, lambd) -> ir.Value:
    """-lambd <= x <= lambd"""
    return hlo.logical_and(hlo.compare(x, constant_like(-lambd, x), "GE"), hlo.compare(x, constant_like(lambd, x), "LE"))


@lowers(aten.softshrink.default)
def _softshrink(ctx, self, lambd=0.5):
    (x,), out = opmath_operands(ctx, self)
    result = select(
        hlo.compare(x, constant_like(lambd, x), "GT"), hlo.sub(x, constant_like(lambd, x)),
        select(hlo.compare(x, constant_like(-lambd, x), "LT"), hlo.add(x, constant_like(lambd, x)), hlo.mul(x, constant_like(0, x))),
    )
    return convert(result, out)


def _in_dtype(value: float, dt: torch.dtype) -> float:
    """`value` rounded to `dt`, as a kernel's `scalar.to<scalar_t>()` rounds it."""
    return torch.tensor(value, dtype=dt).item() if dt.is_floating_point else value


@lowers(aten.hardshrink.default)
def _hardshrink(ctx, self, lambd=0.5):
    # The CPU kernel rounds lambd to the input's dtype (bfloat16(0.2) is in the band of 0.2);
    # softshrink's forward keeps it in float32.
    (x,), out = opmath_operands(ctx, self)
    return convert(select(_in_band(x, _in_dtype(lambd, out)), constant_like(0, x), x), out)


@lowers(aten.softshrink_backward.default, aten.hardshrink_backward.default)
def _shrink_backward(ctx, grad_output, self, lambd):
    # Both backward kernels round lambd to the input's dtype, as hardshrink's forward.
    (g, x), out = opmath_operands(ctx, grad_output, self)
    return convert(select(_in_band(x, _in_dtype(lambd, out)), constant_like(0, g), g), out)


@lowers(aten.celu.default)
def _celu(ctx, self, alpha=1.0):
    """elu(x, alpha, scale=1, input_scale=1/alpha), as ATen computes celu."""
    (x,), out = opmath_operands(ctx, self)
    negative = hlo.mul(constant_like(alpha, x), stablehlo.Expm1Op(hlo.mul(x, constant_like(1.0 / alpha, x))).result)
    return convert(select(hlo.compare(x, constant_like(0, x), "GT"), x, negative), out)


# -- activation backward ops ---------------------------------------------------------------------------------
@lowers(aten.threshold_backward.default)
def _threshold_backward(ctx, grad_output, self, threshold):
    out = ctx.result_dtype()
    shape = ctx.result_shape()
    g = broadcast_to(convert(grad_output, out), shape)
    x = broadcast_to(self, shape)
    return select(hlo.compare(x, full(threshold, dtype(x), shape), "LE"), full(0, out, shape), g)


@lowers(aten.sigmoid_backward.default)
def _sigmoid_backward(ctx, grad_output, output):
    (g, y), out = opmath_operands(ctx, grad_output, output)
    if dtype(y).is_complex:
        return convert(hlo.mul(g, conj(hlo.mul(hlo.sub(constant_like(1, y), y), y))), out)
    return convert(hlo.mul(hlo.mul(g, hlo.sub(constant_like(1, y), y)), y), out)


@lowers(aten.tanh_backward.default)
def _tanh_backward(ctx, grad_output, output):
    (g, y), out = opmath_operands(ctx, grad_output, output)
    return convert(hlo.mul(g, conj(hlo.sub(constant_like(1, y), hlo.mul(y, y)))), out)


@lowers(aten.gelu_backward.default)
def _gelu_backward(ctx, grad_output, self, *, approximate="none"):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    sqrt2, sqrt1_2, two_sqrtpi = 1.41421356237309504880, 0.70710678118654752440, 1.12837916709551257390
    if approximate == "tanh":
        beta, kappa = sqrt2 * two_sqrtpi * 0.5, 0.044715
        x_sq = hlo.mul(x, x)
        x_cube = hlo.mul(x_sq, x)
        inner = hlo.mul(constant_like(beta, x), hlo.add(x, hlo.mul(constant_like(kappa, x), x_cube)))
        t = stablehlo.TanhOp(inner).result
        left = hlo.mul(constant_like(0.5, x), x)
        right = hlo.add(constant_like(1, x), t)
        left_derivative = hlo.mul(constant_like(0.5, x), right)
        tanh_derivative = hlo.sub(constant_like(1, x), hlo.mul(t, t))
        inner_derivative = hlo.mul(constant_like(beta, x), hlo.add(constant_like(1, x), hlo.mul(constant_like(3 * kappa, x), x_sq)))
        right_derivative = hlo.mul(hlo.mul(left, tanh_derivative), inner_derivative)
        return convert(hlo.mul(g, hlo.add(left_derivative, right_derivative)), out)
    beta = two_sqrtpi * sqrt1_2 * 0.5
    cdf = hlo.mul(constant_like(0.5, x), hlo.add(constant_like(1, x), chlo.ErfOp(hlo.mul(x, constant_like(sqrt1_2, x))).result))
    pdf = hlo.mul(constant_like(beta, x), hlo.exp(hlo.mul(hlo.mul(x, x), constant_like(-0.5, x))))
    return convert(hlo.mul(g, hlo.add(cdf, hlo.mul(x, pdf))), out)


@lowers(aten.silu_backward.default)
def _silu_backward(ctx, grad_output, self):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    s = hlo.logistic(x)
    return convert(hlo.mul(hlo.mul(g, s), hlo.add(constant_like(1, x), hlo.mul(x, hlo.sub(constant_like(1, s), s)))), out)


@lowers(aten.hardtanh_backward.default)
def _hardtanh_backward(ctx, grad_output, self, min_val, max_val):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    outside = hlo.logical_or(hlo.compare(x, constant_like(min_val, x), "LE"), hlo.compare(x, constant_like(max_val, x), "GE"))
    return convert(select(outside, constant_like(0, g), g), out)


@lowers(aten.leaky_relu_backward.default)
def _leaky_relu_backward(ctx, grad_output, self, negative_slope, self_is_result):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    return convert(select(hlo.compare(x, constant_like(0, x), "GT"), g, hlo.mul(g, constant_like(negative_slope, g))), out)


@lowers(aten.elu_backward.default)
def _elu_backward(ctx, grad_output, alpha, scale, input_scale, is_result, self_or_result):
    (g, y), out = opmath_operands(ctx, grad_output, self_or_result)
    negcoef, poscoef, negiptcoef = alpha * scale, scale, input_scale
    if is_result:
        negative = hlo.mul(hlo.mul(g, constant_like(negiptcoef, g)), hlo.add(y, constant_like(negcoef, y)))
    else:
        negative = hlo.mul(hlo.mul(hlo.mul(g, constant_like(negiptcoef, g)), constant_like(negcoef, g)), hlo.exp(hlo.mul(y, constant_like(negiptcoef, y))))
    return convert(select(hlo.compare(y, constant_like(0, y), "LE"), negative, hlo.mul(g, constant_like(poscoef, g))), out)


@lowers(aten.rrelu_with_noise_backward.default)
def _rrelu_with_noise_backward(ctx, grad_output, self, noise, lower, upper, training, self_is_result):
    (g, x, n), out = opmath_operands(ctx, grad_output, self, noise)
    if training:
        return convert(hlo.mul(g, n), out)
    slope = (lower + upper) / 2
    return convert(select(hlo.compare(x, constant_like(0, x), "GT"), g, hlo.mul(g, constant_like(slope, g))), out)


@lowers(aten.hardsigmoid_backward.default)
def _hardsigmoid_backward(ctx, grad_output, self):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    inside = hlo.logical_and(hlo.compare(x, constant_like(-3.0, x), "GT"), hlo.compare(x, constant_like(3.0, x), "LT"))
    return convert(select(inside, hlo.mul(g, constant_like(1.0 / 6.0, g)), constant_like(0, g)), out)


@lowers(aten.hardswish_backward.default)
def _hardswish_backward(ctx, grad_output, self):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    middle = hlo.mul(g, hlo.add(hlo.div(x, constant_like(3, x)), constant_like(0.5, x)))
    result = select(hlo.compare(x, constant_like(-3, x), "LE"), constant_like(0, g), select(hlo.compare(x, constant_like(3, x), "LT"), middle, g))
    return convert(result, out)


@lowers(aten.mish_backward.default)
def _mish_backward(ctx, grad_output, self):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    t = stablehlo.TanhOp(hlo.log1p(hlo.exp(x))).result  # the kernel's tanh(log1p(exp(x)))
    s = hlo.logistic(x)
    rest = hlo.mul(hlo.mul(x, s), hlo.sub(constant_like(1, t), hlo.mul(t, t)))
    return convert(hlo.mul(g, hlo.add(t, rest)), out)


@lowers(aten.softplus_backward.default)
def _softplus_backward(ctx, grad_output, self, beta, threshold):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    scaled = hlo.mul(x, constant_like(beta, x))
    z = hlo.exp(scaled)
    soft = hlo.div(hlo.mul(g, z), hlo.add(z, constant_like(1.0, z)))
    return convert(select(hlo.compare(scaled, constant_like(threshold, x), "GT"), g, soft), out)


@lowers(aten.logit_backward.default)
def _logit_backward(ctx, grad_output, self, eps=None):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    lo, hi = (eps, 1.0 - eps) if eps is not None else (0.0, 1.0)
    inside = hlo.logical_and(hlo.compare(x, constant_like(lo, x), "GE"), hlo.compare(x, constant_like(hi, x), "LE"))
    grad = hlo.div(g, hlo.mul(x, hlo.sub(constant_like(1.0, x), x)))
    return convert(select(inside, grad, constant_like(0.0 if eps is not None else float("nan"), x)), out)


@lowers(aten.log_sigmoid_backward.default)
def _log_sigmoid_backward(ctx, grad_output, self, buffer):
    (g, x), out = opmath_operands(ctx, grad_output, self)
    if math.prod(shape_of(buffer)) > 0:
        z = broadcast_to(convert(buffer, dtype(x)), shape_of(x))
    else:
        z = hlo.exp(hlo.neg(hlo.absolute(x)))
    negative = hlo.compare(x, constant_like(0, x), "LT")
    max_deriv = select(negative, constant_like(1, x), constant_like(0, x))
    sign = select(negative, constant_like(1, x), constant_like(-1, x))
    return convert(hlo.mul(g, hlo.sub(max_deriv, hlo.mul(sign, hlo.div(z, hlo.add(constant_like(1, z), z))))), out)


# Bounded dynamism (registry.Padding): every activation but glu is elementwise.
declare_padding(Padding.SAFE, family="activations")
