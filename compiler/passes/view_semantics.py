"""Forward and inverse of each simple view, on values (shared by the view passes).

`forward(op, source)` is the value seen through view `op` when its source holds
`source`; `inverse(op, source, new)` is the source's value after `new` is stored
through the view. Both build StableHLO at the current insertion point and location.
A view whose write would store several values into one element (a broadcast dim, a
gather_view with repeated indices) has no inverse: `overlap_reason` says why.
"""

from __future__ import annotations

from math import prod

import numpy as np
import torch

from ..context import ir, stablehlo
from ..dialect import ref_tensor_type
from ..dtypes import dtype_of
from ..lowering.helpers import broadcast_to, constant, full, reshape, scalar_region, shape_of, transpose
from ..lowering.storage_layout import reinterpret_bits, take_static

# Views that torchtpu-decompose-views rewrites; torchtpu-inverse-views needs them gone.
COMPLEX_VIEWS = frozenset({"torchtpu.diagonal", "torchtpu.unfold", "torchtpu.as_strided"})


class ViewError(Exception):
    """A view the passes cannot give a meaning to; the message completes the diagnostic."""


def attrs_of(op: ir.Operation) -> dict:
    out: dict = {}
    attributes = op.attributes
    for index in range(len(attributes)):
        named = attributes[index]
        name, attr = named.name, named.attr
        if isinstance(attr, ir.IntegerAttr):
            out[name] = ir.IntegerAttr(attr).value
        elif isinstance(attr, ir.DenseI64ArrayAttr):
            out[name] = list(ir.DenseI64ArrayAttr(attr))
        elif isinstance(attr, ir.DenseIntElementsAttr):
            out[name] = np.array(ir.DenseIntElementsAttr(attr), dtype=np.int64)
    return out


def tensor_of(t: ir.Type) -> ir.RankedTensorType:
    """The tensor type of a reference, or `t` itself (torchtpu-inverse-views retypes
    reference arguments to tensors before it removes their views)."""
    inner = ref_tensor_type(t)
    return inner if inner is not None else ir.RankedTensorType(t)


def view_shapes(op: ir.Operation) -> tuple[list[int], list[int]]:
    return list(tensor_of(op.operands[0].type).shape), list(tensor_of(op.results[0].type).shape)


def expand_overlaps(src: list[int], dst: list[int]) -> bool:
    """Whether a broadcast from `src` to `dst` repeats some element."""
    lead = len(dst) - len(src)
    if any(n != 1 for n in dst[:lead]):
        return True
    return any(s == 1 and d != 1 for s, d in zip(src, dst[lead:]))


def overlap_reason(op: ir.Operation) -> str | None:
    """Why a store through `op` would write one element twice, or None."""
    name = op.name
    if name == "torchtpu.expand":
        src, dst = view_shapes(op)
        if expand_overlaps(src, dst):
            return (f"an expanded view (broadcast {src} -> {dst}, stride 0) maps several elements to one "
                    "memory location")
    if name == "torchtpu.gather_view":
        indices = attrs_of(op)["indices"]
        if len(np.unique(indices)) != indices.size:
            return "the view addresses some storage element more than once (overlapping windows or strides)"
    return None


# -- builders --------------------------------------------------------------------------
def _i64_scalar(v: int) -> ir.Value:
    return constant(int(v), torch.int64, [])


def _index_constant(indices: np.ndarray) -> ir.Value:
    flat = np.asarray(indices, dtype=np.int64).reshape(-1, 1)
    dt = torch.int32 if flat.size == 0 or flat.max() < 2**31 else torch.int64
    return constant(flat.astype(np.int32 if dt is torch.int32 else np.int64), dt, list(flat.shape))


def gather_flat(source: ir.Value, indices: np.ndarray) -> ir.Value:
    """Elements of `source` at row-major positions `indices` (shape = indices.shape): the
    storage layout's static gather (`storage_layout.take_static`) of the flattened source."""
    n = prod(shape_of(source))
    if indices.size == 0 or n == 0:
        # Nothing to read (an empty view, or one of an empty source): a gather over an
        # empty operand does not verify, and the result has no elements anyway.
        return full(0, dtype_of(source.type), list(indices.shape))
    return reshape(take_static(reshape(source, [n]), 0, indices.reshape(-1)), list(indices.shape))


def scatter_flat(source: ir.Value, indices: np.ndarray, updates: ir.Value) -> ir.Value:
    """`source` with the elements at row-major positions `indices` replaced by `updates`.

    Not `storage_layout.write_strided`: that writes a (size, stride, offset) window, where
    positions may repeat, by gathering every storage element from [written values, old
    storage]. Here `inverse` has already refused a view that writes an element twice
    (`overlap_reason`), so the positions are unique and a scatter of just the written
    elements is exact and touches no other element."""
    shape = shape_of(source)
    if indices.size == 0:
        return source  # an empty view: the store changes nothing
    n = prod(shape)
    dt = dtype_of(source.type)
    flat = reshape(source, [n])
    values = reshape(updates, [int(indices.size)])
    numbers = ir.Attribute.parse(
        "#stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>"
    )
    op = stablehlo.ScatterOp([flat.type], [flat], _index_constant(indices), [values], numbers,
                             indices_are_sorted=bool(np.all(np.diff(indices.reshape(-1)) > 0)),
                             unique_indices=True)
    scalar_region(op.update_computation, [dt, dt], lambda args: [args[1]])
    return reshape(op.results[0], shape)


def _slice_positions(shape: list[int], dim: int, start: int, limit: int, step: int) -> np.ndarray:
    positions = np.arange(prod(shape), dtype=np.int64).reshape(shape)
    index = [slice(None)] * len(shape)
    index[dim] = slice(start, limit, step)
    return positions[tuple(index)]


def _bitcast(value: ir.Value, to: torch.dtype, shape: list[int]) -> ir.Value:
    src = dtype_of(value.type)
    for dt in (src, to):
        if dt.is_complex or dt is torch.bool:
            raise ViewError(f"a dtype view between {src} and {to} on a written tensor is not supported")
    return reshape(reinterpret_bits(value, to), shape)


# -- forward / inverse -------------------------------------------------------------------
def forward(op: ir.Operation, source: ir.Value) -> ir.Value:
    name = op.name
    a = attrs_of(op)
    src_shape, shape = view_shapes(op)
    if name == "torchtpu.slice":
        starts = [0] * len(src_shape)
        limits = list(src_shape)
        steps = [1] * len(src_shape)
        starts[a["dim"]], limits[a["dim"]], steps[a["dim"]] = a["start"], a["limit"], a["step"]
        return stablehlo.SliceOp(source, starts, limits, steps).result
    if name == "torchtpu.select":
        dim, index = a["dim"], a["index"]
        starts = [0] * len(src_shape)
        limits = list(src_shape)
        starts[dim], limits[dim] = index, index + 1
        piece = stablehlo.SliceOp(source, starts, limits, [1] * len(src_shape)).result
        return reshape(piece, shape)
    if name == "torchtpu.permute":
        return transpose(source, a["permutation"])
    if name in ("torchtpu.reshape", "torchtpu.squeeze", "torchtpu.unsqueeze"):
        return reshape(source, shape)
    if name == "torchtpu.expand":
        return broadcast_to(source, shape)
    if name == "torchtpu.alias":
        return source
    if name == "torchtpu.view_dtype":
        return _bitcast(source, dtype_of(ref_tensor_type(op.results[0].type)), shape)
    if name == "torchtpu.gather_view":
        return gather_flat(source, a["indices"])
    raise ViewError(f"no forward rule for '{name}'")


def inverse(op: ir.Operation, source: ir.Value, new: ir.Value) -> ir.Value:
    name = op.name
    a = attrs_of(op)
    src_shape, _ = view_shapes(op)
    reason = overlap_reason(op)
    if reason is not None:
        raise ViewError(f"cannot write through '{name}': {reason}; PyTorch rejects such writes too — "
                        "clone() the view before writing")
    if name == "torchtpu.slice":
        if a["step"] == 1:
            starts = [0] * len(src_shape)
            starts[a["dim"]] = a["start"]
            return stablehlo.DynamicUpdateSliceOp(source, new, [_i64_scalar(s) for s in starts]).result
        return scatter_flat(source, _slice_positions(src_shape, a["dim"], a["start"], a["limit"], a["step"]), new)
    if name == "torchtpu.select":
        dim = a["dim"]
        update = reshape(new, src_shape[:dim] + [1] + src_shape[dim + 1 :])
        starts = [0] * len(src_shape)
        starts[dim] = a["index"]
        return stablehlo.DynamicUpdateSliceOp(source, update, [_i64_scalar(s) for s in starts]).result
    if name == "torchtpu.permute":
        return transpose(new, list(np.argsort(a["permutation"])))
    if name in ("torchtpu.reshape", "torchtpu.squeeze", "torchtpu.unsqueeze", "torchtpu.expand"):
        return reshape(new, src_shape)
    if name == "torchtpu.alias":
        return new
    if name == "torchtpu.view_dtype":
        return _bitcast(new, dtype_of(tensor_of(op.operands[0].type)), src_shape)
    if name == "torchtpu.gather_view":
        return scatter_flat(source, a["indices"], new)
    raise ViewError(f"no inverse rule for '{name}'")
