"""Pooling: max/avg pooling (with indices and backward), adaptive pooling, and im2col/col2im
(the patches of a sliding window).

Static index arithmetic (bin bounds, window divisors) is done here in NumPy with the
types PyTorch's CPU kernels use, so indices and divisors match eager bit for bit; the
graph only gathers, weights and reduces.

Bounded dynamism: windows and pools along a dynamic spatial dim depend on where it ends,
so they run in eager; along the batch dim they are per sample (each registration's
`padded.reject_spatial_dynamic` rule)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..context import ir, stablehlo
from .. import ir as hlo
from ..dtypes import tensor_type
from .helpers import (
    array_constant,
    compare,
    convert,
    dtype,
    full,
    iota,
    min_value,
    reduce,
    reshape,
    scalar_region,
    select,
    shape_of,
)
from .padded import reject_spatial_dynamic
from .registry import LoweringContext, lowers, Padding
from .static_gather import bool_constant, put_add_static, take_static
from .opmath import opmath_dtype

aten = torch.ops.aten


def _expand(param, n: int, default: Sequence[int] | None = None) -> list[int]:
    if param is None or (isinstance(param, (list, tuple)) and len(param) == 0):
        return list(default) if default is not None else [1] * n
    values = [int(param)] if isinstance(param, int) else [int(p) for p in param]
    return values * n if len(values) == 1 else values


def _dilated(size: int, dilation: int) -> int:
    return 0 if size == 0 else (size - 1) * dilation + 1


def _plane_indices(shape: Sequence[int], nd: int) -> ir.Value:
    """int64 tensor of `shape` holding each element's flat index within its last `nd`
    dims (PyTorch's pooling indices)."""
    plane = list(shape[len(shape) - nd:])
    flat = iota([math.prod(plane)], 0, torch.int64)
    flat = reshape(flat, plane)
    return stablehlo.BroadcastInDimOp(
        tensor_type(shape, torch.int64), flat, list(range(len(shape) - nd, len(shape)))
    ).result


def _reduce_window(
    values: Sequence[ir.Value],
    inits: Sequence[ir.Value],
    window: Sequence[int],
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    body: Callable,
    window_dilations: Sequence[int] | None = None,
) -> list[ir.Value]:
    shape = shape_of(values[0])
    r = len(shape)
    wd = list(window_dilations or [1] * r)
    out = []
    for d in range(r):
        padded = shape[d] + padding[d][0] + padding[d][1]
        w = _dilated(window[d], wd[d])
        out.append((padded - w) // strides[d] + 1 if padded >= w else 0)
    dts = [dtype(v) for v in values]
    op = stablehlo.ReduceWindowOp(
        [tensor_type(out, dt) for dt in dts], list(values), list(inits), list(window),
        window_strides=list(strides), window_dilations=wd,
        padding=np.array(padding, dtype=np.int64).reshape(r, 2),
    )
    scalar_region(op.body, dts + dts, body)
    return list(op.results)


def _sum_body(args):
    return [hlo.add(args[0], args[1])]


def _argmax_body(args):
    """Combines (value, index) pairs as PyTorch's max pooling scan does: the larger value
    wins, ties go to the smaller index, and a NaN beats everything (the later NaN among
    several, since the scan keeps updating on NaN). A total order, so the combination is
    associative and commutative as reduce/reduce_window need."""
    va, ia, vb, ib = args
    gt = compare(vb, va, "GT")
    eq = compare(vb, va, "EQ")
    earlier = compare(ib, ia, "LT")
    pick_b = stablehlo.OrOp(gt, stablehlo.AndOp(eq, earlier).result).result
    if dtype(va).is_floating_point:
        a_nan = compare(va, va, "NE")
        b_nan = compare(vb, vb, "NE")
        later = compare(ib, ia, "GT")
        both = stablehlo.AndOp(a_nan, b_nan).result
        pick_b = select(b_nan, full(True, torch.bool, []), select(a_nan, full(False, torch.bool, []), pick_b))
        pick_b = select(both, later, pick_b)
    return [select(pick_b, vb, va), select(pick_b, ib, ia)]


def _scatter_add_plane(grad: ir.Value, indices: ir.Value, in_shape: Sequence[int], nd: int) -> ir.Value:
    """Adds each element of `grad` into a zero tensor of `in_shape` at the flat plane
    index (last `nd` dims) given by `indices` (the max-pooling backward)."""
    gs = shape_of(grad)
    lead = gs[: len(gs) - nd]
    batch = math.prod(lead)
    n_out = math.prod(gs[len(gs) - nd:])
    n_in = math.prod(in_shape[len(in_shape) - nd:])
    dt = dtype(grad)
    acc = opmath_dtype(dt)
    g = reshape(convert(grad, acc), [batch, n_out])
    idx = reshape(indices, [batch, n_out, 1])
    rows = iota([batch, n_out, 1], 0, torch.int64)
    scatter_idx = stablehlo.ConcatenateOp([rows, idx], 2).result
    attr = ir.Attribute.parse(
        "#stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], "
        "index_vector_dim = 2>"
    )
    op = stablehlo.ScatterOp([tensor_type([batch, n_in], acc)], [full(0, acc, [batch, n_in])], scatter_idx, [g], attr)
    scalar_region(op.update_computation, [acc, acc], lambda a: [hlo.add(a[0], a[1])])
    return convert(reshape(op.results[0], in_shape), dt)


def _pool_padding(in_size: int, out_size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> tuple[int, int]:
    """(low, high) padding that makes a reduce_window produce exactly `out_size` windows,
    the first starting at `-pad` (PyTorch's floor or ceil mode output size)."""
    needed = (out_size - 1) * stride + _dilated(kernel, dilation) - in_size - pad
    return pad, max(needed, 0)


# -- max pooling ---------------------------------------------------------------------------------
def _max_pool(ctx: LoweringContext, nd: int, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k = _expand(kernel_size, nd)
    s = _expand(stride, nd, default=k)
    p = _expand(padding, nd)
    d = _expand(dilation, nd)
    xs = shape_of(x)
    r = len(xs)
    out = ctx.result_shape(0)
    lead = r - nd
    pads = [(0, 0)] * lead + [
        _pool_padding(xs[lead + i], out[lead + i], k[i], s[i], p[i], d[i]) for i in range(nd)
    ]
    dt = dtype(x)
    values, indices = _reduce_window(
        [x, _plane_indices(xs, nd)],
        [full(min_value(dt), dt, []), full(torch.iinfo(torch.int64).max, torch.int64, [])],
        [1] * lead + k, [1] * lead + s, pads, _argmax_body, [1] * lead + d,
    )
    return values, indices


@lowers(
    aten.max_pool2d_with_indices.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.max_pool2d_with_indices.default),
)
def _max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(ctx, 2, x, kernel_size, stride, padding, dilation, ceil_mode)


@lowers(
    aten.max_pool3d_with_indices.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.max_pool3d_with_indices.default),
)
def _max_pool3d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(ctx, 3, x, kernel_size, stride, padding, dilation, ceil_mode)


@lowers(
    aten.max_pool2d_with_indices_backward.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.max_pool2d_with_indices_backward.default),
)
def _max_pool2d_backward(ctx, grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_add_plane(grad_output, indices, shape_of(x), 2)


@lowers(
    aten.max_pool3d_with_indices_backward.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.max_pool3d_with_indices_backward.default),
)
def _max_pool3d_backward(ctx, grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_add_plane(grad_output, indices, shape_of(x), 3)


# -- average pooling ---------------------------------------------------------------------------------
def _avg_divisors(in_sizes, out_sizes, k, s, p, count_include_pad, divisor_override) -> np.ndarray:
    """PyTorch's per-window divisor (AvgPoolKernel.cpp); empty windows get 1 (their sum
    is 0, and PyTorch writes 0)."""
    if divisor_override:
        return np.full(out_sizes, int(divisor_override), dtype=np.int64)
    per_dim = []
    for i, (n, o) in enumerate(zip(in_sizes, out_sizes)):
        full_sizes, real_sizes = [], []
        for j in range(o):
            start = j * s[i] - p[i]
            end = min(start + k[i], n + p[i])
            full_sizes.append(end - start)
            real_sizes.append(min(end, n) - max(start, 0))
        per_dim.append((np.array(full_sizes), np.array(real_sizes)))
    div = np.ones(out_sizes, dtype=np.int64)
    real = np.ones(out_sizes, dtype=np.int64)
    for i, (f, rl) in enumerate(per_dim):
        shape = [1] * len(out_sizes)
        shape[i] = -1
        div = div * f.reshape(shape)
        real = real * rl.reshape(shape)
    if not count_include_pad:
        div = real
    return np.where(real > 0, np.maximum(div, 1), 1)


def _avg_pool(ctx, nd, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    k = _expand(kernel_size, nd)
    s = _expand(stride, nd, default=k)
    p = _expand(padding, nd)
    xs = shape_of(x)
    lead = len(xs) - nd
    out = ctx.result_shape()
    dt = dtype(x)
    acc = opmath_dtype(dt)
    pads = [(0, 0)] * lead + [_pool_padding(xs[lead + i], out[lead + i], k[i], s[i], p[i]) for i in range(nd)]
    (summed,) = _reduce_window([convert(x, acc)], [full(0, acc, [])], [1] * lead + k, [1] * lead + s, pads, _sum_body)
    div = _avg_divisors(xs[lead:], out[lead:], k, s, p, count_include_pad, divisor_override)
    divisor = stablehlo.BroadcastInDimOp(
        tensor_type(out, acc), array_constant(div, acc), list(range(lead, len(out)))
    ).result
    return convert(stablehlo.DivOp(summed, divisor).result, dt)


def _avg_pool_backward(ctx, nd, grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override):
    k = _expand(kernel_size, nd)
    s = _expand(stride, nd, default=k)
    p = _expand(padding, nd)
    xs = shape_of(x)
    gs = shape_of(grad_output)
    lead = len(xs) - nd
    dt = dtype(grad_output)
    acc = opmath_dtype(dt)
    div = _avg_divisors(xs[lead:], gs[lead:], k, s, p, count_include_pad, divisor_override)
    divisor = stablehlo.BroadcastInDimOp(tensor_type(gs, acc), array_constant(div, acc), list(range(lead, len(gs)))).result
    g = stablehlo.DivOp(convert(grad_output, acc), divisor).result
    # The transpose of a strided window sum: dilate the gradient by the stride, pad so
    # every input position sees the windows that covered it, and sum windows of `k`.
    lo = [k[i] - 1 - p[i] for i in range(nd)]
    hi = [xs[lead + i] + k[i] - 1 - _dilated(gs[lead + i], s[i]) - lo[i] for i in range(nd)]
    padded = stablehlo.PadOp(
        g, full(0, acc, []), [0] * lead + lo, [0] * lead + hi, [0] * lead + [si - 1 for si in s]
    ).result
    (summed,) = _reduce_window([padded], [full(0, acc, [])], [1] * lead + k, [1] * len(xs), [(0, 0)] * len(xs), _sum_body)
    return convert(summed, dt)


@lowers(
    aten.avg_pool2d.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.avg_pool2d.default),
)
def _avg_pool2d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return _avg_pool(ctx, 2, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowers(
    aten.avg_pool3d.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.avg_pool3d.default),
)
def _avg_pool3d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return _avg_pool(ctx, 3, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowers(
    aten.avg_pool2d_backward.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.avg_pool2d_backward.default),
)
def _avg_pool2d_backward(ctx, grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    return _avg_pool_backward(ctx, 2, grad_output, x, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


@lowers(
    aten.avg_pool3d_backward.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.avg_pool3d_backward.default),
)
def _avg_pool3d_backward(ctx, grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    return _avg_pool_backward(ctx, 3, grad_output, x, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


# -- adaptive pooling ------------------------------------------------------------------------------
def _adaptive_bins(in_size: int, out_size: int) -> tuple[list[int], list[int]]:
    """PyTorch's adaptive bins: [floor(i * in / out), ceil((i + 1) * in / out))."""
    starts = [(i * in_size) // out_size for i in range(out_size)]
    ends = [-((-(i + 1) * in_size) // out_size) for i in range(out_size)]
    return starts, ends


def _bin_gather(x: ir.Value, axis: int, out_size: int) -> tuple[ir.Value, np.ndarray, int]:
    """x gathered along `axis` into `out_size` bins of K = the largest bin size slots
    (shorter bins repeat their last element): returns the gathered tensor (the axis
    becomes out_size * K), the (out_size, K) validity mask, and K."""
    n = shape_of(x)[axis]
    starts, ends = _adaptive_bins(n, out_size)
    k = max((e - s for s, e in zip(starts, ends)), default=1)
    idx = np.array([[min(s + j, e - 1) for j in range(k)] for s, e in zip(starts, ends)], dtype=np.int64)
    valid = np.array([[s + j < e for j in range(k)] for s, e in zip(starts, ends)])
    return take_static(x, axis, idx.reshape(-1)), valid, k


def _split_axis(x: ir.Value, axis: int, parts: Sequence[int]) -> ir.Value:
    shape = shape_of(x)
    return reshape(x, shape[:axis] + list(parts) + shape[axis + 1:])


def _adaptive_avg(ctx, nd, x, output_size):
    xs = shape_of(x)
    lead = len(xs) - nd
    out_sizes = _expand(output_size, nd)
    dt = dtype(x)
    acc = opmath_dtype(dt)
    y = convert(x, acc)
    count = np.ones(out_sizes, dtype=np.int64)
    for i in range(nd):
        axis = lead + i
        n, o = xs[axis], out_sizes[i]
        starts, ends = _adaptive_bins(n, o)
        sizes = np.array([e - s for s, e in zip(starts, ends)])
        shape = [1] * nd
        shape[i] = -1
        count = count * sizes.reshape(shape)
        if o > 0 and n % o == 0:  # uniform bins: a reshape and a sum
            y = _split_axis(y, axis, [o, n // o])
        else:
            y, valid, k = _bin_gather(y, axis, o)
            y = _split_axis(y, axis, [o, k])
            mask = bool_constant(valid)
            mask = stablehlo.BroadcastInDimOp(tensor_type(shape_of(y), torch.bool), mask, [axis, axis + 1]).result
            y = select(mask, y, full(0, acc, shape_of(y)))
        (y,) = reduce([y], [full(0, acc, [])], [axis + 1], lambda a, b: [hlo.add(a[0], b[0])])
    out = shape_of(y)
    divisor = stablehlo.BroadcastInDimOp(
        tensor_type(out, acc), array_constant(count, acc), list(range(lead, len(out)))
    ).result
    return convert(stablehlo.DivOp(y, divisor).result, dt)


def _adaptive_avg_backward(ctx, nd, grad_output, x):
    xs = shape_of(x)
    gs = shape_of(grad_output)
    lead = len(xs) - nd
    dt = dtype(grad_output)
    acc = opmath_dtype(dt)
    count = np.ones(gs[lead:], dtype=np.int64)
    bins = []
    for i in range(nd):
        starts, ends = _adaptive_bins(xs[lead + i], gs[lead + i])
        bins.append((starts, ends))
        shape = [1] * nd
        shape[i] = -1
        count = count * np.array([e - s for s, e in zip(starts, ends)]).reshape(shape)
    divisor = stablehlo.BroadcastInDimOp(tensor_type(gs, acc), array_constant(count, acc), list(range(lead, len(gs)))).result
    g = stablehlo.DivOp(convert(grad_output, acc), divisor).result
    for i in range(nd):
        axis = lead + i
        starts, ends = bins[i]
        k = max((e - s for s, e in zip(starts, ends)), default=1)
        # Every output bin sends its gradient to each input position of the bin.
        idx = [min(s + j, e - 1) for s, e in zip(starts, ends) for j in range(k)]
        valid = np.array([[s + j < e for j in range(k)] for s, e in zip(starts, ends)])
        shape = shape_of(g)
        expanded = shape[: axis + 1] + [k] + shape[axis + 1:]
        g = stablehlo.BroadcastInDimOp(
            tensor_type(expanded, acc), g, [d for d in range(len(expanded)) if d != axis + 1]
        ).result
        mask = stablehlo.BroadcastInDimOp(tensor_type(expanded, torch.bool), bool_constant(valid), [axis, axis + 1]).result
        g = select(mask, g, full(0, acc, expanded))
        g = reshape(g, shape[:axis] + [len(idx)] + shape[axis + 1:])
        g = put_add_static(g, axis, idx, xs[axis])
    return convert(g, dt)


@lowers(
    aten._adaptive_avg_pool2d.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten._adaptive_avg_pool2d.default),
)
def _adaptive_avg_pool2d(ctx, x, output_size):
    return _adaptive_avg(ctx, 2, x, output_size)


@lowers(
    aten._adaptive_avg_pool3d.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten._adaptive_avg_pool3d.default),
)
def _adaptive_avg_pool3d(ctx, x, output_size):
    return _adaptive_avg(ctx, 3, x, output_size)


@lowers(
    aten._adaptive_avg_pool2d_backward.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten._adaptive_avg_pool2d_backward.default),
)
def _adaptive_avg_pool2d_backward(ctx, grad_output, x):
    return _adaptive_avg_backward(ctx, 2, grad_output, x)


@lowers(
    aten._adaptive_avg_pool3d_backward.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten._adaptive_avg_pool3d_backward.default),
)
def _adaptive_avg_pool3d_backward(ctx, grad_output, x):
    return _adaptive_avg_backward(ctx, 3, grad_output, x)


def _adaptive_max(ctx, nd, x, output_size):
    xs = shape_of(x)
    lead = len(xs) - nd
    out_sizes = _expand(output_size, nd)
    y = x
    idx = _plane_indices(xs, nd)
    ks = []
    for i in range(nd):
        # Axis positions shift as earlier axes split into (bins, K).
        axis = lead + 2 * i
        y, _, k = _bin_gather(y, axis, out_sizes[i])
        idx, _, _ = _bin_gather(idx, axis, out_sizes[i])
        y = _split_axis(y, axis, [out_sizes[i], k])
        idx = _split_axis(idx, axis, [out_sizes[i], k])
        ks.append(axis + 1)
    dt = dtype(x)
    values, indices = reduce(
        [y, idx], [full(min_value(dt), dt, []), full(torch.iinfo(torch.int64).max, torch.int64, [])], ks,
        lambda a, b: _argmax_body([a[0], a[1], b[0], b[1]]),
    )
    return values, indices


@lowers(
    aten.adaptive_max_pool2d.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.adaptive_max_pool2d.default),
)
def _adaptive_max_pool2d(ctx, x, output_size):
    return _adaptive_max(ctx, 2, x, output_size)


@lowers(
    aten.adaptive_max_pool3d.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.adaptive_max_pool3d.default),
)
def _adaptive_max_pool3d(ctx, x, output_size):
    return _adaptive_max(ctx, 3, x, output_size)


@lowers(
    aten.adaptive_max_pool2d_backward.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.adaptive_max_pool2d_backward.default),
)
def _adaptive_max_pool2d_backward(ctx, grad_output, x, indices):
    return _scatter_add_plane(grad_output, indices, shape_of(x), 2)


@lowers(
    aten.adaptive_max_pool3d_backward.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.adaptive_max_pool3d_backward.default),
)
def _adaptive_max_pool3d_backward(ctx, grad_output, x, indices):
    return _scatter_add_plane(grad_output, indices, shape_of(x), 3)


# -- im2col / col2im ------------------------------------------------------------------------------
def _patch_geometry(spatial, kernel, dilation, padding, stride):
    return [
        (spatial[i] + 2 * padding[i] - _dilated(kernel[i], dilation[i])) // stride[i] + 1 for i in range(2)
    ]


@lowers(
    aten.im2col.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_spatial_dynamic(aten.im2col.default),
)
def _im2col(ctx, x, kernel_size, dilation, padding, stride):
    k, d, p, s = (_expand(v, 2) for v in (kernel_size, dilation, padding, stride))
    xs = shape_of(x)
    batched = len(xs) == 4
    if not batched:
        x = reshape(x, [1] + xs)
    n, c, h, w = shape_of(x)
    oh, ow = _patch_geometry([h, w], k, d, p, s)
    dt = dtype(x)
    padded = stablehlo.PadOp(x, full(0, dt, []), [0, 0, p[0], p[1]], [0, 0, p[0], p[1]], [0, 0, 0, 0]).result
    patches = []
    for i in range(k[0]):
        for j in range(k[1]):
            start = [0, 0, i * d[0], j * d[1]]
            limit = [n, c, i * d[0] + (oh - 1) * s[0] + 1, j * d[1] + (ow - 1) * s[1] + 1]
            sl = stablehlo.SliceOp(padded, start, limit, [1, 1, s[0], s[1]]).result
            patches.append(reshape(sl, [n, c, 1, oh * ow]))
    if patches:
        cols = stablehlo.ConcatenateOp(patches, 2).result
    else:
        cols = full(0, dt, [n, c, 0, oh * ow])
    out = reshape(cols, [n, c * k[0] * k[1], oh * ow])
    return out if batched else reshape(out, shape_of(out)[1:])


@lowers(
    aten.col2im.default,
    dynamic=Padding.MOVEMENT,
    dynamic_rule=reject_spatial_dynamic(aten.col2im.default),
)
def _col2im(ctx, cols, output_size, kernel_size, dilation, padding, stride):
    k, d, p, s = (_expand(v, 2) for v in (kernel_size, dilation, padding, stride))
    out_hw = _expand(output_size, 2)
    cs = shape_of(cols)
    batched = len(cs) == 3
    if not batched:
        cols = reshape(cols, [1] + cs)
    n, ckk, _ = shape_of(cols)
    c = ckk // (k[0] * k[1])
    oh, ow = _patch_geometry(out_hw, k, d, p, s)
    dt = dtype(cols)
    acc = opmath_dtype(dt)
    cols = reshape(convert(cols, acc), [n, c, k[0], k[1], oh, ow])
    hp, wp = out_hw[0] + 2 * p[0], out_hw[1] + 2 * p[1]
    total = full(0, acc, [n, c, hp, wp])
    for i in range(k[0]):
        for j in range(k[1]):
            patch = stablehlo.SliceOp(cols, [0, 0, i, j, 0, 0], [n, c, i + 1, j + 1, oh, ow], [1] * 6).result
            patch = reshape(patch, [n, c, oh, ow])
            lo = [0, 0, i * d[0], j * d[1]]
            hi = [0, 0, hp - (i * d[0] + _dilated(oh, s[0])), wp - (j * d[1] + _dilated(ow, s[1]))]
            placed = stablehlo.PadOp(patch, full(0, acc, []), lo, hi, [0, 0, s[0] - 1, s[1] - 1]).result
            total = hlo.add(total, placed)
    out = stablehlo.SliceOp(total, [0, 0, p[0], p[1]], [n, c, p[0] + out_hw[0], p[1] + out_hw[1]], [1] * 4).result
    out = convert(out, dt)
    return out if batched else reshape(out, shape_of(out)[1:])


@lowers(
    aten.avg_pool1d.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.avg_pool1d.default),
)
def _avg_pool1d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(ctx, 1, x, kernel_size, stride, padding, ceil_mode, count_include_pad)


@lowers(
    aten.adaptive_avg_pool1d.default,
    dynamic=Padding.WINDOW,
    dynamic_rule=reject_spatial_dynamic(aten.adaptive_avg_pool1d.default),
)
def _adaptive_avg_pool1d(ctx, x, output_size):
    return _adaptive_avg(ctx, 1, x, output_size)
