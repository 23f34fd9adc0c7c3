"""Distances and cross products: `_cdist_forward`, `_euclidean_dist`, `_pdist_forward`, their
backward ops, and `linalg_cross`.

Formulas follow ATen's CPU kernels operation by operation, so results match eager bit for
bit or to rounding. Like ATen's `opmath`, float16/bfloat16 compute in float32 and round
once at the end."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..context import ir, stablehlo
from .. import ir as hlo
from ..dtypes import tensor_type
from .helpers import (
    broadcast_to,
    constant_like,
    convert,
    dtype,
    full,
    normalize_dim,
    rank_of,
    reduce,
    reshape,
    select,
    shape_of,
)
from .registry import declare_padding, lowers, Padding
from .reduction import reduce_sum
from .opmath import opmath_dtype

aten = torch.ops.aten


# -- distances and cross products ----------------------------------------------------------------------------------
def _pairwise_norm(diff: ir.Value, p: float, axis: int) -> ir.Value:
    """The p-norm of `diff` over `axis` with ATen's special cases (p = 0, 1, 2, inf)."""
    a = hlo.absolute(diff)
    if p == 0:
        return reduce_sum(convert(hlo.compare(a, constant_like(0, a), "NE"), dtype(a)), [axis])
    if p == 1:
        return reduce_sum(a, [axis])
    if p == 2:
        return stablehlo.SqrtOp(reduce_sum(hlo.mul(a, a), [axis])).result
    if math.isinf(p):
        (result,) = reduce([a], [full(0, dtype(a), [])], [axis], lambda acc, new: [hlo.maximum(acc[0], new[0])])
        return result
    powered = stablehlo.PowOp(a, constant_like(p, a)).result
    summed = reduce_sum(powered, [axis])
    return stablehlo.PowOp(summed, constant_like(1.0 / p, summed)).result


def _cdist_direct(x1: ir.Value, x2: ir.Value, p: float, out_shape: Sequence[int]) -> ir.Value:
    """|x1[..., i, None, :] - x2[..., None, j, :]|_p, batch dims broadcast."""
    *_, m = shape_of(x1)
    pr = list(out_shape)
    full_shape = pr + [m]
    r = len(full_shape)
    s1 = shape_of(x1)
    s2 = shape_of(x2)
    a = stablehlo.BroadcastInDimOp(tensor_type(full_shape, dtype(x1)), x1, _aligned(len(s1), r, skip=r - 2)).result
    b = stablehlo.BroadcastInDimOp(tensor_type(full_shape, dtype(x2)), x2, _aligned(len(s2), r, skip=r - 3)).result
    return _pairwise_norm(hlo.sub(a, b), p, r - 1)


def _aligned(src_rank: int, dst_rank: int, *, skip: int) -> list[int]:
    """broadcast_in_dim dims placing a rank-`src_rank` operand right-aligned into
    `dst_rank` dims, skipping output dim `skip` (the other operand's row dim)."""
    dims = [d for d in range(dst_rank) if d != skip]
    return dims[len(dims) - src_rank:]


def _euclidean_mm(x1: ir.Value, x2: ir.Value, out_shape: Sequence[int]) -> ir.Value:
    """ATen's _euclidean_dist: sqrt(clamp_min(|x1|^2 - 2 x1.x2 + |x2|^2, 0)) with the
    terms combined by one matmul, batch dims broadcast first."""
    batch = list(out_shape[:-2])
    m = shape_of(x1)[-1]
    x1 = broadcast_to(x1, batch + shape_of(x1)[-2:])
    x2 = broadcast_to(x2, batch + shape_of(x2)[-2:])
    n1 = reduce_sum(hlo.mul(x1, x1), [len(batch) + 1])
    n2 = reduce_sum(hlo.mul(x2, x2), [len(batch) + 1])
    nb = len(batch)
    del m
    batch_dims = list(range(nb))
    dot = hlo.dot_general(x1, x2, batch=(batch_dims, batch_dims), contract=([nb + 1], [nb + 1]))
    rows = broadcast_to(reshape(n1, shape_of(n1) + [1]), out_shape)
    cols = stablehlo.BroadcastInDimOp(tensor_type(out_shape, dtype(n2)), n2, list(range(nb)) + [nb + 1]).result
    squared = hlo.add(hlo.add(hlo.mul(constant_like(-2, dot), dot), rows), cols)
    return stablehlo.SqrtOp(hlo.maximum(squared, constant_like(0, squared))).result


@lowers(aten._cdist_forward.default)
def _cdist_forward(ctx, x1, x2, p, compute_mode):
    out = ctx.result_dtype()
    out_shape = ctx.result_shape()
    if 0 in out_shape:
        return full(0, out, out_shape)
    cdt = opmath_dtype(out)
    a, b = convert(x1, cdt), convert(x2, cdt)
    if shape_of(a)[-1] == 0:
        return full(0, out, out_shape)
    rows, cols = out_shape[-2], out_shape[-1]
    # ATen: compute_mode None/0 uses the matmul form when p == 2 and either side has
    # more than 25 rows; 1 always; 2 never.
    use_mm = p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (rows > 25 or cols > 25)))
    result = _euclidean_mm(a, b, out_shape) if use_mm else _cdist_direct(a, b, p, out_shape)
    return convert(result, out)


@lowers(aten._euclidean_dist.default)
def _euclidean_dist(ctx, x1, x2):
    """What torch.cdist calls for p=2 in its matmul mode (more than 25 rows)."""
    out = ctx.result_dtype()
    out_shape = ctx.result_shape()
    if 0 in out_shape:
        return full(0, out, out_shape)
    cdt = opmath_dtype(out)
    return convert(_euclidean_mm(convert(x1, cdt), convert(x2, cdt), out_shape), out)


def _upper_pairs(n: int) -> tuple[list[int], list[int]]:
    rows, cols = [], []
    for i in range(n):
        for j in range(i + 1, n):
            rows.append(i)
            cols.append(j)
    return rows, cols


@lowers(aten._pdist_forward.default)
def _pdist_forward(ctx, self, p=2.0):
    out = ctx.result_dtype()
    out_shape = ctx.result_shape()
    n, m = shape_of(self)
    if 0 in out_shape:
        return full(0, out, out_shape)
    x = convert(self, opmath_dtype(out))
    if m == 0:
        return full(0, out, out_shape)
    rows, cols = _upper_pairs(n)
    from .helpers import array_constant
    from .indexing import take_rows

    a = take_rows(x, array_constant(torch.tensor(rows, dtype=torch.int32), torch.int32))
    b = take_rows(x, array_constant(torch.tensor(cols, dtype=torch.int32), torch.int32))
    return convert(_pairwise_norm(hlo.sub(a, b), p, 1), out)


@lowers(aten._cdist_backward.default)
def _cdist_backward(ctx, grad, x1, x2, p, cdist):
    """d cdist / d x1, summed over x2's rows, with ATen's cases per p."""
    out = ctx.result_dtype()
    out_shape = ctx.result_shape()
    if 0 in out_shape or 0 in shape_of(grad):
        return full(0, out, out_shape)
    cdt = opmath_dtype(out)
    batch = shape_of(grad)[:-2]
    rows, cols = shape_of(grad)[-2:]
    m = shape_of(x1)[-1]
    full_shape = batch + [rows, cols, m]
    r = len(full_shape)
    a = stablehlo.BroadcastInDimOp(tensor_type(full_shape, cdt), convert(x1, cdt), _aligned(rank_of(x1), r, skip=r - 2)).result
    b = stablehlo.BroadcastInDimOp(tensor_type(full_shape, cdt), convert(x2, cdt), _aligned(rank_of(x2), r, skip=r - 3)).result
    diff = hlo.sub(a, b)
    g = broadcast_to(reshape(convert(grad, cdt), batch + [rows, cols, 1]), full_shape)
    dist = broadcast_to(reshape(convert(cdist, cdt), batch + [rows, cols, 1]), full_shape)
    term = _distance_grad(diff, g, dist, p)
    result = reduce_sum(term, [r - 2])
    return convert(broadcast_to(result, out_shape), out)


def _distance_grad(diff: ir.Value, g: ir.Value, dist: ir.Value, p: float) -> ir.Value:
    """grad * d|diff|_p / d diff, elementwise (ATen's cdist/pdist backward kernels)."""
    zero = constant_like(0, diff)
    dist_zero = hlo.compare(dist, zero, "EQ")
    if p == 0:
        return zero
    if p == 1:
        return hlo.mul(g, hlo.sign(diff))
    if math.isinf(p):
        return hlo.mul(hlo.mul(g, hlo.sign(diff)), convert(hlo.compare(hlo.absolute(diff), dist, "EQ"), dtype(diff)))
    if p == 2:
        return select(dist_zero, zero, hlo.div(hlo.mul(g, diff), dist))
    if p < 2:
        powered = hlo.div(stablehlo.PowOp(hlo.absolute(diff), constant_like(p - 1, diff)).result, stablehlo.PowOp(dist, constant_like(p - 1, dist)).result)
        value = hlo.mul(hlo.mul(hlo.sign(diff), powered), g)
        return select(hlo.logical_or(dist_zero, hlo.compare(diff, zero, "EQ")), zero, value)
    powered = hlo.div(
        hlo.mul(diff, stablehlo.PowOp(hlo.absolute(diff), constant_like(p - 2, diff)).result),
        stablehlo.PowOp(dist, constant_like(p - 1, dist)).result,
    )
    return select(dist_zero, zero, hlo.mul(powered, g))


@lowers(aten._pdist_backward.default)
def _pdist_backward(ctx, grad, self, p, pdist):
    out = ctx.result_dtype()
    n, m = shape_of(self)
    if n < 2 or m == 0:
        return full(0, out, [n, m])
    cdt = opmath_dtype(out)
    x = convert(self, cdt)
    rows, cols = _upper_pairs(n)
    from .helpers import array_constant
    from .indexing import ScatterSpec, take_rows

    ri = array_constant(torch.tensor(rows, dtype=torch.int32), torch.int32)
    ci = array_constant(torch.tensor(cols, dtype=torch.int32), torch.int32)
    diff = hlo.sub(take_rows(x, ri), take_rows(x, ci))
    k = len(rows)
    g = broadcast_to(reshape(convert(grad, cdt), [k, 1]), [k, m])
    dist = broadcast_to(reshape(convert(pdist, cdt), [k, 1]), [k, m])
    term = _distance_grad(diff, g, dist, p)
    zeros = full(0, cdt, [n, m])
    add_rows = ScatterSpec(reshape(ri, [k, 1]), (1,), (0,), (0,), 1).apply(zeros, term, "add")
    result = ScatterSpec(reshape(ci, [k, 1]), (1,), (0,), (0,), 1).apply(add_rows, hlo.neg(term), "add")
    return convert(result, out)


@lowers(aten.linalg_cross.default)
def _linalg_cross(ctx, self, other, *, dim=-1):
    out = ctx.result_dtype()
    shape = ctx.result_shape()
    a = broadcast_to(convert(self, out), shape)
    b = broadcast_to(convert(other, out), shape)
    d = normalize_dim(dim, len(shape))
    rank = len(shape)

    def part(x, i):
        start = [0] * rank
        limit = list(shape)
        start[d], limit[d] = i, i + 1
        return stablehlo.SliceOp(x, start, limit, [1] * rank).result

    a0, a1, a2 = (part(a, i) for i in range(3))
    b0, b1, b2 = (part(b, i) for i in range(3))
    c0 = hlo.sub(hlo.mul(a1, b2), hlo.mul(a2, b1))
    c1 = hlo.sub(hlo.mul(a2, b0), hlo.mul(a0, b2))
    c2 = hlo.sub(hlo.mul(a0, b1), hlo.mul(a1, b0))
    return stablehlo.ConcatenateOp([c0, c1, c2], d).result


# Bounded dynamism (registry.Padding). Row-pair distances are laid out by pair index.
declare_padding(
    Padding.EAGER,
    aten._cdist_forward.default,
    aten._cdist_backward.default,
    aten._euclidean_dist.default,
    aten._pdist_forward.default,
    aten._pdist_backward.default,
)
# linalg_cross is elementwise along its other dims.
declare_padding(Padding.SAFE, family="distances")
