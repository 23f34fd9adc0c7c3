"""Normalization layers and their backward ops: layer norm, batch norm (training,
inference and the functionalized running-stats update), group norm, RMS norm.

Statistics are computed in float32 for float16/bfloat16 inputs (PyTorch's CPU and CUDA
kernels accumulate in float32 too) and each output is converted to the dtype PyTorch
gives it (`node.meta['val']`). Outputs masked off by `output_mask` are `None`.
"""

from __future__ import annotations

import math
from functools import partial
from collections.abc import Sequence

import torch

from ..context import ir, stablehlo
from .helpers import broadcast_shapes, broadcast_to, convert, dtype, full, reshape, shape_of
from .opmath import opmath_dtype
from .reduction import reduce_sum, variance
from .padded import (
    dynamic_beyond,
    dynamic_dims,
    i64,
    product,
    reject_when,
    run_time_size,
    schema_arg,
    symbolic_arg,
)
from .registry import LoweringContext, lowers, metadata_rule, Padding

aten = torch.ops.aten


# -- small arithmetic on same-shaped (or broadcastable) values -------------------------------
def _mul_bcast(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.MulOp(*_same(a, b)).result


def _add_bcast(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.AddOp(*_same(a, b)).result


def _sub_bcast(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.SubtractOp(*_same(a, b)).result


def _same(a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Both operands broadcast to their common shape, by PyTorch's rule: a size-1 dim
    takes the other's size, 0 included (an empty batch's [0, 1] statistics against its
    [0, C] input stay empty; the larger of the two sizes would make it [1, C])."""
    sa, sb = shape_of(a), shape_of(b)
    if sa == sb:
        return a, b
    shape = broadcast_shapes(sa, sb)
    return broadcast_to(a, shape), broadcast_to(b, shape)


def _scalar(value: float, like: ir.Value) -> ir.Value:
    return full(value, dtype(like), [])


def _scale(x: ir.Value, value: float) -> ir.Value:
    return _mul_bcast(x, _scalar(value, x))


def _rsqrt_plus(var: ir.Value, eps: float) -> ir.Value:
    return stablehlo.RsqrtOp(_add_bcast(var, _scalar(eps, var))).result


def _channel(value: ir.Value, rank: int, acc: torch.dtype) -> ir.Value:
    """A per-channel [C] vector (weight, mean, ...) shaped [1, C, 1, ...] for dim 1."""
    c = shape_of(value)[0]
    return reshape(convert(value, acc), [1, c] + [1] * (rank - 2))


def _out(
    ctx: LoweringContext, index: int, value: ir.Value | None, shape: Sequence[int] | None = None
):
    """Output `index` converted to PyTorch's dtype and shape, or None where PyTorch's is."""
    meta = ctx.meta(index)
    if meta is None or value is None:
        return None
    return reshape(convert(value, meta.dtype), ctx.result_shape(index) if shape is None else shape)


def _empty(ctx: LoweringContext, index: int) -> ir.Value:
    """The empty save_mean/save_invstd PyTorch returns in inference mode."""
    return full(0, ctx.result_dtype(index), ctx.result_shape(index))


# -- layer norm ---------------------------------------------------------------------------------
def _layer_norm_padded(ctx: LoweringContext, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """layer_norm whose normalized dims include a dynamic one: mean and variance divide by
    the run-time element count (the sums are masked by the dynamic padder)."""
    rank = len(shape_of(x))
    dims = list(range(rank - len(normalized_shape), rank))
    if not any(d in dynamic_dims(ctx, 0) for d in dims):
        return NotImplemented
    sym = symbolic_arg(ctx, 0)
    acc = torch.float64 if dtype(x) is torch.float64 else torch.float32
    xf = convert(x, acc)
    count = convert(i64(product([run_time_size(ctx, sym.shape[d]) for d in dims])), acc)
    kept = [1 if d in dims else s for d, s in enumerate(shape_of(xf))]
    mean = stablehlo.DivOp(
        reduce_sum(xf, dims),
        broadcast_to(count, [s for d, s in enumerate(shape_of(xf)) if d not in dims]),
    ).result
    centered = stablehlo.SubtractOp(xf, broadcast_to(reshape(mean, kept), shape_of(xf))).result
    squares = reduce_sum(stablehlo.MulOp(centered, centered).result, dims)
    var = stablehlo.DivOp(squares, broadcast_to(count, shape_of(squares))).result
    rstd = stablehlo.RsqrtOp(stablehlo.AddOp(var, broadcast_to(full(eps, acc, []), shape_of(var))).result).result
    out = stablehlo.MulOp(centered, broadcast_to(reshape(rstd, kept), shape_of(xf))).result
    if weight is not None:
        out = stablehlo.MulOp(out, broadcast_to(convert(weight, acc), shape_of(out))).result
    if bias is not None:
        out = stablehlo.AddOp(out, broadcast_to(convert(bias, acc), shape_of(out))).result
    return (
        convert(out, ctx.result_dtype(0)),
        reshape(convert(mean, ctx.result_dtype(1)), ctx.result_shape(1)),
        reshape(convert(rstd, ctx.result_dtype(2)), ctx.result_shape(2)),
    )


@lowers(aten.native_layer_norm.default, dynamic=Padding.COUNT, dynamic_rule=_layer_norm_padded)
def _native_layer_norm(ctx: LoweringContext, x, normalized_shape, weight, bias, eps):
    shape = shape_of(x)
    axis = len(shape) - len(normalized_shape)
    dims = list(range(axis, len(shape)))
    xf = convert(x, opmath_dtype(dtype(x)))
    var, mean = variance(xf, dims, 0)
    rstd = _rsqrt_plus(var, eps)
    out = _mul_bcast(_sub_bcast(xf, mean), rstd)
    if weight is not None:
        out = _mul_bcast(out, convert(weight, dtype(out)))
    if bias is not None:
        out = _add_bcast(out, convert(bias, dtype(out)))
    return _out(ctx, 0, out), _out(ctx, 1, mean), _out(ctx, 2, rstd)


def _normalized_dim_dynamic(ctx: LoweringContext, args, kwargs) -> bool:
    """Whether layer_norm_backward's input (argument 1) has a dynamic normalized dim."""
    return any(d >= len(symbolic_arg(ctx, 1).shape) - len(args[2]) for d in dynamic_dims(ctx, 1))


@lowers(
    aten.native_layer_norm_backward.default,
    dynamic=Padding.COUNT,
    dynamic_rule=reject_when(_normalized_dim_dynamic, "layer norm backward over a dynamic normalized dimension"),
)
def _native_layer_norm_backward(
    ctx: LoweringContext, grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask
):
    shape = shape_of(x)
    axis = len(shape) - len(normalized_shape)
    inner = list(range(axis, len(shape)))
    outer = list(range(axis))
    n = math.prod(shape[axis:])
    acc = opmath_dtype(dtype(x))
    g, xf = convert(grad_out, acc), convert(x, acc)
    mean, rstd = convert(mean, acc), convert(rstd, acc)
    x_hat = _mul_bcast(_sub_bcast(xf, mean), rstd)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        g_hat = _mul_bcast(g, convert(weight, acc)) if weight is not None else g
        # rstd / N * (N g_hat - sum(g_hat) - x_hat sum(g_hat x_hat))
        terms = _sub_bcast(
            _sub_bcast(_scale(g_hat, n), reduce_sum(g_hat, inner, keepdim=True)),
            _mul_bcast(x_hat, reduce_sum(_mul_bcast(g_hat, x_hat), inner, keepdim=True)),
        )
        grad_input = _mul_bcast(_scale(rstd, 1.0 / n) if n else rstd, terms)
    if output_mask[1]:
        grad_weight = reduce_sum(_mul_bcast(g, x_hat), outer)
    if output_mask[2]:
        grad_bias = reduce_sum(g, outer)
    return _out(ctx, 0, grad_input), _out(ctx, 1, grad_weight), _out(ctx, 2, grad_bias)


# -- batch norm ---------------------------------------------------------------------------------
def _batch_stats(xf: ir.Value) -> tuple[ir.Value, ir.Value, int]:
    """Per-channel (biased var, mean) of an [N, C, ...] tensor, keepdim shape, and the
    number of elements per channel."""
    shape = shape_of(xf)
    dims = [d for d in range(len(shape)) if d != 1]
    var, mean = variance(xf, dims, 0)
    return var, mean, math.prod(shape[d] for d in dims)


def _normalize(xf, mean, invstd, weight, bias) -> ir.Value:
    rank, acc = len(shape_of(xf)), dtype(xf)
    out = _mul_bcast(_sub_bcast(xf, mean), invstd)
    if weight is not None:
        out = _mul_bcast(out, _channel(weight, rank, acc))
    if bias is not None:
        out = _add_bcast(out, _channel(bias, rank, acc))
    return out


def _batch_norm_training(ctx: LoweringContext, x, weight, bias, eps):
    """(output, save_mean [C], save_invstd [C], mean, biased var, count) from batch stats."""
    xf = convert(x, opmath_dtype(dtype(x)))
    var, mean, count = _batch_stats(xf)
    invstd = _rsqrt_plus(var, eps)
    out = _normalize(xf, mean, invstd, weight, bias)
    c = shape_of(xf)[1]
    return out, reshape(mean, [c]), reshape(invstd, [c]), reshape(var, [c]), count


def _batch_norm_inference(x, weight, bias, running_mean, running_var, eps) -> ir.Value:
    xf = convert(x, opmath_dtype(dtype(x)))
    rank, acc = len(shape_of(xf)), dtype(xf)
    invstd = _rsqrt_plus(_channel(running_var, rank, acc), eps)
    return _normalize(xf, _channel(running_mean, rank, acc), invstd, weight, bias)


def _updated_running_stats(running_mean, running_var, mean, var, count, momentum):
    """(1 - momentum) * running + momentum * batch, with the unbiased batch variance."""
    acc = dtype(mean)

    def blend(running, batch):
        running = convert(running, acc)
        return _add_bcast(_scale(running, 1.0 - momentum), _scale(batch, momentum))

    unbiased = _scale(var, count / (count - 1)) if count > 1 else _scale(var, math.nan)
    return blend(running_mean, mean), blend(running_var, unbiased)


def _mutation_unsupported(ctx: LoweringContext, op: str):
    return ctx.fail(
        f"{op} in training mode updates running_mean/running_var in place, which a "
        "functional StableHLO program cannot express; trace with functionalization "
        "(aot_autograd/torch.export produce _native_batch_norm_legit_functional)"
    )


def _training_over_dynamic(ctx: LoweringContext, args, kwargs) -> bool:
    """Whether a training batch norm (or its backward) computes statistics over a dynamic
    dim other than the channel dim."""
    names = [a.name for a in ctx.node.target._schema.arguments]
    flag = "training" if "training" in names else "train" if "train" in names else None
    training = schema_arg(ctx, args, kwargs, flag) if flag else True
    return bool(training) and any(d != 1 for d in dynamic_dims(ctx, 1 if names[0] == "grad_out" else 0))


# Every batch norm that can train shares this rule (statistics divide by the count).
_BATCH_NORM = {
    "dynamic": Padding.COUNT,
    "dynamic_rule": reject_when(_training_over_dynamic, "batch norm statistics over a dynamic dimension"),
}


@lowers(aten._native_batch_norm_legit.default, **_BATCH_NORM)
def _native_batch_norm_legit(
    ctx: LoweringContext, x, weight, bias, running_mean, running_var, training, momentum, eps
):
    if training:
        raise _mutation_unsupported(ctx, "_native_batch_norm_legit")
    out = _batch_norm_inference(x, weight, bias, running_mean, running_var, eps)
    return _out(ctx, 0, out), _empty(ctx, 1), _empty(ctx, 2)


@lowers(aten._native_batch_norm_legit.no_stats, **_BATCH_NORM)
def _native_batch_norm_legit_no_stats(
    ctx: LoweringContext, x, weight, bias, training, momentum, eps
):
    if not training:
        raise ctx.fail(
            "batch norm without running stats needs training=True "
            "(PyTorch has no statistics to use)"
        )
    out, mean, invstd, _, _ = _batch_norm_training(ctx, x, weight, bias, eps)
    return _out(ctx, 0, out), _out(ctx, 1, mean), _out(ctx, 2, invstd)


@lowers(aten._native_batch_norm_legit_no_training.default, dynamic=Padding.SAFE)
def _native_batch_norm_legit_no_training(
    ctx: LoweringContext, x, weight, bias, running_mean, running_var, momentum, eps
):
    out = _batch_norm_inference(x, weight, bias, running_mean, running_var, eps)
    return _out(ctx, 0, out), _empty(ctx, 1), _empty(ctx, 2)


@lowers(aten._native_batch_norm_legit_functional.default, **_BATCH_NORM)
def _native_batch_norm_legit_functional(
    ctx: LoweringContext, x, weight, bias, running_mean, running_var, training, momentum, eps
):
    """The functionalized op: also returns the updated running_mean/running_var (equal
    to the inputs in inference mode)."""
    if not training:
        out = _batch_norm_inference(x, weight, bias, running_mean, running_var, eps)
        return (
            _out(ctx, 0, out),
            _empty(ctx, 1),
            _empty(ctx, 2),
            _out(ctx, 3, running_mean),
            _out(ctx, 4, running_var),
        )
    out, mean, invstd, var, count = _batch_norm_training(ctx, x, weight, bias, eps)
    new_mean, new_var = _updated_running_stats(
        running_mean, running_var, mean, var, count, momentum
    )
    return (
        _out(ctx, 0, out),
        _out(ctx, 1, mean),
        _out(ctx, 2, invstd),
        _out(ctx, 3, new_mean),
        _out(ctx, 4, new_var),
    )


@lowers(aten.native_batch_norm.default, **_BATCH_NORM)
def _native_batch_norm(
    ctx: LoweringContext, x, weight, bias, running_mean, running_var, training, momentum, eps
):
    if training:
        if running_mean is not None or running_var is not None:
            raise _mutation_unsupported(ctx, "native_batch_norm")
        out, mean, invstd, _, _ = _batch_norm_training(ctx, x, weight, bias, eps)
        return _out(ctx, 0, out), _out(ctx, 1, mean), _out(ctx, 2, invstd)
    if running_mean is None or running_var is None:
        raise ctx.fail("batch norm in inference mode needs running_mean and running_var")
    out = _batch_norm_inference(x, weight, bias, running_mean, running_var, eps)
    return _out(ctx, 0, out), _empty(ctx, 1), _empty(ctx, 2)


@lowers(aten._batch_norm_with_update.default, **_BATCH_NORM)
def _batch_norm_with_update(ctx: LoweringContext, *args):
    raise _mutation_unsupported(ctx, "_batch_norm_with_update")


@lowers(aten._batch_norm_with_update_functional.default, **_BATCH_NORM)
def _batch_norm_with_update_functional(
    ctx: LoweringContext, x, weight, bias, running_mean, running_var, momentum, eps
):
    """Training batch norm returning (out, save_mean, save_invstd, reserve, new
    running_mean, new running_var); `reserve` is empty (cuDNN's workspace elsewhere)."""
    out, mean, invstd, var, count = _batch_norm_training(ctx, x, weight, bias, eps)
    new_mean, new_var = _updated_running_stats(
        running_mean, running_var, mean, var, count, momentum
    )
    return (
        _out(ctx, 0, out),
        _out(ctx, 1, mean),
        _out(ctx, 2, invstd),
        _empty(ctx, 3),
        _out(ctx, 4, new_mean),
        _out(ctx, 5, new_var),
    )


@lowers(aten._batch_norm_no_update.default, dynamic=Padding.SAFE)
def _batch_norm_no_update(
    ctx: LoweringContext, x, weight, bias, running_mean, running_var, momentum, eps
):
    if running_mean is None or running_var is None:
        raise ctx.fail("batch norm in inference mode needs running_mean and running_var")
    out = _batch_norm_inference(x, weight, bias, running_mean, running_var, eps)
    return _out(ctx, 0, out), _empty(ctx, 1), _empty(ctx, 2), _empty(ctx, 3)


def _inference_stats_empty(op, *args, **kwargs):
    """`op`'s meta result with save_mean/save_invstd (results 1 and 2) empty when it
    normalizes with the running stats, as its CPU (and CUDA) kernels return them; the meta
    kernels give them [C]. Compiled graphs keep the meta shapes (aot_autograd traces with
    them); the eager device returns what CPU eager returns."""
    results = list(op(*args, **kwargs))
    names = [a.name for a in op._schema.arguments]
    bound = dict(zip(names, args), **kwargs)
    if "training" not in names or not bound["training"]:
        results[1], results[2] = results[1].new_empty((0,)), results[2].new_empty((0,))
    return tuple(results)


for _op in (aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
            aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit_no_training.default,
            aten._batch_norm_no_update.default):
    metadata_rule(_op)(partial(_inference_stats_empty, _op))


@lowers(aten.batch_norm_backward.default, **_BATCH_NORM)
def _batch_norm_backward(
    ctx: LoweringContext,
    grad_out,
    x,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_var,
    update,
    eps,
    output_mask,
    reserve,
):
    """The backward of `_batch_norm_with_update`/`_batch_norm_no_update`: `save_var`
    holds the saved inverse std, as in native_batch_norm_backward; `update` is `train`."""
    return _native_batch_norm_backward(
        ctx,
        grad_out,
        x,
        weight,
        running_mean,
        running_var,
        save_mean,
        save_var,
        update,
        eps,
        output_mask,
    )


@lowers(aten.native_batch_norm_backward.default, **_BATCH_NORM)
def _native_batch_norm_backward(
    ctx: LoweringContext,
    grad_out,
    x,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_invstd,
    train,
    eps,
    output_mask,
):
    shape = shape_of(x)
    rank = len(shape)
    acc = opmath_dtype(dtype(x))
    dims = [d for d in range(rank) if d != 1]
    count = math.prod(shape[d] for d in dims)
    g, xf = convert(grad_out, acc), convert(x, acc)
    if train:
        if save_mean is None or save_invstd is None:
            raise ctx.fail("batch norm backward in training mode needs save_mean and save_invstd")
        mean, invstd = _channel(save_mean, rank, acc), _channel(save_invstd, rank, acc)
    else:
        if running_mean is None or running_var is None:
            raise ctx.fail(
                "batch norm backward in inference mode needs running_mean and running_var"
            )
        mean = _channel(running_mean, rank, acc)
        invstd = _rsqrt_plus(_channel(running_var, rank, acc), eps)
    centered = _sub_bcast(xf, mean)
    grad_sum = reduce_sum(g, dims, keepdim=True)  # [1, C, 1, ...]
    dot = reduce_sum(_mul_bcast(g, centered), dims, keepdim=True)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_scale = _mul_bcast(invstd, _channel(weight, rank, acc)) if weight is not None else invstd
        if train:
            # (g - centered * invstd^2 * dot / N - grad_sum / N) * invstd * weight
            proj_scale = _scale(_mul_bcast(_mul_bcast(invstd, invstd), dot), 1.0 / count)
            inner = _sub_bcast(_sub_bcast(g, _mul_bcast(centered, proj_scale)), _scale(grad_sum, 1.0 / count))
            grad_input = _mul_bcast(inner, grad_scale)
        else:
            grad_input = _mul_bcast(g, grad_scale)
    c = shape[1]
    if output_mask[1]:
        grad_weight = reshape(_mul_bcast(dot, invstd), [c])
    if output_mask[2]:
        grad_bias = reshape(grad_sum, [c])
    return _out(ctx, 0, grad_input), _out(ctx, 1, grad_weight), _out(ctx, 2, grad_bias)


# -- group norm ---------------------------------------------------------------------------------
@lowers(
    aten.native_group_norm.default,
    dynamic=Padding.COUNT,
    dynamic_rule=reject_when(dynamic_beyond(1), "group norm over a dynamic dimension"),
)
def _native_group_norm(ctx: LoweringContext, x, weight, bias, N, C, HxW, group, eps):
    shape = shape_of(x)
    rank = len(shape)
    acc = opmath_dtype(dtype(x))
    grouped = reshape(convert(x, acc), [N, group, (C // group) * HxW])
    var, mean = variance(grouped, [2], 0)  # [N, group, 1]
    rstd = _rsqrt_plus(var, eps)
    out = reshape(_mul_bcast(_sub_bcast(grouped, mean), rstd), shape)
    if weight is not None:
        out = _mul_bcast(out, _channel(weight, rank, acc))
    if bias is not None:
        out = _add_bcast(out, _channel(bias, rank, acc))
    return _out(ctx, 0, out), _out(ctx, 1, mean), _out(ctx, 2, rstd)


@lowers(
    aten.native_group_norm_backward.default,
    dynamic=Padding.COUNT,
    dynamic_rule=reject_when(dynamic_beyond(1, "input"), "group norm over a dynamic dimension"),
)
def _native_group_norm_backward(
    ctx: LoweringContext, grad_out, x, mean, rstd, weight, N, C, HxW, group, output_mask
):
    acc = opmath_dtype(dtype(x))
    cpg = C // group
    shape4 = [N, group, cpg, HxW]
    g = reshape(convert(grad_out, acc), shape4)
    xf = reshape(convert(x, acc), shape4)
    mean = reshape(convert(mean, acc), [N, group, 1, 1])
    rstd = reshape(convert(rstd, acc), [N, group, 1, 1])
    x_hat = _mul_bcast(_sub_bcast(xf, mean), rstd)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        g_hat = (
            _mul_bcast(g, reshape(convert(weight, acc), [1, group, cpg, 1])) if weight is not None else g
        )
        n = cpg * HxW
        # rstd * (g_hat - mean(g_hat) - x_hat * mean(g_hat * x_hat)) over each group
        inv_n = 1.0 / n if n else 0.0
        mean_g = _scale(reduce_sum(g_hat, [2, 3], keepdim=True), inv_n)
        mean_gx = _scale(reduce_sum(_mul_bcast(g_hat, x_hat), [2, 3], keepdim=True), inv_n)
        grad_input = _mul_bcast(rstd, _sub_bcast(_sub_bcast(g_hat, mean_g), _mul_bcast(x_hat, mean_gx)))
        grad_input = reshape(grad_input, shape_of(x))
    if output_mask[1]:
        grad_weight = reshape(reduce_sum(_mul_bcast(g, x_hat), [0, 3]), [C])
    if output_mask[2]:
        grad_bias = reshape(reduce_sum(g, [0, 3]), [C])
    return _out(ctx, 0, grad_input), _out(ctx, 1, grad_weight), _out(ctx, 2, grad_bias)


# -- RMS norm -----------------------------------------------------------------------------------
def _rms(x: ir.Value, normalized_shape, eps) -> tuple[ir.Value, ir.Value, list[int]]:
    """(x * rstd, rstd with keepdim shape, normalized dims) in the accumulation dtype."""
    shape = shape_of(x)
    dims = list(range(len(shape) - len(normalized_shape), len(shape)))
    xf = convert(x, opmath_dtype(dtype(x)))
    if eps is None:  # PyTorch's default: the epsilon of the accumulation ("opmath") type
        eps = torch.finfo(dtype(xf)).eps
    n = math.prod(shape[d] for d in dims)
    mean_sq = _scale(reduce_sum(_mul_bcast(xf, xf), dims, keepdim=True), 1.0 / n if n else math.nan)
    rstd = _rsqrt_plus(mean_sq, eps)
    return _mul_bcast(xf, rstd), rstd, dims


def _reject_rms_over_dynamic(input_position: int):
    """The rule of an RMS norm whose input is argument `input_position`: over a dynamic
    normalized dim it runs in eager (its mean divides by the count)."""

    def rule(ctx: LoweringContext, *args, **kwargs):
        rank = len(ctx.arg_meta(input_position).shape)
        normalized = args[input_position + 1]
        if any(d >= rank - len(normalized) for d in dynamic_dims(ctx, input_position)):
            raise ctx.dynamic_limit("RMS norm over a dynamic (padded) normalized dimension")
        return NotImplemented

    rule.__doc__ = "RMS norm over a dynamic normalized dim runs in eager (its mean divides by the count)."
    rule.__name__ = rule.__qualname__ = "reject_rms_over_dynamic"
    return rule


@lowers(aten.rms_norm.default, dynamic=Padding.COUNT, dynamic_rule=_reject_rms_over_dynamic(0))
def _rms_norm(ctx: LoweringContext, x, normalized_shape, weight=None, eps=None):
    out, _, _ = _rms(x, normalized_shape, eps)
    if weight is not None:
        out = _mul_bcast(out, convert(weight, dtype(out)))
    return _out(ctx, None, out)


@lowers(aten._fused_rms_norm.default, dynamic=Padding.COUNT, dynamic_rule=_reject_rms_over_dynamic(0))
def _fused_rms_norm(ctx: LoweringContext, x, normalized_shape, weight, eps):
    out, rstd, _ = _rms(x, normalized_shape, eps)
    if weight is not None:
        out = _mul_bcast(out, convert(weight, dtype(out)))
    return _out(ctx, 0, out), _out(ctx, 1, rstd)


@lowers(aten._fused_rms_norm_backward.default, dynamic=Padding.COUNT, dynamic_rule=_reject_rms_over_dynamic(1))
def _fused_rms_norm_backward(
    ctx: LoweringContext, grad_out, x, normalized_shape, rstd, weight, output_mask
):
    shape = shape_of(x)
    dims = list(range(len(shape) - len(normalized_shape), len(shape)))
    outer = list(range(dims[0])) if dims else list(range(len(shape)))
    n = math.prod(shape[d] for d in dims)
    acc = opmath_dtype(dtype(x))
    g, xf, rstd = convert(grad_out, acc), convert(x, acc), convert(rstd, acc)
    x_hat = _mul_bcast(xf, rstd)
    grad_input = grad_weight = None
    if output_mask[0]:
        g_hat = _mul_bcast(g, convert(weight, acc)) if weight is not None else g
        # rstd * (g_hat - x_hat * mean(g_hat * x_hat))
        mean_gx = _scale(reduce_sum(_mul_bcast(g_hat, x_hat), dims, keepdim=True), 1.0 / n if n else 0.0)
        grad_input = _mul_bcast(rstd, _sub_bcast(g_hat, _mul_bcast(x_hat, mean_gx)))
    if output_mask[1]:
        grad_weight = reduce_sum(_mul_bcast(g, x_hat), outer)
    return _out(ctx, 0, grad_input), _out(ctx, 1, grad_weight)
