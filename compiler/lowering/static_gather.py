"""Builders the pooling, resampling and embedding families share: gathers and scatter-adds
at static (compile-time) indices, and bool constants from NumPy masks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .. import ir as hlo
from .helpers import array_constant, compare, dtype, full, scalar_region, shape_of


# -- generic builders ---------------------------------------------------------------------------
def bool_constant(mask: np.ndarray) -> ir.Value:
    """A bool constant, built as int8 != 0 (helpers.array_constant's packbits path
    mis-encodes i1 arrays on this jaxlib)."""
    values = array_constant(np.asarray(mask, dtype=np.int8), torch.int8)
    return compare(values, full(0, torch.int8, list(np.shape(mask))), "NE")


def take_static(x: ir.Value, axis: int, indices: Sequence[int]) -> ir.Value:
    """x gathered along `axis` at static `indices` (NumPy's take)."""
    indices = [int(i) for i in indices]
    shape = shape_of(x)
    if indices == list(range(shape[axis])):
        return x
    r = len(shape)
    idx = array_constant(np.array(indices, dtype=np.int64).reshape(-1, 1), torch.int64)
    offset_dims = [d for d in range(r) if d != axis]
    attr = ir.Attribute.parse(
        f"#stablehlo.gather<offset_dims = {offset_dims}, collapsed_slice_dims = [{axis}], "
        f"start_index_map = [{axis}], index_vector_dim = 1>"
    )
    sizes = list(shape)
    sizes[axis] = 1
    out = list(shape)
    out[axis] = len(indices)
    return stablehlo.GatherOp(x, idx, attr, sizes, results=[tensor_type(out, dtype(x))]).result


def put_add_static(values: ir.Value, axis: int, indices: Sequence[int], size: int) -> ir.Value:
    """The adjoint of `take_static`: a zero tensor with `size` along `axis` into which the
    slices of `values` are added at `indices`."""
    shape = shape_of(values)
    r = len(shape)
    out = list(shape)
    out[axis] = size
    idx = array_constant(np.array(list(indices), dtype=np.int64).reshape(-1, 1), torch.int64)
    window = [d for d in range(r) if d != axis]
    attr = ir.Attribute.parse(
        f"#stablehlo.scatter<update_window_dims = {window}, inserted_window_dims = [{axis}], "
        f"scatter_dims_to_operand_dims = [{axis}], index_vector_dim = 1>"
    )
    dt = dtype(values)
    op = stablehlo.ScatterOp([tensor_type(out, dt)], [full(0, dt, out)], idx, [values], attr)
    scalar_region(op.update_computation, [dt, dt], lambda a: [hlo.add(a[0], a[1])])
    return op.results[0]
