"""Dynamic rules: lowerings of ops whose ordinary rule is wrong when a dimension is
padded (bounded dynamism, docs/explanation/bounded-dynamism.md), attached to the one
lowering table with `registry.dynamic_rule` (which rejects a rule for an overload that has
no ordinary lowering, or a second rule). This module is imported after every family module.

XLA's dynamic padder masks what reads padding through reductions, dot contractions and
concatenation (class `masked`). It cannot fix what a rule computed from a *static* size:
a mean's divisor, a reshape that interleaves padding with data, a flattened index. A rule
here runs when an operand or the result has a dynamic dim: it lowers the op for the
padded layout, returns `NotImplemented` when the ordinary rule is right for this node (the
dynamic dims are not the ones it works along), or raises `ctx.dynamic_limit(...)` so the
node runs in PyTorch eager rather than computing a wrong result.

A rule gets the importer's `DynamicShapes` as `ctx.importer.dynamic` and the node's
symbolic metadata through it.
"""

from __future__ import annotations

import math

import sympy
import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import broadcast_to, convert, dtype, normalize_dims, reshape, shape_of
from .registry import LOWERINGS, LoweringContext, Padding, declare_padding, dynamic_rule
from .row_layout import flatten_layout, unflatten_matches
from .symsize import SymSize, static_layout

aten = torch.ops.aten

COUNT, INDEX, SIZE, MOVEMENT, WINDOW, PREFIX = (
    Padding.COUNT, Padding.INDEX, Padding.SIZE, Padding.MOVEMENT, Padding.WINDOW, Padding.PREFIX
)


def _sym(ctx: LoweringContext, position: int):
    arg = ctx.node.args[position]
    return ctx.importer.dynamic.symbolic_val(arg) if isinstance(arg, torch.fx.Node) else arg


def _dynamic_dims(ctx: LoweringContext, position: int) -> list[int]:
    return ctx.importer.dynamic.dynamic_dims(_sym(ctx, position))


def _size(ctx: LoweringContext, s) -> ir.Value | int:
    """A size of symbolic metadata: a 0-d i64 value when symbolic, else an int."""
    if isinstance(s, torch.SymInt) and not s.node.is_constant():
        return ctx.importer.dynamic.size_value(s.node.expr, ctx.node)
    if isinstance(s, sympy.Expr) and not isinstance(s, sympy.Integer):
        return ctx.importer.dynamic.size_value(s, ctx.node)
    return int(s)


def _i64(v: ir.Value | int) -> ir.Value:
    if isinstance(v, ir.Value):
        return v
    attr = ir.DenseElementsAttr.get_splat(
        tensor_type([], torch.int64), ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v))
    )
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
@dynamic_rule(aten.mean.dim, aten.mean.default, padding=COUNT)
def _mean(ctx: LoweringContext, x, dim=None, keepdim=False, *, dtype=None):
    """Divides the (masked) sum by the run-time element count of the reduced dims."""
    sym = _sym(ctx, 0)
    dims = normalize_dims(dim if dim not in ((), []) else None, len(shape_of(x)))
    if not any(d in _dynamic_dims(ctx, 0) for d in dims):
        return NotImplemented
    total = LOWERINGS[aten.sum.dim_IntList].fn(ctx, x, dims, keepdim, dtype=dtype)
    count = _product([_size(ctx, sym.shape[d]) for d in dims])
    return stablehlo.DivOp(
        total, broadcast_to(convert(count, _dtype_of(total)), shape_of(total))
    ).result


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

    rule.__doc__ = "Divides by the run-time element count of the reduced dims (the sums are masked by the dynamic padder)."
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
    dynamic_rule(_op, padding=COUNT)(_var_rule(False, False))
for _op in (aten.std.dim, aten.std.correction, aten.std.default):
    dynamic_rule(_op, padding=COUNT)(_var_rule(True, False))
for _op in (aten.var_mean.correction, aten.var_mean.dim, aten.var_mean.default):
    dynamic_rule(_op, padding=COUNT)(_var_rule(False, True))
for _op in (aten.std_mean.correction, aten.std_mean.dim, aten.std_mean.default):
    dynamic_rule(_op, padding=COUNT)(_var_rule(True, True))


# -- reshapes ----------------------------------------------------------------------------------
def _layout_preserving(in_shape, out_shape) -> bool:
    """Whether reshaping the padded buffer keeps every element where the logical reshape
    puts it: one dynamic dim on each side, the same size, with equal static products
    before and after it (padding then stays in one contiguous block per outer index)."""

    def split(shape):
        dyn = [
            d
            for d, s in enumerate(shape)
            if isinstance(s, torch.SymInt) and not s.node.is_constant()
        ]
        if len(dyn) != 1:
            return None
        d = dyn[0]
        return (
            math.prod(int(s) for s in shape[:d]),
            shape[d].node.expr,
            math.prod(int(s) for s in shape[d + 1 :]),
        )

    a, b = split(in_shape), split(out_shape)
    return a is not None and b is not None and a[0] == b[0] and a[2] == b[2] and a[1] == b[1]


@dynamic_rule(
    aten.view.default,
    aten.view_copy.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten._reshape_alias.default,
    padding=MOVEMENT,
)
def _reshape(ctx: LoweringContext, x, *args, **kwargs):
    """A reshape that keeps the padding in place is a plain reshape; a flattening one is
    kept row-interleaved for row-wise consumers (row_layout.py); any other moves elements
    with a gather at logical positions."""
    in_sym = _sym(ctx, 0)
    out_sym = ctx.importer.dynamic.symbolic_val(ctx.node)
    in_dyn = ctx.importer.dynamic.dynamic_dims(in_sym)
    out_dyn = ctx.importer.dynamic.dynamic_dims(out_sym)
    if not in_dyn and not out_dyn:
        return NotImplemented
    importer = ctx.importer
    source = ctx.node.args[0]
    layout = importer.interleaved.get(source)
    if layout is not None:
        if unflatten_matches(layout, out_sym.shape):
            return reshape(x, ctx.result_shape())  # the padded buffer is already in place
        x = importer.compacted(source)
    elif (
        flat := flatten_layout(in_sym.shape, out_sym.shape, shape_of(x)[in_dyn[0]] if in_dyn else 0)
    ) is not None:
        importer.interleaved[ctx.node] = flat
        return reshape(x, ctx.result_shape())
    if [_key(s) for s in in_sym.shape] == [_key(s) for s in out_sym.shape] or _layout_preserving(
        in_sym.shape, out_sym.shape
    ):
        return reshape(x, ctx.result_shape())
    return _gather_reshape(ctx, x, in_sym.shape, out_sym.shape, ctx.result_shape())


def _key(s):
    return str(s.node.expr) if isinstance(s, torch.SymInt) else int(s)


def _gather_reshape(ctx: LoweringContext, x: ir.Value, in_sizes, out_sizes, out_pad) -> ir.Value:
    """A reshape that moves padding: each output element's logical linear index is mapped
    to its input element, read with one gather of rows (the longest common static suffix
    is kept whole)."""
    in_pad = shape_of(x)
    # Common static trailing block moved as a unit.
    row = 1
    i, o = len(in_pad), len(out_pad)
    while i > 0 and o > 0:
        si, so = in_sizes[i - 1], out_sizes[o - 1]
        if (
            _is_dyn(si)
            or _is_dyn(so)
            or isinstance(si, sympy.Expr)
            and not isinstance(si, sympy.Integer)
            or int(si) != int(so)
        ):
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

    trailing = in_pad[len(in_lead) :]
    taken = _gather(
        x,
        indices,
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
_ALL = object()


def _reject_along_dynamic(dim_position: int | None, what: str, default=_ALL, keyword: str = "dim"):
    """A rule rejecting the op when the dims it works along (argument `dim_position`, or
    `keyword`, else `default`; None or absent: all dims) include a dynamic one."""

    def rule(ctx: LoweringContext, x, *args, **kwargs):
        dyn = _dynamic_dims(ctx, 0)
        if not dyn:
            return NotImplemented
        if dim_position is not None:
            node_args = list(ctx.node.args)
            if dim_position < len(node_args):
                dims = node_args[dim_position]
            else:
                dims = ctx.node.kwargs.get(keyword, None if default is _ALL else default)
            dims = normalize_dims(dims, len(shape_of(x)))
            if not any(d in dyn for d in dims):
                return NotImplemented
        raise ctx.dynamic_limit(f"{what} along a dynamic (padded) dimension")

    rule.__doc__ = f"{what} along a dynamic (padded) dim runs in eager; along static dims the ordinary rule."
    return rule


dynamic_rule(aten.flip.default, padding=MOVEMENT)(_reject_along_dynamic(1, "flip", keyword="dims"))
dynamic_rule(aten.roll.default, padding=MOVEMENT)(_reject_along_dynamic(2, "roll", keyword="dims"))
dynamic_rule(aten.sort.default, padding=MOVEMENT)(_reject_along_dynamic(1, "sort", default=-1))
# (dim is keyword-only in sort.stable)
dynamic_rule(aten.sort.stable, padding=MOVEMENT)(_reject_along_dynamic(99, "sort", default=-1))
dynamic_rule(aten.topk.default, padding=MOVEMENT)(_reject_along_dynamic(2, "topk", default=-1))


@dynamic_rule(aten.repeat.default, padding=MOVEMENT)
def _repeat(ctx: LoweringContext, x, repeats):
    """Repeating a dynamic dim interleaves copies with padding; repeating others is fine."""
    rank = len(shape_of(x))
    offset = len(repeats) - rank
    if all(int(repeats[offset + d]) == 1 for d in _dynamic_dims(ctx, 0)):
        return NotImplemented
    raise ctx.dynamic_limit("repeat along a dynamic (padded) dimension")


@dynamic_rule(aten.constant_pad_nd.default, padding=MOVEMENT)
def _constant_pad(ctx: LoweringContext, x, pad, value=0):
    """Padding after a dynamic dim's end would land after the buffer's padding."""
    rank = len(shape_of(x))
    touched = {rank - 1 - i // 2 for i, p in enumerate(pad) if int(p) != 0}
    if not touched & set(_dynamic_dims(ctx, 0)):
        return NotImplemented
    raise ctx.dynamic_limit("constant padding of a dynamic (padded) dimension")


@dynamic_rule(aten.native_layer_norm.default, padding=COUNT)
def _layer_norm(ctx: LoweringContext, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """layer_norm whose normalized dims include a dynamic one: mean and variance divide by
    the run-time element count (the sums are masked by the dynamic padder)."""
    rank = len(shape_of(x))
    dims = list(range(rank - len(normalized_shape), rank))
    if not any(d in _dynamic_dims(ctx, 0) for d in dims):
        return NotImplemented
    sym = _sym(ctx, 0)
    acc = torch.float64 if dtype(x) is torch.float64 else torch.float32
    xf = convert(x, acc)
    count = convert(_i64(_product([_size(ctx, sym.shape[d]) for d in dims])), acc)
    kept = [1 if d in dims else s for d, s in enumerate(shape_of(xf))]
    mean = stablehlo.DivOp(
        _reduce_sum(xf, dims),
        broadcast_to(count, [s for d, s in enumerate(shape_of(xf)) if d not in dims]),
    ).result
    centered = stablehlo.SubtractOp(xf, broadcast_to(reshape(mean, kept), shape_of(xf))).result
    squares = _reduce_sum(stablehlo.MulOp(centered, centered).result, dims)
    var = stablehlo.DivOp(squares, broadcast_to(count, shape_of(squares))).result
    rstd = stablehlo.RsqrtOp(
        stablehlo.AddOp(var, broadcast_to(_scalar(eps, acc), shape_of(var))).result
    ).result
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


# -- slicing along a dynamic dimension ------------------------------------------------------------
# Where a slice starts depends on the logical size when the start is negative (counted from
# the end) or symbolic. The padded buffer is extended by the slice's bound first, so the
# dynamic_slice never clamps its start.
def _runtime_start(ctx: LoweringContext, start, dim: int) -> ir.Value | int:
    """`start` normalized against operand 0's run-time size along `dim`."""
    return _runtime_index(ctx, start, _size(ctx, _sym(ctx, 0).shape[dim]))


def _runtime_index(ctx: LoweringContext, index, size) -> ir.Value | int:
    """PyTorch's start normalization (negative counts from the end; clamped to [0, size])
    with the run-time size."""
    if index is None:
        return 0
    if isinstance(index, SymSize):
        value = index.value
    elif int(index) >= 0 and not isinstance(size, ir.Value):
        return min(int(index), size)
    elif int(index) >= 0:
        value = _i64(int(index))
    else:
        value = stablehlo.AddOp(_i64(size), _i64(int(index))).result
    value = stablehlo.MaxOp(value, _i64(0)).result
    return stablehlo.MinOp(value, _i64(size)).result


def _pad_dim(x: ir.Value, dim: int, extra: int) -> ir.Value:
    from .helpers import full

    if extra <= 0:
        return x
    shape = shape_of(x)
    shape[dim] = extra
    return stablehlo.ConcatenateOp([x, full(0, dtype(x), shape)], dim).result


def _dynamic_slice(
    x: ir.Value, dim: int, start: ir.Value | int, length: int, step: int = 1
) -> ir.Value:
    """x[..., start : start + length*step : step, ...] for a run-time start."""
    if not isinstance(start, ir.Value) and start + (length - 1) * step + 1 <= shape_of(x)[dim]:
        starts, limits, strides = [0] * len(shape_of(x)), list(shape_of(x)), [1] * len(shape_of(x))
        starts[dim], limits[dim], strides[dim] = start, start + (length - 1) * step + 1, step
        return stablehlo.SliceOp(x, starts, limits, strides).result
    span = (length - 1) * step + 1 if length > 0 else 0
    # Static layout: XLA rejects a dynamic_slice that selects part of a dynamic dim.
    x = _pad_dim(static_layout(x), dim, span)
    shape = shape_of(x)
    sizes = list(shape)
    sizes[dim] = span
    index_type = tensor_type([], torch.int64)
    starts = [
        _i64(start)
        if d == dim
        else stablehlo.ConstantOp(
            ir.DenseElementsAttr.get_splat(
                index_type, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)
            )
        ).result
        for d in range(len(shape))
    ]
    window = stablehlo.DynamicSliceOp(x, starts, sizes).result
    if step == 1:
        return window
    limits = list(sizes)
    strides = [1] * len(sizes)
    strides[dim] = step
    return stablehlo.SliceOp(window, [0] * len(sizes), limits, strides).result


@dynamic_rule(aten.slice.Tensor, aten.slice_copy.Tensor, padding=MOVEMENT)
def _slice(ctx: LoweringContext, x, dim=0, start=None, end=None, step=1):
    """Slices a dynamic dim from its run-time start (negative starts count from the run-time end)."""
    dim = normalize_dims(dim, len(shape_of(x)))[0]
    if dim not in _dynamic_dims(ctx, 0):
        return NotImplemented
    if int(step) < 1:
        raise ctx.fail("slice step must be positive")
    begin = _runtime_start(ctx, start, dim)
    length = ctx.result_shape()[dim]
    return reshape(_dynamic_slice(x, dim, begin, length, int(step)), ctx.result_shape())


@dynamic_rule(aten.select.int, aten.select_copy.int, padding=MOVEMENT)
def _select(ctx: LoweringContext, x, dim, index):
    """Selects along a dynamic dim at a run-time position (negative indices count from the run-time end)."""
    dim = normalize_dims(dim, len(shape_of(x)))[0]
    if dim not in _dynamic_dims(ctx, 0):
        return NotImplemented
    begin = _runtime_start(ctx, index, dim)
    return reshape(_dynamic_slice(x, dim, begin, 1), ctx.result_shape())


@dynamic_rule(aten.narrow.default, aten.narrow_copy.default, padding=MOVEMENT)
def _narrow(ctx: LoweringContext, x, dim, start, length):
    """Narrows a dynamic dim from its run-time start."""
    dim = normalize_dims(dim, len(shape_of(x)))[0]
    if dim not in _dynamic_dims(ctx, 0):
        return NotImplemented
    begin = _runtime_start(ctx, start, dim)
    return reshape(_dynamic_slice(x, dim, begin, ctx.result_shape()[dim]), ctx.result_shape())


def _scatter_into(
    ctx: LoweringContext, base: ir.Value, src: ir.Value, dim: int, begin, length, step: int
) -> ir.Value:
    """base with src written at [begin : begin + length*step : step] along dim, where
    `length` is src's run-time extent: positions outside it keep base (src's padding is
    never written)."""
    from .helpers import compare, convert, select

    src = convert(src, dtype(base))
    shape = shape_of(base)
    extent = shape_of(src)[dim]
    if step != 1:
        raise ctx.dynamic_limit("a strided slice_scatter along a dynamic dimension")
    padded = _pad_dim(static_layout(base), dim, extent)
    index_type = tensor_type([], torch.int64)
    zero = stablehlo.ConstantOp(
        ir.DenseElementsAttr.get_splat(
            index_type, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)
        )
    ).result
    starts = [_i64(begin) if d == dim else zero for d in range(len(shape))]
    placed = stablehlo.DynamicUpdateSliceOp(padded, static_layout(src), starts).result
    limits = list(shape)
    placed = stablehlo.SliceOp(placed, [0] * len(shape), limits, [1] * len(shape)).result
    position = stablehlo.IotaOp(tensor_type(shape, torch.int64), dim).result
    lo = broadcast_to(_i64(begin), shape)
    hi = broadcast_to(stablehlo.AddOp(_i64(begin), _i64(length)).result, shape)
    inside = stablehlo.AndOp(compare(position, lo, "GE"), compare(position, hi, "LT")).result
    return select(inside, placed, base)


@dynamic_rule(aten.slice_scatter.default, padding=MOVEMENT)
def _slice_scatter(ctx: LoweringContext, x, src, dim=0, start=None, end=None, step=1):
    """Writes src at its run-time position along a dynamic dim; src's padding is never written."""
    dim = normalize_dims(dim, len(shape_of(x)))[0]
    if dim not in _dynamic_dims(ctx, 0) and dim not in _dynamic_dims(ctx, 1):
        return NotImplemented
    begin = _runtime_start(ctx, start, dim)
    length = _size(ctx, _sym(ctx, 1).shape[dim])
    return _scatter_into(ctx, x, src, dim, begin, length, int(step))


@dynamic_rule(aten.select_scatter.default, padding=MOVEMENT)
def _select_scatter(ctx: LoweringContext, x, src, dim, index):
    """Writes src at its run-time position along a dynamic dim."""
    dim = normalize_dims(dim, len(shape_of(x)))[0]
    if dim not in _dynamic_dims(ctx, 0):
        return NotImplemented
    begin = _runtime_start(ctx, index, dim)
    shape = shape_of(x)
    src = reshape(src, shape[:dim] + [1] + shape[dim + 1 :])
    return _scatter_into(ctx, x, src, dim, begin, 1, 1)


def _backward_base(ctx: LoweringContext, grad: ir.Value, input_sizes) -> ir.Value:
    from .helpers import full

    return full(0, dtype(grad), [int(s) for s in input_sizes])


@dynamic_rule(aten.slice_backward.default, padding=MOVEMENT)
def _slice_backward(ctx: LoweringContext, grad, input_sizes, dim, start, end, step):
    """The gradient placed at the slice's run-time position; its padding is never written."""
    out = ctx.importer.dynamic.symbolic_val(ctx.node)
    dim = normalize_dims(dim, len(input_sizes))[0]
    if dim not in ctx.importer.dynamic.dynamic_dims(out) and dim not in _dynamic_dims(ctx, 0):
        return NotImplemented
    base = _backward_base(ctx, grad, input_sizes)
    begin = _runtime_index(ctx, start, _size(ctx, out.shape[dim]))
    length = _size(ctx, _sym(ctx, 0).shape[dim])
    return _scatter_into(ctx, base, grad, dim, begin, length, int(step))


@dynamic_rule(aten.select_backward.default, padding=MOVEMENT)
def _select_backward(ctx: LoweringContext, grad, input_sizes, dim, index):
    """The gradient placed at the selected run-time position."""
    out = ctx.importer.dynamic.symbolic_val(ctx.node)
    dim = normalize_dims(dim, len(input_sizes))[0]
    if dim not in ctx.importer.dynamic.dynamic_dims(out):
        return NotImplemented
    base = _backward_base(ctx, grad, input_sizes)
    begin = _runtime_index(ctx, index, _size(ctx, out.shape[dim]))
    shape = shape_of(base)
    grad = reshape(grad, shape[:dim] + [1] + shape[dim + 1 :])
    return _scatter_into(ctx, base, grad, dim, begin, 1, 1)


def _reject_split(ctx: LoweringContext, x, split, dim=0, *args, **kwargs):
    """Splitting along a dynamic dim runs in eager (the pieces' sizes depend on where it
    ends); along static dims the ordinary rule."""
    dim = normalize_dims(dim, len(shape_of(x)))[0]
    if dim not in _dynamic_dims(ctx, 0):
        return NotImplemented
    raise ctx.dynamic_limit("splitting along a dynamic (padded) dimension")


dynamic_rule(
    aten.split,
    aten.split_with_sizes.default,
    aten.split_with_sizes_copy.default,
    aten.split_copy.Tensor,
    aten.unsafe_split.Tensor,
    aten.unsafe_split_with_sizes.default,
    padding=MOVEMENT,
)(_reject_split)
dynamic_rule(aten.unbind.int, aten.unbind_copy.int, padding=MOVEMENT)(
    _reject_along_dynamic(1, "unbind", default=0)
)


def compact_rows(ctx: LoweringContext, raw: ir.Value, layout, symbolic) -> ir.Value:
    """The compact `[lead*s, rest...]` value of an interleaved one (row_layout.py):
    its padded `[lead..., bound, rest...]` buffer, sized, read with one gather."""
    rest = [int(v) for v in symbolic.shape[1:]]
    blocked = reshape(raw, list(layout.lead) + [layout.bound] + rest)
    size = ctx.importer.dynamic.size_i32(layout.symbol, ctx.node)
    blocked = stablehlo.SetDimensionSizeOp(
        blocked, size, len(layout.lead), results=[blocked.type]
    ).result
    in_sizes = list(layout.lead) + [layout.symbol] + rest
    return _gather_reshape(ctx, blocked, in_sizes, list(symbolic.shape), shape_of(raw))


# -- scans ---------------------------------------------------------------------------------------
def _scan_on_padded_buffer(ctx: LoweringContext, x, *args, **kwargs):
    """A forward scan's valid outputs read only valid inputs (a prefix), so it runs on the
    padded buffer as a static one; the importer re-attaches the sizes to its result.
    (XLA's dynamic padder got reduce_window scans wrong with two dynamic dims: rows past
    the other dim's bound came out wrong.)"""
    if not _dynamic_dims(ctx, 0):
        return NotImplemented
    return LOWERINGS[ctx.node.target].fn(ctx, static_layout(x), *args, **kwargs)


for _op in (
    aten.cumsum.default,
    aten.cumprod.default,
    aten.cummax.default,
    aten.cummin.default,
    aten.logcumsumexp.default,
):
    dynamic_rule(_op, padding=PREFIX)(_scan_on_padded_buffer)


# -- sizes used as values inside whole-op rules ---------------------------------------------------
def _arg(ctx: LoweringContext, args, kwargs, name: str):
    """The value of argument `name` of the node's schema (positional, keyword or default)."""
    schema = ctx.node.target._schema.arguments
    for i, a in enumerate(schema):
        if a.name == name:
            if i < len(args):
                return args[i]
            if name in kwargs:
                return kwargs[name]
            return a.default_value if a.has_default_value() else None
    return None


def _with_arg(ctx: LoweringContext, args, kwargs, name: str, value):
    schema = ctx.node.target._schema.arguments
    args = list(args)
    for i, a in enumerate(schema):
        if a.name == name:
            if i < len(args):
                args[i] = value
            else:
                kwargs = {**kwargs, name: value}
    return args, kwargs


def _position(ctx: LoweringContext, name: str) -> int:
    return [a.name for a in ctx.node.target._schema.arguments].index(name)


_REDUCTION_MEAN, _REDUCTION_SUM = 1, 2


def _mean_loss(ctx: LoweringContext, *args, **kwargs):
    """reduction='mean' of a loss (or its backward) over a dynamic input divides by the
    run-time element count: the rule runs with reduction='sum', then divides."""
    if _arg(ctx, args, kwargs, "reduction") != _REDUCTION_MEAN:
        return NotImplemented
    position = _position(ctx, "self")
    sym = _sym(ctx, position)
    if not ctx.importer.dynamic.dynamic_dims(sym):
        return NotImplemented
    args, kwargs = _with_arg(ctx, args, kwargs, "reduction", _REDUCTION_SUM)
    total = LOWERINGS[ctx.node.target].fn(ctx, *args, **kwargs)
    count = _product([_size(ctx, s) for s in sym.shape])
    return stablehlo.DivOp(
        total, broadcast_to(convert(count, dtype(total)), shape_of(total))
    ).result


for _name in (
    "mse_loss",
    "mse_loss_backward",
    "binary_cross_entropy",
    "binary_cross_entropy_backward",
    "binary_cross_entropy_with_logits",
    "smooth_l1_loss",
    "smooth_l1_loss_backward",
    "huber_loss",
    "huber_loss_backward",
    "soft_margin_loss",
    "soft_margin_loss_backward",
):
    dynamic_rule(getattr(aten, _name).default, padding=COUNT)(_mean_loss)


def _reject_when(condition, what: str):
    def rule(ctx: LoweringContext, *args, **kwargs):
        if not condition(ctx, args, kwargs):
            return NotImplemented
        raise ctx.dynamic_limit(what)

    rule.__doc__ = f"{what[0].upper() + what[1:]}: runs in eager; otherwise the ordinary rule."
    return rule


def _dynamic_beyond(first: int, position_name: str = "input"):
    """Whether the tensor argument `position_name` has a dynamic dim at index >= first."""

    def condition(ctx, args, kwargs) -> bool:
        return any(d >= first for d in _dynamic_dims(ctx, _position(ctx, position_name)))

    return condition


def _training_over_dynamic(ctx, args, kwargs) -> bool:
    names = [a.name for a in ctx.node.target._schema.arguments]
    flag = "training" if "training" in names else "train" if "train" in names else None
    training = _arg(ctx, args, kwargs, flag) if flag else True
    return bool(training) and any(
        d != 1 for d in _dynamic_dims(ctx, 1 if names[0] == "grad_out" else 0)
    )


def _attention_head_dim_dynamic(ctx, args, kwargs) -> bool:
    position = _position(ctx, "query")
    sym = _sym(ctx, position)
    return _arg(ctx, args, kwargs, "scale") is None and (sym.dim() - 1) in _dynamic_dims(
        ctx, position
    )


dynamic_rule(
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_functional.default,
    aten._batch_norm_with_update.default,
    aten._batch_norm_with_update_functional.default,
    aten.native_batch_norm_backward.default,
    aten.batch_norm_backward.default,
    padding=COUNT,
)(_reject_when(_training_over_dynamic, "batch norm statistics over a dynamic dimension"))
dynamic_rule(aten.native_group_norm.default, padding=COUNT)(
    _reject_when(_dynamic_beyond(1), "group norm over a dynamic dimension")
)
dynamic_rule(aten.native_group_norm_backward.default, padding=COUNT)(
    _reject_when(_dynamic_beyond(1, "input"), "group norm over a dynamic dimension")
)
dynamic_rule(aten.native_layer_norm_backward.default, padding=COUNT)(
    _reject_when(
        lambda ctx, args, kwargs: any(
            d >= len(_sym(ctx, 1).shape) - len(args[2]) for d in _dynamic_dims(ctx, 1)
        ),
        "layer norm backward over a dynamic normalized dimension",
    )
)
dynamic_rule(
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_efficient_attention.default,
    padding=SIZE,
)(
    _reject_when(
        _attention_head_dim_dynamic,
        "attention with a dynamic head dimension (its default scale)",
    )
)


def _first_tensor(op) -> str:
    names = [a.name for a in op._schema.arguments]
    return "self" if "self" in names else "input" if "input" in names else names[0]


# Windows, pools, padding modes and resampling along a dynamic spatial dim depend on where
# it ends; along the batch dim they are per sample. Rules for every lowered overload of
# these families (the upsampling ones use sizes as values: scales).
_SPATIAL_DOC = (
    "Along a dynamic dim other than the batch dim: runs in eager (windows, padding modes and "
    "resampling depend on where the dim ends); along the batch dim the ordinary rule."
)


def _spatial_rules(names, padding: Padding) -> None:
    for name in names:
        for op in [op for op in LOWERINGS if op.__name__.split(".")[0] == name]:
            rule = _reject_when(_dynamic_beyond(1, _first_tensor(op)), f"{name} along a dynamic dimension")
            rule.__doc__ = _SPATIAL_DOC
            dynamic_rule(op, padding=padding)(rule)


_spatial_rules(
    [
        "avg_pool1d", "avg_pool2d", "avg_pool3d", "avg_pool2d_backward", "avg_pool3d_backward",
        "max_pool2d_with_indices", "max_pool3d_with_indices",
        "max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
        "adaptive_avg_pool1d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
        "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward",
        "adaptive_max_pool2d", "adaptive_max_pool3d",
        "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward",
    ],
    WINDOW,
)
_spatial_rules(
    [
        "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
        "replication_pad1d", "replication_pad2d", "replication_pad3d",
        "replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward",
        "im2col", "col2im", "pixel_shuffle", "pixel_unshuffle",
    ],
    MOVEMENT,
)
_spatial_rules(
    sorted(
        {op.__name__.split(".")[0] for op in LOWERINGS if "upsample" in op.__name__}
        | {"grid_sampler_2d", "grid_sampler_2d_backward"}
    ),
    SIZE,
)

# XLA rejects convolutions over a dynamic spatial dim ("Dynamic Spatial Convolution is not
# supported") and a dynamic kernel feature dim ("Dynamic output feature dim on convolution
# kernel is not supported"); batch-dynamic convolutions are fine.
def _convolution_beyond_batch(ctx, args, kwargs) -> bool:
    names = [a.name for a in ctx.node.target._schema.arguments]
    for position, name in enumerate(names[: len(ctx.node.args)]):
        if not isinstance(ctx.node.args[position], torch.fx.Node):
            continue
        first = 1 if name in ("input", "grad_output", "self") else 0
        if any(d >= first for d in _dynamic_dims(ctx, position)):
            return True
    return False


dynamic_rule(
    aten.convolution.default,
    aten._convolution.default,
    aten._convolution.deprecated,
    aten.convolution_backward.default,
    padding=WINDOW,
)(_reject_when(_convolution_beyond_batch, "convolution with a dynamic dimension other than the batch"))


# -- index-carrying ops ---------------------------------------------------------------------------
def _valid_positions(ctx: LoweringContext, position, shape) -> ir.Value | None:
    """i1 mask of `shape` (the padded layout of argument `position`, or of an FX node):
    True at logical positions, False in the padding of its dynamic dims; None when it
    has none."""
    from .helpers import compare

    sym = ctx.importer.dynamic.symbolic_val(position) if isinstance(position, torch.fx.Node) else _sym(ctx, position)
    valid = None
    for d in ctx.importer.dynamic.dynamic_dims(sym):
        position_d = stablehlo.IotaOp(tensor_type(list(shape), torch.int64), d).result
        inside = compare(position_d, broadcast_to(_i64(_size(ctx, sym.shape[d])), list(shape)), "LT")
        valid = inside if valid is None else stablehlo.AndOp(valid, inside).result
    return valid


def _arg_reduce_rule(largest: bool, with_values: bool):
    """argmax/argmin/max.dim/min.dim over a dynamic dim: padded positions hold the value
    that never wins (-inf/+inf or the dtype's extreme: on a tie the first logical position
    wins, as it comes first in the padded layout too), and a flattened index is computed
    from the logical strides, not the padded ones."""

    def rule(ctx: LoweringContext, x, dim=None, keepdim=False):
        from .helpers import full, max_value, min_value, select
        from .reduction import arg_reduce

        shape = shape_of(x)
        rank = len(shape)
        dims = list(range(rank)) if dim is None else normalize_dims(dim, max(rank, 1))
        if rank == 0 or not set(dims) & set(_dynamic_dims(ctx, 0)):
            return NotImplemented
        dt = dtype(x)
        valid = _valid_positions(ctx, 0, shape)
        fill = full(min_value(dt) if largest else max_value(dt), dt, shape)
        masked = static_layout(select(valid, x, fill))
        if dim is not None:
            values, indices = arg_reduce(masked, dims[0], largest)
        else:
            count = math.prod(shape)
            values, flat = arg_reduce(reshape(masked, [count]), 0, largest)
            sym = _sym(ctx, 0)
            logical = [_size(ctx, s) for s in sym.shape]
            indices = _i64(0)
            for d in range(rank):
                padded_stride = math.prod(shape[d + 1 :])
                coord = stablehlo.DivOp(flat, _i64(padded_stride)).result
                coord = stablehlo.RemOp(coord, _i64(shape[d])).result
                term = stablehlo.MulOp(coord, _i64(_product(logical[d + 1 :]))).result
                indices = stablehlo.AddOp(indices, term).result
        if with_values:
            return reshape(values, ctx.result_shape(0)), reshape(indices, ctx.result_shape(1))
        return reshape(indices, ctx.result_shape())

    rule.__doc__ = _arg_reduce_rule.__doc__
    return rule


dynamic_rule(aten.argmax.default, padding=INDEX)(_arg_reduce_rule(True, False))
dynamic_rule(aten.argmin.default, padding=INDEX)(_arg_reduce_rule(False, False))
dynamic_rule(aten.max.dim, padding=INDEX)(_arg_reduce_rule(True, True))
dynamic_rule(aten.min.dim, padding=INDEX)(_arg_reduce_rule(False, True))

# Order statistics along a dynamic dim would order the padding too.
dynamic_rule(aten.median.default, aten.nanmedian.default, padding=MOVEMENT)(
    _reject_along_dynamic(None, "median")
)
dynamic_rule(aten.median.dim, aten.nanmedian.dim, padding=MOVEMENT)(
    _reject_along_dynamic(1, "median")
)
dynamic_rule(aten.kthvalue.default, padding=MOVEMENT)(_reject_along_dynamic(2, "kthvalue", default=-1))


def _scatter_rule(ctx: LoweringContext, x, dim, index, src, *args, **kwargs):
    """scatter/scatter_add/scatter_reduce with a dynamic operand: indices into a dynamic
    dim are logical positions already (the padded layout keeps coordinates); what must
    not happen is scattering the padded rows of `index`/`src`. Padded index entries are
    set out of bounds (XLA's scatter drops those updates), and the ordinary rule runs on
    static layouts (the importer re-marks the result)."""
    from .helpers import full, select

    rank = max(len(shape_of(x)), 1)
    dim = dim % rank
    index_shape = shape_of(index)
    valid = _valid_positions(ctx, 2, index_shape) if index_shape else None
    if valid is not None:
        out_of_bounds = full(max(shape_of(x)[dim] if shape_of(x) else 1, 1), dtype(index), index_shape)
        index = select(valid, index, out_of_bounds)
    if isinstance(src, ir.Value):
        src = static_layout(src)
    lowering = LOWERINGS[ctx.node.target]
    return lowering.fn(ctx, static_layout(x), dim, static_layout(index), src, *args, **kwargs)


dynamic_rule(
    aten.scatter.src,
    aten.scatter.value,
    aten.scatter.reduce,
    aten.scatter.value_reduce,
    aten.scatter_add.default,
    aten.scatter_reduce.two,
    padding=INDEX,
)(_scatter_rule)


@dynamic_rule(aten.index.Tensor, aten.index.Tensor_hacked_twin, aten._unsafe_index.Tensor, aten._unsafe_index.Tensor_hacked_twin, padding=INDEX)
def _index_rule(ctx: LoweringContext, x, indices):
    """Advanced indexing: a negative index counts from the run-time end of its dim (the
    ordinary rule would count from the bound); a boolean mask index has a data-dependent
    shape and is not supported over a dynamic dim."""
    from .helpers import compare, select

    sym = _sym(ctx, 0)
    dyn = set(_dynamic_dims(ctx, 0))
    wrapped = list(indices)
    for d, idx in enumerate(indices):
        if idx is None or d not in dyn:
            continue
        if dtype(idx) is torch.bool:
            raise ctx.dynamic_limit("a boolean mask index over a dynamic (padded) dimension")
        ishape = shape_of(idx)
        idx64 = convert(idx, torch.int64)
        size = broadcast_to(_i64(_size(ctx, sym.shape[d])), ishape)
        negative = compare(idx64, broadcast_to(_i64(0), ishape), "LT")
        wrapped[d] = select(negative, stablehlo.AddOp(idx64, size).result, idx64)
    return LOWERINGS[ctx.node.target].fn(ctx, x, wrapped)


def _reject_dynamic_argument(name: str, what: str):
    """Rejects the op when tensor argument `name` has a dynamic dim (its padding would be
    read as data: boundaries, test elements)."""

    def rule(ctx: LoweringContext, *args, **kwargs):
        position = _position(ctx, name)
        if position < len(ctx.node.args) and isinstance(ctx.node.args[position], torch.fx.Node):
            if _dynamic_dims(ctx, position):
                raise ctx.dynamic_limit(what)
        return NotImplemented

    rule.__doc__ = f"{what[0].upper() + what[1:]}: runs in eager (the padding would be read as data); otherwise the ordinary rule."
    return rule


dynamic_rule(aten.bucketize.Tensor, aten.bucketize.Scalar, padding=INDEX)(
    _reject_dynamic_argument("boundaries", "bucketize with dynamic (padded) boundaries")
)
dynamic_rule(aten.searchsorted.Tensor, aten.searchsorted.Scalar, padding=INDEX)(
    _reject_dynamic_argument("sorted_sequence", "searchsorted with a dynamic (padded) sorted sequence")
)
dynamic_rule(aten.isin.Tensor_Tensor, aten.isin.Scalar_Tensor, padding=INDEX)(
    _reject_dynamic_argument("test_elements", "isin with dynamic (padded) test elements")
)
# Reads positions or counts that padding would change: no rule yet, so they run in eager
# with a dynamic operand.
declare_padding(
    INDEX,
    aten._unsafe_masked_index,
    aten._unsafe_masked_index_put_accumulate,
    aten.take,
    aten.put,
    aten.masked_scatter,
    aten.masked_scatter_backward,
    aten.nonzero,
    aten.nonzero_static,
    aten.masked_select,
    aten.bincount,
    aten._local_scalar_dense,
    aten.histc,
    aten._embedding_bag,
    aten._embedding_bag_forward_only,
    aten._embedding_bag_backward,
    aten._embedding_bag_dense_backward,
    aten._embedding_bag_per_sample_weights_backward,
)
declare_padding(Padding.SAFE, aten.index_select, aten.gather, aten.masked_fill, aten.isin.Tensor_Scalar)


def _logical_index(ctx: LoweringContext, index: ir.Value, index_node, size, bound: int) -> ir.Value:
    """An index into a dim of run-time size `size` (int or i64 value) and padded extent
    `bound`: negative entries count from the run-time end, and entries in the index's own
    padding are set to `bound` — out of bounds, so a scatter drops their updates."""
    from .helpers import compare, full, select

    shape = shape_of(index)
    idx = convert(index, torch.int64)
    if isinstance(size, ir.Value):
        negative = compare(idx, broadcast_to(_i64(0), shape), "LT")
        idx = select(negative, stablehlo.AddOp(idx, broadcast_to(size, shape)).result, idx)
    valid = _valid_positions(ctx, index_node, shape) if isinstance(index_node, torch.fx.Node) else None
    if valid is not None:
        idx = select(valid, idx, full(bound, torch.int64, shape))
    return idx


@dynamic_rule(
    aten.index_put.default,
    aten.index_put.hacked_twin,
    aten._unsafe_index_put.default,
    aten._unsafe_index_put.hacked_twin,
    padding=INDEX,
)
def _index_put_rule(ctx: LoweringContext, x, indices, values, accumulate=False):
    """Writes through logical indices: negative ones count from the run-time end of a
    dynamic dim, and the index's padded entries are out of bounds (never written); the
    ordinary rule runs on static layouts. A boolean mask index over padding is not
    supported."""
    sym = _sym(ctx, 0)
    nodes = list(ctx.node.args[1])
    logical = []
    for d, (idx, node) in enumerate(zip(indices, nodes)):
        if idx is None:
            logical.append(None)
            continue
        if dtype(idx) is torch.bool:
            raise ctx.dynamic_limit("index_put with a boolean mask and a dynamic (padded) operand")
        logical.append(_logical_index(ctx, idx, node, _size(ctx, sym.shape[d]), shape_of(x)[d]))
    values = static_layout(values) if isinstance(values, ir.Value) else values
    return LOWERINGS[ctx.node.target].fn(ctx, static_layout(x), logical, values, accumulate)


def _index_dim_rule(ctx: LoweringContext, x, dim, index, *args, **kwargs):
    """index_add/index_copy/index_reduce/index_fill along `dim`: the index is logical
    (negative entries from the run-time end) and its padded entries are out of bounds, so
    they neither write nor fill; the ordinary rule runs on static layouts."""
    shape = shape_of(x)
    rank = max(len(shape), 1)
    d = dim % rank
    sym = _sym(ctx, 0)
    size = _size(ctx, sym.shape[d]) if len(shape) else 1
    bound = shape[d] if len(shape) else 1
    index = _logical_index(ctx, index, ctx.node.args[2], size, bound)
    rest = [static_layout(a) if isinstance(a, ir.Value) else a for a in args]
    return LOWERINGS[ctx.node.target].fn(ctx, static_layout(x), dim, static_layout(index), *rest, **kwargs)


dynamic_rule(
    aten.index_add.default,
    aten.index_copy.default,
    aten.index_reduce.default,
    aten.index_fill.int_Scalar,
    aten.index_fill.int_Tensor,
    padding=INDEX,
)(_index_dim_rule)
