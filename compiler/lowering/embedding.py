"""Embeddings: `embedding` (a row gather) and `embedding_dense_backward` (a row scatter-add,
optionally scaled by each row's frequency). `_embedding_bag` belongs to the indexing family."""

from __future__ import annotations

import math

import torch

from ..context import ir, stablehlo
from .. import ir as hlo
from ..dtypes import tensor_type
from .helpers import (
    compare,
    convert,
    dtype,
    full,
    rank_of,
    reshape,
    scalar_region,
    select,
    shape_of,
)
from .registry import declare_padding, lowers, Padding
from .opmath import opmath_dtype

aten = torch.ops.aten


# -- embeddings ---------------------------------------------------------------------------------------
def _gather_rows(weight: ir.Value, indices: ir.Value) -> ir.Value:
    """weight[indices] for a 2-D weight and 1-D indices: (M, D)."""
    (m,) = shape_of(indices)
    _, d = shape_of(weight)
    attr = ir.Attribute.parse(
        "#stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>"
    )
    idx = reshape(indices, [m, 1])
    return stablehlo.GatherOp(weight, idx, attr, [1, d], results=[tensor_type([m, d], dtype(weight))]).result


def _scatter_rows(rows: ir.Value, indices: ir.Value, num: int, combine=hlo.add, init=0) -> ir.Value:
    """A (num, *rest) tensor where each rows[i] is combined into row indices[i]."""
    rs = shape_of(rows)
    m = rs[0]
    dt = dtype(rows)
    window = list(range(1, len(rs)))
    attr = ir.Attribute.parse(
        f"#stablehlo.scatter<update_window_dims = {window}, inserted_window_dims = [0], "
        "scatter_dims_to_operand_dims = [0], index_vector_dim = 1>"
    )
    out = [num] + rs[1:]
    op = stablehlo.ScatterOp([tensor_type(out, dt)], [full(init, dt, out)], reshape(indices, [m, 1]), [rows], attr)
    scalar_region(op.update_computation, [dt, dt], lambda a: [combine(a[0], a[1])])
    return op.results[0]


@lowers(aten.embedding.default)
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # Out-of-range indices (an error in eager) are clamped by the gather.
    if rank_of(weight) != 2:
        raise ctx.fail("embedding expects a 2-D weight")
    ishape = shape_of(indices)
    rows = _gather_rows(weight, reshape(indices, [math.prod(ishape)]))
    return reshape(rows, ishape + [shape_of(weight)[1]])


@lowers(aten.embedding_dense_backward.default)
def _embedding_dense_backward(ctx, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    ishape = shape_of(indices)
    m = math.prod(ishape)
    d = shape_of(grad_output)[-1]
    dt = dtype(grad_output)
    acc = opmath_dtype(dt)
    idx = reshape(indices, [m])
    g = reshape(convert(grad_output, acc), [m, d])
    if padding_idx is not None and padding_idx >= 0:
        keep = compare(idx, full(padding_idx, dtype(idx), [m]), "NE")
        g = select(stablehlo.BroadcastInDimOp(tensor_type([m, d], torch.bool), keep, [0]).result, g, full(0, acc, [m, d]))
    if scale_grad_by_freq:
        counts = _scatter_rows(full(1, acc, [m]), idx, int(num_weights))
        per_row = _gather_rows(reshape(counts, [int(num_weights), 1]), idx)
        g = stablehlo.DivOp(g, stablehlo.BroadcastInDimOp(tensor_type([m, d], acc), reshape(per_row, [m]), [0]).result).result
    return convert(_scatter_rows(g, idx, int(num_weights)), dt)


# Bounded dynamism: an embedding reads rows at given indices; its backward scatters rows,
# which XLA's dynamic padder masks (test_gpt_training_step_dynamic_batch).
declare_padding(Padding.SAFE, aten.embedding.default)
declare_padding(Padding.MASKED, aten.embedding_dense_backward.default)
