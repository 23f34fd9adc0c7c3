"""Losses and their backward ops: `mse_loss`, `binary_cross_entropy` (with logits),
`smooth_l1_loss`, `huber_loss`, `soft_margin_loss`, `nll_loss` / `nll_loss2d`.

Formulas follow ATen's CPU kernels operation by operation, so results match eager bit for
bit or to rounding. Like ATen's `opmath`, float16/bfloat16 compute in float32 and round
once at the end."""

from __future__ import annotations

import math

import torch

from ..context import ir, stablehlo
from .. import ir as hlo
from ..dtypes import tensor_type
from .helpers import (
    broadcast_shapes,
    broadcast_to,
    constant_like,
    convert,
    dtype,
    full,
    rank_of,
    reduce,
    reshape,
    select,
    shape_of,
)
from .padded import arg_position, product, run_time_size, schema_arg, symbolic_arg, with_schema_arg
from .registry import LOWERINGS, LoweringContext, declare_padding, lowers, Padding
from .reduction import reduce_sum
from .opmath import log_sigmoid_parts, opmath_dtype, opmath_operands

aten = torch.ops.aten


_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _sum_all(x: ir.Value) -> ir.Value:
    dims = list(range(rank_of(x)))
    if not dims:
        return x
    (result,) = reduce([x], [full(0, dtype(x), [])], dims, lambda acc, new: [hlo.add(acc[0], new[0])])
    return result


def _reduce_loss(loss: ir.Value, reduction: int) -> ir.Value:
    """ATen's apply_loss_reduction: 0 none, 1 mean, 2 sum."""
    if reduction == _REDUCTION_NONE:
        return loss
    total = _sum_all(loss)
    if reduction == _REDUCTION_MEAN:
        n = math.prod(shape_of(loss))
        return hlo.div(total, full(n, dtype(total), []))  # n == 0 gives NaN, as torch.mean
    return total


# -- losses --------------------------------------------------------------------------------------------------
def _loss_inputs(ctx, *args):
    """Pointwise loss operands in opmath, broadcast together (the result shape of a
    reduced loss is 0-d, so the broadcast shape comes from the operands)."""
    out = ctx.result_dtype()
    cdt = opmath_dtype(out)
    shape = broadcast_shapes(*[shape_of(a) for a in args if isinstance(a, ir.Value)])
    return [broadcast_to(convert(a, cdt), shape) for a in args], out


def _norm(reduction: int, like: ir.Value) -> float:
    return 1.0 / math.prod(shape_of(like)) if reduction == _REDUCTION_MEAN else 1.0


# Bounded dynamism: reduction='mean' divides by an element count, so the mean losses
# share a rule that divides by the run-time count.
_REDUCTION_MEAN, _REDUCTION_SUM = 1, 2


def _mean_loss_padded(ctx: LoweringContext, *args, **kwargs):
    """reduction='mean' of a loss (or its backward) over a dynamic input divides by the
    run-time element count: the rule runs with reduction='sum', then divides."""
    if schema_arg(ctx, args, kwargs, "reduction") != _REDUCTION_MEAN:
        return NotImplemented
    sym = symbolic_arg(ctx, arg_position(ctx, "self"))
    if not ctx.dynamic.dynamic_dims(sym):
        return NotImplemented
    args, kwargs = with_schema_arg(ctx, args, kwargs, "reduction", _REDUCTION_SUM)
    total = LOWERINGS[ctx.node.target].fn(ctx, *args, **kwargs)
    count = product([run_time_size(ctx, s) for s in sym.shape])
    return stablehlo.DivOp(total, broadcast_to(convert(count, dtype(total)), shape_of(total))).result


_MEAN_LOSS = {"dynamic": Padding.COUNT, "dynamic_rule": _mean_loss_padded}


@lowers(aten.mse_loss.default, **_MEAN_LOSS)
def _mse_loss(ctx, self, target, reduction=_REDUCTION_MEAN):
    (x, t), out = _loss_inputs(ctx, self, target)
    d = hlo.sub(x, t)
    return convert(_reduce_loss(hlo.mul(d, d), reduction), out)


@lowers(aten.mse_loss_backward.default, **_MEAN_LOSS)
def _mse_loss_backward(ctx, grad_output, self, target, reduction):
    (g, x, t), out = opmath_operands(ctx, grad_output, self, target)
    norm = 2.0 / math.prod(shape_of(x)) if reduction == _REDUCTION_MEAN else 2.0
    return convert(hlo.mul(hlo.mul(constant_like(norm, x), hlo.sub(x, t)), g), out)


@lowers(aten.binary_cross_entropy.default, **_MEAN_LOSS)
def _binary_cross_entropy(ctx, self, target, weight=None, reduction=_REDUCTION_MEAN):
    (x, t), out = _loss_inputs(ctx, self, target)
    floor = constant_like(-100, x)
    loss = hlo.sub(
        hlo.mul(hlo.sub(t, constant_like(1, t)), hlo.maximum(hlo.log1p(hlo.neg(x)), floor)),
        hlo.mul(t, hlo.maximum(hlo.log(x), floor)),
    )
    if weight is not None:
        loss = hlo.mul(loss, broadcast_to(convert(weight, dtype(loss)), shape_of(loss)))
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.binary_cross_entropy_backward.default, **_MEAN_LOSS)
def _binary_cross_entropy_backward(ctx, grad_output, self, target, weight=None, reduction=_REDUCTION_MEAN):
    (g, x, t), out = opmath_operands(ctx, grad_output, self, target)
    denominator = hlo.maximum(hlo.mul(hlo.sub(constant_like(1, x), x), x), constant_like(1e-12, x))
    result = hlo.div(hlo.mul(g, hlo.sub(x, t)), denominator)
    if weight is not None:
        result = hlo.mul(result, broadcast_to(convert(weight, dtype(result)), shape_of(result)))
    if reduction == _REDUCTION_MEAN:
        result = hlo.div(result, constant_like(math.prod(shape_of(x)), result))
    return convert(result, out)


@lowers(aten.binary_cross_entropy_with_logits.default, **_MEAN_LOSS)
def _binary_cross_entropy_with_logits(ctx, self, target, weight=None, pos_weight=None, reduction=_REDUCTION_MEAN):
    (x, t), out = _loss_inputs(ctx, self, target)
    log_sig, _ = log_sigmoid_parts(x)
    if pos_weight is not None:
        pw = broadcast_to(convert(pos_weight, dtype(x)), shape_of(x))
        log_sig = hlo.mul(log_sig, hlo.add(hlo.mul(hlo.sub(pw, constant_like(1, pw)), t), constant_like(1, t)))
    loss = hlo.sub(hlo.mul(hlo.sub(constant_like(1, t), t), x), log_sig)
    if weight is not None:
        loss = hlo.mul(loss, broadcast_to(convert(weight, dtype(loss)), shape_of(loss)))
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.smooth_l1_loss.default, **_MEAN_LOSS)
def _smooth_l1_loss(ctx, self, target, reduction=_REDUCTION_MEAN, beta=1.0):
    (x, t), out = _loss_inputs(ctx, self, target)
    z = hlo.absolute(hlo.sub(x, t))
    if beta == 0:
        loss = z
    else:
        quadratic = hlo.div(hlo.mul(hlo.mul(constant_like(0.5, z), z), z), constant_like(beta, z))
        loss = select(hlo.compare(z, constant_like(beta, z), "LT"), quadratic, hlo.sub(z, constant_like(0.5 * beta, z)))
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.smooth_l1_loss_backward.default, **_MEAN_LOSS)
def _smooth_l1_loss_backward(ctx, grad_output, self, target, reduction, beta):
    (g, x, t), out = opmath_operands(ctx, grad_output, self, target)
    norm = constant_like(_norm(reduction, x), x)
    d = hlo.sub(x, t)
    inner = hlo.div(hlo.mul(hlo.mul(norm, d), g), constant_like(beta, d)) if beta != 0 else constant_like(0, d)
    result = select(
        hlo.compare(d, constant_like(-beta, d), "LE"), hlo.neg(hlo.mul(norm, g)),
        select(hlo.compare(d, constant_like(beta, d), "GE"), hlo.mul(norm, g), inner),
    )
    return convert(result, out)


@lowers(aten.huber_loss.default, **_MEAN_LOSS)
def _huber_loss(ctx, self, target, reduction=_REDUCTION_MEAN, delta=1.0):
    (x, t), out = _loss_inputs(ctx, self, target)
    z = hlo.absolute(hlo.sub(x, t))
    quadratic = hlo.mul(hlo.mul(constant_like(0.5, z), z), z)
    linear = hlo.mul(constant_like(delta, z), hlo.sub(z, constant_like(0.5 * delta, z)))
    loss = select(hlo.compare(z, constant_like(delta, z), "LT"), quadratic, linear)
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.huber_loss_backward.default, **_MEAN_LOSS)
def _huber_loss_backward(ctx, grad_output, self, target, reduction, delta):
    (g, x, t), out = opmath_operands(ctx, grad_output, self, target)
    norm = constant_like(_norm(reduction, x), x)
    d = hlo.sub(x, t)
    result = select(
        hlo.compare(d, constant_like(-delta, d), "LT"), hlo.mul(hlo.mul(hlo.neg(norm), g), constant_like(delta, g)),
        select(hlo.compare(d, constant_like(delta, d), "GT"), hlo.mul(hlo.mul(norm, g), constant_like(delta, g)), hlo.mul(hlo.mul(norm, d), g)),
    )
    return convert(result, out)


@lowers(aten.soft_margin_loss.default, **_MEAN_LOSS)
def _soft_margin_loss(ctx, self, target, reduction=_REDUCTION_MEAN):
    (x, t), out = _loss_inputs(ctx, self, target)
    loss = hlo.log1p(hlo.exp(hlo.mul(hlo.neg(x), t)))
    return convert(_reduce_loss(loss, reduction), out)


@lowers(aten.soft_margin_loss_backward.default, **_MEAN_LOSS)
def _soft_margin_loss_backward(ctx, grad_output, self, target, reduction=_REDUCTION_MEAN):
    (g, x, t), out = opmath_operands(ctx, grad_output, self, target)
    result = hlo.mul(hlo.mul(t, g), hlo.sub(hlo.logistic(hlo.mul(t, x)), constant_like(1, x)))
    if reduction == _REDUCTION_MEAN:
        result = hlo.div(result, constant_like(math.prod(shape_of(x)), result))
    return convert(result, out)


# -- nll_loss -----------------------------------------------------------------------------------------------------
def _class_dim(self: ir.Value) -> int:
    return 1 if rank_of(self) >= 2 else 0


def _one_hot(self: ir.Value, target: ir.Value, ignore_index: int) -> tuple[ir.Value, ir.Value]:
    """(mask of self's shape: the target class of each sample, valid: target != ignore)
    with target broadcast over the class dim.

    The mask costs one comparison per element, as JAX's one-hot: the ignored samples and
    the targets outside [0, classes) become -1 per sample first (no class is -1), and the
    classes are compared in 32 bits where they fit -- a TPU emulates 64-bit integers (an
    int64 `==` is two 32-bit ones and an `and`), and this mask is recomputed for every tile
    of the matrix product that reads the loss's gradient (the vocabulary projection's weight
    gradient, the training step's largest fusion). The values are the same."""
    shape = shape_of(self)
    cdim = _class_dim(self)
    tshape = list(shape)
    tshape[cdim] = 1
    target = reshape(target, tshape) if math.prod(shape_of(target)) == math.prod(tshape) else target
    tdt = dtype(target)
    tsh = shape_of(target)
    classes_n = shape[cdim]
    valid = hlo.compare(target, full(ignore_index, tdt, tsh), "NE")
    in_range = hlo.compare(target, full(0, tdt, tsh), "GE")
    if classes_n <= torch.iinfo(tdt).max:  # (a uint8 target is below 300 classes whatever it holds)
        in_range = hlo.logical_and(in_range, hlo.compare(target, full(classes_n, tdt, tsh), "LT"))
    cls = torch.int32 if classes_n < 2**31 else torch.int64  # (signed: -1 is no class)
    picked = select(hlo.logical_and(valid, in_range), convert(target, cls), full(-1, cls, tsh))
    classes = stablehlo.IotaOp(tensor_type(shape, cls), cdim).result
    hit = hlo.compare(classes, broadcast_to(picked, shape), "EQ")
    return hit, valid


def _class_weights(self: ir.Value, weight) -> ir.Value | None:
    if weight is None:
        return None
    shape = shape_of(self)
    cdim = _class_dim(self)
    wshape = [1] * len(shape)
    wshape[cdim] = shape[cdim]
    return broadcast_to(reshape(convert(weight, dtype(self)), wshape), shape)


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss_forward(ctx, self, target, weight, reduction, ignore_index):
    """-self[i, target[i]] * weight[target[i]] as a one-hot select and a sum over the
    class dim. Not a gather at the targets: `self` is a log-softmax, and XLA fuses its
    computation from the logits into this sum, where a gather's operand must be stored --
    on the chip the gather made the step write the float32 log-softmax of a 32000-word
    vocabulary (0.79 ms a step, twenty-third session) to save this sum's 0.18 ms."""
    out = ctx.result_dtype(0)
    cdt = opmath_dtype(out)
    x = convert(self, cdt)
    if rank_of(x) == 1 and rank_of(target) == 1:
        target = reshape(target, [])  # the kernel reads target[0]
    hit, valid = _one_hot(x, target, ignore_index)
    w = _class_weights(x, weight)
    weighted = hlo.mul(x, w) if w is not None else x
    cdim = _class_dim(x)
    picked = hlo.neg(reduce_sum(select(hit, weighted, constant_like(0, x)), [cdim]))  # [N, ...]
    if w is not None:
        sample_weight = reduce_sum(select(hit, w, constant_like(0, w)), [cdim])
    else:
        sample_weight = convert(reshape(valid, shape_of(picked)), cdt)
    if reduction == _REDUCTION_NONE and rank_of(x) > 1:
        return convert(picked, out), full(0, ctx.result_dtype(1), ctx.result_shape(1))
    total_weight = _sum_all(sample_weight)
    loss = _sum_all(picked)
    if reduction == _REDUCTION_MEAN:
        loss = hlo.div(loss, total_weight)
    return reshape(convert(loss, out), ctx.result_shape(0)), reshape(convert(total_weight, ctx.result_dtype(1)), ctx.result_shape(1))


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def _nll_loss_backward(ctx, grad_output, self, target, weight, reduction, ignore_index, total_weight):
    out = ctx.result_dtype()
    cdt = opmath_dtype(out)
    shape = shape_of(self)
    cdim = _class_dim(self)
    g = convert(grad_output, cdt)
    if reduction == _REDUCTION_MEAN:
        g = hlo.div(g, broadcast_to(convert(total_weight, cdt), shape_of(g)))
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
        g = hlo.mul(g, w)
    return convert(select(hit, hlo.neg(g), constant_like(0, x)), out)


# Bounded dynamism (registry.Padding). nll_loss sums weights and values (masked) and divides
# by the weight sum, so its mean is right (test_gpt_training_step_dynamic_batch).
declare_padding(
    Padding.MASKED,
    aten.nll_loss_forward.default,
    aten.nll_loss_backward.default,
    aten.nll_loss2d_forward.default,
    aten.nll_loss2d_backward.default,
)
