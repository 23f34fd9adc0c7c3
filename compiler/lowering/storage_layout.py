"""Storage layout: where a strided tensor's elements lie in a flat storage, and the
StableHLO that reads such a window out of a flat storage value and writes one into it.

PyTorch addresses memory as (storage, offset, sizes, strides): element (i0, i1, ...) of
a tensor lies at storage position `offset + i0*stride0 + i1*stride1 + ...`. Its users
build that IR here:

* the eager device (`python/torch_tpu/device/`), which holds every storage as a flat
  1-D buffer, reads each operand of an op as a view of its storage (`read_view`) and
  writes in-place results back into it (`write_view`), dtype views included;
* the `as_strided` / `as_strided_scatter` lowerings (`view_like.py`), which rebuild
  their input's storage from its value (`as_storage`) and read or write a window of it
  (`read_strided`, `write_strided`);
* the view passes (`passes/view_semantics.py`), which read a `torchtpu.gather_view`'s
  static positions with the same gather (`take_static`). Writing through one is a
  scatter of its own: the passes refuse a write that reaches an element twice, so its
  positions are unique and need none of `write_strided`'s ordering.

A window whose layout is a permutation of a dense block is read as a slice, a reshape and
a transpose, and written as a `dynamic_update_slice` of its transposed, flattened value.
A window that is a box of the storage seen as a row-major block array (`box_of`: a slice
of a dense block such as a chunk of a transposed head view, with zero-stride dims read
as a broadcast) is read as a reshape, a slice and a transpose, and written as a
`dynamic_update_slice` of the block.
Any other window (overlapping, odd strides) is read by a gather at its static
positions, and written by a gather too -- every storage position picks its new value
from `[written values, old storage]` -- rather than a scatter: the positions are known
when the module is built, and a gather makes overlapping writes deterministic without a
combiner region. Where a window overlaps itself, each position keeps the element
PyTorch's CPU `copy_` writes last (`write_order`).

Strides here are never negative (PyTorch has none); positions are computed in NumPy
when the module is built, so a window costs no run-time index arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from .. import ir as hlo
from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import (
    bitcast,
    broadcast_to,
    constant,
    convert,
    dtype,
    reshape,
    shape_of,
    transpose,
)


# -- layouts (plain integers) -------------------------------------------------------------------------
def numel_of(size: Sequence[int]) -> int:
    return int(np.prod([int(s) for s in size], dtype=np.int64)) if len(size) else 1


def dense_order(size: Sequence[int], stride: Sequence[int]) -> list[int] | None:
    """A permutation of the dims, outermost to innermost in memory, when the layout is
    non-overlapping and dense -- its storage is then exactly the value transposed by the
    permutation and flattened (contiguous, channels-last, any transpose of those). Size-1
    dims, whose stride means nothing, go last. None for any other layout (and for a
    zero-size tensor whose strides are not those of a dense one: callers that accept any
    layout of an empty tensor check `numel_of` first)."""
    sized = [d for d in range(len(size)) if int(size[d]) != 1]
    unit = [d for d in range(len(size)) if int(size[d]) == 1]
    order = sorted(sized, key=lambda d: -int(stride[d]))
    expected = 1
    for d in reversed(order):
        if int(stride[d]) != expected:
            return None
        expected *= int(size[d])
    return order + unit


def strided_positions(size: Sequence[int], stride: Sequence[int], offset: int) -> np.ndarray:
    """The storage position of every element of the window, in logical order (an array
    of shape `size`)."""
    positions = np.full([int(s) for s in size], int(offset), dtype=np.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = int(n)
        positions = positions + (np.arange(int(n), dtype=np.int64) * int(st)).reshape(shape)
    return positions


def window_span(size: Sequence[int], stride: Sequence[int], offset: int) -> tuple[int, int] | None:
    """(lowest, highest) storage position the window touches; None for an empty window.
    What bounds checks compare with the storage's length, without listing positions."""
    if any(int(n) == 0 for n in size):
        return None
    low = high = int(offset)
    for n, st in zip(size, stride):
        reach = (int(n) - 1) * int(st)
        low, high = low + min(reach, 0), high + max(reach, 0)
    return low, high


def write_order(size: Sequence[int], stride: Sequence[int]) -> list[int]:
    """The dims, outermost first, in the order PyTorch's CPU `copy_` visits a destination
    with these strides from a contiguous source (TensorIterator's `reorder_dimensions`:
    an insertion sort by the destination's strides, ties and zero strides broken by the
    source's, then by size). Where a window overlaps itself, this order says which
    element each storage position keeps: the last one visited."""
    contiguous = [1] * len(size)
    for d in range(len(size) - 2, -1, -1):
        contiguous[d] = contiguous[d + 1] * max(int(size[d + 1]), 1)
    operands = ([int(s) for s in stride], contiguous)

    def comes_after(d0: int, d1: int) -> int:  # 1: d0 is inner to d1, -1: outer, 0: no order
        for strides in operands:
            s0, s1 = strides[d0], strides[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return 1 if s0 > s1 else -1
            if int(size[d0]) > int(size[d1]):
                return 1
        return 0

    perm = list(range(len(size)))[::-1]  # innermost first
    for i in range(1, len(perm)):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            comparison = comes_after(perm[d0], perm[d1])
            if comparison > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif comparison < 0:
                break
    return perm[::-1]


@dataclass(frozen=True)
class Box:
    """A window that is a box of the storage read as a row-major block array (`box_of`):
    the storage's first `prod(block)` elements reshaped to `block`, sliced from `starts`
    to `limits`, give the window's non-broadcast dims of size > 1 (`dims`, outermost in
    memory first) and a trailing dim of 1 where `block` has an inner gap dim."""

    block: tuple[int, ...]
    starts: tuple[int, ...]
    limits: tuple[int, ...]
    dims: tuple[int, ...]  # the window's dims each block dim but the gap holds, outermost first

    @property
    def covered(self) -> int:
        return numel_of(self.block)


def box_of(size: Sequence[int], stride: Sequence[int], offset: int, total: int) -> Box | None:
    """The window (`size`, `stride`, `offset`) of a flat storage of `total` elements as a
    box of a block array, or None. It is one when its strides (size-1 and zero-stride
    dims left out) each divide the next larger one and the window lies inside each
    block dim: a slice of a dense block (`x[..., :8]`, `x.chunk(2, -1)` of a transposed
    head view), a transpose of one, a strided row pick. On a TPU a gather of single
    elements is slow and its index array is a constant as large as the window; a box is a
    reshape and a slice."""
    dims = sorted((d for d in range(len(size)) if int(size[d]) != 1 and int(stride[d]) != 0),
                  key=lambda d: int(stride[d]))  # innermost first
    if not dims:  # one element, broadcast
        return Box((int(total),), (int(offset),), (int(offset) + 1,), ())
    block, starts, limits = [], [], []
    rest = int(offset)
    inner = int(stride[dims[0]])
    if inner > 1:  # the elements between two neighbours of the innermost dim: one is taken
        block.append(inner)
        starts.append(rest % inner)
        limits.append(rest % inner + 1)
    for k, d in enumerate(dims):
        unit = int(stride[d])
        outer = int(stride[dims[k + 1]]) if k + 1 < len(dims) else None
        if outer is not None and (outer <= unit or outer % unit):
            return None
        extent = outer // unit if outer is not None else total // unit
        start = (rest // unit) % extent if outer is not None else rest // unit
        if start + int(size[d]) > extent:
            return None
        block.append(extent)
        starts.append(start)
        limits.append(start + int(size[d]))
    return Box(tuple(block[::-1]), tuple(starts[::-1]), tuple(limits[::-1]), tuple(dims[::-1]))


def _read_box(storage: ir.Value, box: Box, size: Sequence[int]) -> ir.Value:
    """The window `box` describes (`box_of`), as a value of shape `size`: its zero-stride
    dims broadcast."""
    head = storage if box.covered == shape_of(storage)[0] else hlo.slice_in_dim(storage, 0, 0, box.covered)
    taken = stablehlo.SliceOp(reshape(head, box.block), list(box.starts), list(box.limits), [1] * len(box.block)).result
    held = reshape(taken, [int(size[d]) for d in box.dims])
    logical = sorted(box.dims)
    value = transpose(held, [box.dims.index(d) for d in logical])
    if len(logical) == len(size):
        return value
    return hlo.broadcast_in_dim(value, [int(s) for s in size], logical)


def _write_box(storage: ir.Value, value: ir.Value, box: Box, size: Sequence[int]) -> ir.Value:
    """The flat storage after writing `value` (of shape `size`, no zero-stride dim of
    size > 1) into the window `box` describes: a `dynamic_update_slice` of the block."""
    total = shape_of(storage)[0]
    head = storage if box.covered == total else hlo.slice_in_dim(storage, 0, 0, box.covered)
    logical = sorted(box.dims)
    held = transpose(reshape(value, [int(size[d]) for d in logical]), [logical.index(d) for d in box.dims])
    update = reshape(held, [hi - lo for lo, hi in zip(box.starts, box.limits)])
    starts = [constant(int(s), torch.int64) for s in box.starts]
    block = stablehlo.DynamicUpdateSliceOp(reshape(head, box.block), update, starts).result
    written = reshape(block, [box.covered])
    if box.covered == total:
        return written
    return hlo.concatenate([written, hlo.slice_in_dim(storage, 0, box.covered, total)], 0)


def _inverse(order: Sequence[int]) -> list[int]:
    return [list(order).index(d) for d in range(len(order))]


# -- IR: static gathers ----------------------------------------------------------------------------
def take_static(x: ir.Value, dim: int, index: np.ndarray) -> ir.Value:
    """Gathers along `dim` with a static index array: the result has shape
    `x.shape[:dim] + index.shape + x.shape[dim+1:]`."""
    shape = shape_of(x)
    index = np.asarray(index, dtype=np.int64)
    q = index.ndim
    index_dtype = torch.int32 if shape[dim] < 2**31 else torch.int64
    indices = constant(index.reshape(index.shape + (1,)), index_dtype, list(index.shape) + [1])
    before, after = list(range(dim)), list(range(dim + q, dim + q + len(shape) - dim - 1))
    offset_dims = before + after
    fields = []
    if offset_dims:
        fields.append(f"offset_dims = [{', '.join(map(str, offset_dims))}]")
    fields += [f"collapsed_slice_dims = [{dim}]", f"start_index_map = [{dim}]", f"index_vector_dim = {q}"]
    numbers = ir.Attribute.parse(f"#stablehlo.gather<{', '.join(fields)}>")
    slice_sizes = list(shape)
    slice_sizes[dim] = 1
    result_shape = shape[:dim] + list(index.shape) + shape[dim + 1 :]
    return stablehlo.GatherOp(
        x, indices, numbers, slice_sizes, indices_are_sorted=False, results=[tensor_type(result_shape, dtype(x))]
    ).result


# -- IR: windows of a flat storage of the window's own dtype -------------------------------------------
def as_storage(value: ir.Value, size: Sequence[int], stride: Sequence[int]) -> ir.Value:
    """`value` (of shape `size`) laid out as the flat storage of a dense tensor with
    `stride`: transposed to memory order, then flattened."""
    numel = numel_of(size)
    order = dense_order(size, stride)
    if order is None and numel != 0:
        raise ValueError(f"storage_layout.as_storage: sizes {list(size)} with strides {list(stride)} are not a "
                         "dense layout, so a value does not determine its storage; read such windows with "
                         "read_strided and write them with write_strided")
    if order is not None and order != sorted(order):
        value = transpose(value, order)
    return reshape(value, [numel])


def read_strided(storage: ir.Value, size: Sequence[int], stride: Sequence[int], offset: int) -> ir.Value:
    """The value (of shape `size`) of the window (`size`, `stride`, `offset`) of a flat
    storage value. The window must lie inside the storage (`window_span`)."""
    size = [int(s) for s in size]
    numel = numel_of(size)
    if numel == 0:
        return reshape(hlo.slice_in_dim(storage, 0, 0, 0), size)
    order = dense_order(size, stride)
    if order is not None:
        flat = storage
        if offset != 0 or numel != shape_of(storage)[0]:
            flat = hlo.slice_in_dim(storage, 0, int(offset), int(offset) + numel)
        value = reshape(flat, [size[d] for d in order])
        return value if order == sorted(order) else transpose(value, _inverse(order))
    box = box_of(size, stride, offset, shape_of(storage)[0])
    if box is not None:
        return _read_box(storage, box, size)
    positions = strided_positions(size, stride, offset)
    return reshape(take_static(storage, 0, positions.reshape(-1)), size)


def write_strided(storage: ir.Value, value: ir.Value, size: Sequence[int], stride: Sequence[int],
                  offset: int) -> ir.Value:
    """The flat storage after writing `value` (of shape `size`, the storage's dtype) into
    the window (`size`, `stride`, `offset`); where the window overlaps itself, a position
    keeps the element PyTorch's CPU `copy_` writes last (`write_order`). The window must
    lie inside the storage."""
    numel = numel_of(size)
    total = shape_of(storage)[0]
    order = dense_order(size, stride)
    if order is not None and offset == 0 and numel == total:
        return as_storage(value, size, stride)  # the window is the whole storage
    if numel == 0:
        return storage
    if order is not None:
        # A dense block of the storage (`x[2:4] += 1` on a contiguous x): an update of
        # that block, which XLA can do in place, where a gather rebuilds every element.
        start = constant(int(offset), torch.int64)
        return stablehlo.DynamicUpdateSliceOp(storage, as_storage(value, size, stride), [start]).result
    box = None if any(int(st) == 0 and int(n) > 1 for n, st in zip(size, stride)) else \
        box_of(size, stride, offset, total)
    if box is not None:
        return _write_box(storage, value, box, size)
    # source[p]: the index into [value..., storage...] of what storage position p holds after.
    source = np.arange(numel, numel + total, dtype=np.int64)
    order = write_order(size, stride)
    positions = strided_positions(size, stride, offset).transpose(order).reshape(-1)
    elements = np.arange(numel, dtype=np.int64).reshape([int(n) for n in size]).transpose(order).reshape(-1)
    # The last write of each position (NumPy does not promise which of repeated indices an
    # assignment keeps): the first occurrence in the reversed write order.
    written, last = np.unique(positions[::-1], return_index=True)
    source[written] = elements[::-1][last]
    combined = hlo.concatenate([reshape(value, [numel]), storage], 0)
    return take_static(combined, 0, source)


# -- IR: reinterpreting bytes ----------------------------------------------------------------------------
def reinterpret_bits(x: ir.Value, to: torch.dtype) -> ir.Value:
    """`x`'s bits read as `to` along its last dim: a wider source splits its last dim, a
    narrower one packs it. Real and integer dtypes of StableHLO only (`reinterpret` also
    takes bool and complex). Public: `torchtpu-inverse-views` (view_semantics) builds
    with it."""
    src = dtype(x)
    if src == to:
        return x
    src_bytes, dst_bytes = src.itemsize, to.itemsize
    shape = shape_of(x)
    if src_bytes == dst_bytes:
        return bitcast(x, to)
    if src_bytes > dst_bytes:
        ratio = src_bytes // dst_bytes
        pieces = bitcast(x, to, shape + [ratio])
        return reshape(pieces, (shape[:-1] + [shape[-1] * ratio]) if shape else [ratio])
    ratio = dst_bytes // src_bytes
    grouped = reshape(x, shape[:-1] + [shape[-1] // ratio, ratio])
    return bitcast(grouped, to, shape[:-1] + [shape[-1] // ratio])


def reinterpret(x: ir.Value, to: torch.dtype) -> ir.Value:
    """`x`'s bytes (little-endian, as PyTorch lays them out on CPU and TPU hosts) read as
    `to` elements along its last dim: the core of `aten.view(dtype)`, before its final
    reshape (a 0-d source becomes 1-d). Bool is one byte in PyTorch but i1 in StableHLO,
    so it goes through uint8; complex goes through its interleaved (real, imag) pairs."""
    src = dtype(x)
    if src == to:
        return x
    if src.is_complex:
        x = _interleaved(x)
    elif src is torch.bool:
        x = convert(x, torch.uint8)
    carrier = torch.uint8 if to is torch.bool else to.to_real() if to.is_complex else to
    x = reinterpret_bits(x, carrier)
    if to is torch.bool:
        return convert(x, torch.bool)
    if to.is_complex:
        return _paired(x)
    return x


def _interleaved(x: ir.Value) -> ir.Value:
    """A complex value's (real, imag) parts interleaved along the last dim: [..., n] ->
    [..., 2n] (0-d -> [2])."""
    shape = shape_of(x)
    parts = [reshape(op(x).result, shape + [1]) for op in (stablehlo.RealOp, stablehlo.ImagOp)]
    pairs = hlo.concatenate(parts, len(shape))
    return reshape(pairs, shape[:-1] + [shape[-1] * 2] if shape else [2])


def _paired(x: ir.Value) -> ir.Value:
    """The inverse of `_interleaved`: [..., 2n] reals -> [..., n] complex."""
    shape = shape_of(x)
    lead, n = shape[:-1], shape[-1] // 2
    pairs = reshape(x, lead + [n, 2])
    real, imag = (reshape(hlo.slice_in_dim(pairs, len(lead) + 1, k, k + 1), lead + [n]) for k in (0, 1))
    return stablehlo.ComplexOp(real, imag).result


# -- IR: views of a storage, dtype views included -----------------------------------------------------
@dataclass(frozen=True)
class StorageView:
    """A tensor as a window of a flat storage: its dtype and layout (counted in its own
    elements), and its storage's element dtype and length. A dtype view (`t.view(torch.int32)`
    of a float16 storage) has `dtype != storage_dtype`."""

    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    storage_dtype: torch.dtype
    storage_numel: int


def _as_view_dtype(storage: ir.Value, view: StorageView) -> tuple[ir.Value, StorageView, int]:
    """(the storage read as `view.dtype` elements, `view` described over that, how many
    storage elements it covers). Elements narrower than the view's past the last whole
    view element (a 3-byte tail under an int32 view) are no part of any view element:
    they are left out here, and kept by writes."""
    if view.dtype == view.storage_dtype:
        return storage, view, view.storage_numel
    ratio = view.dtype.itemsize // view.storage_dtype.itemsize
    covered = view.storage_numel - view.storage_numel % ratio if ratio > 1 else view.storage_numel
    head = storage if covered == view.storage_numel else hlo.slice_in_dim(storage, 0, 0, covered)
    numel = covered * view.storage_dtype.itemsize // view.dtype.itemsize
    return reinterpret(head, view.dtype), replace(view, storage_dtype=view.dtype, storage_numel=numel), covered


def read_view(storage: ir.Value, view: StorageView) -> ir.Value:
    """The value of the tensor `view` describes, from its flat storage value."""
    storage, view, _ = _as_view_dtype(storage, view)
    return read_strided(storage, view.size, view.stride, view.offset)


def write_view(storage: ir.Value, value: ir.Value, view: StorageView) -> ir.Value:
    """The flat storage after writing `value` (converted to the view's dtype and
    broadcast to its sizes, as `copy_` does) into the tensor `view` describes; a dtype
    view writes its elements' bytes (the inverse reinterpretation of `read_view`)."""
    viewed, viewed_as, covered = _as_view_dtype(storage, view)
    value = broadcast_to(convert(value, view.dtype), list(view.size))
    written = write_strided(viewed, value, viewed_as.size, viewed_as.stride, viewed_as.offset)
    if viewed_as is view:
        return written
    written = reinterpret(written, view.storage_dtype)
    if covered < view.storage_numel:
        written = hlo.concatenate([written, hlo.slice_in_dim(storage, 0, covered, view.storage_numel)], 0)
    return written


def apply_lazy_bits(value: ir.Value, *, conj: bool, neg: bool) -> ir.Value:
    """The value PyTorch means by a view of `value`'s storage carrying its lazy negation
    (`x.neg()` of a conjugate view) and conjugation (`x.conj()`) bits: the storage holds the
    plain values, the bits apply on read."""
    if neg:
        value = stablehlo.NegOp(value).result
    if conj:
        real, imag = stablehlo.RealOp(value).result, stablehlo.ImagOp(value).result
        value = stablehlo.ComplexOp(real, stablehlo.NegOp(imag).result).result
    return value
