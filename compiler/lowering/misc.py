"""Miscellaneous math: pointwise helpers (`lerp`, `addcmul`, `hypot`, `xlogy`, `copysign`,
...), activations and their backward ops (what aot_autograd puts in backward graphs:
`gelu_backward`, `threshold_backward`, ...), losses (`mse_loss`, `binary_cross_entropy`,
`nll_loss*`, ...) and distances (`_cdist_forward`, `_pdist_forward`, their backward,
`linalg_cross`).

Formulas follow ATen's CPU kernels operation by operation (the order of multiplications
and the comparisons at boundaries), so results match eager bit for bit or to rounding.
Like ATen's `opmath`, float16/bfloat16 compute in float32 and round once at the end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..context import chlo, ir, stablehlo
from ..dtypes import tensor_type
from .helpers import (
    absolute,
    add,
    div,
    exp,
    like,
    log,
    log1p,
    logical_and,
    logical_or,
    maximum,
    minimum,
    mul,
    neg,
    sign,
    sub,
    broadcast_shapes,
    broadcast_to,
    compare,
    convert,
    dtype,
    full,
    normalize_dim,
    rank_of,
    reduce,
    reshape,
    select,
    shape_of,
)
from .registry import declare_padding, dynamic_rule, LoweringContext, lowers, Padding

aten = torch.ops.aten

_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


# -- small builders -----------------------------------------------------------------------------------
def _opmath(dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


# Formula shorthands shared with the other families (helpers.py).
_c = like
_add, _sub, _mul, _div = add, sub, mul, div
_and, _or, _max, _min = logical_and, logical_or, maximum, minimum
_abs, _exp, _log, _log1p, _neg, _sign = absolute, exp, log, log1p, neg, sign


def _cmp(a, b, direction: str):
    return compare(a, b, direction)


def _isnan(x):
    return compare(x, x, "NE")


def _conj(x):
    if not dtype(x).is_complex:
        return x
    return stablehlo.ComplexOp(stablehlo.RealOp(x).result, _neg(stablehlo.ImagOp(x).result)).result


def _inputs(ctx: LoweringContext, *args, compute: torch.dtype | None = None):
    """The tensor/scalar arguments as values of the compute dtype (opmath of the result
    dtype) broadcast to the result shape; returns (values, result dtype)."""
    out = ctx.result_dtype()
    cdt = compute or _opmath(out)
    shape = ctx.result_shape()
    values = []
    for a in args:
        if isinstance(a, ir.Value):
            values.append(broadcast_to(convert(a, cdt), shape))
        else:
            values.append(full(a, cdt, shape))
    return values, out


def _sum_all(x: ir.Value) -> ir.Value:
    dims = list(range(rank_of(x)))
    if not dims:
        return x
    (result,) = reduce([x], [full(0, dtype(x), [])], dims, lambda acc, new: [_add(acc[0], new[0])])
    return result


def _reduce_loss(loss: ir.Value, reduction: int) -> ir.Value:
    """ATen's apply_loss_reduction: 0 none, 1 mean, 2 sum."""
    if reduction == _REDUCTION_NONE:
        return loss
    total = _sum_all(loss)
    if reduction == _REDUCTION_MEAN:
        n = math.prod(shape_of(loss))
        return _div(total, full(n, dtype(total), []))  # n == 0 gives NaN, as torch.mean
    return total


def _log_sigmoid(x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(log_sigmoid(x), exp(-|x|)) = (min(0, x) - log1p(exp(-|x|)), buffer)."""
    z = _exp(_neg(_abs(x)))
    return _sub(_min(_c(0, x), x), _log1p(z)), z


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


@lowers(aten.glu.default)
def _glu(ctx, self, dim=-1):
    out = ctx.result_dtype()
    x = convert(self, _opmath(out))
    a, b = _halves(x, normalize_dim(dim, rank_of(x)))
    return convert(_mul(a, stablehlo.LogisticOp(b).result), out)


@lowers(aten.glu_backward.default)
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


# -- losses --------------------------------------------------------------------------------------------------
def _loss_inputs(ctx, *args):
    """Pointwise loss operands in opmath, broadcast together (the result shape of a
    reduced loss is 0-d, so the broadcast shape comes from the operands)."""
    out = ctx.result_dtype()
    cdt = _opmath(out)
    shape = broadcast_shapes(*[shape_of(a) for a in args if isinstance(a, ir.Value)])
    return [broadcast_to(convert(a, cdt), shape) for a in args], out


def _norm(reduction: int, like: ir.Value) -> float:
    return 1.0 / math.prod(shape_of(like)) if reduction == _REDUCTION_MEAN else 1.0


@lowers(aten.mse_loss.default)
def _mse_loss(ctx, self, target, reduction=_REDUCTION_MEAN):
    (x, t), out = _loss_inputs(ctx, self, target)
    d = _sub(x, t)
    return convert(_reduce_loss(_mul(d, d), reduction), out)


@lowers(aten.mse_loss_backward.default)
def _mse_loss_backward(ctx, grad_output, self, target, reduction):
    (g, x, t), out = _inputs(ctx, grad_output, self, target)
    norm = 2.0 / math.prod(shape_of(x)) if reduction == _REDUCTION_MEAN else 2.0
    return convert(_mul(_mul(_c(norm, x), _sub(x, t)), g), out)


@lowers(aten.binary_cross_entropy.default)
def _binary_cross_entropy(ctx, self, target, weight=None, reduction=_REDUCTION_MEAN):
    (x, t), out = _loss_inputs(ctx, self, target)
    floor = _c(-100, x)
    loss = _sub(
        _mul(_sub(t, _c(1, t)), _max(_log1p(_neg(x)), floor)),
        _mul(t, _max(_log(x), floor)),
    )
    if weight is not None:
        loss = _mul(loss, broadcast_to(convert(weight, dtype(loss)), shape_of(loss)))
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.binary_cross_entropy_backward.default)
def _binary_cross_entropy_backward(ctx, grad_output, self, target, weight=None, reduction=_REDUCTION_MEAN):
    (g, x, t), out = _inputs(ctx, grad_output, self, target)
    denominator = _max(_mul(_sub(_c(1, x), x), x), _c(1e-12, x))
    result = _div(_mul(g, _sub(x, t)), denominator)
    if weight is not None:
        result = _mul(result, broadcast_to(convert(weight, dtype(result)), shape_of(result)))
    if reduction == _REDUCTION_MEAN:
        result = _div(result, _c(math.prod(shape_of(x)), result))
    return convert(result, out)


@lowers(aten.binary_cross_entropy_with_logits.default)
def _binary_cross_entropy_with_logits(ctx, self, target, weight=None, pos_weight=None, reduction=_REDUCTION_MEAN):
    (x, t), out = _loss_inputs(ctx, self, target)
    log_sig, _ = _log_sigmoid(x)
    if pos_weight is not None:
        pw = broadcast_to(convert(pos_weight, dtype(x)), shape_of(x))
        log_sig = _mul(log_sig, _add(_mul(_sub(pw, _c(1, pw)), t), _c(1, t)))
    loss = _sub(_mul(_sub(_c(1, t), t), x), log_sig)
    if weight is not None:
        loss = _mul(loss, broadcast_to(convert(weight, dtype(loss)), shape_of(loss)))
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.smooth_l1_loss.default)
def _smooth_l1_loss(ctx, self, target, reduction=_REDUCTION_MEAN, beta=1.0):
    (x, t), out = _loss_inputs(ctx, self, target)
    z = _abs(_sub(x, t))
    if beta == 0:
        loss = z
    else:
        quadratic = _div(_mul(_mul(_c(0.5, z), z), z), _c(beta, z))
        loss = select(_cmp(z, _c(beta, z), "LT"), quadratic, _sub(z, _c(0.5 * beta, z)))
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.smooth_l1_loss_backward.default)
def _smooth_l1_loss_backward(ctx, grad_output, self, target, reduction, beta):
    (g, x, t), out = _inputs(ctx, grad_output, self, target)
    norm = _c(_norm(reduction, x), x)
    d = _sub(x, t)
    inner = _div(_mul(_mul(norm, d), g), _c(beta, d)) if beta != 0 else _c(0, d)
    result = select(
        _cmp(d, _c(-beta, d), "LE"), _neg(_mul(norm, g)),
        select(_cmp(d, _c(beta, d), "GE"), _mul(norm, g), inner),
    )
    return convert(result, out)


@lowers(aten.huber_loss.default)
def _huber_loss(ctx, self, target, reduction=_REDUCTION_MEAN, delta=1.0):
    (x, t), out = _loss_inputs(ctx, self, target)
    z = _abs(_sub(x, t))
    quadratic = _mul(_mul(_c(0.5, z), z), z)
    linear = _mul(_c(delta, z), _sub(z, _c(0.5 * delta, z)))
    loss = select(_cmp(z, _c(delta, z), "LT"), quadratic, linear)
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.huber_loss_backward.default)
def _huber_loss_backward(ctx, grad_output, self, target, reduction, delta):
    (g, x, t), out = _inputs(ctx, grad_output, self, target)
    norm = _c(_norm(reduction, x), x)
    d = _sub(x, t)
    result = select(
        _cmp(d, _c(-delta, d), "LT"), _mul(_mul(_neg(norm), g), _c(delta, g)),
        select(_cmp(d, _c(delta, d), "GT"), _mul(_mul(norm, g), _c(delta, g)), _mul(_mul(norm, d), g)),
    )
    return convert(result, out)


@lowers(aten.soft_margin_loss.default)
def _soft_margin_loss(ctx, self, target, reduction=_REDUCTION_MEAN):
    (x, t), out = _loss_inputs(ctx, self, target)
    loss = _log1p(_exp(_mul(_neg(x), t)))
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.soft_margin_loss_backward.default)
def _soft_margin_loss_backward(ctx, grad_output, self, target, reduction=_REDUCTION_MEAN):
    (g, x, t), out = _inputs(ctx, grad_output, self, target)
    result = _mul(_mul(t, g), _sub(stablehlo.LogisticOp(_mul(t, x)).result, _c(1, x)))
    if reduction == _REDUCTION_MEAN:
        result = _div(result, _c(math.prod(shape_of(x)), result))
    return convert(result, out)


# -- nll_loss -----------------------------------------------------------------------------------------------------
def _class_dim(self: ir.Value) -> int:
    return 1 if rank_of(self) >= 2 else 0


def _one_hot(self: ir.Value, target: ir.Value, ignore_index: int) -> tuple[ir.Value, ir.Value]:
    """(mask of self's shape: the target class of each sample, valid: target != ignore)
    with target broadcast over the class dim."""
    shape = shape_of(self)
    cdim = _class_dim(self)
    tshape = list(shape)
    tshape[cdim] = 1
    target = reshape(target, tshape) if math.prod(shape_of(target)) == math.prod(tshape) else target
    tdt = dtype(target)
    valid = _cmp(target, full(ignore_index, tdt, shape_of(target)), "NE")
    classes = stablehlo.IotaOp(tensor_type(shape, tdt), cdim).result
    hit = _and(_cmp(classes, broadcast_to(target, shape), "EQ"), broadcast_to(valid, shape))
    return hit, valid


def _class_weights(self: ir.Value, weight) -> ir.Value | None:
    if weight is None:
        return None
    shape = shape_of(self)
    cdim = _class_dim(self)
    wshape = [1] * len(shape)
    wshape[cdim] = shape[cdim]
    return broadcast_to(reshape(convert(weight, dtype(self)), wshape), shape)


def _sum_dim(x: ir.Value, dim: int) -> ir.Value:
    (result,) = reduce([x], [full(0, dtype(x), [])], [dim], lambda acc, new: [_add(acc[0], new[0])])
    return result


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss_forward(ctx, self, target, weight, reduction, ignore_index):
    """-self[i, target[i]] * weight[target[i]] as a one-hot select and a sum over the
    class dim (no gather: ignored targets may be out of range)."""
    out = ctx.result_dtype(0)
    cdt = _opmath(out)
    x = convert(self, cdt)
    if rank_of(x) == 1 and rank_of(target) == 1:
        target = reshape(target, [])  # the kernel reads target[0]
    hit, valid = _one_hot(x, target, ignore_index)
    w = _class_weights(x, weight)
    weighted = _mul(x, w) if w is not None else x
    cdim = _class_dim(x)
    picked = _neg(_sum_dim(select(hit, weighted, _c(0, x)), cdim))  # [N, ...]
    if w is not None:
        sample_weight = _sum_dim(select(hit, w, _c(0, w)), cdim)
    else:
        sample_weight = convert(reshape(valid, shape_of(picked)), cdt)
    if reduction == _REDUCTION_NONE and rank_of(x) > 1:
        return convert(picked, out), full(0, ctx.result_dtype(1), ctx.result_shape(1))
    total_weight = _sum_all(sample_weight)
    loss = _sum_all(picked)
    if reduction == _REDUCTION_MEAN:
        loss = _div(loss, total_weight)
    return reshape(convert(loss, out), ctx.result_shape(0)), reshape(convert(total_weight, ctx.result_dtype(1)), ctx.result_shape(1))


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def _nll_loss_backward(ctx, grad_output, self, target, weight, reduction, ignore_index, total_weight):
    out = ctx.result_dtype()
    cdt = _opmath(out)
    shape = shape_of(self)
    cdim = _class_dim(self)
    g = convert(grad_output, cdt)
    if reduction == _REDUCTION_MEAN:
        g = _div(g, broadcast_to(convert(total_weight, cdt), shape_of(g)))
    if rank_of(self) == 1 and rank_of(target) == 1:
        target = reshape(target, [])
    x = convert(self, cdt)
    hit, _ = _one_hot(x, target, ignore_index)
    if rank_of(g) > 0 and rank_of(g) < len(shape):
        gshape = list(shape)
        gshape[cdim] = 1
        g = reshape(g, gshape)
    g = broadcast_to(g, shape)
    w = _class_weights(x, weight)
    if w is not None:
        g = _mul(g, w)
    return convert(select(hit, _neg(g), _c(0, x)), out)


# -- distances and cross products ----------------------------------------------------------------------------------
def _pairwise_norm(diff: ir.Value, p: float, axis: int) -> ir.Value:
    """The p-norm of `diff` over `axis` with ATen's special cases (p = 0, 1, 2, inf)."""
    a = _abs(diff)
    if p == 0:
        return _sum_dim(convert(_cmp(a, _c(0, a), "NE"), dtype(a)), axis)
    if p == 1:
        return _sum_dim(a, axis)
    if p == 2:
        return stablehlo.SqrtOp(_sum_dim(_mul(a, a), axis)).result
    if math.isinf(p):
        (result,) = reduce([a], [full(0, dtype(a), [])], [axis], lambda acc, new: [_max(acc[0], new[0])])
        return result
    powered = stablehlo.PowOp(a, _c(p, a)).result
    summed = _sum_dim(powered, axis)
    return stablehlo.PowOp(summed, _c(1.0 / p, summed)).result


def _cdist_direct(x1: ir.Value, x2: ir.Value, p: float, out_shape: Sequence[int]) -> ir.Value:
    """|x1[..., i, None, :] - x2[..., None, j, :]|_p, batch dims broadcast."""
    *_, m = shape_of(x1)
    pr = list(out_shape)
    full_shape = pr + [m]
    r = len(full_shape)
    s1 = shape_of(x1)
    s2 = shape_of(x2)
    a = stablehlo.BroadcastInDimOp(tensor_type(full_shape, dtype(x1)), x1, _aligned(len(s1), r, skip=r - 2)).result
    b = stablehlo.BroadcastInDimOp(tensor_type(full_shape, dtype(x2)), x2, _aligned(len(s2), r, skip=r - 3)).result
    return _pairwise_norm(_sub(a, b), p, r - 1)


def _aligned(src_rank: int, dst_rank: int, *, skip: int) -> list[int]:
    """broadcast_in_dim dims placing a rank-`src_rank` operand right-aligned into
    `dst_rank` dims, skipping output dim `skip` (the other operand's row dim)."""
    dims = [d for d in range(dst_rank) if d != skip]
    return dims[len(dims) - src_rank:]


def _euclidean_mm(x1: ir.Value, x2: ir.Value, out_shape: Sequence[int]) -> ir.Value:
    """ATen's _euclidean_dist: sqrt(clamp_min(|x1|^2 - 2 x1.x2 + |x2|^2, 0)) with the
    terms combined by one matmul, batch dims broadcast first."""
    batch = list(out_shape[:-2])
    m = shape_of(x1)[-1]
    x1 = broadcast_to(x1, batch + shape_of(x1)[-2:])
    x2 = broadcast_to(x2, batch + shape_of(x2)[-2:])
    n1 = _sum_dim(_mul(x1, x1), len(batch) + 1)
    n2 = _sum_dim(_mul(x2, x2), len(batch) + 1)
    nb = len(batch)
    dims = ",".join(str(i) for i in range(nb))
    attr = ir.Attribute.parse(
        f"#stablehlo.dot<lhs_batching_dimensions = [{dims}], rhs_batching_dimensions = [{dims}], "
        f"lhs_contracting_dimensions = [{nb + 1}], rhs_contracting_dimensions = [{nb + 1}]>"
    )
    del m
    dot = stablehlo.DotGeneralOp(tensor_type(out_shape, dtype(x1)), x1, x2, attr).result
    rows = broadcast_to(reshape(n1, shape_of(n1) + [1]), out_shape)
    cols = stablehlo.BroadcastInDimOp(tensor_type(out_shape, dtype(n2)), n2, list(range(nb)) + [nb + 1]).result
    squared = _add(_add(_mul(_c(-2, dot), dot), rows), cols)
    return stablehlo.SqrtOp(_max(squared, _c(0, squared))).result


@lowers(aten._cdist_forward.default)
def _cdist_forward(ctx, x1, x2, p, compute_mode):
    out = ctx.result_dtype()
    out_shape = ctx.result_shape()
    if 0 in out_shape:
        return full(0, out, out_shape)
    cdt = _opmath(out)
    a, b = convert(x1, cdt), convert(x2, cdt)
    if shape_of(a)[-1] == 0:
        return full(0, out, out_shape)
    rows, cols = out_shape[-2], out_shape[-1]
    # ATen: compute_mode None/0 uses the matmul form when p == 2 and either side has
    # more than 25 rows; 1 always; 2 never.
    use_mm = p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (rows > 25 or cols > 25)))
    result = _euclidean_mm(a, b, out_shape) if use_mm else _cdist_direct(a, b, p, out_shape)
    return convert(result, out)


@lowers(aten._euclidean_dist.default)
def _euclidean_dist(ctx, x1, x2):
    """What torch.cdist calls for p=2 in its matmul mode (more than 25 rows)."""
    out = ctx.result_dtype()
    out_shape = ctx.result_shape()
    if 0 in out_shape:
        return full(0, out, out_shape)
    cdt = _opmath(out)
    return convert(_euclidean_mm(convert(x1, cdt), convert(x2, cdt), out_shape), out)


def _upper_pairs(n: int) -> tuple[list[int], list[int]]:
    rows, cols = [], []
    for i in range(n):
        for j in range(i + 1, n):
            rows.append(i)
            cols.append(j)
    return rows, cols


@lowers(aten._pdist_forward.default)
def _pdist_forward(ctx, self, p=2.0):
    out = ctx.result_dtype()
    out_shape = ctx.result_shape()
    n, m = shape_of(self)
    if 0 in out_shape:
        return full(0, out, out_shape)
    x = convert(self, _opmath(out))
    if m == 0:
        return full(0, out, out_shape)
    rows, cols = _upper_pairs(n)
    from .helpers import array_constant
    from .indexing import _take_rows

    a = _take_rows(x, array_constant(torch.tensor(rows, dtype=torch.int32), torch.int32))
    b = _take_rows(x, array_constant(torch.tensor(cols, dtype=torch.int32), torch.int32))
    return convert(_pairwise_norm(_sub(a, b), p, 1), out)


@lowers(aten._cdist_backward.default)
def _cdist_backward(ctx, grad, x1, x2, p, cdist):
    """d cdist / d x1, summed over x2's rows, with ATen's cases per p."""
    out = ctx.result_dtype()
    out_shape = ctx.result_shape()
    if 0 in out_shape or 0 in shape_of(grad):
        return full(0, out, out_shape)
    cdt = _opmath(out)
    batch = shape_of(grad)[:-2]
    rows, cols = shape_of(grad)[-2:]
    m = shape_of(x1)[-1]
    full_shape = batch + [rows, cols, m]
    r = len(full_shape)
    a = stablehlo.BroadcastInDimOp(tensor_type(full_shape, cdt), convert(x1, cdt), _aligned(rank_of(x1), r, skip=r - 2)).result
    b = stablehlo.BroadcastInDimOp(tensor_type(full_shape, cdt), convert(x2, cdt), _aligned(rank_of(x2), r, skip=r - 3)).result
    diff = _sub(a, b)
    g = broadcast_to(reshape(convert(grad, cdt), batch + [rows, cols, 1]), full_shape)
    dist = broadcast_to(reshape(convert(cdist, cdt), batch + [rows, cols, 1]), full_shape)
    term = _distance_grad(diff, g, dist, p)
    result = _sum_dim(term, r - 2)
    return convert(broadcast_to(result, out_shape), out)


def _distance_grad(diff: ir.Value, g: ir.Value, dist: ir.Value, p: float) -> ir.Value:
    """grad * d|diff|_p / d diff, elementwise (ATen's cdist/pdist backward kernels)."""
    zero = _c(0, diff)
    dist_zero = _cmp(dist, zero, "EQ")
    if p == 0:
        return zero
    if p == 1:
        return _mul(g, _sign(diff))
    if math.isinf(p):
        return _mul(_mul(g, _sign(diff)), convert(_cmp(_abs(diff), dist, "EQ"), dtype(diff)))
    if p == 2:
        return select(dist_zero, zero, _div(_mul(g, diff), dist))
    if p < 2:
        powered = _div(stablehlo.PowOp(_abs(diff), _c(p - 1, diff)).result, stablehlo.PowOp(dist, _c(p - 1, dist)).result)
        value = _mul(_mul(_sign(diff), powered), g)
        return select(_or(dist_zero, _cmp(diff, zero, "EQ")), zero, value)
    powered = _div(
        _mul(diff, stablehlo.PowOp(_abs(diff), _c(p - 2, diff)).result),
        stablehlo.PowOp(dist, _c(p - 1, dist)).result,
    )
    return select(dist_zero, zero, _mul(powered, g))


@lowers(aten._pdist_backward.default)
def _pdist_backward(ctx, grad, self, p, pdist):
    out = ctx.result_dtype()
    n, m = shape_of(self)
    if n < 2 or m == 0:
        return full(0, out, [n, m])
    cdt = _opmath(out)
    x = convert(self, cdt)
    rows, cols = _upper_pairs(n)
    from .helpers import array_constant
    from .indexing import _Scatter, _take_rows

    ri = array_constant(torch.tensor(rows, dtype=torch.int32), torch.int32)
    ci = array_constant(torch.tensor(cols, dtype=torch.int32), torch.int32)
    diff = _sub(_take_rows(x, ri), _take_rows(x, ci))
    k = len(rows)
    g = broadcast_to(reshape(convert(grad, cdt), [k, 1]), [k, m])
    dist = broadcast_to(reshape(convert(pdist, cdt), [k, 1]), [k, m])
    term = _distance_grad(diff, g, dist, p)
    zeros = full(0, cdt, [n, m])
    add_rows = _Scatter(reshape(ri, [k, 1]), (1,), (0,), (0,), 1).apply(zeros, term, "add")
    result = _Scatter(reshape(ci, [k, 1]), (1,), (0,), (0,), 1).apply(add_rows, _neg(term), "add")
    return convert(result, out)


@lowers(aten.linalg_cross.default)
def _linalg_cross(ctx, self, other, *, dim=-1):
    out = ctx.result_dtype()
    shape = ctx.result_shape()
    a = broadcast_to(convert(self, out), shape)
    b = broadcast_to(convert(other, out), shape)
    d = normalize_dim(dim, len(shape))
    rank = len(shape)

    def part(x, i):
        start = [0] * rank
        limit = list(shape)
        start[d], limit[d] = i, i + 1
        return stablehlo.SliceOp(x, start, limit, [1] * rank).result

    a0, a1, a2 = (part(a, i) for i in range(3))
    b0, b1, b2 = (part(b, i) for i in range(3))
    c0 = _sub(_mul(a1, b2), _mul(a2, b1))
    c1 = _sub(_mul(a2, b0), _mul(a0, b2))
    c2 = _sub(_mul(a0, b1), _mul(a1, b0))
    return stablehlo.ConcatenateOp([c0, c1, c2], d).result


# Bounded dynamism (registry.Padding). Row-pair distances are laid out by pair index;
# nll_loss sums weights and values (masked) and divides by the weight sum, so its mean is
# right (test_gpt_training_step_dynamic_batch); the mean losses have count rules
# (dynamic_rules.py); glu splits its dim in halves (a rule there); every other op here is
# elementwise.
declare_padding(
    Padding.EAGER,
    aten._cdist_forward.default,
    aten._cdist_backward.default,
    aten._euclidean_dist.default,
    aten._pdist_forward.default,
    aten._pdist_backward.default,
)
declare_padding(
    Padding.MASKED,
    aten.nll_loss_forward.default,
    aten.nll_loss_backward.default,
    aten.nll_loss2d_forward.default,
    aten.nll_loss2d_backward.default,
)
# Mean losses divide by a count (their rule is in dynamic_rules.py).
declare_padding(
    Padding.COUNT,
    *(
        getattr(aten, name).default
        for name in (
            "mse_loss", "mse_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward",
            "binary_cross_entropy_with_logits", "smooth_l1_loss", "smooth_l1_loss_backward",
            "huber_loss", "huber_loss_backward", "soft_margin_loss", "soft_margin_loss_backward",
        )
    ),
)


def _glu_rule(ctx: LoweringContext, x, dim=-1):
    """glu halves its dim: along a dynamic one the halves are at run-time positions."""
    from .dynamic_rules import _dynamic_dims

    if dim % len(ctx.arg_meta(0).shape) in _dynamic_dims(ctx, 0):
        raise ctx.dynamic_limit("glu along a dynamic (padded) dimension")
    return NotImplemented


def _glu_backward_rule(ctx: LoweringContext, grad, x, dim):
    """glu's backward halves its dim: along a dynamic one it runs in eager."""
    from .dynamic_rules import _dynamic_dims

    if dim % len(ctx.arg_meta(1).shape) in _dynamic_dims(ctx, 1):
        raise ctx.dynamic_limit("glu along a dynamic (padded) dimension")
    return NotImplemented


dynamic_rule(aten.glu.default, padding=Padding.MOVEMENT)(_glu_rule)
dynamic_rule(aten.glu_backward.default, padding=Padding.MOVEMENT)(_glu_backward_rule)
# Every other op of this family is elementwise.
declare_padding(Padding.SAFE, family="misc")
