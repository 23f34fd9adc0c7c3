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
from .indexing import clamp_index, prefix_sum_last_axis
from .opmath import opmath_dtype
from .reduction import sort_with_indices
from .registry import declare_padding, lowers, Padding

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


def _scatter_rows(rows: ir.Value, indices: ir.Value, num: int, combine=hlo.add, init=0,
                  indices_sorted: bool = False) -> ir.Value:
    """A (num, *rest) tensor where each rows[i] is combined into row indices[i]; rows
    whose index is outside [0, num) are dropped. `indices_sorted`: the indices are in
    ascending order (XLA then needs no sort of its own)."""
    rs = shape_of(rows)
    m = rs[0]
    dt = dtype(rows)
    window = list(range(1, len(rs)))
    attr = ir.Attribute.parse(
        f"#stablehlo.scatter<update_window_dims = {window}, inserted_window_dims = [0], "
        "scatter_dims_to_operand_dims = [0], index_vector_dim = 1>"
    )
    out = [num] + rs[1:]
    op = stablehlo.ScatterOp([tensor_type(out, dt)], [full(init, dt, out)], reshape(indices, [m, 1]), [rows], attr,
                             indices_are_sorted=indices_sorted)
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


def _scatter_rows_summed_first(g: ir.Value, idx: ir.Value, num: int, dt: torch.dtype) -> ir.Value:
    """`convert(_scatter_rows(g, idx, num), dt)` for float32 rows `g` (m, d) and m < num,
    without a float32 (num, d) table: the indices are sorted, each run of equal ones sums
    its rows in float32 into one of m slots, and the m sums, rounded to `dt` once, are
    scattered into `dt` zeros. The same sums, each rounded once (the float32 additions
    may come in another order). On the chip the 32000-row table of a Llama step cost a
    float32 fill, scatter and read (0.37 + 0.48 ms, and the AdamW update read 4 bytes an
    element) where JAX's bf16 scatter takes 0.32 ms.

    The keys and the sort's indices are 32-bit (num < 2**31): a TPU carries int64 as two
    32-bit words, and the runs' keys scattered as int64 pairs took 0.17 ms a step on the
    chip, twice the float32 rows' scatter (0.09 ms). An index outside [0, num) becomes -1 or
    num, which the last scatter drops, as it drops the int64 index. The last scatter is
    JAX's embedding gradient's form, unsorted, the unreached slots at row 0: marked sorted,
    with those slots out of range instead, it took 0.306 ms on the chip against 0.250."""
    (m,) = shape_of(idx)
    keys, order = sort_with_indices(convert(clamp_index(idx, -1, num), torch.int32), 0, False, index_dtype=torch.int32)
    rows = _gather_rows(g, order)
    # A run of equal keys starts where the key differs from the one before (and at 0).
    before = stablehlo.PadOp(stablehlo.SliceOp(keys, [0], [m - 1], [1]).result, full(0, torch.int32, []),
                             [1], [0], [0]).result
    first = compare(stablehlo.IotaOp(tensor_type([m], torch.int32), 0).result, full(0, torch.int32, [m]), "EQ")
    starts = stablehlo.OrOp(compare(keys, before, "NE"), first).result
    run = stablehlo.SubtractOp(prefix_sum_last_axis(convert(starts, torch.int32)), full(1, torch.int32, [m])).result
    sums = _scatter_rows(rows, run, m, indices_sorted=True)
    # Each run's key (its elements agree); a slot no run reaches keeps row 0 and a zero
    # sum, which adds nothing to row 0.
    run_keys = _scatter_rows(keys, run, m, combine=lambda old, new: new, indices_sorted=True)
    return _scatter_rows(convert(sums, dt), run_keys, num)


def _embedding_rows_summed(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """(float32 rows (m, d), flat indices (m,), the gradient's dtype)."""
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
    return g, idx, dt


def _embedding_dense_backward_padded(ctx, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The scatter-add into a float32 table: what XLA's dynamic padder masks when the
    token count is dynamic (it has no masking for the sort of the other path)."""
    g, idx, dt = _embedding_rows_summed(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    return convert(_scatter_rows(g, idx, int(num_weights)), dt)


# Bounded dynamism: an embedding reads rows at given indices; its backward scatters rows:
# with a dynamic token count the rule is the float32 table's scatter, which XLA's dynamic
# padder masks (test_gpt_training_step_dynamic_batch); the sorted runs' rule is not masked.
@lowers(aten.embedding_dense_backward.default, dynamic=Padding.INDEX, dynamic_rule=_embedding_dense_backward_padded)
def _embedding_dense_backward(ctx, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    # PyTorch sums each row's gradients in float32 for a bf16/f16 gradient; where fewer
    # tokens than rows, the sums are made over the tokens, not in a float32 table.
    g, idx, dt = _embedding_rows_summed(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    if dtype(g) is not dt and 1 < shape_of(idx)[0] < int(num_weights) < 2**31 - 1:
        return _scatter_rows_summed_first(g, idx, int(num_weights), dt)
    return convert(_scatter_rows(g, idx, int(num_weights)), dt)


declare_padding(Padding.SAFE, aten.embedding.default)
