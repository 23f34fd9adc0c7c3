"""Elementwise ops: unary math, binary arithmetic with PyTorch's type promotion,
comparisons, logical and bitwise ops, `where`, `clamp` and the pointwise activations.

Most rules are one line: a generic unary or binary rule specialised with the StableHLO
op to emit (JAX's `partial(_nary_lower_hlo, hlo.op)` habit).
"""

from __future__ import annotations

import functools
import math
from functools import partial

import torch

from .. import ir as hlo
from ..context import chlo, ir, stablehlo
from .helpers import (
    coerce,
    compare,
    convert,
    dtype,
    full,
    promote,
    promote_dtypes,
    select,
    shape_of,
)
from .opmath import opmath_dtype
from .reduction import reduce_with
from .registry import declare_padding, LoweringContext, lowers, Padding

aten = torch.ops.aten


# -- generic rules ---------------------------------------------------------------------------
def _unary_float(op_class, ctx: LoweringContext, x):
    """`op_class(x)` in the result dtype (integers promote to float), 16-bit floats computed
    in float32 and rounded once, as PyTorch's kernels compute them."""
    out = ctx.result_dtype()
    return convert(op_class(convert(x, opmath_dtype(out))).result, out)


def _in_opmath(rule):
    """`rule` on its input in the opmath dtype (16-bit floats as float32), its result
    rounded once to the input's dtype, as PyTorch's kernels compute activations: a
    formula of several ops in bfloat16 rounds after each (and its constants too) --
    bfloat16 GELU differed from CPU's by an ulp at 876 of 2,001 inputs over [-6, 6]."""

    @functools.wraps(rule)
    def in_opmath(ctx: LoweringContext, x, *args, **kwargs):
        out = dtype(x)
        wide = opmath_dtype(out)
        if wide == out:
            return rule(ctx, x, *args, **kwargs)
        return convert(rule(ctx, convert(x, wide), *args, **kwargs), out)

    return in_opmath


def _binary(op_class, ctx: LoweringContext, a, b):
    """`a op b` in the result's opmath dtype, rounded once: PyTorch's CPU kernels compute
    16-bit floats in float32, and mul and div keep a Python scalar or a 0-dim
    tensor of another dtype at that precision -- bfloat16 `x * 0.1` is x times 0.1f rounded
    once, not x times bfloat16(0.1) (an ulp off at 809 of 4,096 inputs)."""
    out = ctx.result_dtype()
    lhs, rhs = promote(a, b, to=opmath_dtype(out))
    return convert(op_class(lhs, rhs).result, out)


def _with_alpha(op_class, ctx: LoweringContext, a, b, alpha=1):
    """add/sub with `alpha`: a op (alpha * b). Unlike mul, PyTorch's CPU kernels round a
    scalar operand and `alpha` to the result dtype first, then compute in the opmath dtype
    and round once (bfloat16 `x + 0.3` adds bfloat16(0.3); `add(a, b, alpha=0.3)` scales
    by bfloat16(0.3) in float32)."""
    out = ctx.result_dtype()
    compute = opmath_dtype(out)
    lhs, rhs = (convert(v, compute) for v in promote(a, b, to=out))
    if alpha != 1:
        rhs = stablehlo.MulOp(rhs, convert(full(alpha, out, shape_of(rhs)), compute)).result
    return convert(op_class(lhs, rhs).result, out)


_UNARY_FLOAT = {
    aten.exp.default: stablehlo.ExpOp,
    aten.expm1.default: stablehlo.Expm1Op,
    aten.log.default: stablehlo.LogOp,
    aten.log1p.default: stablehlo.Log1pOp,
    aten.sqrt.default: stablehlo.SqrtOp,
    aten.rsqrt.default: stablehlo.RsqrtOp,
    aten.sin.default: stablehlo.SineOp,
    aten.cos.default: stablehlo.CosineOp,
    aten.tan.default: stablehlo.TanOp,
    aten.tanh.default: stablehlo.TanhOp,
    aten.asin.default: chlo.AsinOp,
    aten.acos.default: chlo.AcosOp,
    aten.atan.default: chlo.AtanOp,
    aten.sinh.default: chlo.SinhOp,
    aten.cosh.default: chlo.CoshOp,
    aten.asinh.default: chlo.AsinhOp,
    aten.acosh.default: chlo.AcoshOp,
    aten.atanh.default: chlo.AtanhOp,
    aten.erf.default: chlo.ErfOp,
    aten.erfinv.default: chlo.ErfInvOp,
    aten.lgamma.default: chlo.LgammaOp,
}
for _op, _cls in _UNARY_FLOAT.items():
    lowers(_op)(partial(_unary_float, _cls))


@lowers(aten.sigmoid.default)
def _sigmoid(ctx: LoweringContext, x):
    """In the opmath dtype (16-bit floats in float32, rounded once), as PyTorch's kernel:
    the form's three ops would round between them."""
    out = ctx.result_dtype()
    return convert(hlo.logistic(convert(x, opmath_dtype(out))), out)


@lowers(aten.neg.default, aten._neg_view.default)  # _neg_view: the negative bit, as a value
def _neg(ctx, x):
    return stablehlo.NegOp(convert(x, ctx.result_dtype())).result


@lowers(aten.abs.default)
def _abs(ctx, x):
    out = stablehlo.AbsOp(x).result
    return convert(out, ctx.result_dtype())


@lowers(aten.sign.default)
def _sign(ctx, x):
    if dtype(x) is torch.bool:
        return x
    return stablehlo.SignOp(x).result


@lowers(aten.sgn.default)
def _sgn(ctx, x):
    if dtype(x).is_complex:
        # x / |x|, and 0 where x == 0.
        magnitude = stablehlo.AbsOp(x).result
        zero = full(0, dtype(magnitude), shape_of(magnitude))
        is_zero = compare(magnitude, zero, "EQ")
        safe = select(is_zero, full(1, dtype(magnitude), shape_of(magnitude)), magnitude)
        quotient = stablehlo.DivOp(x, convert(safe, dtype(x))).result
        return select(is_zero, full(0, dtype(x), shape_of(x)), quotient)
    return _sign(ctx, x)


@lowers(aten.log2.default)
def _log2(ctx, x):
    x = convert(x, ctx.result_dtype())
    return stablehlo.DivOp(stablehlo.LogOp(x).result, full(math.log(2.0), dtype(x), shape_of(x))).result


@lowers(aten.log10.default)
def _log10(ctx, x):
    x = convert(x, ctx.result_dtype())
    return stablehlo.DivOp(stablehlo.LogOp(x).result, full(math.log(10.0), dtype(x), shape_of(x))).result


@lowers(aten.exp2.default)
def _exp2(ctx, x):
    x = convert(x, ctx.result_dtype())
    return stablehlo.PowOp(full(2.0, dtype(x), shape_of(x)), x).result


@lowers(aten.reciprocal.default)
def _reciprocal(ctx, x):
    x = convert(x, ctx.result_dtype())
    return stablehlo.DivOp(full(1, dtype(x), shape_of(x)), x).result


def _rounding(op_class, ctx, x):
    if not dtype(x).is_floating_point:
        return x  # integers are already rounded
    return op_class(x).result


lowers(aten.floor.default)(partial(_rounding, stablehlo.FloorOp))
lowers(aten.ceil.default)(partial(_rounding, stablehlo.CeilOp))
lowers(aten.round.default)(partial(_rounding, stablehlo.RoundNearestEvenOp))


@lowers(aten.trunc.default)
def _trunc(ctx, x):
    if not dtype(x).is_floating_point:
        return x
    # trunc(x) = sign(x) * floor(|x|)
    floor_abs = stablehlo.FloorOp(stablehlo.AbsOp(x).result).result
    return stablehlo.MulOp(stablehlo.SignOp(x).result, floor_abs).result


@lowers(aten.round.decimals)
def _round_decimals(ctx, x, *, decimals=0):
    scale = full(10.0**decimals, dtype(x), shape_of(x))
    scaled = stablehlo.MulOp(x, scale).result
    return stablehlo.DivOp(stablehlo.RoundNearestEvenOp(scaled).result, scale).result


# -- binary arithmetic -------------------------------------------------------------------------
lowers(aten.add.Tensor, aten.add.Scalar)(partial(_with_alpha, stablehlo.AddOp))
lowers(aten.sub.Tensor, aten.sub.Scalar)(partial(_with_alpha, stablehlo.SubtractOp))
lowers(aten.mul.Tensor, aten.mul.Scalar)(partial(_binary, stablehlo.MulOp))
lowers(aten.maximum.default)(partial(_binary, stablehlo.MaxOp))
lowers(aten.minimum.default)(partial(_binary, stablehlo.MinOp))
lowers(aten.atan2.default)(partial(_binary, stablehlo.Atan2Op))


@lowers(aten.atan2.out)
def _atan2_out(ctx, a, b, *, out):
    # In a functional graph the `out=` form yields the new value of `out` (its previous
    # contents are irrelevant); writing it into `out`'s storage is the view passes' job.
    return _binary(stablehlo.Atan2Op, ctx, a, b)


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, a, b, alpha=1):
    return _with_alpha(stablehlo.SubtractOp, ctx, b, a, alpha)


# true_divide is div's alias; PyTorch's own graph passes emit it (Dynamo's tensorify pass
# turns a float computed from sizes, GPT-2's GELU constant under dynamic=True, into
# tensor ops through TensorReferenceAnalysis, which writes true_divide).
_div = lowers(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor, aten.true_divide.Scalar)(
    partial(_binary, stablehlo.DivOp))


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, a, b, *, rounding_mode=None):
    out = ctx.result_dtype()
    if rounding_mode is None:
        return _div(ctx, a, b)
    lhs, rhs = promote(a, b, to=out)
    if out.is_floating_point:
        q = stablehlo.DivOp(lhs, rhs).result
        if rounding_mode == "trunc":
            return _trunc(ctx, q)
        # floor division: floor(a / b), matching PyTorch's Python-style semantics.
        return stablehlo.FloorOp(q).result
    q = stablehlo.DivOp(lhs, rhs).result  # integer division truncates toward zero
    if rounding_mode == "trunc":
        return q
    return _floor_correct(lhs, rhs, q)


def _floor_correct(lhs, rhs, q):
    """Integer floor division from truncating division: subtract 1 where the remainder
    is non-zero and the operands' signs differ."""
    shape = shape_of(q)
    dt = dtype(q)
    zero = full(0, dt, shape)
    rem = stablehlo.RemOp(lhs, rhs).result
    nonzero = compare(rem, zero, "NE")
    signs_differ = compare(compare(lhs, zero, "LT"), compare(rhs, zero, "LT"), "NE")
    adjust = stablehlo.AndOp(nonzero, signs_differ).result
    return select(adjust, stablehlo.SubtractOp(q, full(1, dt, shape)).result, q)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(ctx, a, b):
    return _div_mode(ctx, a, b, rounding_mode="floor")


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def _remainder(ctx, a, b):
    # Python-style modulo: the result takes the sign of the divisor.
    out = ctx.result_dtype()
    lhs, rhs = promote(a, b, to=out)
    rem = stablehlo.RemOp(lhs, rhs).result
    shape = shape_of(rem)
    zero = full(0, out, shape)
    nonzero = compare(rem, zero, "NE")
    signs_differ = compare(compare(rem, zero, "LT"), compare(rhs, zero, "LT"), "NE")
    fix = stablehlo.AndOp(nonzero, signs_differ).result
    return select(fix, stablehlo.AddOp(rem, rhs).result, rem)


@lowers(aten.gcd.default)
def _gcd(ctx, a, b):
    """Euclid's algorithm on |a| and |b|, as the kernel's loop (gcd(0, 0) = 0), for every
    element at once: one while loop that runs until every element's divisor is zero (an
    element already done keeps its value)."""
    out = ctx.result_dtype()
    init = [stablehlo.AbsOp(v).result if out.is_signed else v for v in promote(a, b, to=out)]
    shape = shape_of(init[0])

    def step(values: list[ir.Value]) -> list[ir.Value]:
        x, y = values
        active = compare(y, full(0, out, shape), "NE")
        remainder = stablehlo.RemOp(x, select(active, y, full(1, out, shape))).result
        return [select(active, y, x), select(active, remainder, y)]

    def pending(values: list[ir.Value]) -> ir.Value:  # any divisor non-zero (none when empty)
        return reduce_with(stablehlo.OrOp, convert(values[1], torch.bool), False, range(len(shape)))

    return hlo.while_loop(init, pending, step)[0]


@lowers(aten.lcm.default)
def _lcm(ctx, a, b):
    """|a / gcd(a, b) * b|, and 0 where the gcd is 0 (the kernel's formula)."""
    out = ctx.result_dtype()
    x, y = promote(a, b, to=out)
    g = _gcd(ctx, x, y)
    shape = shape_of(g)
    zero = full(0, out, shape)
    undefined = compare(g, zero, "EQ")
    quotient = stablehlo.DivOp(x, select(undefined, full(1, out, shape), g)).result
    product = stablehlo.MulOp(quotient, y).result
    return select(undefined, zero, stablehlo.AbsOp(product).result if out.is_signed else product)


@lowers(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(ctx, a, b):
    out = ctx.result_dtype()
    lhs, rhs = promote(a, b, to=out)
    return stablehlo.RemOp(lhs, rhs).result


@lowers(aten.square.default)  # also emitted by the tensorify pass (TensorReferenceAnalysis)
def _square(ctx, a):
    return _pow(ctx, a, 2)


@lowers(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(ctx, a, b):
    out = ctx.result_dtype()
    if not isinstance(b, ir.Value) and not out.is_complex:
        base = coerce(a, out)
        if b == 2:
            return stablehlo.MulOp(base, base).result
        if b == 0.5 and out.is_floating_point:
            return stablehlo.SqrtOp(base).result
        if b == 1:
            return base
    lhs, rhs = promote(a, b, to=out)
    return stablehlo.PowOp(lhs, rhs).result


# -- comparisons ---------------------------------------------------------------------------------
def _comparison(direction: str, ctx: LoweringContext, a, b):
    lhs, rhs = promote(a, b, to=promote_dtypes(a, b))
    return compare(lhs, rhs, direction)


for _name, _dir in (("eq", "EQ"), ("ne", "NE"), ("lt", "LT"), ("le", "LE"), ("gt", "GT"), ("ge", "GE")):
    _packet = getattr(aten, _name)
    lowers(_packet.Tensor, _packet.Scalar)(partial(_comparison, _dir))


@lowers(aten.isnan.default)
def _isnan(ctx, x):
    if not (dtype(x).is_floating_point or dtype(x).is_complex):
        return full(False, torch.bool, shape_of(x))
    return compare(x, x, "NE")


@lowers(aten.isinf.default)
def _isinf(ctx, x):
    if not dtype(x).is_floating_point:
        return full(False, torch.bool, shape_of(x))
    magnitude = stablehlo.AbsOp(x).result
    return compare(magnitude, full(float("inf"), dtype(x), shape_of(x)), "EQ")


@lowers(aten.isfinite.default)
def _isfinite(ctx, x):
    if not dtype(x).is_floating_point:
        return full(True, torch.bool, shape_of(x))
    return stablehlo.IsFiniteOp(x).result


# -- logical and bitwise ------------------------------------------------------------------------------
def _logical(op_class, ctx, a, b):
    lhs, rhs = promote(convert(a, torch.bool), convert(b, torch.bool), to=torch.bool)
    return op_class(lhs, rhs).result


lowers(aten.logical_and.default)(partial(_logical, stablehlo.AndOp))
lowers(aten.logical_or.default)(partial(_logical, stablehlo.OrOp))
lowers(aten.logical_xor.default)(partial(_logical, stablehlo.XorOp))


@lowers(aten.logical_not.default)
def _logical_not(ctx, x):
    return stablehlo.NotOp(convert(x, torch.bool)).result


lowers(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)(partial(_binary, stablehlo.AndOp))
lowers(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)(partial(_binary, stablehlo.OrOp))
lowers(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)(partial(_binary, stablehlo.XorOp))


@lowers(aten.bitwise_not.default)
def _bitwise_not(ctx, x):
    return stablehlo.NotOp(x).result


_UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def _shift(direction: str, ctx: LoweringContext, a, b):
    """`a << b` / `a >> b` in the promoted integer dtype. PyTorch's kernels give 0 for a
    shift amount outside [0, bits) (the sign, -1 or 0, for a right shift of a signed
    integer), and so do XLA's shifts, which read the amount as unsigned: a negative one
    is out of range too. A right shift is arithmetic for signed dtypes, logical for
    unsigned ones."""
    out = ctx.result_dtype()
    if out.is_floating_point or out.is_complex or out == torch.bool:
        raise ctx.fail(f"shifts are not implemented for {out} (PyTorch's kernels take integers only)")
    lhs, rhs = promote(a, b, to=out)
    if direction == "left":
        return stablehlo.ShiftLeftOp(lhs, rhs).result
    if out in _UNSIGNED:
        return stablehlo.ShiftRightLogicalOp(lhs, rhs).result
    return stablehlo.ShiftRightArithmeticOp(lhs, rhs).result


lowers(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor,
       aten.__lshift__.Tensor, aten.__lshift__.Scalar)(partial(_shift, "left"))
lowers(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
       aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)(partial(_shift, "right"))


# -- selection ---------------------------------------------------------------------------------------
@lowers(aten.where.self)
def _where(ctx, cond, a, b):
    out = ctx.result_dtype()
    lhs, rhs = promote(a, b, to=out)
    return select(convert(cond, torch.bool), lhs, rhs)


@lowers(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx, x, min=None, max=None):
    # PyTorch broadcasts the bounds with the input (`clamp(x[5, 1], min=b[1, 5])` is
    # [5, 5]) and promotes all three: the result takes the common shape, not x's.
    out = ctx.result_dtype()
    result, *bounds = promote(x, *(b for b in (min, max) if b is not None), to=out)
    if min is not None:
        result = stablehlo.MaxOp(result, bounds.pop(0)).result
    if max is not None:
        result = stablehlo.MinOp(result, bounds.pop(0)).result
    return result


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx, x, min):
    return _clamp(ctx, x, min=min)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx, x, max):
    return _clamp(ctx, x, max=max)


# -- activations ----------------------------------------------------------------------------------------
@lowers(aten.relu.default)
def _relu(ctx, x):
    return stablehlo.MaxOp(x, full(0, dtype(x), shape_of(x))).result


@lowers(aten.hardtanh.default)
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return _clamp(ctx, x, min=min_val, max=max_val)


@lowers(aten.leaky_relu.default)
@_in_opmath
def _leaky_relu(ctx, x, negative_slope=0.01):
    shape, dt = shape_of(x), dtype(x)
    positive = compare(x, full(0, dt, shape), "GT")
    return select(positive, x, stablehlo.MulOp(x, full(negative_slope, dt, shape)).result)


@lowers(aten.elu.default)
@_in_opmath
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    shape, dt = shape_of(x), dtype(x)
    positive = compare(x, full(0, dt, shape), "GT")
    negative = stablehlo.MulOp(
        full(alpha, dt, shape),
        stablehlo.Expm1Op(stablehlo.MulOp(x, full(input_scale, dt, shape)).result).result,
    ).result
    return stablehlo.MulOp(select(positive, x, negative), full(scale, dt, shape)).result


@lowers(aten.gelu.default)
@_in_opmath
def _gelu(ctx, x, *, approximate="none"):
    shape, dt = shape_of(x), dtype(x)

    def c(v):
        return full(v, dt, shape)

    if approximate == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = stablehlo.MulOp(stablehlo.MulOp(x, x).result, x).result
        inner = stablehlo.AddOp(x, stablehlo.MulOp(c(0.044715), cube).result).result
        t = stablehlo.TanhOp(stablehlo.MulOp(c(math.sqrt(2.0 / math.pi)), inner).result).result
        return stablehlo.MulOp(stablehlo.MulOp(c(0.5), x).result, stablehlo.AddOp(c(1.0), t).result).result
    # 0.5 x (1 + erf(x / sqrt(2)))
    e = chlo.ErfOp(stablehlo.MulOp(x, c(1.0 / math.sqrt(2.0))).result).result
    return stablehlo.MulOp(stablehlo.MulOp(c(0.5), x).result, stablehlo.AddOp(c(1.0), e).result).result


@lowers(aten.silu.default)
@_in_opmath
def _silu(ctx, x):
    """x / (1 + exp(-x)), PyTorch's kernel's form (x * sigmoid(x) rounds once more)."""
    one = full(1, dtype(x), shape_of(x))
    return hlo.div(x, hlo.add(one, hlo.exp(hlo.neg(x))))


# Bounded dynamism: every op here reads only the same position of its operands.
declare_padding(Padding.SAFE, family="elementwise")
