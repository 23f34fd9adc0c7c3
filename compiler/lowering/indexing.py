"""Indexing, gather/scatter and search ops: advanced indexing (`index`, `index_put`),
`gather` / `scatter*` / `scatter_reduce`, the `index_*` family, masked ops, `take` /
`put`, `_embedding_bag`, `searchsorted` / `bucketize`, and clear failures for the ops
whose output shape depends on data (`nonzero`, `masked_select`, `.item()`, ...).

Everything lowers to `stablehlo.gather` / `stablehlo.scatter` with static shapes. Index
tensors are converted to `i32` (when the indexed size allows) because that is what TPUs
gather with natively; out-of-range indices are undefined behaviour in this lowering
(PyTorch raises), gathers clamp them and scatters drop them.
"""

from __future__ import annotations

import math
from functools import partial
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..context import ir, stablehlo
from .. import ir as hlo
from .helpers import (
    broadcast_shapes,
    broadcast_to,
    compare,
    convert,
    dtype,
    full,
    iota,
    is_nan,
    max_value,
    min_value,
    rank_of,
    reduce,
    reshape,
    scalar_region,
    select,
    shape_of,
)
from .padded import dynamic_dims, i64, reject_dynamic_argument, run_time_size, symbolic_arg, valid_positions
from .registry import LOWERINGS, LoweringContext, lowers, metadata_rule, Padding
from .symsize import static_layout

aten = torch.ops.aten

_MASK_DTYPES = (torch.bool, torch.uint8)


# -- small builders ------------------------------------------------------------------------
def _index_dtype(size: int) -> torch.dtype:
    """i32 indices where they can address `size` elements (TPUs gather with i32)."""
    return torch.int32 if size < 2**31 else torch.int64


def _add_scalar(x: ir.Value, value) -> ir.Value:
    return stablehlo.AddOp(x, full(value, dtype(x), shape_of(x))).result


def _as_index(index: ir.Value, size: int, *, wrap: bool, dt: torch.dtype | None = None) -> ir.Value:
    """`index` as an index tensor of `dt`; with `wrap`, negative entries count from the
    end (`i + size`), as PyTorch's advanced indexing does."""
    dt = dt or _index_dtype(size)
    index = convert(index, dt)
    if wrap:
        negative = compare(index, full(0, dt, shape_of(index)), "LT")
        index = select(negative, _add_scalar(index, size), index)
    return index


def clamp_index(index: ir.Value, lo: int, hi: int) -> ir.Value:
    """`index` clamped to [lo, hi] in its own dtype (shared with ctc.py)."""
    dt = dtype(index)
    return stablehlo.ClampOp(full(lo, dt, []), index, full(hi, dt, [])).result


def _dims_attr(kind: str, **fields) -> ir.Attribute:
    parts = []
    for name, value in fields.items():
        if isinstance(value, (list, tuple)):
            if value:
                parts.append(f"{name} = [{', '.join(str(int(v)) for v in value)}]")
        else:
            parts.append(f"{name} = {int(value)}")
    return ir.Attribute.parse(f"#stablehlo.{kind}<{', '.join(parts)}>")


def gather(
    operand: ir.Value,
    indices: ir.Value,
    *,
    offset_dims: Sequence[int] = (),
    collapsed_slice_dims: Sequence[int] = (),
    start_index_map: Sequence[int],
    index_vector_dim: int,
    slice_sizes: Sequence[int],
    operand_batching_dims: Sequence[int] = (),
    start_indices_batching_dims: Sequence[int] = (),
) -> ir.Value:
    """stablehlo.gather with its dimension numbers as keywords (the view_like and
    distances families use it too)."""
    attr = _dims_attr(
        "gather",
        offset_dims=offset_dims,
        collapsed_slice_dims=collapsed_slice_dims,
        operand_batching_dims=operand_batching_dims,
        start_indices_batching_dims=start_indices_batching_dims,
        start_index_map=start_index_map,
        index_vector_dim=index_vector_dim,
    )
    return stablehlo.GatherOp(operand, indices, attr, [int(s) for s in slice_sizes]).result


def _take_1d(operand: ir.Value, index: ir.Value) -> ir.Value:
    """`operand[index]` for a 1-D operand and an index tensor of any shape."""
    return gather(
        operand, index, collapsed_slice_dims=[0], start_index_map=[0],
        index_vector_dim=rank_of(index), slice_sizes=[1],
    )


def take_rows(operand: ir.Value, index: ir.Value) -> ir.Value:
    """`operand[index]` along dim 0 for a 1-D index: rows of a rank-r operand."""
    shape = shape_of(operand)
    (k,) = shape_of(index)
    return gather(
        operand, reshape(index, [k, 1]), offset_dims=list(range(1, len(shape))), collapsed_slice_dims=[0],
        start_index_map=[0], index_vector_dim=1, slice_sizes=[1] + shape[1:],
    )


def _combiner(kind: str, dt: torch.dtype) -> Callable[[ir.Value, ir.Value], ir.Value]:
    """The scatter update computation `(current, update) -> new` for a reduction."""
    if kind == "replace":
        return lambda current, update: update
    if dt is torch.bool:
        op = {"add": stablehlo.OrOp, "mul": stablehlo.AndOp, "max": stablehlo.OrOp, "min": stablehlo.AndOp}[kind]
    else:
        op = {"add": stablehlo.AddOp, "mul": stablehlo.MulOp, "max": stablehlo.MaxOp, "min": stablehlo.MinOp}[kind]
    return lambda current, update: op(current, update).result


@dataclass(frozen=True)
class ScatterSpec:
    """A scatter's index tensor and dimension numbers, applied with different update
    values and combiners (scatter_reduce needs several scatters at the same indices)."""

    indices: ir.Value
    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int
    input_batching_dims: tuple[int, ...] = ()
    scatter_indices_batching_dims: tuple[int, ...] = ()

    def apply(self, operand: ir.Value, updates: ir.Value, kind: str) -> ir.Value:
        attr = _dims_attr(
            "scatter",
            update_window_dims=self.update_window_dims,
            inserted_window_dims=self.inserted_window_dims,
            input_batching_dims=self.input_batching_dims,
            scatter_indices_batching_dims=self.scatter_indices_batching_dims,
            scatter_dims_to_operand_dims=self.scatter_dims_to_operand_dims,
            index_vector_dim=self.index_vector_dim,
        )
        dt = dtype(operand)
        updates = convert(updates, dt)
        op = stablehlo.ScatterOp([operand.type], [operand], self.indices, [updates], attr)
        combine = _combiner(kind, dt)
        scalar_region(op.update_computation, [dt, dt], lambda args: [combine(args[0], args[1])])
        return op.results[0]


def prefix_sum_last_axis(x: ir.Value) -> ir.Value:
    """Inclusive prefix sum along the last axis in log2(n) shifted adds (Hillis-Steele):
    O(n log n) work and no quadratic reduce_window on backends that lack a scan."""
    shape = shape_of(x)
    rank, n = len(shape), shape[-1]
    zero = full(0, dtype(x), [])
    shift = 1
    while shift < n:
        head = stablehlo.SliceOp(x, [0] * rank, shape[:-1] + [n - shift], [1] * rank).result
        shifted = stablehlo.PadOp(head, zero, [0] * (rank - 1) + [shift], [0] * rank, [0] * rank).result
        x = stablehlo.AddOp(x, shifted).result
        shift *= 2
    return x


def _floor_divide_int(a: ir.Value, b: ir.Value) -> ir.Value:
    """Integer division rounding toward -inf (PyTorch's `div(..., rounding_mode="floor")`)."""
    q = stablehlo.DivOp(a, b).result
    shape, dt = shape_of(q), dtype(q)
    zero = full(0, dt, shape)
    rem = stablehlo.RemOp(a, b).result
    fix = stablehlo.AndOp(
        compare(rem, zero, "NE"), compare(compare(a, zero, "LT"), compare(b, zero, "LT"), "NE")
    ).result
    return select(fix, _add_scalar(q, -1), q)


def _is_mask(value) -> bool:
    return isinstance(value, ir.Value) and dtype(value) in _MASK_DTYPES


_DATA_DEPENDENT = (
    "its output shape depends on the values of a tensor (data-dependent), which a static-shape "
    "XLA program cannot express"
)


# -- advanced indexing: index / index_put --------------------------------------------------------
@dataclass(frozen=True)
class _AdvancedIndex:
    """`self[indices]` with `indices` a list of index tensors and Nones, as a gather:
    `stacked` is the broadcast indices stacked on a trailing axis, `dims` the operand dims
    they index, `offset_dims` where the remaining (sliced) dims land in the result."""

    stacked: ir.Value
    dims: tuple[int, ...]
    batch_rank: int
    offset_dims: tuple[int, ...]
    result_shape: tuple[int, ...]


def _advanced_index(ctx: LoweringContext, self: ir.Value, indices, *, wrap: bool = True, clamp: tuple | None = None) -> _AdvancedIndex | None:
    shape = shape_of(self)
    rank = len(shape)
    if len(indices) > rank:
        raise ctx.fail(f"too many indices ({len(indices)}) for a tensor of rank {rank}")
    dims: list[int] = []
    tensors: list[ir.Value] = []
    for d, index in enumerate(indices):
        if index is None:
            continue
        if _is_mask(index):
            raise ctx.fail(
                "indexing with a boolean mask is not supported: " + _DATA_DEPENDENT
                + " (rewrite it as torch.where(mask, x, other) or use a fixed-size index)"
            )
        dims.append(d)
        tensors.append(index)
    if not dims:
        return None
    batch = broadcast_shapes(*[shape_of(t) for t in tensors])
    idt = _index_dtype(max(shape[d] for d in dims) + 1)
    columns = []
    for d, t in zip(dims, tensors):
        t = convert(t, idt)
        if clamp is not None:
            t = clamp_index(t, clamp[0](shape[d]), clamp[1](shape[d]))
        if wrap:
            t = _as_index(t, shape[d], wrap=True, dt=idt)
        columns.append(reshape(broadcast_to(t, batch), batch + [1]))
    stacked = hlo.concatenate(columns, len(batch))
    remaining = [d for d in range(rank) if d not in dims]
    if dims == list(range(dims[0], dims[-1] + 1)):
        # Adjacent advanced indices: the broadcast index dims replace them in place.
        first = dims[0]
        offset_dims = list(range(first)) + [first + len(batch) + i for i in range(len(remaining) - first)]
        result_shape = shape[:first] + batch + shape[dims[-1] + 1:]
    else:
        # Separated by a slice: the index dims go first (NumPy's rule).
        offset_dims = [len(batch) + i for i in range(len(remaining))]
        result_shape = batch + [shape[d] for d in remaining]
    return _AdvancedIndex(stacked, tuple(dims), len(batch), tuple(offset_dims), tuple(result_shape))


def _gather_advanced(self: ir.Value, plan: _AdvancedIndex) -> ir.Value:
    shape = shape_of(self)
    if 0 in plan.result_shape or any(shape[d] == 0 for d in plan.dims):
        return full(0, dtype(self), plan.result_shape)
    return gather(
        self, plan.stacked,
        offset_dims=plan.offset_dims,
        collapsed_slice_dims=plan.dims,
        start_index_map=plan.dims,
        index_vector_dim=plan.batch_rank,
        slice_sizes=[1 if d in plan.dims else s for d, s in enumerate(shape)],
    )


def _scatter_advanced(self: ir.Value, plan: _AdvancedIndex, values: ir.Value, kind: str) -> ir.Value:
    if 0 in plan.result_shape or 0 in shape_of(self):
        return self
    updates = broadcast_to(convert(values, dtype(self)), list(plan.result_shape))
    spec = ScatterSpec(plan.stacked, plan.offset_dims, plan.dims, plan.dims, plan.batch_rank)
    return spec.apply(self, updates, kind)


def _index_padded(ctx: LoweringContext, x, indices):
    """Advanced indexing: a negative index counts from the run-time end of its dim (the
    ordinary rule would count from the bound), and an index past the end is clamped to
    the run-time last element, as the static program's gather clamps it to the last one
    (the ordinary rule would read the padding between the size and the bound). PyTorch's
    decompositions rely on that clamp: `_unsafe_index` is unchecked, and eager's fused
    kernels clamp where the decomposition does not. A boolean mask index has a
    data-dependent shape and is not supported over a dynamic dim."""
    sym = symbolic_arg(ctx, 0)
    dyn = set(dynamic_dims(ctx, 0))
    wrapped = list(indices)
    for d, idx in enumerate(indices):
        if idx is None or d not in dyn:
            continue
        if dtype(idx) is torch.bool:
            raise ctx.dynamic_limit("a boolean mask index over a dynamic (padded) dimension")
        ishape = shape_of(idx)
        idx64 = convert(idx, torch.int64)
        size = i64(run_time_size(ctx, sym.shape[d]))
        negative = compare(idx64, broadcast_to(i64(0), ishape), "LT")
        idx64 = select(negative, stablehlo.AddOp(idx64, broadcast_to(size, ishape)).result, idx64)
        last = stablehlo.SubtractOp(size, i64(1)).result
        wrapped[d] = stablehlo.ClampOp(i64(0), idx64, last).result
    return LOWERINGS[ctx.node.target].fn(ctx, x, wrapped)


@lowers(
    aten.index.Tensor,
    aten.index.Tensor_hacked_twin,
    aten._unsafe_index.Tensor,
    aten._unsafe_index.Tensor_hacked_twin,
    dynamic=Padding.INDEX,
    dynamic_rule=_index_padded,
)
def _index(ctx, self, indices):
    plan = _advanced_index(ctx, self, indices)
    return self if plan is None else _gather_advanced(self, plan)


def _index_put_mask(ctx, self, indices, values, accumulate):
    """`self[mask] = values` where the values broadcast over the selected elements (a
    scalar or a row): a select, no data-dependent shape. Other mask forms fail."""
    positions = [i for i, t in enumerate(indices) if t is not None]
    if len(positions) != 1:
        raise ctx.fail("index_put with a boolean mask mixed with other indices is not supported: " + _DATA_DEPENDENT)
    p = positions[0]
    mask = convert(indices[p], torch.bool)
    shape = shape_of(self)
    rank, m = len(shape), rank_of(mask)
    # `values` broadcasts against shape[:p] + [number selected] + shape[p + m:]; place its
    # axes in self's space, the selected-elements axis (which must be 1) over the mask dims.
    vshape = shape_of(values)
    missing = (rank - m + 1) - len(vshape)
    expanded = [1] * rank
    for j, size in enumerate(vshape):
        t = j + missing
        if t < p:
            expanded[t] = size
        elif t == p:
            if size != 1:
                raise ctx.fail(
                    "index_put with a boolean mask and one value per selected element is not supported: "
                    + _DATA_DEPENDENT + " (use a scalar value, or masked_scatter)"
                )
        else:
            expanded[t - 1 + m] = size
    vals = broadcast_to(reshape(convert(values, dtype(self)), expanded), shape)
    mask_b = broadcast_to(reshape(mask, [1] * p + shape_of(mask) + [1] * (rank - p - m)), shape)
    if accumulate:
        vals = select(mask_b, vals, full(0, dtype(self), shape))
        if dtype(self) is torch.bool:
            return stablehlo.OrOp(self, vals).result
        return stablehlo.AddOp(self, vals).result
    return select(mask_b, vals, self)


def _logical_index(ctx: LoweringContext, index: ir.Value, index_node, size, bound: int) -> ir.Value:
    """An index into a dim of run-time size `size` (int or i64 value) and padded extent
    `bound`: negative entries count from the run-time end, and entries in the index's own
    padding are set to `bound` — out of bounds, so a scatter drops their updates."""
    shape = shape_of(index)
    idx = convert(index, torch.int64)
    if isinstance(size, ir.Value):
        negative = compare(idx, broadcast_to(i64(0), shape), "LT")
        idx = select(negative, stablehlo.AddOp(idx, broadcast_to(size, shape)).result, idx)
    valid = valid_positions(ctx, index_node, shape) if isinstance(index_node, torch.fx.Node) else None
    if valid is not None:
        idx = select(valid, idx, full(bound, torch.int64, shape))
    return idx


def _index_put_padded(ctx: LoweringContext, x, indices, values, accumulate=False):
    """Writes through logical indices: negative ones count from the run-time end of a
    dynamic dim, and the index's padded entries are out of bounds (never written); the
    ordinary rule runs on static layouts. A boolean mask index over padding is not
    supported."""
    sym = symbolic_arg(ctx, 0)
    nodes = list(ctx.node.args[1])
    logical = []
    for d, (idx, node) in enumerate(zip(indices, nodes)):
        if idx is None:
            logical.append(None)
            continue
        if dtype(idx) is torch.bool:
            raise ctx.dynamic_limit("index_put with a boolean mask and a dynamic (padded) operand")
        logical.append(_logical_index(ctx, idx, node, run_time_size(ctx, sym.shape[d]), shape_of(x)[d]))
    values = static_layout(values) if isinstance(values, ir.Value) else values
    return LOWERINGS[ctx.node.target].fn(ctx, static_layout(x), logical, values, accumulate)


@lowers(
    aten.index_put.default,
    aten.index_put.hacked_twin,
    aten._unsafe_index_put.default,
    aten._unsafe_index_put.hacked_twin,
    dynamic=Padding.INDEX,
    dynamic_rule=_index_put_padded,
)
def _index_put(ctx, self, indices, values, accumulate=False):
    if any(_is_mask(t) for t in indices):
        return _index_put_mask(ctx, self, indices, values, accumulate)
    plan = _advanced_index(ctx, self, indices)
    if plan is None:
        shape = shape_of(self)
        values = broadcast_to(convert(values, dtype(self)), shape)
        return _combiner("add" if accumulate else "replace", dtype(self))(self, values)
    return _scatter_advanced(self, plan, values, "add" if accumulate else "replace")


@lowers(aten._unsafe_masked_index.default, dynamic=Padding.INDEX)
def _unsafe_masked_index(ctx, self, mask, indices, fill):
    # torch._decomp: indices clamped to [0, size - 1] (a gather clamps the same way),
    # then masked_fill(~mask, fill).
    out_shape, out_dtype = ctx.result_shape(), ctx.result_dtype()
    if 0 in shape_of(self) or 0 in out_shape:
        return full(fill, out_dtype, out_shape)
    plan = _advanced_index(ctx, self, indices, wrap=False)
    gathered = self if plan is None else _gather_advanced(self, plan)
    return select(convert(mask, torch.bool), gathered, full(fill, out_dtype, out_shape))


@lowers(aten._unsafe_masked_index_put_accumulate.default, dynamic=Padding.INDEX)
def _unsafe_masked_index_put_accumulate(ctx, self, mask, indices, values):
    if 0 in shape_of(self):
        return self
    masked = select(convert(mask, torch.bool), values, full(0, dtype(values), []))
    plan = _advanced_index(ctx, self, indices, clamp=(lambda s: -s, lambda s: s - 1))
    if plan is None:
        return stablehlo.AddOp(self, broadcast_to(convert(masked, dtype(self)), shape_of(self))).result
    return _scatter_advanced(self, plan, masked, "add")


# -- index_select / gather / take ------------------------------------------------------------------
@lowers(aten.index_select.default, dynamic=Padding.SAFE)
def _index_select(ctx, self, dim, index):
    out_shape = ctx.result_shape()
    if rank_of(self) == 0:
        self = reshape(self, [1])
    dim = dim % rank_of(self)
    index = reshape(index, [max(1, math.prod(shape_of(index)))] if rank_of(index) == 0 else shape_of(index))
    plan = _advanced_index(ctx, self, [None] * dim + [index], wrap=False)
    return reshape(_gather_advanced(self, plan), out_shape)


@lowers(aten.gather.default, dynamic=Padding.SAFE)
def _gather_dim(ctx, self, dim, index, *, sparse_grad=False):
    out_shape = ctx.result_shape()
    if 0 in out_shape:
        return full(0, dtype(self), out_shape)
    if rank_of(self) == 0:
        self = reshape(self, [1])
    if rank_of(index) == 0:
        index = reshape(index, [1])
    rank = rank_of(self)
    dim = dim % rank
    ishape = shape_of(index)
    # Only self[..., :index.size(d), ...] is read along the other dims: slice to the
    # index's shape so they become gather batching dims.
    limits = [shape_of(self)[d] if d == dim else ishape[d] for d in range(rank)]
    if limits != shape_of(self):
        self = stablehlo.SliceOp(self, [0] * rank, limits, [1] * rank).result
    others = [d for d in range(rank) if d != dim]
    index = convert(index, _index_dtype(shape_of(self)[dim]))
    result = gather(
        self, index,
        collapsed_slice_dims=[dim], start_index_map=[dim], index_vector_dim=rank,
        slice_sizes=[1] * rank, operand_batching_dims=others, start_indices_batching_dims=others,
    )
    return reshape(result, out_shape)


@lowers(aten.take.default, dynamic=Padding.INDEX)
def _take(ctx, self, index):
    out_shape = ctx.result_shape()
    n = math.prod(shape_of(self))
    if n == 0 or 0 in out_shape:
        return full(0, dtype(self), out_shape)
    flat = reshape(self, [n])
    return reshape(_take_1d(flat, _as_index(index, n, wrap=True)), out_shape)


@lowers(aten.put.default, dynamic=Padding.INDEX)
def _put(ctx, self, index, source, accumulate=False):
    shape = shape_of(self)
    n = math.prod(shape)
    k = math.prod(shape_of(index))
    if n == 0 or k == 0:
        return self
    flat = reshape(self, [n])
    idx = reshape(_as_index(index, n, wrap=True), [k, 1])
    spec = ScatterSpec(idx, (), (0,), (0,), 1)
    out = spec.apply(flat, reshape(source, [k]), "add" if accumulate else "replace")
    return reshape(out, shape)


# -- scatter family -------------------------------------------------------------------------------
def _scatter_dim_spec(self: ir.Value, dim: int, index: ir.Value) -> ScatterSpec:
    """The scatter of torch.scatter: `out[..., index[i...], ...] = src[i...]` along `dim`,
    every other coordinate taken from the position in `index`."""
    shape = shape_of(self)
    rank = len(shape)
    ishape = shape_of(index)
    index = convert(index, _index_dtype(shape[dim]))
    others = [d for d in range(rank) if d != dim]
    if all(ishape[d] == shape[d] for d in others):
        return ScatterSpec(index, (), (dim,), (dim,), rank, tuple(others), tuple(others))
    # The index covers a smaller box: spell out every coordinate.
    columns = [
        reshape(index if d == dim else iota(ishape, d, dtype(index)), ishape + [1]) for d in range(rank)
    ]
    return ScatterSpec(hlo.concatenate(columns, rank), (), tuple(range(rank)), tuple(range(rank)), rank)


def _prepare_dim_scatter(self, dim, index, src):
    """Rank-0 operands as rank 1, `src` cut to the index's shape; returns
    (self, dim, index, src, restore) or None when there is nothing to scatter."""
    shape = shape_of(self)
    if rank_of(self) == 0:
        self = reshape(self, [1])
    if rank_of(index) == 0:
        index = reshape(index, [1])
    rank = rank_of(self)
    dim = dim % rank
    ishape = shape_of(index)
    if 0 in ishape or 0 in shape_of(self):
        return None
    if isinstance(src, ir.Value):
        if rank_of(src) == 0:
            src = reshape(src, [1])
        if shape_of(src) != ishape:
            src = stablehlo.SliceOp(src, [0] * rank, ishape, [1] * rank).result
        src = convert(src, dtype(self))
    else:
        src = full(src, dtype(self), ishape)
    return self, dim, index, src, shape


def _reduction_identity(reduce: str, dt: torch.dtype):
    return {"sum": 0, "mean": 0, "add": 0, "prod": 1, "multiply": 1, "amax": min_value(dt), "amin": max_value(dt)}[reduce]


_REDUCE_KIND = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _scatter_reduce(ctx, spec: ScatterSpec, self, updates, reduce: str, include_self: bool):
    """PyTorch's scatter_reduce / index_reduce: with `include_self=False` the scattered
    positions start from the reduction's identity; `mean` divides by the count (one more
    with `include_self`), floor division for integers."""
    dt = dtype(self)
    if reduce not in _REDUCE_KIND and reduce != "mean":
        raise ctx.fail(f"unknown reduction {reduce!r}")
    ushape = shape_of(updates)
    base = self
    if not include_self:
        base = spec.apply(self, full(_reduction_identity(reduce, dt), dt, ushape), "replace")
    if reduce != "mean":
        return spec.apply(base, updates, _REDUCE_KIND[reduce])
    total = spec.apply(base, updates, "add")
    shape = shape_of(self)
    count = spec.apply(full(1 if include_self else 0, dt, shape), full(1, dt, ushape), "add")
    count = select(compare(count, full(0, dt, shape), "EQ"), full(1, dt, shape), count)
    if dt.is_floating_point or dt.is_complex:
        return stablehlo.DivOp(total, count).result
    return _floor_divide_int(total, count)


def _scatter_common(ctx, self, dim, index, src, reduce: str, include_self: bool = True):
    prepared = _prepare_dim_scatter(self, dim, index, src)
    if prepared is None:
        return self
    self_, dim, index, src, shape = prepared
    spec = _scatter_dim_spec(self_, dim, index)
    if reduce == "replace":
        out = spec.apply(self_, src, "replace")
    else:
        out = _scatter_reduce(ctx, spec, self_, src, reduce, include_self)
    return reshape(out, shape)


def _scatter_padded(ctx: LoweringContext, x, dim, index, src, *args, **kwargs):
    """scatter/scatter_add/scatter_reduce with a dynamic operand: indices into a dynamic
    dim are logical positions already (the padded layout keeps coordinates); what must
    not happen is scattering the padded rows of `index`/`src`. Padded index entries are
    set out of bounds (XLA's scatter drops those updates), and the ordinary rule runs on
    static layouts (the importer re-marks the result)."""
    rank = max(len(shape_of(x)), 1)
    dim = dim % rank
    index_shape = shape_of(index)
    valid = valid_positions(ctx, 2, index_shape) if index_shape else None
    if valid is not None:
        out_of_bounds = full(max(shape_of(x)[dim] if shape_of(x) else 1, 1), dtype(index), index_shape)
        index = select(valid, index, out_of_bounds)
    if isinstance(src, ir.Value):
        src = static_layout(src)
    lowering = LOWERINGS[ctx.node.target]
    return lowering.fn(ctx, static_layout(x), dim, static_layout(index), src, *args, **kwargs)


_SCATTER = {"dynamic": Padding.INDEX, "dynamic_rule": _scatter_padded}


@lowers(aten.scatter.src, aten.scatter.value, **_SCATTER)
def _scatter(ctx, self, dim, index, src):
    return _scatter_common(ctx, self, dim, index, src, "replace")


@lowers(aten.scatter.reduce, aten.scatter.value_reduce, **_SCATTER)
def _scatter_reduce_legacy(ctx, self, dim, index, src, *, reduce):
    if reduce not in ("add", "multiply"):
        raise ctx.fail(f"scatter reduce={reduce!r} is not one of 'add', 'multiply'")
    return _scatter_common(ctx, self, dim, index, src, reduce)


@lowers(aten.scatter_add.default, **_SCATTER)
def _scatter_add(ctx, self, dim, index, src):
    return _scatter_common(ctx, self, dim, index, src, "add")


@lowers(aten.scatter_reduce.two, **_SCATTER)
def _scatter_reduce_two(ctx, self, dim, index, src, reduce, *, include_self=True):
    return _scatter_common(ctx, self, dim, index, src, reduce, include_self)


# -- index_add / index_copy / index_fill / index_reduce --------------------------------------------
def _index_dim_spec(self: ir.Value, dim: int, index: ir.Value, *, wrap: bool) -> ScatterSpec:
    """Scatter of whole slices along `dim`: slice i of the source goes to `index[i]`."""
    rank = rank_of(self)
    size = shape_of(self)[dim]
    n = math.prod(shape_of(index))
    idx = reshape(_as_index(index, size, wrap=wrap), [n, 1])
    return ScatterSpec(idx, tuple(d for d in range(rank) if d != dim), (dim,), (dim,), 1)


def _index_source(self, dim, index, source):
    """(self, dim, source, original shape) with rank-0 operands as rank 1."""
    shape = shape_of(self)
    if rank_of(self) == 0:
        self = reshape(self, [1])
    dim = dim % rank_of(self)
    sshape = list(shape_of(self))
    sshape[dim] = math.prod(shape_of(index))
    source = reshape(convert(source, dtype(self)), sshape)
    return self, dim, source, shape


def _index_dim_padded(ctx: LoweringContext, x, dim, index, *args, **kwargs):
    """index_add/index_copy/index_reduce/index_fill along `dim`: the index is logical
    (negative entries from the run-time end) and its padded entries are out of bounds, so
    they neither write nor fill; the ordinary rule runs on static layouts."""
    shape = shape_of(x)
    rank = max(len(shape), 1)
    d = dim % rank
    sym = symbolic_arg(ctx, 0)
    size = run_time_size(ctx, sym.shape[d]) if len(shape) else 1
    bound = shape[d] if len(shape) else 1
    index = _logical_index(ctx, index, ctx.node.args[2], size, bound)
    rest = [static_layout(a) if isinstance(a, ir.Value) else a for a in args]
    return LOWERINGS[ctx.node.target].fn(ctx, static_layout(x), dim, static_layout(index), *rest, **kwargs)


_INDEX_DIM = {"dynamic": Padding.INDEX, "dynamic_rule": _index_dim_padded}


@lowers(aten.index_add.default, **_INDEX_DIM)
def _index_add(ctx, self, dim, index, source, *, alpha=1):
    self_, dim, source, shape = _index_source(self, dim, index, source)
    if 0 in shape_of(source) or 0 in shape_of(self_):
        return self
    if alpha != 1:
        source = stablehlo.MulOp(source, full(alpha, dtype(source), shape_of(source))).result
    return reshape(_index_dim_spec(self_, dim, index, wrap=False).apply(self_, source, "add"), shape)


@lowers(aten.index_copy.default, **_INDEX_DIM)
def _index_copy(ctx, self, dim, index, source):
    self_, dim, source, shape = _index_source(self, dim, index, source)
    if 0 in shape_of(source) or 0 in shape_of(self_):
        return self
    if math.prod(shape_of(index)) == 1:
        return reshape(_copy_one_slice(self_, dim, index, source), shape)
    return reshape(_index_dim_spec(self_, dim, index, wrap=False).apply(self_, source, "replace"), shape)


def _copy_one_slice(self: ir.Value, dim: int, index: ir.Value, source: ir.Value) -> ir.Value:
    """index_copy of a single slice (a KV cache's new position) as a dynamic_update_slice,
    as JAX writes one: XLA updates the operand in place, where a scatter is a loop over
    its indices. An index outside [0, size) writes nothing, as the scatter's out-of-bounds
    rule: the slice at the clamped start is written back as it was."""
    shape = shape_of(self)
    size = shape[dim]
    i = reshape(_as_index(index, size, wrap=False, dt=torch.int64), [])
    starts = [i if d == dim else i64(0) for d in range(len(shape))]
    sizes = list(shape)
    sizes[dim] = 1
    current = stablehlo.DynamicSliceOp(self, starts, sizes).result
    in_range = hlo.logical_and(compare(i, full(0, torch.int64, []), "GE"), compare(i, full(size, torch.int64, []), "LT"))
    update = select(broadcast_to(in_range, sizes), source, current)
    return stablehlo.DynamicUpdateSliceOp(self, update, starts).result


@lowers(aten.index_reduce.default, **_INDEX_DIM)
def _index_reduce(ctx, self, dim, index, source, reduce, *, include_self=True):
    self_, dim, source, shape = _index_source(self, dim, index, source)
    if 0 in shape_of(source) or 0 in shape_of(self_):
        return self
    spec = _index_dim_spec(self_, dim, index, wrap=False)
    return reshape(_scatter_reduce(ctx, spec, self_, source, reduce, include_self), shape)


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, **_INDEX_DIM)
def _index_fill(ctx, self, dim, index, value):
    shape = shape_of(self)
    rank = len(shape)
    dim = dim % max(rank, 1)
    size = shape[dim] if rank else 1
    n = math.prod(shape_of(index))
    if n == 0 or 0 in shape:
        return self
    # A bool mask over `dim` (index_fill wraps negative indices), broadcast to self.
    idx = reshape(_as_index(index, size, wrap=True), [n, 1])
    hit = ScatterSpec(idx, (), (0,), (0,), 1).apply(full(False, torch.bool, [size]), full(True, torch.bool, [n]), "replace")
    if rank == 0:
        hit = reshape(hit, [])
    else:
        from ..dtypes import tensor_type

        hit = stablehlo.BroadcastInDimOp(tensor_type(shape, torch.bool), hit, [dim]).result
    fill = convert(value, dtype(self)) if isinstance(value, ir.Value) else full(value, dtype(self), [])
    return select(hit, broadcast_to(fill, shape), self)


# -- segment_reduce ---------------------------------------------------------------------------------
# torch.segment_reduce reduces consecutive runs of `data` along `axis`: segment s of batch row b
# covers positions offsets[b, s] <= k < offsets[b, s + 1] (offsets given, or the lengths' prefix
# sums). Each element's segment id comes from marking the segment starts and prefix-summing the
# marks; the reduction is then one scatter into [rows, segments + 1, inner], the extra segment
# collecting the elements no segment covers (unsafe lengths that do not sum to the axis size,
# offsets that do not start at 0).
_SEGMENT_KIND = {"sum": "add", "mean": "add", "prod": "mul", "max": "max", "min": "min"}


def _segment_identity(reduce: str):
    """ATen's start value of a segment without `initial` (what an empty one returns)."""
    return {"sum": 0, "mean": 0, "prod": 1, "max": float("-inf"), "min": float("inf")}[reduce]


@dataclass(frozen=True)
class _Segments:
    """The segment layout of `data` viewed as [rows, n, inner]: `ids` [rows, n] is each
    element's segment (`count` for elements outside every segment), `lengths` [rows, count]
    the number of elements each segment covers."""

    rows: int
    n: int
    inner: int
    count: int
    ids: ir.Value
    lengths: ir.Value

    @property
    def scatter(self) -> ScatterSpec:
        """Scatter of [rows, n, inner] updates into a [rows, count + 1, inner] operand."""
        return ScatterSpec(reshape(self.ids, [self.rows, self.n, 1]), (2,), (1,), (1,), 2, (0,), (0,))

    def per_element(self, per_segment: ir.Value) -> ir.Value:
        """[rows, count(+1), inner] values read back at each element's segment: [rows, n, inner]
        (elements outside every segment read the last real segment; callers mask them)."""
        last = full(self.count - 1, dtype(self.ids), [self.rows, self.n])
        ids = stablehlo.MinOp(self.ids, last).result
        return gather(
            per_segment, reshape(ids, [self.rows, self.n, 1]), offset_dims=[2], collapsed_slice_dims=[1],
            start_index_map=[1], index_vector_dim=2, slice_sizes=[1, 1, self.inner],
            operand_batching_dims=[0], start_indices_batching_dims=[0],
        )

    def covered(self) -> ir.Value:
        """[rows, n, inner]: the elements that belong to a segment."""
        inside = compare(self.ids, full(self.count, dtype(self.ids), [self.rows, self.n]), "LT")
        return broadcast_to(reshape(inside, [self.rows, self.n, 1]), [self.rows, self.n, self.inner])

    def reduce(self, updates: ir.Value, kind: str, start) -> ir.Value:
        """Scatter-reduce of [rows, n, inner] `updates` per segment from `start`: [rows, count, inner]."""
        dt = dtype(updates)
        operand = full(start, dt, [self.rows, self.count + 1, self.inner])
        if self.rows * self.n * self.inner:
            operand = self.scatter.apply(operand, updates, kind)
        return stablehlo.SliceOp(operand, [0, 0, 0], [self.rows, self.count, self.inner], [1, 1, 1]).result


def _segment_layout(ctx, data: ir.Value, lengths, indices, offsets, axis: int) -> tuple[_Segments, list[int]]:
    """The segments of `data` and the result's shape (data's, with `axis` holding the segments)."""
    if indices is not None:
        raise ctx.fail("segment_reduce with `indices` is not supported (ATen does not implement it either)")
    if (lengths is None) == (offsets is None):
        raise ctx.fail("segment_reduce needs exactly one of `lengths` and `offsets`")
    shape = shape_of(data)
    axis = axis % max(len(shape), 1)
    bounds = lengths if lengths is not None else offsets
    if rank_of(bounds) != axis + 1 or shape_of(bounds)[:axis] != shape[:axis]:
        raise ctx.fail(f"segment_reduce: axis {axis} must be the last dim of lengths/offsets, whose leading dims "
                       f"match data's (data {shape}, lengths/offsets {shape_of(bounds)})")
    rows, n, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    count = shape_of(bounds)[-1] - (1 if offsets is not None else 0)
    idt = _index_dtype(max(n, count) + 2)
    starts = _segment_starts(bounds, rows, n, is_offsets=offsets is not None, idt=idt)
    ids = _segment_ids(starts, rows, n, count, idt)
    head = stablehlo.SliceOp(starts, [0, 0], [rows, count], [1, 1]).result
    tail = stablehlo.SliceOp(starts, [0, 1], [rows, count + 1], [1, 1]).result
    lengths_ = stablehlo.SubtractOp(tail, head).result
    return _Segments(rows, n, inner, count, ids, lengths_), shape[:axis] + [count] + shape[axis + 1:]


def _segment_starts(bounds: ir.Value, rows: int, n: int, *, is_offsets: bool, idt: torch.dtype) -> ir.Value:
    """[rows, count + 1] segment boundaries clamped to [0, n]: the offsets, or 0 followed
    by the lengths' prefix sums."""
    bdt = dtype(bounds)
    bounds = reshape(bounds, [rows, shape_of(bounds)[-1]])
    if not is_offsets:
        bounds = prefix_sum_last_axis(bounds)
        bounds = stablehlo.PadOp(bounds, full(0, bdt, []), [0, 1], [0, 0], [0, 0]).result
    # Clamped in the input's dtype: an int64 offset past n must not wrap when narrowed.
    return convert(clamp_index(bounds, 0, n), idt)


def _segment_ids(starts: ir.Value, rows: int, n: int, count: int, idt: torch.dtype) -> ir.Value:
    """[rows, n]: the segment of each position, i.e. (#boundaries <= k) - 1, from a mark at
    every boundary (a boundary at n marks the spare column) prefix-summed; positions before
    the first boundary or past the last get `count`, the spare segment."""
    marks = full(0, idt, [rows, n + 1])
    if rows * (count + 1):
        at = ScatterSpec(reshape(starts, [rows, count + 1, 1]), (), (1,), (1,), 2, (0,), (0,))
        marks = at.apply(marks, full(1, idt, [rows, count + 1]), "add")
    seen = stablehlo.SliceOp(prefix_sum_last_axis(marks), [0, 0], [rows, n], [1, 1]).result
    ids = _add_scalar(seen, -1)
    before_first = compare(ids, full(0, idt, [rows, n]), "LT")
    return select(before_first, full(count, idt, [rows, n]), ids)


def _check_reduce(ctx, reduce: str) -> None:
    if reduce not in _SEGMENT_KIND:
        raise ctx.fail(f"segment_reduce: unknown reduction {reduce!r} (sum, mean, max, min, prod)")


def _segment_lengths_as(seg: _Segments, dt: torch.dtype) -> ir.Value:
    """[rows, count, inner]: each segment's element count in `dt`."""
    counts = reshape(convert(seg.lengths, dt), [seg.rows, seg.count, 1])
    return broadcast_to(counts, [seg.rows, seg.count, seg.inner])


@lowers(aten.segment_reduce.default, dynamic=Padding.INDEX)
def _segment_reduce(ctx, data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """ATen's CPU kernel: every segment starts from `initial` (else the identity: -inf/inf
    for max/min), max/min propagate NaN (XLA's max/min do), mean divides the total by the
    length and gives `initial`, else NaN, for an empty segment. `unsafe` only skips
    eager's checks of the lengths, which a compiled program cannot raise."""
    _check_reduce(ctx, reduce)
    seg, out_shape = _segment_layout(ctx, data, lengths, indices, offsets, axis)
    dt = dtype(data)
    start = _segment_identity(reduce) if initial is None else initial
    values = reshape(data, [seg.rows, seg.n, seg.inner])
    reduced = seg.reduce(values, _SEGMENT_KIND[reduce], start)
    if reduce == "mean":
        counts = _segment_lengths_as(seg, dt)
        shape = shape_of(counts)
        empty = compare(counts, full(0, dt, shape), "EQ")
        divided = stablehlo.DivOp(reduced, select(empty, full(1, dt, shape), counts)).result
        reduced = select(empty, full(float("nan") if initial is None else initial, dt, shape), divided)
    return reshape(reduced, out_shape)


def _count_per_segment(seg: _Segments, flags: ir.Value) -> ir.Value:
    """[rows, n, inner] booleans counted per segment and read back per element."""
    idt = dtype(seg.ids)
    return seg.per_element(seg.reduce(convert(flags, idt), "add", 0))


def _extreme_grad(seg: _Segments, grad_each, output_each, values) -> ir.Value:
    """max/min: the elements equal to their segment's result (or NaN) take its gradient;
    where several do, ATen divides the positive gradients among them and leaves the
    others whole (its kernel tests `grad > 0`), which is reproduced here."""
    dt = dtype(values)
    shape = shape_of(values)
    hit = stablehlo.OrOp(is_nan(values), compare(values, output_each, "EQ")).result
    grad = select(hit, grad_each, full(0, dt, shape))
    ties = _count_per_segment(seg, stablehlo.AndOp(hit, seg.covered()).result)
    shared = stablehlo.AndOp(
        compare(ties, full(2, dtype(ties), shape), "GE"), compare(grad, full(0, dt, shape), "GT")
    ).result
    return select(shared, stablehlo.DivOp(grad, convert(ties, dt)).result, grad)


def _prod_grad(seg: _Segments, grad_each, output_each, values, initial) -> ir.Value:
    """prod: grad * output / x, except at zeros and NaNs, where ATen multiplies out the
    product of the other elements (times `initial`): the product of the segment's ordinary
    elements, made NaN by another NaN or else 0 by another zero."""
    dt = dtype(values)
    shape = shape_of(values)
    idt = dtype(seg.ids)
    nan, zero = is_nan(values), compare(values, full(0, dt, shape), "EQ")
    special = stablehlo.OrOp(nan, zero).result
    covered = seg.covered()
    ordinary = select(special, full(1, dt, shape), values)
    ordinary_prod = seg.per_element(seg.reduce(ordinary, "mul", 1 if initial is None else initial))
    other_nans = stablehlo.SubtractOp(
        _count_per_segment(seg, stablehlo.AndOp(nan, covered).result), convert(nan, idt)).result
    other_zeros = stablehlo.SubtractOp(
        _count_per_segment(seg, stablehlo.AndOp(zero, covered).result), convert(zero, idt)).result
    none = full(0, idt, shape)
    factor = select(compare(other_zeros, none, "GT"), full(0, dt, shape), full(1, dt, shape))
    factor = select(compare(other_nans, none, "GT"), full(float("nan"), dt, shape), factor)
    exclusive = stablehlo.MulOp(ordinary_prod, factor).result
    through_output = stablehlo.DivOp(stablehlo.MulOp(grad_each, output_each).result, values).result
    return select(special, stablehlo.MulOp(grad_each, exclusive).result, through_output)


@lowers(aten._segment_reduce_backward.default, dynamic=Padding.INDEX)
def _segment_reduce_backward(ctx, grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """ATen's CPU backward: sum passes each segment's gradient to its elements, mean
    divides it by the length, max/min and prod as `_extreme_grad`/`_prod_grad` say;
    elements outside every segment get 0."""
    _check_reduce(ctx, reduce)
    seg, _ = _segment_layout(ctx, data, lengths, None, offsets, axis)
    dt = dtype(data)
    data_shape = shape_of(data)
    if seg.rows * seg.n * seg.inner * seg.count == 0:
        return full(0, dt, data_shape)
    values = reshape(data, [seg.rows, seg.n, seg.inner])
    grad_each = seg.per_element(reshape(convert(grad, dt), [seg.rows, seg.count, seg.inner]))
    output_each = seg.per_element(reshape(convert(output, dt), [seg.rows, seg.count, seg.inner]))
    if reduce == "sum":
        result = grad_each
    elif reduce == "mean":
        result = stablehlo.DivOp(grad_each, seg.per_element(_segment_lengths_as(seg, dt))).result
    elif reduce == "prod":
        result = _prod_grad(seg, grad_each, output_each, values, initial)
    else:
        result = _extreme_grad(seg, grad_each, output_each, values)
    result = select(seg.covered(), result, full(0, dt, shape_of(values)))
    return reshape(result, data_shape)


# -- masked ops -------------------------------------------------------------------------------------
@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor, dynamic=Padding.SAFE)
def _masked_fill(ctx, self, mask, value):
    shape, dt = ctx.result_shape(), ctx.result_dtype()
    fill = convert(value, dt) if isinstance(value, ir.Value) else full(value, dt, [])
    return select(broadcast_to(convert(mask, torch.bool), shape), broadcast_to(fill, shape), broadcast_to(convert(self, dt), shape))


def _mask_positions(mask: ir.Value) -> tuple[ir.Value, ir.Value]:
    """For a mask flattened to 1-D: (flat bool mask, position of each element among the
    selected ones (cumsum - 1))."""
    n = math.prod(shape_of(mask))
    flat = reshape(convert(mask, torch.bool), [n])
    idt = _index_dtype(n + 1)
    positions = _add_scalar(prefix_sum_last_axis(convert(flat, idt)), -1)
    return flat, positions


@lowers(aten.masked_scatter.default, dynamic=Padding.INDEX)
def _masked_scatter(ctx, self, mask, source):
    shape = ctx.result_shape()
    self = broadcast_to(self, shape)
    m = math.prod(shape_of(source))
    n = math.prod(shape)
    if n == 0 or m == 0:
        return self  # no element can be selected (PyTorch checks the count at runtime)
    flat_mask, positions = _mask_positions(broadcast_to(mask, shape))
    picked = _take_1d(reshape(convert(source, dtype(self)), [m]), positions)  # gather clamps -1 to 0
    return reshape(select(flat_mask, picked, reshape(self, [n])), shape)


@lowers(aten.masked_scatter_backward.default, dynamic=Padding.INDEX)
def _masked_scatter_backward(ctx, grad_output, mask, sizes):
    out_shape, dt = ctx.result_shape(), ctx.result_dtype()
    m = math.prod(out_shape)
    shape = broadcast_shapes(shape_of(grad_output), shape_of(mask))
    n = math.prod(shape)
    if m == 0 or n == 0:
        return full(0, dt, out_shape)
    flat_mask, positions = _mask_positions(broadcast_to(mask, shape))
    # Unselected elements go to position m, out of bounds: the scatter drops them.
    target = select(flat_mask, positions, full(m, dtype(positions), [n]))
    grad = reshape(broadcast_to(grad_output, shape), [n])
    out = ScatterSpec(reshape(target, [n, 1]), (), (0,), (0,), 1).apply(full(0, dt, [m]), grad, "replace")
    return reshape(out, out_shape)


@lowers(aten.nonzero_static.default, dynamic=Padding.INDEX)
def _nonzero_static(ctx, self, *, size, fill_value=-1):
    shape = shape_of(self)
    rank = len(shape)
    out_shape = ctx.result_shape()
    result = full(fill_value, torch.int64, out_shape)
    n = math.prod(shape)
    if n == 0 or size == 0:
        return result
    flat_mask, positions = _mask_positions(self)
    target = select(flat_mask, positions, full(size, dtype(positions), [n]))  # out of range: dropped
    if rank == 0:
        coords = full(0, torch.int64, [n, 0])
        return result if out_shape[1] == 0 else coords
    coords = hlo.concatenate([reshape(iota(shape, d, torch.int64), [n, 1]) for d in range(rank)], 1)
    return ScatterSpec(reshape(target, [n, 1]), (1,), (0,), (0,), 1).apply(result, coords, "replace")


# -- data-dependent ops: fail clearly -----------------------------------------------------------------
@lowers(aten.nonzero.default, dynamic=Padding.INDEX)
def _nonzero(ctx, self):
    raise ctx.fail("nonzero is not supported: " + _DATA_DEPENDENT + " (torch.nonzero_static(x, size=...) is)")


@lowers(aten.masked_select.default, dynamic=Padding.INDEX)
def _masked_select(ctx, self, mask):
    raise ctx.fail("masked_select is not supported: " + _DATA_DEPENDENT + " (use torch.where(mask, x, 0) instead)")


@lowers(aten.bincount.default, dynamic=Padding.INDEX)
def _bincount(ctx, self, weights=None, minlength=0):
    raise ctx.fail("bincount is not supported: its output size is max(input) + 1, " + _DATA_DEPENDENT)


@lowers(aten._unique2.default, aten._unique.default, aten.unique_dim.default, aten.unique_consecutive.default,
        aten.unique_dim_consecutive.default, dynamic=Padding.INDEX)
def _unique(ctx, self, *args, **kwargs):
    raise ctx.fail(
        "unique is not supported: its output size is the number of distinct values, " + _DATA_DEPENDENT
        + " (call it outside the compiled function, e.g. under torch.compiler.disable, or keep a "
        "fixed-size form: torch.sort(x) and a mask of the positions where the sorted value changes)"
    )


@lowers(aten._local_scalar_dense.default, dynamic=Padding.INDEX)
def _local_scalar_dense(ctx, self):
    raise ctx.fail(
        "data-dependent .item() cannot be compiled; Dynamo normally graph-breaks here "
        "(torch._dynamo.config.capture_scalar_outputs=False)"
    )


# -- searchsorted / bucketize ---------------------------------------------------------------------------
def _bisect(seq: ir.Value, vals: ir.Value, *, right: bool, sort_index: ir.Value | None = None) -> ir.Value:
    """Unrolled binary search (the exact comparisons of ATen's lower/upper bound, so NaNs
    land where PyTorch puts them): bit_length(M) rounds of one gather each. Returns the
    insertion index of each of `vals` into the last dim of `seq` (M >= 1 entries, in the
    values' dtype); a batched `seq` is searched row by row, each with the values of its
    row. `sort_index` is searchsorted's `sorter`."""
    sshape = shape_of(seq)
    m = sshape[-1] if sshape else 1
    vshape = shape_of(vals)
    batched = len(sshape) > 1
    idt = _index_dtype(m + 1)

    def lookup(table: ir.Value, index: ir.Value) -> ir.Value:
        if not batched:
            return _take_1d(table, index)
        r = len(vshape)
        lead = list(range(r - 1))
        return gather(
            table, index, collapsed_slice_dims=[r - 1], start_index_map=[r - 1], index_vector_dim=r,
            slice_sizes=[1] * r, operand_batching_dims=lead, start_indices_batching_dims=lead,
        )

    sort_index = convert(sort_index, idt) if sort_index is not None else None
    lo = full(0, idt, vshape)
    hi = full(m, idt, vshape)
    one = full(1, idt, vshape)
    for _ in range(m.bit_length()):
        active = compare(lo, hi, "LT")
        mid = stablehlo.AddOp(lo, stablehlo.ShiftRightLogicalOp(stablehlo.SubtractOp(hi, lo).result, one).result).result
        probe = stablehlo.MinOp(mid, full(m - 1, idt, vshape)).result
        if sort_index is not None:
            probe = lookup(sort_index, probe)
        mid_val = lookup(seq, probe)
        # lower bound: advance while !(mid_val >= v); upper bound: while !(mid_val > v)
        stop = compare(mid_val, vals, "GT" if right else "GE")
        advance = stablehlo.AndOp(active, stablehlo.NotOp(stop).result).result
        shrink = stablehlo.AndOp(active, stop).result
        lo = select(advance, stablehlo.AddOp(mid, one).result, lo)
        hi = select(shrink, mid, hi)
    return lo


def _searchsorted(ctx, sorted_sequence, values, *, out_int32: bool, right: bool, sorter=None):
    out_dtype = torch.int32 if out_int32 else torch.int64
    out_shape = ctx.result_shape()
    sshape = shape_of(sorted_sequence)
    m = sshape[-1] if sshape else 1
    if m == 0 or 0 in out_shape:
        return full(0, out_dtype, out_shape)
    from .helpers import promote_dtypes

    common = promote_dtypes(sorted_sequence, values)
    index = _bisect(convert(sorted_sequence, common), convert(values, common), right=right, sort_index=sorter)
    return reshape(convert(index, out_dtype), out_shape)


@lowers(
    aten.searchsorted.Tensor,
    aten.searchsorted.Scalar,
    dynamic=Padding.INDEX,
    dynamic_rule=reject_dynamic_argument("sorted_sequence", "searchsorted with a dynamic (padded) sorted sequence"),
)
def _searchsorted_rule(ctx, sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if side is not None:
        right = side == "right"
    if not isinstance(self, ir.Value):
        self = full(self, dtype(sorted_sequence), [])
    return _searchsorted(ctx, sorted_sequence, self, out_int32=out_int32, right=right, sorter=sorter)


@lowers(
    aten.bucketize.Tensor,
    aten.bucketize.Scalar,
    dynamic=Padding.INDEX,
    dynamic_rule=reject_dynamic_argument("boundaries", "bucketize with dynamic (padded) boundaries"),
)
def _bucketize(ctx, self, boundaries, *, out_int32=False, right=False):
    if not isinstance(self, ir.Value):
        self = full(self, dtype(boundaries), [])
    return _searchsorted(ctx, boundaries, self, out_int32=out_int32, right=right)


# -- isin / histc / histogram -------------------------------------------------------------------------------------
@lowers(
    aten.isin.Tensor_Tensor,
    aten.isin.Scalar_Tensor,
    dynamic=Padding.INDEX,
    dynamic_rule=reject_dynamic_argument("test_elements", "isin with dynamic (padded) test elements"),
)
@lowers(aten.isin.Tensor_Scalar, dynamic=Padding.SAFE)
def _isin(ctx, elements, test_elements, *, assume_unique=False, invert=False):
    """Every element against every test element (an [E, T] compare and an any-reduce)."""
    from .helpers import promote_dtypes

    out_shape = ctx.result_shape()
    common = promote_dtypes(elements, test_elements)
    elements = convert(elements, common) if isinstance(elements, ir.Value) else full(elements, common, [])
    tests = convert(test_elements, common) if isinstance(test_elements, ir.Value) else full(test_elements, common, [])
    e = math.prod(shape_of(elements))
    t = math.prod(shape_of(tests))
    if e == 0 or t == 0:
        return full(invert, torch.bool, out_shape)
    from ..dtypes import tensor_type

    grid = tensor_type([e, t], common)
    lhs = stablehlo.BroadcastInDimOp(grid, reshape(elements, [e]), [0]).result
    rhs = stablehlo.BroadcastInDimOp(grid, reshape(tests, [t]), [1]).result
    equal = compare(lhs, rhs, "EQ")
    (found,) = reduce([equal], [full(False, torch.bool, [])], [1], lambda acc, new: [stablehlo.OrOp(acc[0], new[0]).result])
    if invert:
        found = stablehlo.NotOp(found).result
    return reshape(found, out_shape)


# ATen's histograms (aten/src/ATen/native/Histogram.cpp and its CPU kernel): an element
# is counted when it lies in [first edge, last edge] in every dimension (NaN never is),
# in the bin whose half-open [edge, next edge) holds it, the last bin closed on the right.
# Evenly spaced bins (histc; histogram and histogramdd with a bin count) interpolate the
# bin from the range; histogram corrects that estimate against the edges it returns.
def _divide(a: ir.Value, b: ir.Value) -> ir.Value:
    """a / b rounded as eager rounds it. XLA rewrites a division by a constant (the bin
    count, a given range's width) as a multiplication by the rounded reciprocal, which
    can be off in the last bit, and that bit decides the bin of a value near an edge: an
    optimization barrier keeps the divisor opaque, so the division stays a division."""
    (opaque,) = stablehlo.OptimizationBarrierOp([b]).results
    return stablehlo.DivOp(a, opaque).result


def _counted(x: ir.Value, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """lo <= x <= hi (0-d bounds): the elements a histogram counts; NaN is not."""
    shape = shape_of(x)
    above = compare(x, broadcast_to(lo, shape), "GE")
    return stablehlo.AndOp(above, compare(x, broadcast_to(hi, shape), "LE")).result


def _interpolated_bin(
    x: ir.Value, lo: ir.Value, hi: ir.Value, bins: int, counted: ir.Value, idt: torch.dtype
) -> ir.Value:
    """trunc((x - lo) * bins / (hi - lo)) in x's dtype, as the kernel computes it; the
    elements not counted read 0, so NaN and infinities never reach the conversion."""
    shape, dt = shape_of(x), dtype(x)
    lo, hi = broadcast_to(lo, shape), broadcast_to(hi, shape)
    scaled = _divide(
        stablehlo.MulOp(stablehlo.SubtractOp(x, lo).result, full(bins, dt, shape)).result,
        stablehlo.SubtractOp(hi, lo).result,
    )
    return convert(select(counted, scaled, full(0, dt, shape)), idt)


def _closed_last_bin(position: ir.Value, bins: int) -> ir.Value:
    """An element on the last edge lands at `bins`: the last bin includes its right edge."""
    return stablehlo.MinOp(position, full(bins - 1, dtype(position), shape_of(position))).result


def _searched_near(x: ir.Value, edges: ir.Value, estimate: ir.Value) -> ir.Value:
    """The kernel's local search after the interpolated estimate p, so that histogram's
    bins agree with the edges it returns: upper_bound of x in edges[max(p - 1, 0) : p + 2],
    minus one. The edges are sorted, so that is the window's start, minus one, plus the
    number of its edges <= x."""
    shape, idt = shape_of(x), dtype(estimate)
    (num_edges,) = shape_of(edges)
    estimate = clamp_index(estimate, 0, num_edges - 1)
    window_start = stablehlo.MaxOp(_add_scalar(estimate, -1), full(0, idt, shape)).result
    position = _add_scalar(window_start, -1)
    for offset in (-1, 0, 1):
        k = _add_scalar(estimate, offset)
        in_window = stablehlo.AndOp(
            compare(k, full(0, idt, shape), "GE"), compare(k, full(num_edges, idt, shape), "LT")
        ).result
        edge = _take_1d(edges, clamp_index(k, 0, num_edges - 1))
        at_or_below = stablehlo.AndOp(in_window, compare(edge, x, "LE")).result
        position = stablehlo.AddOp(position, convert(at_or_below, idt)).result
    return position


def _extremes(x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """min(x) and max(x) of a 1-D tensor, as 0-d values."""
    dt = dtype(x)

    def extreme(op, init):
        (value,) = reduce([x], [full(init, dt, [])], [0], lambda acc, new: [op(acc[0], new[0]).result])
        return value

    return extreme(stablehlo.MinOp, float("inf")), extreme(stablehlo.MaxOp, float("-inf"))


def _widened(lo: ir.Value, hi: ir.Value, by: float) -> tuple[ir.Value, ir.Value]:
    """A range holding a single value v as [v - by, v + by], so that its bins have a width
    (histc widens by 1, histogram by 0.5 as NumPy does)."""
    same = compare(lo, hi, "EQ")
    by = full(by, dtype(lo), [])
    return select(same, stablehlo.SubtractOp(lo, by).result, lo), select(same, stablehlo.AddOp(hi, by).result, hi)


def _accumulate(
    positions: Sequence[ir.Value], counted: ir.Value, weight: ir.Value | None, bins: Sequence[int],
    out_dtype: torch.dtype,
) -> ir.Value:
    """The histogram of shape `bins`: each counted element adds its weight (1 without
    weights) to the bin at its `positions` (one per dimension), through one scatter-add
    at the flattened bin; the elements not counted are sent past the end, where the
    scatter drops them."""
    total = math.prod(bins)
    (n,) = shape_of(counted)
    idt = _index_dtype(total + 1)
    flat = full(0, idt, [n])
    for position, size in zip(positions, bins):  # row-major: flat * size + position
        flat = stablehlo.AddOp(stablehlo.MulOp(flat, full(size, idt, [n])).result, convert(position, idt)).result
    target = select(counted, flat, full(total, idt, [n]))
    updates = convert(weight, out_dtype) if weight is not None else full(1, out_dtype, [n])
    hist = ScatterSpec(reshape(target, [n, 1]), (), (0,), (0,), 1).apply(full(0, out_dtype, [total]), updates, "add")
    return reshape(hist, list(bins))


@lowers(aten.histc.default, dynamic=Padding.INDEX)
def _histc(ctx, self, bins=100, min=0, max=0):
    """ATen's histc: interpolated bins over [min, max]; min == max takes the data's range
    (widened by 1 on each side if that is a single value)."""
    out_dtype = ctx.result_dtype()
    dt = dtype(self)
    n = math.prod(shape_of(self))
    if n == 0 or bins == 0:
        return full(0, out_dtype, [bins])
    x = reshape(self, [n])
    if min == max:
        lo, hi = _widened(*_extremes(x), 1)
    else:
        lo, hi = full(min, dt, []), full(max, dt, [])
    counted = _counted(x, lo, hi)
    position = _closed_last_bin(_interpolated_bin(x, lo, hi, bins, counted, _index_dtype(bins + 1)), bins)
    return _accumulate([position], counted, None, [bins], out_dtype)


@dataclass(frozen=True)
class _HistogramAxis:
    """One dimension of a histogram: its bin edges, and whether they are evenly spaced
    (the kernel then interpolates the bin and corrects it against the edges; given edges
    are binary searched)."""

    edges: ir.Value
    evenly_spaced: bool

    @property
    def bins(self) -> int:
        return shape_of(self.edges)[0] - 1

    def bin_of(self, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The bin of each element of the 1-D `x`, and whether it is counted."""
        lo = reshape(hlo.slice_in_dim(self.edges, 0, 0, 1), [])
        hi = reshape(hlo.slice_in_dim(self.edges, 0, self.bins, self.bins + 1), [])
        counted = _counted(x, lo, hi)
        idt = _index_dtype(self.bins + 2)
        if self.evenly_spaced:
            position = _searched_near(x, self.edges, _interpolated_bin(x, lo, hi, self.bins, counted, idt))
        else:
            position = _add_scalar(convert(_bisect(self.edges, x, right=True), idt), -1)
        return _closed_last_bin(position, self.bins), counted


def _evenly_spaced_edges(lo: ir.Value, hi: ir.Value, bins: int) -> ir.Value:
    """linspace(lo, hi, bins + 1) for 0-d bounds computed in the program, as ATen's CPU
    linspace computes it: step = (hi - lo) / bins in the bounds' dtype, then lo + step * i
    for the first half and hi - step * (bins - i) for the rest. The kernel is compiled
    with those multiply-adds fused (one rounding each), and the edges decide bins
    (histogram corrects its bins against them), so they run in float64 (only bins + 1
    elements) and are rounded once to the bounds' dtype: a float32 product is exact in
    float64, so float32 edges are eager's (measured: all of them over random ranges and
    bin counts). For float64 bounds an edge can differ from eager's in its last bit."""
    dt = dtype(lo)
    steps = bins + 1
    step = _divide(stablehlo.SubtractOp(hi, lo).result, full(bins, dt, []))

    def wide(value: ir.Value) -> ir.Value:
        return broadcast_to(convert(value, torch.float64), [steps])

    i = iota([steps], 0, torch.float64)
    head = stablehlo.AddOp(wide(lo), stablehlo.MulOp(wide(step), i).result).result
    steps_from_end = stablehlo.SubtractOp(full(bins, torch.float64, [steps]), i).result
    tail = stablehlo.SubtractOp(wide(hi), stablehlo.MulOp(wide(step), steps_from_end).result).result
    return convert(select(compare(i, full(steps // 2, torch.float64, [steps]), "LT"), head, tail), dt)


def _as_samples(self: ir.Value) -> ir.Value:
    """histogramdd's input as [M, D]: M samples of D coordinates (the last dim)."""
    shape = shape_of(self)
    d = shape[-1]
    return reshape(self, [math.prod(shape[:-1]), d])


def _column(samples: ir.Value, j: int) -> ir.Value:
    return reshape(hlo.slice_in_dim(samples, 1, j, j + 1), [shape_of(samples)[0]])


def _outer_edges(ctx, samples: ir.Value, bounds) -> list[tuple[ir.Value, ir.Value]]:
    """Each dimension's (first, last) edge as ATen chooses them: the given range (a flat
    [lo0, hi0, lo1, hi1, ...]), else the data's min and max, [0, 1] for no data; a range
    holding a single value is widened by 0.5 on each side."""
    dt = dtype(samples)
    m, d = shape_of(samples)
    if bounds is None:
        if m == 0:
            return [(full(0.0, dt, []), full(1.0, dt, []))] * d
        return [_widened(*_extremes(_column(samples, j)), 0.5) for j in range(d)]
    if len(bounds) != 2 * d:
        raise ctx.fail(
            f"histogramdd: for a {d}-dimensional histogram range should have {2 * d} elements, "
            f"but got {len(bounds)}"
        )
    edges = []
    for lo, hi in zip(bounds[0::2], bounds[1::2]):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ctx.fail(f"histogram: range [{lo}, {hi}] must be finite with min <= max")
        if lo == hi:  # compared and widened in double, as ATen does, before the cast
            lo, hi = lo - 0.5, hi + 0.5
        edges.append((full(lo, dt, []), full(hi, dt, [])))
    return edges


def _evenly_spaced_axes(ctx, samples: ir.Value, bins: Sequence[int], bounds) -> list[_HistogramAxis]:
    d = shape_of(samples)[1]
    if len(bins) != d:
        raise ctx.fail("histogramdd: The size of bins must be equal to the innermost dimension of the input.")
    outer = _outer_edges(ctx, samples, bounds)
    return [_HistogramAxis(_evenly_spaced_edges(lo, hi, b), evenly_spaced=True) for (lo, hi), b in zip(outer, bins)]


def _density(hist: ir.Value, edges: Sequence[ir.Value]) -> ir.Value:
    """hist / (sum(hist) * bin volume), divided in ATen's order: by the total, then by
    each dimension's bin widths."""
    shape, dt = shape_of(hist), dtype(hist)
    add = lambda acc, new: [stablehlo.AddOp(acc[0], new[0]).result]  # noqa: E731
    (total,) = reduce([hist], [full(0, dt, [])], list(range(len(shape))), add)
    hist = _divide(hist, broadcast_to(total, shape))
    for j, e in enumerate(edges):
        b = shape[j]
        widths = stablehlo.SubtractOp(hlo.slice_in_dim(e, 0, 1, b + 1), hlo.slice_in_dim(e, 0, 0, b)).result
        along_j = [b if k == j else 1 for k in range(len(shape))]
        hist = _divide(hist, broadcast_to(reshape(convert(widths, dt), along_j), shape))
    return hist


def _histogramdd(
    samples: ir.Value, axes: Sequence[_HistogramAxis], weight, density: bool, out_dtype: torch.dtype
) -> ir.Value:
    """The histogram of [M, D] samples over `axes` (one per coordinate); `weight` has
    one entry per sample. An element out of range in any dimension is not counted."""
    m = shape_of(samples)[0]
    bins = [axis.bins for axis in axes]
    if m == 0 or not axes or 0 in bins:
        hist = full(0, out_dtype, bins)
    else:
        positions, counted = [], full(True, torch.bool, [m])
        for j, axis in enumerate(axes):
            position, inside = axis.bin_of(_column(samples, j))
            positions.append(position)
            counted = stablehlo.AndOp(counted, inside).result
        weights = reshape(weight, [m]) if weight is not None else None
        hist = _accumulate(positions, counted, weights, bins, out_dtype)
    return _density(hist, [axis.edges for axis in axes]) if density else hist


@lowers(aten.histogram.bin_ct, dynamic=Padding.INDEX)
def _histogram_bin_ct(ctx, self, bins=100, *, range=None, weight=None, density=False):
    """torch.histogram with a bin count: histogramdd of the flattened input in 1-D."""
    samples = reshape(self, [math.prod(shape_of(self)), 1])
    (axis,) = _evenly_spaced_axes(ctx, samples, [bins], range)
    return _histogramdd(samples, [axis], weight, density, ctx.result_dtype(0)), axis.edges


@lowers(aten.histogram.bins_tensor, dynamic=Padding.INDEX)
def _histogram_bins_tensor(ctx, self, bins, *, weight=None, density=False):
    """torch.histogram with given edges, which it also returns."""
    samples = reshape(self, [math.prod(shape_of(self)), 1])
    axis = _HistogramAxis(bins, evenly_spaced=False)
    return _histogramdd(samples, [axis], weight, density, ctx.result_dtype(0)), bins


@lowers(aten._histogramdd_bin_edges.default, dynamic=Padding.INDEX)
def _histogramdd_bin_edges(ctx, self, bins, *, range=None, weight=None, density=False):
    """The edges torch.histogramdd returns for bin counts (its histogram is
    `_histogramdd_from_bin_cts`, which computes the same edges)."""
    return tuple(axis.edges for axis in _evenly_spaced_axes(ctx, _as_samples(self), bins, range))


@lowers(aten._histogramdd_from_bin_cts.default, dynamic=Padding.INDEX)
def _histogramdd_from_bin_cts(ctx, self, bins, *, range=None, weight=None, density=False):
    samples = _as_samples(self)
    axes = _evenly_spaced_axes(ctx, samples, bins, range)
    return _histogramdd(samples, axes, weight, density, ctx.result_dtype())


@lowers(aten._histogramdd_from_bin_tensors.default, dynamic=Padding.INDEX)
def _histogramdd_from_bin_tensors(ctx, self, bins, *, weight=None, density=False):
    samples = _as_samples(self)
    if len(bins) != shape_of(samples)[1]:
        raise ctx.fail("histogramdd: The size of bins must be equal to the innermost dimension of the input.")
    axes = [_HistogramAxis(edges, evenly_spaced=False) for edges in bins]
    return _histogramdd(samples, axes, weight, density, ctx.result_dtype())


# -- _embedding_bag ------------------------------------------------------------------------------------------
_MODE_SUM, _MODE_MEAN, _MODE_MAX = 0, 1, 2


def _bag_of_each_index(offsets: ir.Value, n: int, num_bags: int, idt: torch.dtype) -> ir.Value:
    """offset2bag: the bag starts offsets[1:num_bags] marked and prefix-summed (repeated
    offsets are empty bags; an offset == n marks nothing)."""
    marks = full(0, idt, [n])
    if num_bags > 1:
        starts = reshape(stablehlo.SliceOp(convert(offsets, idt), [1], [num_bags], [1]).result, [num_bags - 1, 1])
        marks = ScatterSpec(starts, (), (0,), (0,), 1).apply(marks, full(1, idt, [num_bags - 1]), "add")
    return prefix_sum_last_axis(marks)


def _not_padding(ids: ir.Value, padding_idx: int) -> ir.Value:
    shape = shape_of(ids)
    if padding_idx is None or padding_idx < 0:
        return full(True, torch.bool, shape)
    return compare(ids, full(padding_idx, dtype(ids), shape), "NE")


@lowers(aten._embedding_bag.default, aten._embedding_bag_forward_only.default, dynamic=Padding.INDEX)
def _embedding_bag(
    ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
    per_sample_weights=None, include_last_offset=False, padding_idx=-1,
):
    """(output, offset2bag, bag_size, max_indices) as ATen's CPU kernel computes them: the
    bag of each index comes from a prefix sum of bag starts; empty bags give 0. The
    auxiliary outputs take the shapes the op's meta function gives (offset2bag is empty
    on the CPU fast path of mode='sum')."""
    if rank_of(indices) != 1:
        raise ctx.fail("_embedding_bag expects 1-D indices (F.embedding_bag flattens 2-D input)")
    wdt = dtype(weight)
    num_rows, feat = shape_of(weight)
    (n,) = shape_of(indices)
    num_offsets = shape_of(offsets)[0]
    num_bags = num_offsets - 1 if include_last_offset else num_offsets
    out_shapes = [ctx.result_shape(i) for i in range(4)]
    odt = ctx.result_dtype(1)
    idt = _index_dtype(max(n, num_rows) + 1)

    if n:
        bag = _bag_of_each_index(offsets, n, num_bags, idt)
        ids = convert(indices, idt)
        valid = _not_padding(ids, padding_idx)
        rows = take_rows(weight, ids) if num_rows and feat else full(0, wdt, [n, feat])
    by_bag = ScatterSpec(reshape(bag, [n, 1]), (1,), (0,), (0,), 1) if n else None
    valid_rows = broadcast_to(reshape(valid, [n, 1]), [n, feat]) if n else None

    if n and mode != _MODE_MAX:
        if per_sample_weights is not None:
            psw = broadcast_to(reshape(convert(per_sample_weights, wdt), [n, 1]), [n, feat])
            rows = stablehlo.MulOp(rows, psw).result
        rows = select(valid_rows, rows, full(0, wdt, [n, feat]))
    counts = full(0, idt, [num_bags])
    if n:
        counts = ScatterSpec(reshape(bag, [n, 1]), (), (0,), (0,), 1).apply(counts, convert(valid, idt), "add")

    max_indices = None
    if not n or num_bags == 0:
        output = full(0, wdt, [num_bags, feat])
    elif mode == _MODE_MAX:
        lowest = full(min_value(wdt), wdt, [n, feat])
        best = by_bag.apply(full(min_value(wdt), wdt, [num_bags, feat]), select(valid_rows, rows, lowest), "max")
        # ATen keeps the first index reaching the maximum (strict '>' while scanning).
        bag_best = gather(
            best, reshape(bag, [n, 1]), offset_dims=[1], collapsed_slice_dims=[0], start_index_map=[0],
            index_vector_dim=1, slice_sizes=[1, feat],
        )
        hit = stablehlo.AndOp(valid_rows, compare(rows, bag_best, "EQ")).result
        position = broadcast_to(reshape(iota([n], 0, idt), [n, 1]), [n, feat])
        first = by_bag.apply(full(n, idt, [num_bags, feat]), select(hit, position, full(n, idt, [n, feat])), "min")
        empty = compare(first, full(n, idt, [num_bags, feat]), "EQ")
        which = _take_1d(ids, stablehlo.MinOp(first, full(n - 1, idt, [num_bags, feat])).result)
        max_indices = select(empty, full(0, idt, [num_bags, feat]), which)
        output = select(empty, full(0, wdt, [num_bags, feat]), best)
    else:
        output = by_bag.apply(full(0, wdt, [num_bags, feat]), rows, "add")
        if mode == _MODE_MEAN:
            divisor = stablehlo.MaxOp(counts, full(1, idt, [num_bags])).result
            divisor = broadcast_to(reshape(convert(divisor, wdt), [num_bags, 1]), [num_bags, feat])
            output = stablehlo.DivOp(output, divisor).result

    def sized(value: ir.Value | None, shape: list[int]) -> ir.Value:
        """`value` in the offsets dtype, zero-padded/cut to the meta shape."""
        if value is None or 0 in shape:
            return full(0, odt, shape)
        value = convert(value, odt)
        have = shape_of(value)
        if have != shape:
            pad = [max(s - h, 0) for s, h in zip(shape, have)]
            value = stablehlo.PadOp(value, full(0, odt, []), [0] * len(pad), pad, [0] * len(pad)).result
            value = stablehlo.SliceOp(value, [0] * len(shape), shape, [1] * len(shape)).result
        return value

    bag_size = counts if mode in (_MODE_MEAN, _MODE_MAX) else None
    offset2bag = bag if n else None
    if mode != _MODE_MAX:
        max_indices = bag_size
    return (
        output,
        sized(offset2bag, out_shapes[1]),
        sized(bag_size, out_shapes[2]),
        sized(max_indices, out_shapes[3]),
    )


def _embedding_bag_metadata(
    op, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
    per_sample_weights=None, include_last_offset=False, padding_idx=-1,
):
    """The results' metadata as ATen's CPU kernel gives them (the eager device returns
    CPU eager's shapes; the meta kernel's differ, and compiled graphs keep those):
    offset2bag is empty on CPU's fast path of mode='sum' (a float/half/bfloat16 table
    with unit row stride, unit-stride per-sample weights, no padding_idx) and one bag per
    index otherwise; bag_size has one entry per bag, except for `_embedding_bag_forward_only`
    in mode='sum', which leaves it one per offset (the meta kernel counts offsets whenever
    include_last_offset is set); max_indices is bag_size's copy except in mode='max'."""
    output, _, _, max_indices = aten._embedding_bag.default(
        weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset,
        padding_idx)
    fast_sum = (
        mode == _MODE_SUM and weight.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and weight.stride(1) == 1 and (padding_idx is None or padding_idx < 0)
        and (per_sample_weights is None or per_sample_weights.stride(0) == 1)
    )
    offset2bag = offsets.new_empty((0 if fast_sum else indices.shape[0],))
    counted = mode != _MODE_SUM or op is aten._embedding_bag.default  # (ATen: for the backward)
    bag_size = offsets.new_empty((offsets.shape[0] - (1 if include_last_offset and counted else 0),))
    if mode != _MODE_MAX:
        max_indices = bag_size.new_empty(bag_size.shape)
    return output, offset2bag, bag_size, max_indices


for _op in (aten._embedding_bag.default, aten._embedding_bag_forward_only.default):
    metadata_rule(_op)(partial(_embedding_bag_metadata, _op))


def _bags_for_backward(offsets, offset2bag, n: int, num_bags: int, idt: torch.dtype) -> ir.Value:
    """The forward's offset2bag, or recomputed from offsets when the forward left it
    empty (the CPU fast path of mode='sum'), as ATen's backward does."""
    if math.prod(shape_of(offset2bag)) == n:
        return convert(reshape(offset2bag, [n]), idt)
    return _bag_of_each_index(offsets, n, num_bags, idt)


def _embedding_bag_grad_weight(
    ctx, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
    scale_grad_by_freq, mode, per_sample_weights, padding_idx,
):
    """Dense gradient of the bag table: every index adds its bag's gradient row (scaled by
    its per-sample weight, 1/bag_size for mean, 1/frequency with scale_grad_by_freq) to
    its table row; max mode adds each bag's gradient at its argmax rows."""
    gdt = dtype(grad)
    num_bags, feat = shape_of(grad)
    (n,) = shape_of(indices)
    out = full(0, gdt, [num_weights, feat])
    if n == 0 or num_bags == 0 or feat == 0 or num_weights == 0:
        return out
    idt = _index_dtype(max(n, num_weights, num_bags) + 1)
    if mode == _MODE_MAX:
        nonempty = compare(convert(bag_size, idt), full(0, idt, [num_bags]), "GT")
        updates = select(broadcast_to(reshape(nonempty, [num_bags, 1]), [num_bags, feat]), grad, full(0, gdt, [num_bags, feat]))
        spec = _scatter_dim_spec(out, 0, convert(maximum_indices, idt))
        return spec.apply(out, updates, "add")
    bag = _bags_for_backward(offsets, offset2bag, n, num_bags, idt)
    ids = convert(indices, idt)
    scale = full(1, gdt, [n])
    if mode == _MODE_MEAN:
        sizes = _take_1d(convert(bag_size, gdt), bag)
        scale = stablehlo.DivOp(scale, sizes).result
    if per_sample_weights is not None:
        scale = stablehlo.MulOp(scale, convert(per_sample_weights, gdt)).result
    if scale_grad_by_freq:
        counts = ScatterSpec(reshape(ids, [n, 1]), (), (0,), (0,), 1).apply(full(0, gdt, [num_weights]), full(1, gdt, [n]), "add")
        scale = stablehlo.DivOp(scale, _take_1d(counts, ids)).result
    scale = select(_not_padding(ids, padding_idx), scale, full(0, gdt, [n]))
    rows = stablehlo.MulOp(take_rows(grad, bag), broadcast_to(reshape(scale, [n, 1]), [n, feat])).result
    return ScatterSpec(reshape(ids, [n, 1]), (1,), (0,), (0,), 1).apply(out, rows, "add")


@lowers(aten._embedding_bag_backward.default, dynamic=Padding.INDEX)
def _embedding_bag_backward(
    ctx, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
    scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1,
):
    if sparse:
        raise ctx.fail("sparse gradients (EmbeddingBag(sparse=True)) are not supported: XLA has no sparse tensors")
    return _embedding_bag_grad_weight(
        ctx, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
        scale_grad_by_freq, mode, per_sample_weights, padding_idx,
    )


@lowers(aten._embedding_bag_dense_backward.default, dynamic=Padding.INDEX)
def _embedding_bag_dense_backward(
    ctx, grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
    scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1,
):
    if mode != _MODE_MAX and math.prod(shape_of(offset2bag)) != math.prod(shape_of(indices)):
        raise ctx.fail("_embedding_bag_dense_backward needs the forward's offset2bag for every index")
    return _embedding_bag_grad_weight(
        ctx, grad, indices, None, offset2bag, bag_size, maximum_indices, num_weights,
        scale_grad_by_freq, mode, per_sample_weights, padding_idx,
    )


@lowers(aten._embedding_bag_per_sample_weights_backward.default, dynamic=Padding.INDEX)
def _embedding_bag_per_sample_weights_backward(ctx, grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """d output / d per_sample_weights[i] = <grad[bag(i)], weight[indices[i]]> (0 for
    padding); only mode='sum' has per-sample weights."""
    if mode != _MODE_SUM:
        raise ctx.fail("per_sample_weights are only supported with mode='sum'")
    out_shape, out_dtype = ctx.result_shape(), ctx.result_dtype()
    (n,) = shape_of(indices)
    num_bags, feat = shape_of(grad)
    if n == 0 or feat == 0:
        return full(0, out_dtype, out_shape)
    idt = _index_dtype(max(n, shape_of(weight)[0], num_bags) + 1)
    bag = _bags_for_backward(offsets, offset2bag, n, num_bags, idt)
    ids = convert(indices, idt)
    products = stablehlo.MulOp(take_rows(grad, bag), convert(take_rows(weight, ids), dtype(grad))).result
    (dots,) = reduce([products], [full(0, dtype(grad), [])], [1], lambda acc, new: [stablehlo.AddOp(acc[0], new[0]).result])
    dots = select(_not_padding(ids, padding_idx), dots, full(0, dtype(grad), [n]))
    return convert(dots, out_dtype)
