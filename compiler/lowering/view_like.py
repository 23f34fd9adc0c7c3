"""View-like and shape ops: reshapes, permutations, slicing, concatenation, padding,
diagonals, `as_strided` and their `*_scatter` / `*_copy` / `*_backward` relatives.

Semantics are functional: a view op returns a new value holding the view's elements in
logical (row-major) order. Aliasing (a later in-place write through a view) is resolved
before lowering by functionalization, so nothing here tracks storage, with one
exception: `as_strided` and `as_strided_scatter` address the *storage* of their input.
We rebuild that storage from the input's logical value, which is exact when the input
(per its FX metadata) is non-overlapping and dense — contiguous, channels-last or any
other permutation of a dense layout — and fail loudly otherwise (see `_storage_of`).
The windows of that storage are read and written by `storage_layout.py`, which the eager
device uses for its own storages.

Result shapes are taken from `node.meta['val']` wherever PyTorch already computed them
(view sizes with -1, split chunk sizes, squeeze), so the rules only decide *how* to move
elements, never re-derive PyTorch's shape logic.

Bounded dynamism (registry.Padding, declared at each registration): views that keep
every dim whole (each element stays at its logical coordinates, padding stays padding),
copies and triangular masks (by position) are `safe`; concatenation along a dynamic dim
is `masked` by XLA's dynamic padder. Reshapes, slices, flips, splits and pads have
dynamic rules; diagonals, unfold, rot90, `as_strided` and dtype views read positions that
depend on where a dynamic dim ends (`movement`, no rule: they run in eager).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import sympy
import torch

from ..context import ir, stablehlo
from .. import ir as hlo
from ..dtypes import tensor_type
from .helpers import (
    broadcast_to,
    compare,
    convert,
    dtype,
    full,
    iota,
    normalize_dim,
    rank_of,
    reduce,
    reshape,
    select,
    shape_of,
    transpose,
)
from .padded import (
    dynamic_dims,
    i64,
    is_dynamic_size,
    product,
    reject_along_dynamic,
    reject_spatial_dynamic,
    run_time_size,
    symbolic_arg,
)
from .registry import LoweringContext, lowers, Padding
from .storage_layout import (
    as_storage,
    dense_order,
    numel_of,
    read_strided,
    reinterpret,
    take_static,
    window_span,
    write_strided,
)
from .row_layout import flatten_layout, unflatten_matches
from .symsize import SymSize, static_layout

aten = torch.ops.aten


# -- family-private builders -------------------------------------------------------------------
def _reverse(x: ir.Value, dims: Sequence[int]) -> ir.Value:
    dims = sorted({int(d) for d in dims})
    if not dims:
        return x
    return stablehlo.ReverseOp(x, dims).result


def _pad(x: ir.Value, value: ir.Value, low: Sequence[int], high: Sequence[int], interior: Sequence[int] | None = None) -> ir.Value:
    """stablehlo.pad (negative `low`/`high` crop)."""
    interior = list(interior) if interior is not None else [0] * len(low)
    if not any(low) and not any(high) and not any(interior):
        return x
    return stablehlo.PadOp(x, value, list(low), list(high), interior).result


def _slice_bounds(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """PyTorch's `slice` start/end normalization: negatives wrap once, then both clamp to
    [0, size] and end >= start."""
    start = 0 if start is None else int(start)
    end = size if end is None else int(end)
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


def _inverse_permutation(perm: Sequence[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


# -- reshapes ----------------------------------------------------------------------------------
def _to_result_shape(ctx: LoweringContext, x, *args, **kwargs):
    """Every op whose effect on a contiguous value is a reshape to the result shape."""
    return reshape(x, ctx.result_shape())


def _layout_preserving(in_shape, out_shape) -> bool:
    """Whether reshaping the padded buffer keeps every element where the logical reshape
    puts it: one dynamic dim on each side, the same size, with equal static products
    before and after it (padding then stays in one contiguous block per outer index)."""

    def split(shape):
        dyn = [d for d, s in enumerate(shape) if is_dynamic_size(s)]
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


def _size_key(s):
    return str(s.node.expr) if isinstance(s, torch.SymInt) else int(s)


def _reshape_padded(ctx: LoweringContext, x, *args, **kwargs):
    """A reshape that keeps the padding in place is a plain reshape; a flattening one is
    kept row-interleaved for row-wise consumers (row_layout.py); any other moves elements
    with a gather at logical positions."""
    in_sym = symbolic_arg(ctx, 0)
    out_sym = ctx.dynamic.symbolic_val(ctx.node)
    in_dyn = ctx.dynamic.dynamic_dims(in_sym)
    out_dyn = ctx.dynamic.dynamic_dims(out_sym)
    if not in_dyn and not out_dyn:
        return NotImplemented
    rows = ctx.row_layouts
    source = ctx.node.args[0]
    layout = rows.interleaved.get(source)
    if layout is not None:
        if unflatten_matches(layout, out_sym.shape):
            return reshape(x, ctx.result_shape())  # the padded buffer is already in place
        x = rows.compacted(source)
    elif (
        flat := flatten_layout(in_sym.shape, out_sym.shape, shape_of(x)[in_dyn[0]] if in_dyn else 0)
    ) is not None:
        rows.interleaved[ctx.node] = flat
        return reshape(x, ctx.result_shape())
    if [_size_key(s) for s in in_sym.shape] == [_size_key(s) for s in out_sym.shape] or _layout_preserving(
        in_sym.shape, out_sym.shape
    ):
        return reshape(x, ctx.result_shape())
    return gather_reshape(ctx, x, in_sym.shape, out_sym.shape, ctx.result_shape())


def gather_reshape(ctx: LoweringContext, x: ir.Value, in_sizes, out_sizes, out_pad) -> ir.Value:
    """A reshape that moves padding: each output element's logical linear index is mapped
    to its input element, read with one gather of rows (the longest common static suffix
    is kept whole)."""
    in_pad = shape_of(x)
    # Common static trailing block moved as a unit.
    i, o = len(in_pad), len(out_pad)
    while i > 0 and o > 0:
        si, so = in_sizes[i - 1], out_sizes[o - 1]
        if (
            is_dynamic_size(si)
            or is_dynamic_size(so)
            or isinstance(si, sympy.Expr)
            and not isinstance(si, sympy.Integer)
            or int(si) != int(so)
        ):
            break
        i -= 1
        o -= 1
    in_lead, out_lead = in_pad[:i], out_pad[:o]
    in_log = [run_time_size(ctx, s) for s in in_sizes[:i]]
    out_log = [run_time_size(ctx, s) for s in out_sizes[:o]]
    lead_shape = list(out_lead) or [1]
    # Logical linear index of each output row.
    linear = None
    for d in range(len(out_lead)):
        idx = stablehlo.IotaOp(tensor_type(lead_shape, torch.int64), d).result
        stride = product(out_log[d + 1 :])
        term = stablehlo.MulOp(idx, broadcast_to(i64(stride), lead_shape)).result
        linear = term if linear is None else stablehlo.AddOp(linear, term).result
    if linear is None:
        linear = broadcast_to(i64(0), lead_shape)
    # The input coordinates of that logical index; the gather reads the padded input
    # directly (reshaping it first would let XLA's dynamic padder move the padding).
    count = math.prod(lead_shape)
    flat = reshape(linear, [count])
    coords = []
    for d in range(len(in_lead)):
        logical_stride = product(in_log[d + 1 :])
        coord = stablehlo.DivOp(flat, broadcast_to(i64(logical_stride), [count])).result
        coord = stablehlo.RemOp(coord, broadcast_to(i64(in_log[d]), [count])).result
        coords.append(reshape(coord, [count, 1]))
    if not coords:
        return reshape(x, out_pad)
    indices = coords[0] if len(coords) == 1 else stablehlo.ConcatenateOp(coords, 1).result
    from .indexing import gather

    trailing = in_pad[len(in_lead) :]
    taken = gather(
        x,
        indices,
        offset_dims=list(range(1, 1 + len(trailing))),
        collapsed_slice_dims=list(range(len(in_lead))),
        start_index_map=list(range(len(in_lead))),
        index_vector_dim=1,
        slice_sizes=[1] * len(in_lead) + list(trailing),
    )
    return reshape(taken, out_pad)


def compact_rows(ctx: LoweringContext, raw: ir.Value, layout, symbolic) -> ir.Value:
    """The compact `[lead*s, rest...]` value of an interleaved one (row_layout.py):
    its padded `[lead..., bound, rest...]` buffer, sized, read with one gather."""
    rest = [int(v) for v in symbolic.shape[1:]]
    blocked = reshape(raw, list(layout.lead) + [layout.bound] + rest)
    size = ctx.dynamic.size_i32(layout.symbol, ctx.node)
    blocked = stablehlo.SetDimensionSizeOp(
        blocked, size, len(layout.lead), results=[blocked.type]
    ).result
    in_sizes = list(layout.lead) + [layout.symbol] + rest
    return gather_reshape(ctx, blocked, in_sizes, list(symbolic.shape), shape_of(raw))


lowers(
    aten.view.default,
    aten.view_copy.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten._reshape_alias.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=_reshape_padded,
)(_to_result_shape)
lowers(
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze_copy.default,
    aten.squeeze_copy.dim,
    aten.squeeze_copy.dims,
    aten.unsqueeze.default,
    aten.unsqueeze_copy.default,
    dynamic=Padding.SAFE,
)(_to_result_shape)


def _identity(ctx: LoweringContext, x, *args, **kwargs):
    """alias/detach/clone: values are immutable, so the view is the value (clone's
    memory_format is a layout request with no effect on values)."""
    return x


lowers(
    aten.alias.default,
    aten.alias_copy.default,
    aten.detach.default,
    aten.detach_copy.default,
    aten.clone.default,
    # Conjugate/negative bits are lazy flags in eager PyTorch; our values are always
    # materialized, so resolving them is the identity.
    aten.resolve_conj.default,
    aten.resolve_neg.default,
    dynamic=Padding.SAFE,
)(_identity)


@lowers(aten.expand.default, aten.expand_copy.default, dynamic=Padding.SAFE)
def _expand(ctx: LoweringContext, x, size, *, implicit=False):
    return broadcast_to(x, ctx.result_shape())


@lowers(aten.permute.default, aten.permute_copy.default, dynamic=Padding.SAFE)
def _permute(ctx: LoweringContext, x, dims):
    rank = rank_of(x)
    return transpose(x, [normalize_dim(d, rank) for d in dims])


@lowers(aten.t.default, aten.t_copy.default, dynamic=Padding.SAFE)
def _t(ctx: LoweringContext, x):
    return x if rank_of(x) < 2 else transpose(x, [1, 0])


@lowers(aten.transpose.int, aten.transpose_copy.int, dynamic=Padding.SAFE)
def _transpose(ctx: LoweringContext, x, dim0, dim1):
    rank = rank_of(x)
    if rank == 0:
        return x
    d0, d1 = normalize_dim(dim0, rank), normalize_dim(dim1, rank)
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return transpose(x, perm)


@lowers(aten.movedim.int, aten.movedim.intlist, dynamic=Padding.SAFE)
def _movedim(ctx: LoweringContext, x, source, destination):
    rank = rank_of(x)
    source = [source] if isinstance(source, int) else list(source)
    destination = [destination] if isinstance(destination, int) else list(destination)
    src = [normalize_dim(s, rank) for s in source]
    dst = [normalize_dim(d, rank) for d in destination]
    perm = [-1] * rank
    for s, d in zip(src, dst):
        perm[d] = s
    rest_src = [i for i in range(rank) if i not in src]
    rest_dst = [i for i in range(rank) if i not in dst]
    for s, d in zip(rest_src, rest_dst):
        perm[d] = s
    return transpose(x, perm)


# -- slicing -----------------------------------------------------------------------------------
# Along a dynamic dim, where a slice starts depends on the logical size when the start is
# negative (counted from the end) or symbolic. The padded buffer is extended by the
# slice's bound first, so the dynamic_slice never clamps its start.
def _runtime_start(ctx: LoweringContext, start, dim: int) -> ir.Value | int:
    """`start` normalized against operand 0's run-time size along `dim`."""
    return _runtime_index(ctx, start, run_time_size(ctx, symbolic_arg(ctx, 0).shape[dim]))


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
        value = i64(int(index))
    else:
        value = stablehlo.AddOp(i64(size), i64(int(index))).result
    value = stablehlo.MaxOp(value, i64(0)).result
    return stablehlo.MinOp(value, i64(size)).result


def _pad_dim(x: ir.Value, dim: int, extra: int) -> ir.Value:
    """`x` extended by `extra` zeros at the end of `dim`."""
    if extra <= 0:
        return x
    shape = shape_of(x)
    shape[dim] = extra
    return stablehlo.ConcatenateOp([x, full(0, dtype(x), shape)], dim).result


def _dynamic_slice(x: ir.Value, dim: int, start: ir.Value | int, length: int, step: int = 1) -> ir.Value:
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
    starts = [i64(start) if d == dim else i64(0) for d in range(len(shape))]
    window = stablehlo.DynamicSliceOp(x, starts, sizes).result
    if step == 1:
        return window
    limits = list(sizes)
    strides = [1] * len(sizes)
    strides[dim] = step
    return stablehlo.SliceOp(window, [0] * len(sizes), limits, strides).result


def _slice_padded(ctx: LoweringContext, x, dim=0, start=None, end=None, step=1):
    """Slices a dynamic dim from its run-time start (negative starts count from the run-time end)."""
    dim = normalize_dim(dim, len(shape_of(x)))
    if dim not in dynamic_dims(ctx, 0):
        return NotImplemented
    if int(step) < 1:
        raise ctx.fail("slice step must be positive")
    begin = _runtime_start(ctx, start, dim)
    length = ctx.result_shape()[dim]
    return reshape(_dynamic_slice(x, dim, begin, length, int(step)), ctx.result_shape())


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor, dynamic=Padding.MOVEMENT, dynamic_rule=_slice_padded)
def _slice_tensor(ctx: LoweringContext, x, dim=0, start=None, end=None, step=1):
    dim = normalize_dim(dim, rank_of(x))
    start, end = _slice_bounds(shape_of(x)[dim], start, end)
    return reshape(hlo.slice_in_dim(x, dim, start, end, int(step)), ctx.result_shape())


def _narrow_padded(ctx: LoweringContext, x, dim, start, length):
    """Narrows a dynamic dim from its run-time start."""
    dim = normalize_dim(dim, len(shape_of(x)))
    if dim not in dynamic_dims(ctx, 0):
        return NotImplemented
    begin = _runtime_start(ctx, start, dim)
    return reshape(_dynamic_slice(x, dim, begin, ctx.result_shape()[dim]), ctx.result_shape())


@lowers(aten.narrow.default, aten.narrow_copy.default, dynamic=Padding.MOVEMENT, dynamic_rule=_narrow_padded)
def _narrow(ctx: LoweringContext, x, dim, start, length):
    dim = normalize_dim(dim, rank_of(x))
    if start < 0:
        start += shape_of(x)[dim]
    return hlo.slice_in_dim(x, dim, int(start), int(start + length))


def _select_padded(ctx: LoweringContext, x, dim, index):
    """Selects along a dynamic dim at a run-time position (negative indices count from the run-time end)."""
    dim = normalize_dim(dim, len(shape_of(x)))
    if dim not in dynamic_dims(ctx, 0):
        return NotImplemented
    begin = _runtime_start(ctx, index, dim)
    return reshape(_dynamic_slice(x, dim, begin, 1), ctx.result_shape())


@lowers(aten.select.int, aten.select_copy.int, dynamic=Padding.MOVEMENT, dynamic_rule=_select_padded)
def _select(ctx: LoweringContext, x, dim, index):
    dim = normalize_dim(dim, rank_of(x))
    size = shape_of(x)[dim]
    index = int(index) + size if index < 0 else int(index)
    return reshape(hlo.slice_in_dim(x, dim, index, index + 1), ctx.result_shape())


def _split_by_sizes(ctx: LoweringContext, x, dim: int, sizes: Sequence | None = None) -> tuple:
    """Splits along `dim` into the chunk sizes PyTorch computed (node.meta['val']); sizes
    known only at run time (`sizes` holding SymSizes) go to `_split_at_run_time_offsets`."""
    dim = normalize_dim(dim, rank_of(x))
    if sizes is not None and any(isinstance(size, SymSize) for size in sizes):
        return _split_at_run_time_offsets(x, dim, sizes)
    pieces, offset = [], 0
    for piece in ctx.meta():
        size = int(piece.shape[dim])
        pieces.append(hlo.slice_in_dim(x, dim, offset, offset + size))
        offset += size
    return tuple(pieces)


def _split_at_run_time_offsets(x: ir.Value, dim: int, sizes: Sequence) -> tuple:
    """`dim` split into pieces whose sizes may be symbolic (a MoE's tokens per expert,
    `x.split(counts.tolist())`): each piece is laid out at its size's bound and read from
    its run-time offset, the sum of the sizes before it (the importer then marks its
    logical size). Dynamo's guards hold the sizes' sum to the dim's (run-time) size, so no
    offset passes the dim's end and `_dynamic_slice`'s padding keeps the window from being
    clamped back over another piece's rows."""
    pieces, offset = [], 0
    for size in sizes:
        pieces.append(_dynamic_slice(x, dim, offset, int(size)))
        step = size.value if isinstance(size, SymSize) else int(size)
        if isinstance(offset, int) and isinstance(step, int):
            offset += step
        else:
            offset = stablehlo.AddOp(i64(offset), i64(step)).result
    return tuple(pieces)


def _reject_split_along_dynamic(ctx: LoweringContext, x, split, dim=0, *args, **kwargs):
    """Splitting along a dynamic dim into pieces of one size runs in eager (how many pieces
    there are depends on where the dim ends); along static dims the ordinary rule."""
    dim = normalize_dim(dim, len(shape_of(x)))
    if dim not in dynamic_dims(ctx, 0):
        return NotImplemented
    raise ctx.dynamic_limit("splitting along a dynamic (padded) dimension")


@lowers(
    aten.split.Tensor,
    aten.unsafe_split.Tensor,
    aten.split_copy.Tensor,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=_reject_split_along_dynamic,
)
def _split(ctx: LoweringContext, x, split_size, dim=0):
    return _split_by_sizes(ctx, x, dim)


def _split_with_sizes_padded(ctx: LoweringContext, x, split_sizes, dim=0):
    """Along a dynamic dim each piece is read from its run-time offset in the padded
    layout (whose logical entries come first); the sizes are given, so the pieces' count
    does not depend on where the dim ends."""
    dim = normalize_dim(dim, len(shape_of(x)))
    if dim not in dynamic_dims(ctx, 0):
        return NotImplemented
    return _split_at_run_time_offsets(x, dim, split_sizes)


@lowers(
    aten.split_with_sizes.default,
    aten.split_with_sizes_copy.default,
    aten.unsafe_split_with_sizes.default,
    aten.split.sizes,
    aten.split.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=_split_with_sizes_padded,
)
def _split_with_sizes(ctx: LoweringContext, x, split_sizes, dim=0):
    return _split_by_sizes(ctx, x, dim, split_sizes)


@lowers(
    aten.unbind.int,
    aten.unbind_copy.int,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_along_dynamic("unbind", dim_position=1, default=0),
)
def _unbind(ctx: LoweringContext, x, dim=0):
    dim = normalize_dim(dim, rank_of(x))
    shape = shape_of(x)
    rest = shape[:dim] + shape[dim + 1 :]
    return tuple(reshape(hlo.slice_in_dim(x, dim, i, i + 1), rest) for i in range(shape[dim]))


@lowers(aten.unfold.default, aten.unfold_copy.default, dynamic=Padding.MOVEMENT)
def _unfold(ctx: LoweringContext, x, dimension, size, step):
    """Sliding windows along `dimension` (placed there), window elements as a new last
    dim: a gather with static indices `w * step + k`."""
    out_shape = ctx.result_shape()
    if rank_of(x) == 0:
        x = reshape(x, [1])
    dim = normalize_dim(dimension, rank_of(x))
    n = shape_of(x)[dim]
    windows = (n - size) // step + 1
    index = np.arange(windows)[:, None] * step + np.arange(size)[None, :]
    gathered = take_static(x, dim, index)  # shape[:dim] + [windows, size] + shape[dim+1:]
    rank = rank_of(gathered)
    perm = [i for i in range(rank) if i != dim + 1] + [dim + 1]
    return reshape(transpose(gathered, perm), out_shape)


# -- concatenation -------------------------------------------------------------------------------
@lowers(aten.cat.default, dynamic=Padding.MASKED)
def _cat(ctx: LoweringContext, tensors, dim=0):
    """Concatenation in the promoted dtype. Like PyTorch, 1-D empty tensors (shape [0])
    are skipped whatever the other inputs' rank (legacy behaviour)."""
    out_dtype = ctx.result_dtype()
    kept = [t for t in tensors if shape_of(t) != [0]]
    if not kept:
        return full(0, out_dtype, ctx.result_shape())
    dim = normalize_dim(dim, rank_of(kept[0]))
    kept = [convert(t, out_dtype) for t in kept]
    return hlo.concatenate(kept, dim)


@lowers(aten.stack.default, dynamic=Padding.SAFE)
def _stack(ctx: LoweringContext, tensors, dim=0):
    out_dtype = ctx.result_dtype()
    shape = shape_of(tensors[0])
    dim = normalize_dim(dim, len(shape) + 1)
    expanded = shape[:dim] + [1] + shape[dim:]
    return hlo.concatenate([reshape(convert(t, out_dtype), expanded) for t in tensors], dim)


# -- reordering ----------------------------------------------------------------------------------
@lowers(
    aten.flip.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_along_dynamic("flip", dim_position=1, keyword="dims"),
)
def _flip(ctx: LoweringContext, x, dims):
    rank = rank_of(x)
    if rank == 0:
        return x
    return _reverse(x, [normalize_dim(d, rank) for d in dims])


@lowers(
    aten.roll.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_along_dynamic("roll", dim_position=2, keyword="dims"),
)
def _roll(ctx: LoweringContext, x, shifts, dims=()):
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        # No dims: roll the flattened tensor, then restore the shape.
        shape = shape_of(x)
        flat = reshape(x, [int(np.prod(shape, dtype=np.int64))])
        return reshape(_roll(ctx, flat, shifts[:1], [0]), shape)
    rank = rank_of(x)
    for shift, d in zip(shifts, dims):
        d = normalize_dim(d, rank)
        n = shape_of(x)[d]
        if n == 0:
            continue
        s = int(shift) % n
        if s:
            x = hlo.concatenate([hlo.slice_in_dim(x, d, n - s, n), hlo.slice_in_dim(x, d, 0, n - s)], d)
    return x


@lowers(aten.rot90.default, dynamic=Padding.MOVEMENT)
def _rot90(ctx: LoweringContext, x, k=1, dims=(0, 1)):
    rank = rank_of(x)
    d0, d1 = normalize_dim(dims[0], rank), normalize_dim(dims[1], rank)
    k %= 4
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    if k == 1:
        return transpose(_reverse(x, [d1]), perm)
    if k == 2:
        return _reverse(x, [d0, d1])
    if k == 3:
        return transpose(_reverse(x, [d0]), perm)
    return x


def _reject_repeat_along_dynamic(ctx: LoweringContext, x, repeats):
    """Repeating a dynamic dim interleaves copies with padding; repeating others is fine."""
    rank = len(shape_of(x))
    offset = len(repeats) - rank
    if all(int(repeats[offset + d]) == 1 for d in dynamic_dims(ctx, 0)):
        return NotImplemented
    raise ctx.dynamic_limit("repeat along a dynamic (padded) dimension")


@lowers(aten.repeat.default, dynamic=Padding.MOVEMENT, dynamic_rule=_reject_repeat_along_dynamic)
def _repeat(ctx: LoweringContext, x, repeats):
    """Tiling: broadcast to interleaved [r0, s0, r1, s1, ...] and merge pairs."""
    repeats = [int(r) for r in repeats]
    shape = [1] * (len(repeats) - rank_of(x)) + shape_of(x)
    x = reshape(x, shape)
    interleaved = [v for pair in zip(repeats, shape) for v in pair]
    dims = [2 * i + 1 for i in range(len(shape))]
    tiled = stablehlo.BroadcastInDimOp(tensor_type(interleaved, dtype(x)), x, dims).result
    return reshape(tiled, ctx.result_shape())


@lowers(
    aten.pixel_shuffle.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_spatial_dynamic(aten.pixel_shuffle.default),
)
def _pixel_shuffle(ctx: LoweringContext, x, upscale_factor):
    r = int(upscale_factor)
    *batch, c, h, w = shape_of(x)
    b = len(batch)
    x = reshape(x, batch + [c // (r * r), r, r, h, w])
    x = transpose(x, list(range(b)) + [b, b + 3, b + 1, b + 4, b + 2])
    return reshape(x, ctx.result_shape())


@lowers(
    aten.pixel_unshuffle.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_spatial_dynamic(aten.pixel_unshuffle.default),
)
def _pixel_unshuffle(ctx: LoweringContext, x, downscale_factor):
    r = int(downscale_factor)
    *batch, c, h, w = shape_of(x)
    b = len(batch)
    x = reshape(x, batch + [c, h // r, r, w // r, r])
    x = transpose(x, list(range(b)) + [b, b + 2, b + 4, b + 1, b + 3])
    return reshape(x, ctx.result_shape())


# -- padding -------------------------------------------------------------------------------------
def _pad_pairs(rank: int, pad: Sequence[int]) -> list[tuple[int, int, int]]:
    """PyTorch's pad list (last dim first, (low, high) pairs) as (dim, low, high)."""
    pad = [int(p) for p in pad]
    return [(rank - 1 - i, pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]


def _reject_padding_a_dynamic_dim(ctx: LoweringContext, x, pad, value=0):
    """Padding after a dynamic dim's end would land after the buffer's padding."""
    rank = len(shape_of(x))
    touched = {rank - 1 - i // 2 for i, p in enumerate(pad) if int(p) != 0}
    if not touched & set(dynamic_dims(ctx, 0)):
        return NotImplemented
    raise ctx.dynamic_limit("constant padding of a dynamic (padded) dimension")


@lowers(aten.constant_pad_nd.default, dynamic=Padding.MOVEMENT, dynamic_rule=_reject_padding_a_dynamic_dim)
def _constant_pad_nd(ctx: LoweringContext, x, pad, value=0):
    rank = rank_of(x)
    low, high = [0] * rank, [0] * rank
    for d, lo, hi in _pad_pairs(rank, pad):
        low[d], high[d] = lo, hi
    return _pad(x, full(value, dtype(x), []), low, high)


def _edge_pad(mode: str, ctx: LoweringContext, x, padding):
    """reflection/replication padding of the last len(padding)/2 dims. Negative pads
    crop (from the original tensor, as PyTorch does)."""
    rank = rank_of(x)
    for d, lo, hi in _pad_pairs(rank, padding):
        n = shape_of(x)[d]
        parts = []
        if lo > 0:
            if mode == "reflect":
                parts.append(_reverse(hlo.slice_in_dim(x, d, 1, lo + 1), [d]))
            else:
                parts.append(_repeat_edge(x, d, 0, lo))
        parts.append(hlo.slice_in_dim(x, d, max(-lo, 0), n - max(-hi, 0)))
        if hi > 0:
            if mode == "reflect":
                parts.append(_reverse(hlo.slice_in_dim(x, d, n - 1 - hi, n - 1), [d]))
            else:
                parts.append(_repeat_edge(x, d, n - 1, hi))
        x = hlo.concatenate(parts, d)
    return x


def _repeat_edge(x: ir.Value, dim: int, index: int, count: int) -> ir.Value:
    edge = hlo.slice_in_dim(x, dim, index, index + 1)
    shape = shape_of(edge)
    shape[dim] = count
    return broadcast_to(edge, shape)


# Padding modes read where a dynamic spatial dim ends (reject_spatial_dynamic).
for _op in (aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default):
    lowers(_op, dynamic=Padding.MOVEMENT, dynamic_rule=reject_spatial_dynamic(_op))(
        lambda ctx, x, padding: _edge_pad("reflect", ctx, x, padding)
    )
for _op in (aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default):
    lowers(_op, dynamic=Padding.MOVEMENT, dynamic_rule=reject_spatial_dynamic(_op))(
        lambda ctx, x, padding: _edge_pad("replicate", ctx, x, padding)
    )


def _replication_pad_backward(ctx: LoweringContext, grad, x, padding):
    """Gradient of replication padding: the centre passes through, each edge region sums
    into the first/last input element, cropped (negative-pad) elements get zero. There
    is no PyTorch decomposition for it, and training graphs with replicate padding hold
    it."""
    rank = rank_of(grad)
    zero = full(0, dtype(grad), [])
    for d, lo, hi in _pad_pairs(rank, padding):
        n = shape_of(x)[d]
        length = shape_of(grad)[d]
        crop_lo, crop_hi = max(-lo, 0), max(-hi, 0)
        begin = max(lo, 0)
        centre = hlo.slice_in_dim(grad, d, begin, begin + n - crop_lo - crop_hi)
        low, high = [0] * rank, [0] * rank
        low[d], high[d] = crop_lo, crop_hi
        result = _pad(centre, zero, low, high)
        for start, stop, at in ((0, lo, 0), (length - hi, length, n - 1)):
            if stop - start <= 0:
                continue
            edge = _sum_keepdim(hlo.slice_in_dim(grad, d, start, stop), d)
            low, high = [0] * rank, [0] * rank
            low[d], high[d] = at, n - 1 - at
            result = stablehlo.AddOp(result, _pad(edge, zero, low, high)).result
        grad = result
    return grad


def _sum_keepdim(x: ir.Value, dim: int) -> ir.Value:
    shape = shape_of(x)
    (total,) = reduce([x], [full(0, dtype(x), [])], [dim], lambda acc, new: [stablehlo.AddOp(acc[0], new[0]).result])
    return reshape(total, shape[:dim] + [1] + shape[dim + 1 :])


for _op in (
    aten.replication_pad1d_backward.default,
    aten.replication_pad2d_backward.default,
    aten.replication_pad3d_backward.default,
):
    lowers(_op, dynamic=Padding.MOVEMENT, dynamic_rule=reject_spatial_dynamic(_op))(_replication_pad_backward)


# -- triangles and diagonals ----------------------------------------------------------------------
def _triangle(lower: bool, ctx: LoweringContext, x, diagonal=0):
    """tril/triu: keep elements with col - row <= k (tril) or >= k (triu)."""
    shape = shape_of(x)
    rank = len(shape)
    rows, cols = iota(shape, rank - 2, torch.int64), iota(shape, rank - 1, torch.int64)
    offset = stablehlo.SubtractOp(cols, rows).result
    keep = compare(offset, full(int(diagonal), torch.int64, shape), "LE" if lower else "GE")
    return select(keep, x, full(0, dtype(x), shape))


lowers(aten.tril.default, dynamic=Padding.SAFE)(lambda ctx, x, diagonal=0: _triangle(True, ctx, x, diagonal))
lowers(aten.triu.default, dynamic=Padding.SAFE)(lambda ctx, x, diagonal=0: _triangle(False, ctx, x, diagonal))


def _diagonal_layout(shape: Sequence[int], offset: int, dim1: int, dim2: int):
    """The permutation moving (dim1, dim2) last, and the diagonal's (row0, col0, length)
    in the permuted [..., n, m] tensor."""
    rank = len(shape)
    d1, d2 = normalize_dim(dim1, rank), normalize_dim(dim2, rank)
    if d1 == d2:
        raise ValueError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    perm = [i for i in range(rank) if i not in (d1, d2)] + [d1, d2]
    n, m = shape[d1], shape[d2]
    if offset >= 0:
        r0, c0, length = 0, offset, max(min(n, m - offset), 0)
    else:
        r0, c0, length = -offset, 0, max(min(n + offset, m), 0)
    return perm, r0, c0, length


@lowers(aten.diagonal.default, aten.diagonal_copy.default, dynamic=Padding.MOVEMENT)
def _diagonal(ctx: LoweringContext, x, offset=0, dim1=0, dim2=1):
    """The square [L, L] block holding the diagonal, flattened, sliced with stride L+1."""
    perm, r0, c0, length = _diagonal_layout(shape_of(x), int(offset), dim1, dim2)
    if length == 0:
        return full(0, dtype(x), ctx.result_shape())
    xt = transpose(x, perm)
    rank = len(perm)
    block = hlo.slice_in_dim(hlo.slice_in_dim(xt, rank - 2, r0, r0 + length), rank - 1, c0, c0 + length)
    batch = shape_of(block)[:-2]
    flat = reshape(block, batch + [length * length])
    return hlo.slice_in_dim(flat, rank - 2, 0, length * length, length + 1)


def _place_on_diagonal(base: ir.Value, src: ir.Value, r0: int, offset: int) -> ir.Value:
    """`base` ([..., n, m]) with its offset-diagonal replaced by `src` ([..., L])."""
    shape = shape_of(base)
    rank = len(shape)
    n = shape[-2]
    length = shape_of(src)[-1]
    src = convert(src, dtype(base))
    low, high = [0] * (rank - 1), [0] * (rank - 1)
    low[-1], high[-1] = r0, n - r0 - length
    rows = _pad(src, full(0, dtype(base), []), low, high)  # [..., n]: row i holds src[i - r0]
    placed = stablehlo.BroadcastInDimOp(tensor_type(shape, dtype(base)), rows, list(range(rank - 1))).result
    diff = stablehlo.SubtractOp(iota(shape, rank - 1, torch.int64), iota(shape, rank - 2, torch.int64)).result
    on_diagonal = compare(diff, full(offset, torch.int64, shape), "EQ")
    return select(on_diagonal, placed, base)


@lowers(aten.diagonal_scatter.default, dynamic=Padding.MOVEMENT)
def _diagonal_scatter(ctx: LoweringContext, x, src, offset=0, dim1=0, dim2=1):
    perm, r0, _, length = _diagonal_layout(shape_of(x), int(offset), dim1, dim2)
    if length == 0:
        return x
    out = _place_on_diagonal(transpose(x, perm), src, r0, int(offset))
    return transpose(out, _inverse_permutation(perm))


@lowers(aten.diagonal_backward.default, dynamic=Padding.MOVEMENT)
def _diagonal_backward(ctx: LoweringContext, grad, input_sizes, offset, dim1, dim2):
    zeros = full(0, dtype(grad), [int(s) for s in input_sizes])
    return _diagonal_scatter(ctx, zeros, grad, offset, dim1, dim2)


@lowers(aten.diag_embed.default, dynamic=Padding.MOVEMENT)
def _diag_embed(ctx: LoweringContext, x, offset=0, dim1=-2, dim2=-1):
    """Builds [..., n, n] (batch = x.shape[:-1]) with x on the offset-diagonal, then moves
    the two new dims to dim1/dim2 of the result."""
    offset = int(offset)
    out_shape = ctx.result_shape()
    rank = len(out_shape)
    d1, d2 = normalize_dim(dim1, rank), normalize_dim(dim2, rank)
    batch = shape_of(x)[:-1]
    n = shape_of(x)[-1] + abs(offset)
    zeros = full(0, dtype(x), batch + [n, n])
    square = _place_on_diagonal(zeros, x, max(-offset, 0), offset)
    b = len(batch)
    perm, next_batch = [], 0
    for d in range(rank):
        if d == d1:
            perm.append(b)
        elif d == d2:
            perm.append(b + 1)
        else:
            perm.append(next_batch)
            next_batch += 1
    return transpose(square, perm)


# -- scatters into slices -------------------------------------------------------------------------
def _scatter_into(
    ctx: LoweringContext, base: ir.Value, src: ir.Value, dim: int, begin, length, step: int
) -> ir.Value:
    """base with src written at [begin : begin + length*step : step] along dim, where
    `length` is src's run-time extent: positions outside it keep base (src's padding is
    never written)."""
    src = convert(src, dtype(base))
    shape = shape_of(base)
    extent = shape_of(src)[dim]
    if step != 1:
        raise ctx.dynamic_limit("a strided slice_scatter along a dynamic dimension")
    padded = _pad_dim(static_layout(base), dim, extent)
    starts = [i64(begin) if d == dim else i64(0) for d in range(len(shape))]
    placed = stablehlo.DynamicUpdateSliceOp(padded, static_layout(src), starts).result
    limits = list(shape)
    placed = stablehlo.SliceOp(placed, [0] * len(shape), limits, [1] * len(shape)).result
    position = stablehlo.IotaOp(tensor_type(shape, torch.int64), dim).result
    lo = broadcast_to(i64(begin), shape)
    hi = broadcast_to(stablehlo.AddOp(i64(begin), i64(length)).result, shape)
    inside = stablehlo.AndOp(compare(position, lo, "GE"), compare(position, hi, "LT")).result
    return select(inside, placed, base)


def _slice_scatter_padded(ctx: LoweringContext, x, src, dim=0, start=None, end=None, step=1):
    """Writes src at its run-time position along a dynamic dim; src's padding is never written."""
    dim = normalize_dim(dim, len(shape_of(x)))
    if dim not in dynamic_dims(ctx, 0) and dim not in dynamic_dims(ctx, 1):
        return NotImplemented
    begin = _runtime_start(ctx, start, dim)
    length = run_time_size(ctx, symbolic_arg(ctx, 1).shape[dim])
    return _scatter_into(ctx, x, src, dim, begin, length, int(step))


@lowers(aten.slice_scatter.default, dynamic=Padding.MOVEMENT, dynamic_rule=_slice_scatter_padded)
def _slice_scatter(ctx: LoweringContext, x, src, dim=0, start=None, end=None, step=1):
    shape = shape_of(x)
    dim = normalize_dim(dim, len(shape))
    start, _ = _slice_bounds(shape[dim], start, end)
    step = int(step)
    length = shape_of(src)[dim]
    src = convert(src, dtype(x))
    if length == 0 or 0 in shape:
        return x
    if step == 1:
        starts = [full(start if d == dim else 0, torch.int64, []) for d in range(len(shape))]
        return stablehlo.DynamicUpdateSliceOp(x, src, starts).result
    # Strided: spread src with interior padding and select where it landed.
    low, high, interior = [0] * len(shape), [0] * len(shape), [0] * len(shape)
    low[dim], interior[dim] = start, step - 1
    high[dim] = shape[dim] - (start + (length - 1) * step + 1)
    placed = _pad(src, full(0, dtype(x), []), low, high, interior)
    mask = _pad(full(True, torch.bool, shape_of(src)), full(False, torch.bool, []), low, high, interior)
    return select(mask, placed, x)


def _select_scatter_padded(ctx: LoweringContext, x, src, dim, index):
    """Writes src at its run-time position along a dynamic dim."""
    dim = normalize_dim(dim, len(shape_of(x)))
    if dim not in dynamic_dims(ctx, 0):
        return NotImplemented
    begin = _runtime_start(ctx, index, dim)
    shape = shape_of(x)
    src = reshape(src, shape[:dim] + [1] + shape[dim + 1 :])
    return _scatter_into(ctx, x, src, dim, begin, 1, 1)


@lowers(aten.select_scatter.default, dynamic=Padding.MOVEMENT, dynamic_rule=_select_scatter_padded)
def _select_scatter(ctx: LoweringContext, x, src, dim, index):
    shape = shape_of(x)
    dim = normalize_dim(dim, len(shape))
    index = int(index) + shape[dim] if index < 0 else int(index)
    src = reshape(src, shape[:dim] + [1] + shape[dim + 1 :])
    return _slice_scatter(ctx, x, src, dim, index, index + 1, 1)


def _slice_backward_padded(ctx: LoweringContext, grad, input_sizes, dim, start, end, step):
    """The gradient placed at the slice's run-time position; its padding is never written."""
    out = ctx.dynamic.symbolic_val(ctx.node)
    dim = normalize_dim(dim, len(input_sizes))
    if dim not in ctx.dynamic.dynamic_dims(out) and dim not in dynamic_dims(ctx, 0):
        return NotImplemented
    base = full(0, dtype(grad), [int(s) for s in input_sizes])
    begin = _runtime_index(ctx, start, run_time_size(ctx, out.shape[dim]))
    length = run_time_size(ctx, symbolic_arg(ctx, 0).shape[dim])
    return _scatter_into(ctx, base, grad, dim, begin, length, int(step))


@lowers(aten.slice_backward.default, dynamic=Padding.MOVEMENT, dynamic_rule=_slice_backward_padded)
def _slice_backward(ctx: LoweringContext, grad, input_sizes, dim, start, end, step):
    zeros = full(0, dtype(grad), [int(s) for s in input_sizes])
    return _slice_scatter(ctx, zeros, grad, dim, start, end, step)


def _select_backward_padded(ctx: LoweringContext, grad, input_sizes, dim, index):
    """The gradient placed at the selected run-time position."""
    out = ctx.dynamic.symbolic_val(ctx.node)
    dim = normalize_dim(dim, len(input_sizes))
    if dim not in ctx.dynamic.dynamic_dims(out):
        return NotImplemented
    base = full(0, dtype(grad), [int(s) for s in input_sizes])
    begin = _runtime_index(ctx, index, run_time_size(ctx, out.shape[dim]))
    shape = shape_of(base)
    grad = reshape(grad, shape[:dim] + [1] + shape[dim + 1 :])
    return _scatter_into(ctx, base, grad, dim, begin, 1, 1)


@lowers(aten.select_backward.default, dynamic=Padding.MOVEMENT, dynamic_rule=_select_backward_padded)
def _select_backward(ctx: LoweringContext, grad, input_sizes, dim, index):
    zeros = full(0, dtype(grad), [int(s) for s in input_sizes])
    return _select_scatter(ctx, zeros, grad, dim, index)


# -- as_strided: indexing the input's storage (storage_layout.py builds the windows) -------------------
def _storage_of(ctx: LoweringContext, x: ir.Value, meta, what: str) -> ir.Value:
    """x's storage as a flat value. Requires a non-overlapping dense layout (then the
    storage is a permutation of the logical value)."""
    if not isinstance(meta, torch.Tensor):
        raise ctx.fail(f"{what}: the input has no tensor metadata to read its strides from")
    size, stride = tuple(meta.shape), tuple(meta.stride())
    if meta.numel() != 0 and dense_order(size, stride) is None:
        raise ctx.fail(
            f"{what} of an input with sizes {list(size)} and strides {list(stride)} "
            "is not supported: the input's storage is not dense, so it cannot be rebuilt from "
            "its value (as_strided is only lowered over non-overlapping dense inputs)"
        )
    return as_storage(x, size, stride)


def _outside(size, stride, offset: int, numel: int) -> bool:
    span = window_span(size, stride, offset)
    return span is not None and (span[0] < 0 or span[1] >= numel)


@lowers(aten.as_strided.default, aten.as_strided_copy.default, dynamic=Padding.MOVEMENT)
def _as_strided(ctx: LoweringContext, x, size, stride, storage_offset=None):
    """A window of the input's storage. Exact when the input is non-overlapping and dense
    (PyTorch's functional graphs apply as_strided to a base, which is contiguous); other
    inputs fail because their storage holds elements the value does not carry."""
    meta = ctx.arg_meta(0)
    storage = _storage_of(ctx, x, meta, "as_strided")
    base_offset = int(meta.storage_offset())
    offset = base_offset if storage_offset is None else int(storage_offset)
    numel = shape_of(storage)[0]
    if _outside(size, stride, offset - base_offset, numel):
        raise ctx.fail(
            f"as_strided(size={list(size)}, stride={list(stride)}, storage_offset={offset}) reads "
            f"storage outside the input's {numel} elements (at offset {base_offset}); only views "
            "within the input's own elements can be lowered"
        )
    return reshape(read_strided(storage, size, stride, offset - base_offset), ctx.result_shape())


@lowers(aten.as_strided_scatter.default, dynamic=Padding.MOVEMENT)
def _as_strided_scatter(ctx: LoweringContext, x, src, size, stride, storage_offset=None):
    """`out = x.clone(); out.as_strided(size, stride, offset).copy_(src)`. The clone is a
    fresh storage (offset 0) in x's dense layout; positions written twice take the last
    write in logical order."""
    meta = ctx.arg_meta(0)
    storage = _storage_of(ctx, x, meta, "as_strided_scatter")
    numel = shape_of(storage)[0]
    offset = 0 if storage_offset is None else int(storage_offset)
    if _outside(size, stride, offset, numel):
        raise ctx.fail(
            f"as_strided_scatter(size={list(size)}, stride={list(stride)}, storage_offset={offset}) "
            f"writes outside the input's {numel} elements"
        )
    if any(int(st) == 0 and int(n) > 1 for n, st in zip(size, stride)):
        # PyTorch's copy_ refuses such a write ("more than one element of the written-to
        # tensor refers to a single memory location"): eager raises that error.
        raise ctx.fail(
            f"as_strided_scatter(size={list(size)}, stride={list(stride)}) writes a window with a zero "
            "stride, which PyTorch refuses; eager reports it"
        )
    if numel_of(size) == 0:
        return x
    written = write_strided(storage, convert(src, dtype(x)), size, stride, offset)
    return read_strided(written, tuple(meta.shape), tuple(meta.stride()), 0)


# -- values: copies, dtype conversion, dtype views ------------------------------------------------------
@lowers(aten.copy.default, dynamic=Padding.SAFE)
def _copy(ctx: LoweringContext, x, src, non_blocking=False):
    """The value of `x.copy_(src)`: src converted to x's dtype and broadcast to x's shape."""
    return broadcast_to(convert(src, dtype(x)), shape_of(x))


@lowers(aten._to_copy.default, dynamic=Padding.SAFE)
def _to_copy(ctx: LoweringContext, x, **kwargs):
    """dtype conversion (complex -> real keeps the real part, as PyTorch does). Device,
    layout, memory_format, pin_memory and non_blocking do not change values."""
    return convert(x, ctx.result_dtype())


@lowers(torch.ops.prims.convert_element_type.default, dynamic=Padding.SAFE)
def _convert_element_type(ctx: LoweringContext, x, dtype_):
    """prims' dtype conversion, as `_to_copy`. aot_autograd emits it for a Python float
    traced as a graph input (a float argument that changes between calls)."""
    return convert(x, ctx.result_dtype())


@lowers(aten.view_as_real.default, dynamic=Padding.SAFE)
def _view_as_real(ctx: LoweringContext, x):
    shape = shape_of(x) + [1]
    parts = [reshape(op(x).result, shape) for op in (stablehlo.RealOp, stablehlo.ImagOp)]
    return hlo.concatenate(parts, len(shape) - 1)


@lowers(aten.view_as_complex.default, dynamic=Padding.SAFE)
def _view_as_complex(ctx: LoweringContext, x):
    rank = rank_of(x)
    out_shape = shape_of(x)[:-1]
    real = reshape(hlo.slice_in_dim(x, rank - 1, 0, 1), out_shape)
    imag = reshape(hlo.slice_in_dim(x, rank - 1, 1, 2), out_shape)
    return stablehlo.ComplexOp(real, imag).result


@lowers(aten.view.dtype, aten.view_copy.dtype, dynamic=Padding.MOVEMENT)
def _view_dtype(ctx: LoweringContext, x, dtype_):
    """Reinterprets the bytes (`storage_layout.reinterpret`): a different element size
    changes the last dim."""
    if dtype(x) == ctx.result_dtype():
        return x
    return reshape(reinterpret(x, ctx.result_dtype()), ctx.result_shape())


@lowers(aten.resize_.default, dynamic=Padding.MOVEMENT)
def _resize(ctx: LoweringContext, x, size, *, memory_format=None):
    """The value after `resize_`: the first numel(size) elements of the flattened input,
    in the new shape. Elements past the old end are uninitialized in PyTorch; we use
    zeros (as for `empty`)."""
    out_shape = ctx.result_shape()
    count = 1
    for s in out_shape:
        count *= s
    flat = reshape(x, [_numel(shape_of(x))])
    have = shape_of(flat)[0]
    if count <= have:
        flat = hlo.slice_in_dim(flat, 0, 0, count)
    else:
        padding = full(0, dtype(x), [count - have])
        flat = stablehlo.ConcatenateOp([flat, padding], 0).result
    return reshape(flat, out_shape)


def _numel(shape) -> int:
    total = 1
    for s in shape:
        total *= s
    return total
