"""Rules for ops whose static lowering is wrong when a dimension is padded (bounded
dynamism, docs/explanation/bounded-dynamism.md).

XLA's dynamic padder masks what reads padding through reductions, dot contractions,
concatenation, argmax and scans (tested in test/python/frontend/test_bounded_dynamism.py).
It cannot fix what a rule computed from a *static* size: a mean's divisor, a reshape that
interleaves padding with data. Those ops are lowered here when an operand has a dynamic
dimension; everything else uses the ordinary rule. Ops whose result depends on where the
end of a dynamic dimension is (flip, roll, sort along it, ...) are rejected (the node runs
in PyTorch eager) rather than computed wrongly.

A rule gets the importer's `DynamicShapes` as `ctx.importer.dynamic` and the node's
symbolic metadata through it. It returns `NotImplemented` to use the ordinary rule.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import broadcast_to, convert, dtype, normalize_dims, reshape, shape_of
from .registry import LOWERINGS, LoweringContext

aten = torch.ops.aten

DYNAMIC_LOWERINGS: dict[Any, Callable] = {}


def lowers_dynamic(*ops) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for op in ops:
            DYNAMIC_LOWERINGS[op] = fn
        return fn

    return register


def _sym(ctx: LoweringContext, position: int):
    arg = ctx.node.args[position]
    return ctx.importer.dynamic.symbolic_val(arg) if isinstance(arg, torch.fx.Node) else arg


def _dynamic_dims(ctx: LoweringContext, position: int) -> list[int]:
    return ctx.importer.dynamic.dynamic_dims(_sym(ctx, position))


def _size(ctx: LoweringContext, s) -> ir.Value | int:
    """A size of symbolic metadata: a 0-d i64 value when symbolic, else an int."""
    if isinstance(s, torch.SymInt) and not s.node.is_constant():
        return ctx.importer.dynamic.size_value(s.node.expr, ctx.node)
    return int(s)


def _i64(v: ir.Value | int) -> ir.Value:
    if isinstance(v, ir.Value):
        return v
    attr = ir.DenseElementsAttr.get_splat(tensor_type([], torch.int64), ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v)))
    return stablehlo.ConstantOp(attr).result


def _product(values) -> ir.Value | int:
    static = math.prod(v for v in values if not isinstance(v, ir.Value))
    dynamic = [v for v in values if isinstance(v, ir.Value)]
    if not dynamic:
        return static
    result = dynamic[0]
    for v in dynamic[1:]:
        result = stablehlo.MulOp(result, v).result
    if static != 1:
        result = stablehlo.MulOp(result, _i64(static)).result
    return result


# -- count-dependent reductions --------------------------------------------------------------
@lowers_dynamic(aten.mean.dim, aten.mean.default)
def _mean(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None):
    sym = _sym(ctx, 0)
    dims = normalize_dims(dim if dim not in ((), []) else None, len(shape_of(x)))
    if not any(d in _dynamic_dims(ctx, 0) for d in dims):
        return NotImplemented
    total = LOWERINGS[aten.sum.dim_IntList].fn(ctx, x, dims, keepdim, dtype=dtype)
    count = _product([_size(ctx, sym.shape[d]) for d in dims])
    return stablehlo.DivOp(total, broadcast_to(convert(count, _dtype_of(total)), shape_of(total))).result


def _var_rule(take_sqrt: bool, with_mean: bool):
    def rule(ctx: LoweringContext, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        sym = _sym(ctx, 0)
        dims = normalize_dims(dim if dim not in ((), []) else None, len(shape_of(x)))
        if not any(d in _dynamic_dims(ctx, 0) for d in dims):
            return NotImplemented
        if correction is None:
            correction = 0 if unbiased is False else 1
        acc = torch.float64 if dtype(x) is torch.float64 else torch.float32
        xf = convert(x, acc)
        count = convert(_i64(_product([_size(ctx, sym.shape[d]) for d in dims])), acc)
        total = _reduce_sum(xf, dims)
        mean = stablehlo.DivOp(total, broadcast_to(count, shape_of(total))).result
        kept = [1 if d in dims else s for d, s in enumerate(shape_of(xf))]
        centered = stablehlo.SubtractOp(xf, broadcast_to(reshape(mean, kept), shape_of(xf))).result
        # Padding in `centered` is masked by the dynamic padder in the reduction.
        squares = _reduce_sum(stablehlo.MulOp(centered, centered).result, dims)
        denom = stablehlo.MaxOp(
            stablehlo.SubtractOp(count, _scalar(correction, acc)).result, _scalar(0, acc)
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

    return rule


def _reduce_sum(x: ir.Value, dims) -> ir.Value:
    from .reduction import reduce_sum

    return reduce_sum(x, dims)


def _scalar(value, dt: torch.dtype) -> ir.Value:
    from .helpers import full

    return full(value, dt, [])


def _dtype_of(v: ir.Value) -> torch.dtype:
    return dtype(v)


for _op in (aten.var.dim, aten.var.correction, aten.var.default):
    lowers_dynamic(_op)(_var_rule(False, False))
for _op in (aten.std.dim, aten.std.correction, aten.std.default):
    lowers_dynamic(_op)(_var_rule(True, False))
for _op in (aten.var_mean.correction, aten.var_mean.dim, aten.var_mean.default):
    lowers_dynamic(_op)(_var_rule(False, True))
for _op in (aten.std_mean.correction, aten.std_mean.dim, aten.std_mean.default):
    lowers_dynamic(_op)(_var_rule(True, True))


# -- reshapes ----------------------------------------------------------------------------------
def _layout_preserving(in_shape, out_shape) -> bool:
    """Whether reshaping the padded buffer keeps every element where the logical reshape
    puts it: one dynamic dim on each side, the same size, with equal static products
    before and after it (padding then stays in one contiguous block per outer index)."""

    def split(shape):
        dyn = [d for d, s in enumerate(shape) if isinstance(s, torch.SymInt) and not s.node.is_constant()]
        if len(dyn) != 1:
            return None
        d = dyn[0]
        return math.prod(int(s) for s in shape[:d]), shape[d].node.expr, math.prod(int(s) for s in shape[d + 1 :])

    a, b = split(in_shape), split(out_shape)
    return a is not None and b is not None and a[0] == b[0] and a[2] == b[2] and a[1] == b[1]


@lowers_dynamic(aten.view.default, aten.view_copy.default, aten._unsafe_view.default, aten.reshape.default)
def _reshape(ctx: LoweringContext, x, *args, **kwargs):
    in_sym = _sym(ctx, 0)
    out_sym = ctx.importer.dynamic.symbolic_val(ctx.node)
    in_dyn = ctx.importer.dynamic.dynamic_dims(in_sym)
    out_dyn = ctx.importer.dynamic.dynamic_dims(out_sym)
    if not in_dyn and not out_dyn:
        return NotImplemented
    if [_key(s) for s in in_sym.shape] == [_key(s) for s in out_sym.shape] or _layout_preserving(in_sym.shape, out_sym.shape):
        return reshape(x, ctx.result_shape())
    return _gather_reshape(ctx, x, in_sym.shape, out_sym.shape)


def _key(s):
    return str(s.node.expr) if isinstance(s, torch.SymInt) else int(s)


def _gather_reshape(ctx: LoweringContext, x: ir.Value, in_sizes, out_sizes) -> ir.Value:
    """A reshape that moves padding: each output element's logical linear index is mapped
    to its input element, read with one gather of rows (the longest common static suffix
    is kept whole)."""
    in_pad, out_pad = shape_of(x), ctx.result_shape()
    # Common static trailing block moved as a unit.
    row = 1
    i, o = len(in_pad), len(out_pad)
    while i > 0 and o > 0:
        si, so = in_sizes[i - 1], out_sizes[o - 1]
        if _is_dyn(si) or _is_dyn(so) or int(si) != int(so):
            break
        row *= int(si)
        i -= 1
        o -= 1
    in_lead, out_lead = in_pad[:i], out_pad[:o]
    in_log = [_size(ctx, s) for s in in_sizes[:i]]
    del row
    out_log = [_size(ctx, s) for s in out_sizes[:o]]
    i64 = torch.int64
    lead_shape = list(out_lead) or [1]
    # Logical linear index of each output row.
    linear = None
    for d in range(len(out_lead)):
        idx = stablehlo.IotaOp(tensor_type(lead_shape, i64), d).result
        stride = _product(out_log[d + 1 :])
        term = stablehlo.MulOp(idx, broadcast_to(_i64(stride), lead_shape)).result
        linear = term if linear is None else stablehlo.AddOp(linear, term).result
    if linear is None:
        linear = broadcast_to(_i64(0), lead_shape)
    # The input coordinates of that logical index; the gather reads the padded input
    # directly (reshaping it first would let XLA's dynamic padder move the padding).
    count = math.prod(lead_shape)
    flat = reshape(linear, [count])
    coords = []
    for d in range(len(in_lead)):
        logical_stride = _product(in_log[d + 1 :])
        coord = stablehlo.DivOp(flat, broadcast_to(_i64(logical_stride), [count])).result
        coord = stablehlo.RemOp(coord, broadcast_to(_i64(in_log[d]), [count])).result
        coords.append(reshape(coord, [count, 1]))
    if not coords:
        return reshape(x, out_pad)
    indices = coords[0] if len(coords) == 1 else stablehlo.ConcatenateOp(coords, 1).result
    from .indexing import _gather

    trailing = in_pad[len(in_lead):]
    taken = _gather(
        x, indices,
        offset_dims=list(range(1, 1 + len(trailing))),
        collapsed_slice_dims=list(range(len(in_lead))),
        start_index_map=list(range(len(in_lead))),
        index_vector_dim=1,
        slice_sizes=[1] * len(in_lead) + list(trailing),
    )
    return reshape(taken, out_pad)


def _is_dyn(s) -> bool:
    return isinstance(s, torch.SymInt) and not s.node.is_constant()


# -- ops that depend on where a dynamic dimension ends ------------------------------------------
def _reject_along_dynamic(dim_position: int | None, what: str):
    def rule(ctx: LoweringContext, x, *args, **kwargs):
        dyn = _dynamic_dims(ctx, 0)
        if not dyn:
            return NotImplemented
        if dim_position is not None:
            all_args = list(ctx.node.args) + list(ctx.node.kwargs.values())
            dims = all_args[dim_position] if dim_position < len(all_args) else None
            dims = normalize_dims(dims, len(shape_of(x)))
            if not any(d in dyn for d in dims):
                return NotImplemented
        raise ctx.fail(
            f"{what} along a dynamic (padded) dimension is not supported with bounded "
            "dynamism; it runs in PyTorch eager (or mark the dimension static)"
        )

    return rule


lowers_dynamic(aten.flip.default)(_reject_along_dynamic(1, "flip"))
lowers_dynamic(aten.roll.default)(_reject_along_dynamic(2, "roll"))
lowers_dynamic(aten.sort.default, aten.sort.stable)(_reject_along_dynamic(None, "sort"))
lowers_dynamic(aten.topk.default)(_reject_along_dynamic(None, "topk"))
lowers_dynamic(aten.repeat.default)(_reject_along_dynamic(None, "repeat"))
lowers_dynamic(aten.constant_pad_nd.default)(_reject_along_dynamic(None, "constant padding"))


@lowers_dynamic(aten.native_layer_norm.default)
def _layer_norm(ctx: LoweringContext, x, normalized_shape, *args, **kwargs):
    rank = len(shape_of(x))
    normalized = range(rank - len(normalized_shape), rank)
    if not any(d in _dynamic_dims(ctx, 0) for d in normalized):
        return NotImplemented
    raise ctx.fail(
        "layer_norm over a dynamic (padded) dimension is not supported with bounded dynamism; "
        "it runs in PyTorch eager"
    )
