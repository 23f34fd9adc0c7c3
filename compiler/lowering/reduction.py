"""Reductions, scans, sorting and the softmax family.

* Reductions (`sum`, `mean`, `prod`, `amax`, `any`, `var`, norms, ...) are one
  `stablehlo.reduce` each; `float16`/`bfloat16` accumulate in `float32` (as PyTorch's CPU
  and CUDA kernels do) and convert back.
* Index-returning reductions (`argmax`, `max.dim`, ...) are a variadic reduce over
  (value, iota) pairs whose body is a total order: NaN beats every number, ties go to
  the smaller index. Being associative and commutative, XLA may reduce in any order and
  still return PyTorch's "first occurrence" index.
* Scans (`cumsum`, `cummax`, `logcumsumexp`, ...) are a `reduce_window` whose window
  spans the whole scanned dim with `n - 1` low padding (the lowering JAX uses on TPU).
* `sort`/`topk` are a stable `stablehlo.sort` of (value, iota) with a comparator that
  orders NaN above +inf, as PyTorch does; `topk` slices the sorted result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import (
    bitcast,
    broadcast_to,
    compare,
    convert,
    dtype,
    full,
    is_nan,
    max_value,
    min_value,
    normalize_dim,
    normalize_dims,
    promote,
    reduce,
    reshape,
    scalar_region,
    select,
    shape_of,
)
from .padded import (
    dynamic_dims,
    i64,
    product,
    reject_along_dynamic,
    run_time_size,
    symbolic_arg,
    valid_positions,
)
from .registry import LOWERINGS, LoweringContext, lowers, Padding
from .opmath import opmath_dtype
from .symsize import static_layout

aten = torch.ops.aten


# Bounded dynamism (registry.Padding, declared at each registration): XLA's dynamic padder
# pads a reduction's operand with the reduction's init value, so the plain reductions and
# softmaxes are `masked`: right over a dynamic dim (checked by
# test/python/frontend/test_bounded_dynamism_opinfo.py). mean/var/std have count rules,
# scans prefix rules, sort/topk/median/kthvalue reject a dynamic dim they order along and
# argmax/argmin/max.dim/min.dim mask padding.


# -- shared pieces ------------------------------------------------------------------------------
def reduction_dims(dim, rank: int, *, empty_means_all: bool = True) -> list[int]:
    """The dims a reduction's `dim` argument names, sorted and non-negative. `None` (and,
    for most ops, `[]`) means every dim; a rank-0 tensor accepts dim 0/-1 and reduces
    over nothing."""
    if dim is None or (not isinstance(dim, int) and len(dim) == 0 and empty_means_all):
        return list(range(rank))
    dims = normalize_dims(dim, rank)  # validates; rank 0 maps 0/-1 to 0
    return [] if rank == 0 else dims


def keepdim_shape(shape: Sequence[int], dims: Sequence[int]) -> list[int]:
    return [1 if i in dims else s for i, s in enumerate(shape)]


def reduce_with(op_class, x: ir.Value, init, dims: Sequence[int]) -> ir.Value:
    """`stablehlo.reduce` of `x` over `dims` with a binary op; `init` is a Python scalar."""
    init_value = full_via_real(init, dtype(x), [])
    (result,) = reduce([x], [init_value], dims, lambda acc, new: [op_class(acc[0], new[0]).result])
    return result


def reduce_sum(x: ir.Value, dims: Sequence[int], *, keepdim: bool = False) -> ir.Value:
    result = reduce_with(stablehlo.AddOp, x, 0, dims)
    return reshape(result, keepdim_shape(shape_of(x), dims)) if keepdim else result


def reduce_max(x: ir.Value, dims: Sequence[int], *, keepdim: bool = False) -> ir.Value:
    """amax with NaN propagation (stablehlo.maximum is IEEE-754 `maximum`)."""
    result = reduce_with(stablehlo.MaxOp, x, min_value(dtype(x)), dims)
    return reshape(result, keepdim_shape(shape_of(x), dims)) if keepdim else result


def reduce_min(x: ir.Value, dims: Sequence[int], *, keepdim: bool = False) -> ir.Value:
    """amin with NaN propagation (stablehlo.minimum is IEEE-754 `minimum`)."""
    result = reduce_with(stablehlo.MinOp, x, max_value(dtype(x)), dims)
    return reshape(result, keepdim_shape(shape_of(x), dims)) if keepdim else result


def reduce_prod(x: ir.Value, dims: Sequence[int], *, keepdim: bool = False) -> ir.Value:
    result = reduce_with(stablehlo.MulOp, x, 1, dims)
    return reshape(result, keepdim_shape(shape_of(x), dims)) if keepdim else result


def num_elements(shape: Sequence[int], dims: Sequence[int]) -> int:
    return math.prod(shape[d] for d in dims)


def full_via_real(value, dt: torch.dtype, shape: Sequence[int]) -> ir.Value:
    """helpers.full, except that a real `value` of a complex dtype is the real splat
    converted (helpers.full builds complex splats from a numpy array, which once came
    out with shape [1] at rank 0)."""
    if dt.is_complex and not isinstance(value, complex):
        real = torch.float64 if dt is torch.complex128 else torch.float32
        return convert(full(value, real, shape), dt)
    return full(value, dt, shape)


dtype_of_value = dtype  # for rules whose `dtype` argument shadows the helper


def _finish(ctx: LoweringContext, value: ir.Value, index: int | None = None) -> ir.Value:
    """Converts and reshapes a reduction result to the node's dtype and shape (applies
    keepdim: the reduced dims come back as size 1)."""
    return reshape(convert(value, ctx.result_dtype(index)), ctx.result_shape(index))


def _binop(op_class, a: ir.Value, b: ir.Value) -> ir.Value:
    return op_class(a, b).result


def _is_float(dt: torch.dtype) -> bool:
    return dt.is_floating_point


# -- sum, mean, prod, nansum ------------------------------------------------------------------
@lowers(aten.sum.dim_IntList, aten.sum.default, dynamic=Padding.MASKED)
def _sum(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None):
    out = ctx.result_dtype()  # `dtype`, else int64 for integers/bool, else x's dtype
    x = convert(convert(x, out), opmath_dtype(out))
    dims = reduction_dims(dim, len(shape_of(x)))
    return _finish(ctx, reduce_sum(x, dims))


@lowers(aten.nansum.default, dynamic=Padding.MASKED)
def _nansum(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None):
    out = ctx.result_dtype()
    x = convert(convert(x, out), opmath_dtype(out))
    if _is_float(out) or out.is_complex:
        x = select(is_nan(x), full_via_real(0, dtype_of_value(x), shape_of(x)), x)
    dims = reduction_dims(dim, len(shape_of(x)))
    return _finish(ctx, reduce_sum(x, dims))


def _mean_padded(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None):
    """Divides the (masked) sum by the run-time element count of the reduced dims."""
    sym = symbolic_arg(ctx, 0)
    dims = normalize_dims(dim if dim not in ((), []) else None, len(shape_of(x)))
    if not any(d in dynamic_dims(ctx, 0) for d in dims):
        return NotImplemented
    total = _sum(ctx, x, dims, keepdim, dtype=dtype)
    count = product([run_time_size(ctx, sym.shape[d]) for d in dims])
    return stablehlo.DivOp(
        total, broadcast_to(convert(count, dtype_of_value(total)), shape_of(total))
    ).result


@lowers(aten.mean.dim, aten.mean.default, dynamic=Padding.COUNT, dynamic_rule=_mean_padded)
def _mean(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None):
    out = ctx.result_dtype()
    x = convert(convert(x, out), opmath_dtype(out))
    shape = shape_of(x)
    dims = reduction_dims(dim, len(shape))
    total = reduce_sum(x, dims)
    count = full_via_real(num_elements(shape, dims), dtype_of_value(total), shape_of(total))
    return _finish(ctx, stablehlo.DivOp(total, count).result)


@lowers(aten.prod.default, aten.prod.dim_int, dynamic=Padding.MASKED)
def _prod(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None):
    out = ctx.result_dtype()
    x = convert(convert(x, out), opmath_dtype(out))
    dims = reduction_dims(dim, len(shape_of(x)))
    return _finish(ctx, reduce_with(stablehlo.MulOp, x, 1, dims))


# -- any, all, count_nonzero -----------------------------------------------------------------------
def _any_all(op_class, init: bool, ctx: LoweringContext, x, dim=None, keepdim=False):
    # `any.dims` with `dim=[]` reduces nothing (PyTorch returns the input as bool).
    dims = reduction_dims(dim, len(shape_of(x)), empty_means_all=False)
    result = reduce_with(op_class, convert(x, torch.bool), init, dims)
    return _finish(ctx, result)  # uint8 inputs give uint8 results


for _op in (aten.any.default, aten.any.dim, aten.any.dims):
    lowers(_op, dynamic=Padding.MASKED)(partial(_any_all, stablehlo.OrOp, False))
for _op in (aten.all.default, aten.all.dim, aten.all.dims):
    lowers(_op, dynamic=Padding.MASKED)(partial(_any_all, stablehlo.AndOp, True))


@lowers(aten.count_nonzero.default, aten.count_nonzero.dim_IntList, dynamic=Padding.MASKED)
def _count_nonzero(ctx: LoweringContext, x, dim=None):
    nonzero = convert(convert(x, torch.bool), torch.int64)
    return _finish(ctx, reduce_sum(nonzero, reduction_dims(dim, len(shape_of(x)))))


# -- hash_tensor ---------------------------------------------------------------------------------
@lowers(aten.hash_tensor.default, dynamic=Padding.MASKED)
def _hash_tensor(ctx: LoweringContext, x, dim=(), *, keepdim=False, mode=0):
    """torch.hash_tensor's xor_sum (mode 0, its only mode): each element widened to 64
    bits as PyTorch's kernel does (floats to float64, integers sign-extended to int64,
    bool to 0/1), its bits read as uint64, XOR-reduced over `dim` (every dim when empty)."""
    if mode != 0:
        raise ctx.fail(f"hash_tensor mode {mode} is not one PyTorch defines (0: xor_sum)")
    if dtype(x).is_complex:
        raise ctx.fail("hash_tensor of a complex tensor is not supported by PyTorch either")
    wide = convert(x, torch.float64 if dtype(x).is_floating_point else torch.int64)
    bits = bitcast(wide, torch.uint64)
    dims = reduction_dims(dim, len(shape_of(x)))
    return _finish(ctx, reduce_with(stablehlo.XorOp, bits, 0, dims))


# -- amax, amin, max, min, aminmax -------------------------------------------------------------
def _extreme(x: ir.Value, dims: Sequence[int], largest: bool) -> ir.Value:
    if dtype(x) is torch.bool:  # max/min of i1 as or/and
        return reduce_with(stablehlo.OrOp if largest else stablehlo.AndOp, x, not largest, dims)
    if largest:
        return reduce_with(stablehlo.MaxOp, x, min_value(dtype(x)), dims)
    return reduce_with(stablehlo.MinOp, x, max_value(dtype(x)), dims)


def _amax_amin(largest: bool, ctx: LoweringContext, x, dim=(), keepdim=False):
    dims = reduction_dims(dim, len(shape_of(x)))
    return _finish(ctx, _extreme(x, dims, largest))


lowers(aten.amax.default, dynamic=Padding.MASKED)(partial(_amax_amin, True))
lowers(aten.amin.default, dynamic=Padding.MASKED)(partial(_amax_amin, False))
lowers(aten.max.default, dynamic=Padding.MASKED)(partial(_amax_amin, True))
lowers(aten.min.default, dynamic=Padding.MASKED)(partial(_amax_amin, False))


@lowers(aten.aminmax.default, dynamic=Padding.MASKED)
def _aminmax(ctx: LoweringContext, x, *, dim=None, keepdim=False):
    dims = reduction_dims(dim, len(shape_of(x)))
    return _finish(ctx, _extreme(x, dims, False), 0), _finish(ctx, _extreme(x, dims, True), 1)


# -- argmax, argmin, max.dim, min.dim ----------------------------------------------------------
def _better(a: ir.Value, b: ir.Value, largest: bool) -> ir.Value:
    """Whether `a` strictly beats `b` (NaN beats every number, in both directions)."""
    beats = compare(a, b, "GT" if largest else "LT")
    if _is_float(dtype(a)):
        a_nan_only = stablehlo.AndOp(is_nan(a), stablehlo.NotOp(is_nan(b)).result).result
        beats = stablehlo.OrOp(beats, a_nan_only).result
    return beats


def _ties(a: ir.Value, b: ir.Value) -> ir.Value:
    equal = compare(a, b, "EQ")
    if _is_float(dtype(a)):
        equal = stablehlo.OrOp(equal, stablehlo.AndOp(is_nan(a), is_nan(b)).result).result
    return equal


def arg_reduce(x: ir.Value, dim: int, largest: bool) -> tuple[ir.Value, ir.Value]:
    """(extreme value, int64 index of its first occurrence) along `dim`."""
    shape = shape_of(x)
    iota = stablehlo.IotaOp(tensor_type(shape, torch.int64), dim).result
    init_value = full_via_real(min_value(dtype(x)) if largest else max_value(dtype(x)), dtype(x), [])
    init_index = full_via_real(0, torch.int64, [])

    def body(acc, new):
        (va, ia), (vb, ib) = acc, new
        smaller_index = compare(ia, ib, "LT")
        pick_a = stablehlo.OrOp(
            _better(va, vb, largest), stablehlo.AndOp(_ties(va, vb), smaller_index).result
        ).result
        # On ties the value is the same; on NaN ties either NaN will do.
        return [select(pick_a, va, vb), select(pick_a, ia, ib)]

    values, indices = reduce([x, iota], [init_value, init_index], [dim], body)
    return values, indices


def _arg_reduce_node(ctx: LoweringContext, x: ir.Value, dim, largest: bool):
    if dim is None or len(shape_of(x)) == 0:
        if dim is not None:
            normalize_dim(dim, 0)
        x = reshape(x, [int(np.prod(shape_of(x)))])
        dim = 0
    else:
        dim = normalize_dim(dim, len(shape_of(x)))
    return arg_reduce(x, dim, largest)


def _argmax_argmin(largest: bool, ctx: LoweringContext, x, dim=None, keepdim=False):
    if dtype(x).is_complex:
        raise ctx.fail("argmax/argmin of complex tensors is not defined")
    _, indices = _arg_reduce_node(ctx, x, dim, largest)
    return reshape(indices, ctx.result_shape())


def _arg_reduce_padded(largest: bool, with_values: bool):
    """argmax/argmin/max.dim/min.dim over a dynamic dim: padded positions hold the value
    that never wins (-inf/+inf or the dtype's extreme: on a tie the first logical position
    wins, as it comes first in the padded layout too), and a flattened index is computed
    from the logical strides, not the padded ones."""

    def rule(ctx: LoweringContext, x, dim=None, keepdim=False):
        shape = shape_of(x)
        rank = len(shape)
        dims = list(range(rank)) if dim is None else normalize_dims(dim, max(rank, 1))
        if rank == 0 or not set(dims) & set(dynamic_dims(ctx, 0)):
            return NotImplemented
        dt = dtype(x)
        valid = valid_positions(ctx, 0, shape)
        fill = full(min_value(dt) if largest else max_value(dt), dt, shape)
        masked = static_layout(select(valid, x, fill))
        if dim is not None:
            values, indices = arg_reduce(masked, dims[0], largest)
        else:
            count = math.prod(shape)
            values, flat = arg_reduce(reshape(masked, [count]), 0, largest)
            sym = symbolic_arg(ctx, 0)
            logical = [run_time_size(ctx, s) for s in sym.shape]
            indices = i64(0)
            for d in range(rank):
                padded_stride = math.prod(shape[d + 1 :])
                coord = stablehlo.DivOp(flat, i64(padded_stride)).result
                coord = stablehlo.RemOp(coord, i64(shape[d])).result
                term = stablehlo.MulOp(coord, i64(product(logical[d + 1 :]))).result
                indices = stablehlo.AddOp(indices, term).result
        if with_values:
            return reshape(values, ctx.result_shape(0)), reshape(indices, ctx.result_shape(1))
        return reshape(indices, ctx.result_shape())

    rule.__doc__ = _arg_reduce_padded.__doc__
    rule.__name__ = rule.__qualname__ = f"{'max' if largest else 'min'}_{'values_and_' if with_values else ''}index_padded"
    return rule


lowers(aten.argmax.default, dynamic=Padding.INDEX, dynamic_rule=_arg_reduce_padded(True, False))(
    partial(_argmax_argmin, True)
)
lowers(aten.argmin.default, dynamic=Padding.INDEX, dynamic_rule=_arg_reduce_padded(False, False))(
    partial(_argmax_argmin, False)
)


def _max_min_dim(largest: bool, ctx: LoweringContext, x, dim, keepdim=False):
    values, indices = _arg_reduce_node(ctx, x, dim, largest)
    return reshape(values, ctx.result_shape(0)), reshape(indices, ctx.result_shape(1))


lowers(aten.max.dim, dynamic=Padding.INDEX, dynamic_rule=_arg_reduce_padded(True, True))(
    partial(_max_min_dim, True)
)
lowers(aten.min.dim, dynamic=Padding.INDEX, dynamic_rule=_arg_reduce_padded(False, True))(
    partial(_max_min_dim, False)
)


# -- mode ------------------------------------------------------------------------------------
@lowers(aten.mode.default, dynamic=Padding.INDEX)
def _mode(ctx: LoweringContext, x, dim=-1, keepdim=False):
    """torch.mode as CPU eager gives it: the value occurring most often along `dim`, the
    smallest such value on a tie (NaNs count as equal and sort last), and the index of its
    last occurrence. Counts come from comparing every pair of a row (an [..., n, n]
    intermediate): exact, quadratic in the size of `dim`."""
    rank = len(shape_of(x))
    if rank == 0:
        return x, full(0, torch.int64, [])
    d = normalize_dim(dim, rank)
    order = [i for i in range(rank) if i != d] + [d]
    moved = stablehlo.TransposeOp(x, ir.DenseI64ArrayAttr.get(order)).result if order != list(range(rank)) else x
    work = convert(moved, torch.uint8) if dtype(x) is torch.bool else moved
    shape = shape_of(work)
    n = shape[-1]
    pair = shape + [n]
    rows = broadcast_to(reshape(work, shape + [1]), pair)  # [..., i, j] = x_i
    cols = broadcast_to(reshape(work, shape[:-1] + [1, n]), pair)  # [..., i, j] = x_j
    floating = dtype(work).is_floating_point
    same = compare(rows, cols, "EQ")
    if floating:
        same = stablehlo.OrOp(same, stablehlo.AndOp(is_nan(rows), is_nan(cols)).result).result
    counts = reduce_sum(convert(same, torch.int64), [len(pair) - 1])  # [..., n]
    best = reduce_with(stablehlo.MaxOp, counts, 0, [len(shape) - 1])
    candidate = compare(counts, broadcast_to(reshape(best, shape[:-1] + [1]), shape), "EQ")
    number = stablehlo.AndOp(candidate, stablehlo.NotOp(is_nan(work)).result).result if floating else candidate
    lowest = reduce_with(stablehlo.MinOp, select(number, work, full(max_value(dtype(work)), dtype(work), shape)),
                         max_value(dtype(work)), [len(shape) - 1])
    if floating:  # every candidate is NaN: the mode is NaN
        some_number = reduce_with(stablehlo.OrOp, number, False, [len(shape) - 1])
        lowest = select(some_number, lowest, full(math.nan, dtype(work), shape_of(lowest)))
    target = broadcast_to(reshape(lowest, shape[:-1] + [1]), shape)
    at = compare(work, target, "EQ")
    if floating:
        at = stablehlo.OrOp(at, stablehlo.AndOp(is_nan(work), is_nan(target)).result).result
    positions = stablehlo.IotaOp(tensor_type(shape, torch.int64), len(shape) - 1).result
    index = reduce_with(stablehlo.MaxOp, select(at, positions, full(-1, torch.int64, shape)), -1, [len(shape) - 1])
    return (reshape(convert(lowest, ctx.result_dtype(0)), ctx.result_shape(0)),
            reshape(index, ctx.result_shape(1)))


# -- var, std -------------------------------------------------------------------------------
def variance(x: ir.Value, dims: Sequence[int], correction: float) -> tuple[ir.Value, ir.Value]:
    """(var, mean) over `dims`, both with keepdim shape, in x's (accumulation) dtype;
    `var` is real for complex `x`. The divisor is max(N - correction, 0), as PyTorch's."""
    shape = shape_of(x)
    n = num_elements(shape, dims)
    total = reduce_sum(x, dims, keepdim=True)
    mean = stablehlo.DivOp(total, full_via_real(n, dtype(x), shape_of(total))).result
    diff = stablehlo.SubtractOp(x, broadcast_to(mean, shape)).result
    if dtype(x).is_complex:
        re, im = stablehlo.RealOp(diff).result, stablehlo.ImagOp(diff).result
        squares = stablehlo.AddOp(
            _binop(stablehlo.MulOp, re, re), _binop(stablehlo.MulOp, im, im)
        ).result
    else:
        squares = stablehlo.MulOp(diff, diff).result
    sum_sq = reduce_sum(squares, dims, keepdim=True)
    divisor = full_via_real(max(n - correction, 0), dtype(sum_sq), shape_of(sum_sq))
    return stablehlo.DivOp(sum_sq, divisor).result, mean


def _correction(unbiased, correction) -> float:
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased in (None, True) else 0.0


def _var_std(
    take_sqrt: bool,
    with_mean: bool,
    ctx: LoweringContext,
    x,
    dim=None,
    unbiased=None,
    keepdim=False,
    *,
    correction=None,
):
    if isinstance(dim, bool):  # var.default(self, unbiased): the bool arrives as `dim`
        dim, unbiased = None, dim
    if not (_is_float(dtype(x)) or dtype(x).is_complex):
        raise ctx.fail(f"var/std need a floating point or complex input, got {dtype(x)}")
    x = convert(x, opmath_dtype(dtype(x)))
    dims = reduction_dims(dim, len(shape_of(x)))
    var, mean = variance(x, dims, _correction(unbiased, correction))
    if take_sqrt:
        var = stablehlo.SqrtOp(var).result
    if with_mean:
        return _finish(ctx, var, 0), _finish(ctx, mean, 1)
    return _finish(ctx, var)


def _var_std_padded(take_sqrt: bool, with_mean: bool):
    """var/std (and var_mean/std_mean) over a dynamic dim: divides by the run-time
    element count of the reduced dims."""

    def rule(ctx: LoweringContext, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        sym = symbolic_arg(ctx, 0)
        dims = normalize_dims(dim if dim not in ((), []) else None, len(shape_of(x)))
        if not any(d in dynamic_dims(ctx, 0) for d in dims):
            return NotImplemented
        if correction is None:
            correction = 0 if unbiased is False else 1
        acc = torch.float64 if dtype(x) is torch.float64 else torch.float32
        xf = convert(x, acc)
        count = convert(i64(product([run_time_size(ctx, sym.shape[d]) for d in dims])), acc)
        total = reduce_sum(xf, dims)
        mean = stablehlo.DivOp(total, broadcast_to(count, shape_of(total))).result
        kept = [1 if d in dims else s for d, s in enumerate(shape_of(xf))]
        centered = stablehlo.SubtractOp(xf, broadcast_to(reshape(mean, kept), shape_of(xf))).result
        # Padding in `centered` is masked by the dynamic padder in the reduction.
        squares = reduce_sum(stablehlo.MulOp(centered, centered).result, dims)
        denom = stablehlo.MaxOp(
            stablehlo.SubtractOp(count, full(correction, acc, [])).result, full(0, acc, [])
        ).result
        var = stablehlo.DivOp(squares, broadcast_to(denom, shape_of(squares))).result
        if take_sqrt:
            var = stablehlo.SqrtOp(var).result
        out_shape = ctx.result_shape(0) if with_mean else ctx.result_shape()
        out_dtype = ctx.result_dtype(0) if with_mean else ctx.result_dtype()
        var = reshape(convert(var, out_dtype), out_shape)
        if with_mean:
            return var, reshape(convert(mean, ctx.result_dtype(1)), ctx.result_shape(1))
        return var

    rule.__doc__ = "Divides by the run-time element count of the reduced dims (the sums are masked by the dynamic padder)."
    rule.__name__ = rule.__qualname__ = f"{'std' if take_sqrt else 'var'}{'_mean' if with_mean else ''}_padded"
    return rule


for _op in (aten.var.dim, aten.var.correction, aten.var.default):
    lowers(_op, dynamic=Padding.COUNT, dynamic_rule=_var_std_padded(False, False))(partial(_var_std, False, False))
for _op in (aten.std.dim, aten.std.correction, aten.std.default):
    lowers(_op, dynamic=Padding.COUNT, dynamic_rule=_var_std_padded(True, False))(partial(_var_std, True, False))
for _op in (aten.var_mean.correction, aten.var_mean.dim, aten.var_mean.default):
    lowers(_op, dynamic=Padding.COUNT, dynamic_rule=_var_std_padded(False, True))(partial(_var_std, False, True))
for _op in (aten.std_mean.correction, aten.std_mean.dim, aten.std_mean.default):
    lowers(_op, dynamic=Padding.COUNT, dynamic_rule=_var_std_padded(True, True))(partial(_var_std, True, True))


# -- norms and logsumexp ------------------------------------------------------------------------
def _vector_norm(ctx: LoweringContext, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    out = ctx.result_dtype()
    if dtype is not None:
        x = convert(x, dtype)
    if not (_is_float(dtype_of_value(x)) or dtype_of_value(x).is_complex):
        raise ctx.fail(
            f"vector norms need a floating point or complex input, got {dtype_of_value(x)}"
        )
    dims = reduction_dims(dim, len(shape_of(x)))
    magnitude = convert(stablehlo.AbsOp(x).result, opmath_dtype(out))
    acc = dtype_of_value(magnitude)
    shape = shape_of(magnitude)
    ord = float(ord)
    if ord == math.inf:
        result = _extreme(magnitude, dims, True)
    elif ord == -math.inf:
        result = _extreme(magnitude, dims, False)
    elif ord == 0:
        result = reduce_sum(convert(convert(magnitude, torch.bool), acc), dims)
    elif ord == 1:
        result = reduce_sum(magnitude, dims)
    elif ord == 2:
        result = stablehlo.SqrtOp(
            reduce_sum(_binop(stablehlo.MulOp, magnitude, magnitude), dims)
        ).result
    else:
        powered = stablehlo.PowOp(magnitude, full_via_real(ord, acc, shape)).result
        total = reduce_sum(powered, dims)
        result = stablehlo.PowOp(total, full_via_real(1.0 / ord, acc, shape_of(total))).result
    return _finish(ctx, result)


lowers(aten.linalg_vector_norm.default, dynamic=Padding.MASKED)(_vector_norm)


@lowers(
    aten.norm.Scalar,
    aten.norm.ScalarOpt_dim,
    aten.norm.ScalarOpt_dim_dtype,
    aten.norm.ScalarOpt_dtype,
    dynamic=Padding.MASKED,
)
def _norm(ctx: LoweringContext, x, p=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(ctx, x, 2 if p is None else p, dim, keepdim, dtype=dtype)


@lowers(aten.logsumexp.default, dynamic=Padding.MASKED)
def _logsumexp(ctx: LoweringContext, x, dim, keepdim=False):
    out = ctx.result_dtype()
    if out.is_complex:
        raise ctx.fail("logsumexp of complex tensors is not supported")
    x = convert(x, opmath_dtype(out))
    shape = shape_of(x)
    dims = reduction_dims(dim, len(shape))
    # PyTorch's formulation: shift by the max, except where the max is infinite.
    m = reduce_max(x, dims, keepdim=True)
    magnitude = stablehlo.AbsOp(m).result
    infinite = compare(magnitude, full_via_real(math.inf, dtype(m), shape_of(m)), "EQ")
    m = select(infinite, full_via_real(0, dtype(m), shape_of(m)), m)
    shifted = stablehlo.ExpOp(stablehlo.SubtractOp(x, broadcast_to(m, shape)).result).result
    total = stablehlo.LogOp(reduce_sum(shifted, dims, keepdim=True)).result
    return _finish(ctx, stablehlo.AddOp(total, m).result)


# -- softmax family --------------------------------------------------------------------------------
def _softmax_parts(x: ir.Value, dim: int) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(x - max, exp(x - max), sum(exp(x - max)) with keepdim shape) along `dim`."""
    shape = shape_of(x)
    dims = reduction_dims(dim, len(shape))
    shifted = stablehlo.SubtractOp(x, broadcast_to(reduce_max(x, dims, keepdim=True), shape)).result
    exp = stablehlo.ExpOp(shifted).result
    return shifted, exp, reduce_sum(exp, dims, keepdim=True)


def _softmax_of(x: ir.Value, dim: int) -> ir.Value:
    _, exp, total = _softmax_parts(x, dim)
    return stablehlo.DivOp(exp, broadcast_to(total, shape_of(x))).result


@lowers(aten._softmax.default, dynamic=Padding.MASKED)
def _softmax(ctx: LoweringContext, x, dim, half_to_float=False):
    out = ctx.result_dtype()
    return convert(_softmax_of(convert(x, opmath_dtype(out)), dim), out)


@lowers(aten._log_softmax.default, dynamic=Padding.MASKED)
def _log_softmax(ctx: LoweringContext, x, dim, half_to_float=False):
    out = ctx.result_dtype()
    shifted, _, total = _softmax_parts(convert(x, opmath_dtype(out)), dim)
    log_total = broadcast_to(stablehlo.LogOp(total).result, shape_of(shifted))
    return convert(stablehlo.SubtractOp(shifted, log_total).result, out)


@lowers(aten._safe_softmax.default, dynamic=Padding.MASKED)
def _safe_softmax(ctx: LoweringContext, x, dim, dtype=None):
    """softmax, but 0 (not NaN) along slices that are entirely -inf (masked rows)."""
    out = ctx.result_dtype()
    x = convert(x, opmath_dtype(out))
    acc, shape = dtype_of_value(x), shape_of(x)
    result = _softmax_of(x, dim)
    dims = reduction_dims(dim, len(shape))
    masked = compare(x, full_via_real(-math.inf, acc, shape), "EQ")
    all_masked = reshape(
        reduce_with(stablehlo.AndOp, masked, True, dims), keepdim_shape(shape, dims)
    )
    result = select(broadcast_to(all_masked, shape), full_via_real(0, acc, shape), result)
    return convert(result, out)


@lowers(aten._softmax_backward_data.default, dynamic=Padding.MASKED)
def _softmax_backward(ctx: LoweringContext, grad, output, dim, input_dtype):
    out = ctx.result_dtype()
    acc = opmath_dtype(out)
    grad, output = convert(grad, acc), convert(output, acc)
    shape = shape_of(grad)
    dims = reduction_dims(dim, len(shape))
    # y * (g - sum(g * y))
    dot = broadcast_to(reduce_sum(_binop(stablehlo.MulOp, grad, output), dims, keepdim=True), shape)
    return convert(stablehlo.MulOp(output, stablehlo.SubtractOp(grad, dot).result).result, out)


@lowers(aten._log_softmax_backward_data.default, dynamic=Padding.MASKED)
def _log_softmax_backward(ctx: LoweringContext, grad, output, dim, input_dtype):
    out = ctx.result_dtype()
    acc = opmath_dtype(out)
    grad, output = convert(grad, acc), convert(output, acc)
    shape = shape_of(grad)
    dims = reduction_dims(dim, len(shape))
    # g - exp(y) * sum(g)
    total = broadcast_to(reduce_sum(grad, dims, keepdim=True), shape)
    correction = stablehlo.MulOp(stablehlo.ExpOp(output).result, total).result
    return convert(stablehlo.SubtractOp(grad, correction).result, out)


# -- scans ------------------------------------------------------------------------------------
def scan(
    values: Sequence[ir.Value],
    inits: Sequence[ir.Value],
    dim: int,
    body: Callable[[list[ir.Value], list[ir.Value]], list[ir.Value]],
) -> list[ir.Value]:
    """Inclusive prefix scan along `dim`: a reduce_window whose window covers the whole
    dim, padded by n - 1 on the low side. `body(acc_args, new_args)` must be associative."""
    shape = shape_of(values[0])
    rank, n = len(shape), shape[dim]
    window = [1] * rank
    window[dim] = n
    padding = np.zeros((rank, 2), dtype=np.int64)
    padding[dim, 0] = n - 1
    result_types = [v.type for v in values]
    op = stablehlo.ReduceWindowOp(
        result_types,
        list(values),
        list(inits),
        window,
        padding=ir.DenseIntElementsAttr.get(padding, type=ir.IntegerType.get_signless(64)),
    )
    count = len(values)
    scalar_region(
        op.body, [dtype(v) for v in values] * 2, lambda args: body(args[:count], args[count:])
    )
    return list(op.results)


def _scan_input(ctx: LoweringContext, x: ir.Value, dim: int) -> tuple[ir.Value, int]:
    """Rank-0 inputs scan as a 1-element vector; returns (x, normalised dim)."""
    dim = normalize_dim(dim, len(shape_of(x)))
    if len(shape_of(x)) == 0:
        x = reshape(x, [1])
    return x, dim


def _cumulative(op_class, init, ctx: LoweringContext, x, dim, *, dtype=None):
    out = ctx.result_dtype()
    x, dim = _scan_input(ctx, convert(convert(x, out), opmath_dtype(out)), dim)
    if shape_of(x)[dim] == 0:
        return _finish(ctx, x)
    (result,) = scan(
        [x],
        [full_via_real(init, dtype_of_value(x), [])],
        dim,
        lambda acc, new: [op_class(acc[0], new[0]).result],
    )
    return _finish(ctx, result)


def _scan_on_padded_buffer(ctx: LoweringContext, x, *args, **kwargs):
    """A forward scan's valid outputs read only valid inputs (a prefix), so it runs on the
    padded buffer as a static one; the importer re-attaches the sizes to its result.
    (XLA's dynamic padder got reduce_window scans wrong with two dynamic dims: rows past
    the other dim's bound came out wrong.)"""
    if not dynamic_dims(ctx, 0):
        return NotImplemented
    return LOWERINGS[ctx.node.target].fn(ctx, static_layout(x), *args, **kwargs)


_SCAN = {"dynamic": Padding.PREFIX, "dynamic_rule": _scan_on_padded_buffer}
lowers(aten.cumsum.default, **_SCAN)(partial(_cumulative, stablehlo.AddOp, 0))
lowers(aten.cumprod.default, **_SCAN)(partial(_cumulative, stablehlo.MulOp, 1))


def _running(op_class, x: ir.Value, init, dim: int) -> ir.Value:
    (result,) = scan(
        [x], [full_via_real(init, dtype(x), [])], dim, lambda acc, new: [op_class(acc[0], new[0]).result]
    )
    return result


def _cumulative_extreme(largest: bool, ctx: LoweringContext, x, dim):
    """cummax/cummin: the running extreme (NaN propagates) and the index PyTorch reports
    for it: the latest index among equal values, and once a NaN is seen, the latest NaN.
    That index is the latest j <= i where x[j] is the running extreme at j (or NaN): a
    running max of those positions. Two single-operand scans (no variadic
    reduce_window, which not every XLA backend implements)."""
    x, dim = _scan_input(ctx, x, dim)
    if shape_of(x)[dim] == 0:
        return _finish(ctx, x, 0), _finish(ctx, convert(x, torch.int64), 1)
    if dtype(x) is torch.bool:
        op_class = stablehlo.OrOp if largest else stablehlo.AndOp
    else:
        op_class = stablehlo.MaxOp if largest else stablehlo.MinOp
    init = min_value(dtype(x)) if largest else max_value(dtype(x))
    values = _running(op_class, x, init, dim)
    marked = compare(x, values, "EQ")
    if _is_float(dtype(x)):
        marked = stablehlo.OrOp(marked, is_nan(x)).result
    iota = stablehlo.IotaOp(tensor_type(shape_of(x), torch.int64), dim).result
    positions = select(marked, iota, full_via_real(-1, torch.int64, shape_of(x)))
    indices = _running(stablehlo.MaxOp, positions, -1, dim)
    return _finish(ctx, values, 0), _finish(ctx, indices, 1)


lowers(aten.cummax.default, **_SCAN)(partial(_cumulative_extreme, True))
lowers(aten.cummin.default, **_SCAN)(partial(_cumulative_extreme, False))


@lowers(aten.logcumsumexp.default, **_SCAN)
def _logcumsumexp(ctx: LoweringContext, x, dim):
    out = ctx.result_dtype()
    if out.is_complex:
        raise ctx.fail("logcumsumexp of complex tensors is not supported")
    x, dim = _scan_input(ctx, convert(x, opmath_dtype(out)), dim)
    if shape_of(x)[dim] == 0:
        return _finish(ctx, x)

    def log_add_exp(acc, new):
        a, b = acc[0], new[0]
        hi, lo = stablehlo.MaxOp(a, b).result, stablehlo.MinOp(a, b).result
        # hi + log1p(exp(lo - hi)); equal operands (incl. both +-inf) give hi + log 2.
        general = stablehlo.AddOp(
            hi,
            stablehlo.Log1pOp(stablehlo.ExpOp(stablehlo.SubtractOp(lo, hi).result).result).result,
        ).result
        equal = stablehlo.AddOp(hi, full_via_real(math.log(2.0), dtype(a), [])).result
        return [select(compare(a, b, "EQ"), equal, general)]

    (result,) = scan([x], [full_via_real(-math.inf, dtype_of_value(x), [])], dim, log_add_exp)
    return _finish(ctx, result)


# -- sort, topk ----------------------------------------------------------------------------------
def _sort_less(a: ir.Value, b: ir.Value, descending: bool) -> ir.Value:
    """Whether `a` sorts before `b`: ascending with NaN above +inf; descending reverses
    that order (NaN first). -0.0 and 0.0 are equal, so a stable sort keeps their order."""
    if descending:
        a, b = b, a
    less = compare(a, b, "LT")
    if _is_float(dtype(a)):
        b_nan_only = stablehlo.AndOp(stablehlo.NotOp(is_nan(a)).result, is_nan(b)).result
        less = stablehlo.OrOp(less, b_nan_only).result
    return less


def sort_with_indices(x: ir.Value, dim: int, descending: bool,
                      index_dtype: torch.dtype = torch.int64) -> tuple[ir.Value, ir.Value]:
    """Stable sort of `x` (rank >= 1) along `dim` with the source indices (int64, as
    aten.sort returns them; int32 for internal sorts: a TPU carries int64 as two words)."""
    shape = shape_of(x)
    iota = stablehlo.IotaOp(tensor_type(shape, index_dtype), dim).result
    op = stablehlo.SortOp([x.type, iota.type], [x, iota], dimension=dim, is_stable=True)
    scalar_region(
        op.comparator,
        [dtype(x), dtype(x), index_dtype, index_dtype],
        lambda args: [_sort_less(args[0], args[1], descending)],
    )
    return op.results[0], op.results[1]


def _sort(ctx: LoweringContext, x, dim=-1, descending=False):
    if dtype(x).is_complex:
        raise ctx.fail("sorting complex tensors is not supported (PyTorch has no order on them)")
    x, dim = _scan_input(ctx, x, dim)
    values, indices = sort_with_indices(x, dim, bool(descending))
    return _finish(ctx, values, 0), _finish(ctx, indices, 1)


@lowers(
    aten.sort.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_along_dynamic("sort", dim_position=1, default=-1),
)
def _sort_default(ctx: LoweringContext, x, dim=-1, descending=False):
    return _sort(ctx, x, dim, descending)


@lowers(
    aten.sort.stable,
    dynamic=Padding.MOVEMENT,
    # dim is keyword-only in sort.stable
    dynamic_rule=reject_along_dynamic("sort", dim_position=99, default=-1),
)
def _sort_stable(ctx: LoweringContext, x, *, stable=None, dim=-1, descending=False):
    # Always stable: PyTorch's unstable sort may return any order among ties, and the
    # stable order is one of them (and what PyTorch's CPU kernel returns).
    return _sort(ctx, x, dim, descending)


@lowers(
    aten.topk.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_along_dynamic("topk", dim_position=2, default=-1),
)
def _topk(ctx: LoweringContext, x, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) along `dim`, NaN counting as the largest. Results come
    sorted even for sorted=False, whose order PyTorch leaves unspecified."""
    if dtype(x).is_complex:
        raise ctx.fail("topk of complex tensors is not supported")
    x, dim = _scan_input(ctx, x, dim)
    values, indices = sort_with_indices(x, dim, bool(largest))
    limit = list(shape_of(x))
    limit[dim] = int(k)
    start, strides = [0] * len(limit), [1] * len(limit)
    values = stablehlo.SliceOp(values, start, limit, strides).result
    indices = stablehlo.SliceOp(indices, start, limit, strides).result
    return _finish(ctx, values, 0), _finish(ctx, indices, 1)


# -- order statistics: kthvalue, median, nanmedian ---------------------------------------------
# The value is exact; among equal values PyTorch's CPU kernel (quickselect) may report
# any of their indices, and we report the one a stable sort gives.
def _order_statistic_input(ctx: LoweringContext, x, dim) -> tuple[ir.Value, int]:
    if dtype(x).is_complex:
        raise ctx.fail("order statistics of complex tensors are not defined")
    if dim is None:
        return reshape(x, [math.prod(shape_of(x))]), 0
    return _scan_input(ctx, x, dim)


def _pick(values: ir.Value, indices: ir.Value, position: ir.Value, dim: int):
    """values/indices at a per-slice `position` (keepdim shape) along `dim`."""
    shape = shape_of(values)
    iota = stablehlo.IotaOp(tensor_type(shape, torch.int64), dim).result
    hit = compare(iota, broadcast_to(position, shape), "EQ")
    zero_v = full_via_real(0, dtype(values), shape)
    picked_values = select(hit, values, zero_v)
    if dtype(values) is torch.bool:
        value = reduce_with(stablehlo.OrOp, picked_values, False, [dim])
    else:
        value = reduce_with(stablehlo.AddOp, picked_values, 0, [dim])
    index = reduce_with(
        stablehlo.AddOp, select(hit, indices, full_via_real(0, torch.int64, shape)), 0, [dim]
    )
    return value, index


def _count_nan(x: ir.Value, dim: int) -> ir.Value:
    """Number of NaNs along `dim`, int64, keepdim shape."""
    if not _is_float(dtype(x)):
        return full_via_real(0, torch.int64, keepdim_shape(shape_of(x), [dim]))
    return reduce_sum(convert(is_nan(x), torch.int64), [dim], keepdim=True)


def _median(ignore_nan: bool, ctx: LoweringContext, x, dim=None, keepdim=False):
    """The lower median. `median` returns NaN (and the first NaN's index) when the
    slice holds one; `nanmedian` takes the median of the non-NaN values (NaN if none)."""
    x, dim = _order_statistic_input(ctx, x, dim)
    n = shape_of(x)[dim]
    if n == 0:
        raise ctx.fail("median of an empty dimension is not defined")
    values, indices = sort_with_indices(x, dim, False)  # NaNs sort last, in order
    nan_count = _count_nan(x, dim)
    count = stablehlo.SubtractOp(full_via_real(n, torch.int64, shape_of(nan_count)), nan_count).result
    if ignore_nan:
        # (count - 1) // 2, and 0 (a NaN) when every value is NaN.
        one = full_via_real(1, torch.int64, shape_of(count))
        position = stablehlo.DivOp(
            stablehlo.MaxOp(
                stablehlo.SubtractOp(count, one).result, full_via_real(0, torch.int64, shape_of(count))
            ).result,
            full_via_real(2, torch.int64, shape_of(count)),
        ).result
    else:
        # (n - 1) // 2 without NaNs; the first NaN (sorted position `count`) otherwise.
        has_nan = compare(nan_count, full_via_real(0, torch.int64, shape_of(nan_count)), "GT")
        position = select(has_nan, count, full_via_real((n - 1) // 2, torch.int64, shape_of(count)))
    value, index = _pick(values, indices, position, dim)
    if isinstance(ctx.meta(), (tuple, list)):  # the .dim overloads: (values, indices)
        return _finish(ctx, value, 0), _finish(ctx, index, 1)
    return _finish(ctx, value)


# Order statistics along a dynamic dim would order the padding too.
for _ignore_nan, _packet in ((False, aten.median), (True, aten.nanmedian)):
    _rule = partial(_median, _ignore_nan)
    lowers(
        _packet.default, dynamic=Padding.MOVEMENT, dynamic_rule=reject_along_dynamic("median", dim_position=None)
    )(_rule)
    lowers(_packet.dim, dynamic=Padding.MOVEMENT, dynamic_rule=reject_along_dynamic("median", dim_position=1))(
        _rule
    )


@lowers(
    aten.kthvalue.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_along_dynamic("kthvalue", dim_position=2, default=-1),
)
def _kthvalue(ctx: LoweringContext, x, k, dim=-1, keepdim=False):
    """The k-th smallest (1-based) along `dim`, NaN counting as the largest."""
    x, dim = _order_statistic_input(ctx, x, dim)
    n = shape_of(x)[dim]
    if not 1 <= k <= n:
        raise ctx.fail(f"kthvalue: k={k} is out of range for a dimension of size {n}")
    values, indices = sort_with_indices(x, dim, False)
    start = [0] * len(shape_of(x))
    start[dim] = k - 1
    limit = list(shape_of(x))
    limit[dim] = k
    strides = [1] * len(limit)
    value = stablehlo.SliceOp(values, start, limit, strides).result
    index = stablehlo.SliceOp(indices, start, limit, strides).result
    return _finish(ctx, value, 0), _finish(ctx, index, 1)


@lowers(aten.dist.default, dynamic=Padding.MASKED)
def _dist(ctx: LoweringContext, a, b, p=2):
    """‖a - b‖_p over all elements (broadcast, in the promoted dtype)."""
    lhs, rhs = promote(a, b, to=ctx.result_dtype())
    return _vector_norm(ctx, stablehlo.SubtractOp(lhs, rhs).result, ord=p)
