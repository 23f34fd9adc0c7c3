"""Resampling: upsampling (nearest, nearest-exact, linear, bilinear, trilinear, bicubic,
anti-aliased, and their backward) and grid_sampler_2d (and its backward).

Static index arithmetic (source pixels, interpolation weights) is done here in NumPy with
the float type PyTorch's CPU kernels use, so indices and weights match eager bit for bit;
the graph only gathers, weights and reduces. Gathers and interpolation never multiply by a
0/1 matrix, so an inf or NaN stays where PyTorch would put it."""

from __future__ import annotations

import math
from collections.abc import Sequence

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
    reduce,
    reshape,
    scalar_region,
    select,
    shape_of,
    transpose,
)
from .padded import reject_spatial_dynamic
from .registry import lowers, Padding
from .static_gather import bool_constant, put_add_static, take_static
from .opmath import opmath_dtype

aten = torch.ops.aten


# -- upsampling ------------------------------------------------------------------------------------
# Each mode maps one axis (in size, out size, scale) to taps: a list of (source indices,
# weights or None, validity or None), one entry per output position. The output is
# sum_t weight_t * take(x, indices_t) (invalid taps contribute exactly 0), axis by axis
# from the innermost, as PyTorch's separable CPU kernels nest them.
Tap = tuple[np.ndarray, "np.ndarray | None", "np.ndarray | None"]
Taps = list[Tap]


def _scales_value(scale: float | None, in_size: int, out_size: int, np_t) -> np.floating:
    """compute_scales_value: 1/scale when a positive scale was given, else in/out."""
    if scale is not None and scale > 0:
        return np_t(1.0 / scale)
    return np_t(in_size) / np_t(out_size)


def _area_scale(in_size, out_size, align_corners, scale, np_t):
    if align_corners:
        return np_t(in_size - 1) / np_t(out_size - 1) if out_size > 1 else np_t(0)
    return _scales_value(scale, in_size, out_size, np_t)


def _source_index(ratio, out_size, align_corners, cubic, np_t) -> np.ndarray:
    dst = np.arange(out_size).astype(np_t)
    if align_corners:
        return (ratio * dst).astype(np_t)
    src = (ratio * (dst + np_t(0.5)) - np_t(0.5)).astype(np_t)
    return src if cubic else np.maximum(src, np_t(0))


def _guard(src: np.ndarray, in_size: int, np_t) -> tuple[np.ndarray, np.ndarray]:
    index = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam = np.minimum(np.maximum(src - index.astype(np_t), np_t(0)), np_t(1)).astype(np_t)
    return index, lam


def _nearest_taps(in_size, out_size, scale, np_t, align_corners=None) -> Taps:
    o = np.arange(out_size)
    if out_size == in_size:
        idx = o
    elif out_size == 2 * in_size:
        idx = o >> 1
    else:
        s = _scales_value(scale, in_size, out_size, np.float32)
        idx = np.minimum(np.floor(o.astype(np.float32) * s).astype(np.int64), in_size - 1)
    return [(idx, None, None)]


def _nearest_exact_taps(in_size, out_size, scale, np_t, align_corners=None) -> Taps:
    s = _scales_value(scale, in_size, out_size, np.float32)
    o = np.arange(out_size)
    # floorf((dst + 0.5) * scale): the product is a double that floorf's argument rounds to float.
    idx = np.minimum(np.floor(((o + 0.5) * np.float64(s)).astype(np.float32)).astype(np.int64), in_size - 1)
    return [(idx, None, None)]


def _linear_taps(in_size, out_size, scale, np_t, align_corners) -> Taps:
    o = np.arange(out_size)
    if out_size == in_size:
        return [(o, None, None)]
    ratio = _area_scale(in_size, out_size, align_corners, scale, np_t)
    src = _source_index(ratio, out_size, align_corners, False, np_t)
    i0, lam1 = _guard(src, in_size, np_t)
    i1 = i0 + (i0 < in_size - 1)
    lam0 = (np_t(1) - lam1).astype(np_t)
    return [(i0, lam0, None), (i1, lam1, None)]


def _cubic_coefficients(t: np.ndarray, np_t) -> list[np.ndarray]:
    a = np_t(-0.75)

    def conv1(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def conv2(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    one = np_t(1)
    return [conv2(t + one).astype(np_t), conv1(t).astype(np_t), conv1(one - t).astype(np_t),
            conv2((one - t) + one).astype(np_t)]


def _cubic_taps(in_size, out_size, scale, np_t, align_corners) -> Taps:
    ratio = _area_scale(in_size, out_size, align_corners, scale, np_t)
    src = _source_index(ratio, out_size, align_corners, True, np_t)
    i0, t = _guard(src, in_size, np_t)
    coeffs = _cubic_coefficients(t, np_t)
    return [(np.clip(i0 - 1 + j, 0, in_size - 1), coeffs[j], None) for j in range(4)]


def _filter_rows(in_size, out_size, scale, np_t, align_corners, cubic: bool, antialias: bool):
    """Per output (first index, weights) of PyTorch's separable filter kernels
    (`_compute_indices_min_size_weights_aa`): a triangle or cubic filter (Keys a = -0.5
    when antialiasing, -0.75 otherwise) widened by the downscale factor when
    antialiasing, truncated to the input and normalized to sum 1. align_corners only
    changes the scale when antialiasing."""
    s = np_t(_area_scale(in_size, out_size, align_corners, scale, np.float64))
    half = np_t(2.0 if cubic else 1.0)
    widen = antialias and s >= 1
    support = np_t(half * s) if widen else half
    invscale = np_t(1.0 / s) if widen else np_t(1.0)
    shift = 0.5 if (align_corners and not antialias) else 0.0
    a = -0.5 if antialias else -0.75
    max_size = math.ceil(float(support)) * 2 + 1

    def filt(x):
        x = abs(float(x))
        if not cubic:
            return max(0.0, 1.0 - x)
        if x < 1.0:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * a
        return 0.0

    rows = []
    for k in range(out_size):
        center = np_t(s * (k + 0.5 - shift))
        xmin = max(int(center - support + 0.5 + shift), 0)
        xsize = min(max(min(int(center + support + 0.5 + shift), in_size) - xmin, 0), max_size)
        w = [np_t(filt(np_t((j + xmin - center + 0.5 - shift) * invscale))) for j in range(xsize)]
        total = np_t(0)
        for v in w:
            total = np_t(total + v)
        rows.append((xmin, [np_t(v / total) for v in w] if total != 0 else w))
    return rows


def _rows_to_taps(rows, in_size: int, np_t) -> Taps:
    k = max((len(w) for _, w in rows), default=1)
    taps = []
    for t in range(k):
        idx = np.array([min(xmin + t, in_size - 1) if t < len(w) else min(xmin, in_size - 1) for xmin, w in rows])
        weight = np.array([w[t] if t < len(w) else 0 for _, w in rows], dtype=np_t)
        valid = np.array([t < len(w) for _, w in rows])
        taps.append((idx, weight, None if valid.all() else valid))
    return taps


def _aa_taps(cubic: bool):
    def taps(in_size, out_size, scale, np_t, align_corners) -> Taps:
        if in_size == out_size:
            return [(np.arange(out_size), None, None)]
        return _rows_to_taps(_filter_rows(in_size, out_size, scale, np_t, align_corners, cubic, True), in_size, np_t)

    return taps


def _np_type(dt: torch.dtype):
    return np.float64 if dt is torch.float64 else np.float32


def _weight(w: np.ndarray, shape: Sequence[int], axis: int, dt: torch.dtype) -> ir.Value:
    return stablehlo.BroadcastInDimOp(tensor_type(shape, dt), array_constant(w, dt), [axis]).result


def _masked(term: ir.Value, axis: int, valid: np.ndarray | None) -> ir.Value:
    if valid is None:
        return term
    shape = shape_of(term)
    mask = stablehlo.BroadcastInDimOp(tensor_type(shape, torch.bool), bool_constant(valid), [axis]).result
    return select(mask, term, full(0, dtype(term), shape))


def _apply_taps(x: ir.Value, axis: int, taps: Taps) -> ir.Value:
    out = None
    for idx, w, valid in taps:
        term = take_static(x, axis, idx)
        if w is not None:
            term = hlo.mul(term, _weight(w, shape_of(term), axis, dtype(term)))
        term = _masked(term, axis, valid)
        out = term if out is None else hlo.add(out, term)
    return out


def _apply_taps_transposed(g: ir.Value, axis: int, taps: Taps, size: int) -> ir.Value:
    out = None
    for idx, w, valid in taps:
        term = g if w is None else hlo.mul(g, _weight(w, shape_of(g), axis, dtype(g)))
        term = put_add_static(_masked(term, axis, valid), axis, idx, size)
        out = term if out is None else hlo.add(out, term)
    return out


_TAPS = {
    "nearest": _nearest_taps,
    "nearest_exact": _nearest_exact_taps,
    "linear": _linear_taps,
    "cubic": _cubic_taps,
    "linear_aa": _aa_taps(cubic=False),
    "cubic_aa": _aa_taps(cubic=True),
}


# uint8 images: PyTorch's CPU kernels resample uint8 in int16 fixed point, one pass per
# dim (innermost first, unchanged dims skipped), rounding and saturating after each.
def _uint8_rows(mode, in_size, out_size, scale, align_corners):
    if mode == "cubic":
        # Clamped cubic taps, with the weights of repeated (border) indices merged.
        rows = []
        taps = _cubic_taps(in_size, out_size, scale, np.float64, align_corners)
        for k in range(out_size):
            merged: dict[int, float] = {}
            for idx, w, _ in taps:
                merged[int(idx[k])] = merged.get(int(idx[k]), 0.0) + float(w[k])
            first = min(merged)
            rows.append((first, [merged.get(first + j, 0.0) for j in range(max(merged) - first + 1)]))
        return rows
    antialias = mode.endswith("_aa")
    return _filter_rows(in_size, out_size, scale, np.float64, align_corners, mode.startswith("cubic"), antialias)


def _fixed_point_pass(y: ir.Value, axis: int, rows, in_size: int) -> ir.Value:
    wmax = max((max(w) for _, w in rows if w), default=0.0)
    precision = 0
    while precision < 22 and int(0.5 + wmax * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scale = 1 << precision
    quantized = [(xmin, [int(0.5 + v * scale) if v >= 0 else int(-0.5 + v * scale) for v in w]) for xmin, w in rows]
    acc = None
    for idx, w, valid in _rows_to_taps(quantized, in_size, np.int32):
        term = take_static(y, axis, idx)
        w = np.where(valid, w, 0).astype(np.int32) if valid is not None else w.astype(np.int32)
        term = hlo.mul(term, _weight(w, shape_of(term), axis, torch.int32))
        acc = term if acc is None else hlo.add(acc, term)
    shape = shape_of(acc)
    acc = hlo.add(acc, full(1 << (precision - 1), torch.int32, shape))
    acc = stablehlo.ShiftRightArithmeticOp(acc, full(precision, torch.int32, shape)).result
    return stablehlo.ClampOp(full(0, torch.int32, []), acc, full(255, torch.int32, [])).result


def _upsample_uint8(mode, x, lead, in_sizes, out_sizes, align_corners, scales):
    y = convert(x, torch.int32)
    for i in reversed(range(len(in_sizes))):
        if in_sizes[i] != out_sizes[i]:
            rows = _uint8_rows(mode, in_sizes[i], out_sizes[i], scales[i], align_corners)
            y = _fixed_point_pass(y, lead + i, rows, in_sizes[i])
    return convert(y, torch.uint8)


def _upsample(ctx, mode: str, nd: int, x, out_sizes, align_corners, scales):
    xs = shape_of(x)
    lead = len(xs) - nd
    out_sizes = [int(o) for o in ctx.result_shape()[lead:]]
    scales = list(scales) if scales is not None else [None] * nd
    dt = dtype(x)
    interpolating = not mode.startswith("nearest")
    if interpolating and not dt.is_floating_point:
        if dt is torch.uint8 and nd == 2:
            return _upsample_uint8(mode, x, lead, xs[lead:], out_sizes, align_corners, scales)
        raise ctx.fail(f"{mode} upsampling of {dt} tensors is not supported (PyTorch's CPU kernels take floats, "
                       "and uint8 for 2-d bilinear/bicubic)")
    np_t = _np_type(dt)
    taps_fn = _TAPS[mode]
    y = convert(x, opmath_dtype(dt)) if interpolating else x
    for i in reversed(range(nd)):
        if mode.endswith("_aa") and xs[lead + i] == out_sizes[i]:
            continue
        y = _apply_taps(y, lead + i, taps_fn(xs[lead + i], out_sizes[i], scales[i], np_t, align_corners))
    return convert(y, dt)


def _upsample_backward(ctx, mode, nd, grad_output, out_sizes, input_size, align_corners, scales):
    gs = shape_of(grad_output)
    lead = len(gs) - nd
    input_size = [int(s) for s in input_size]
    scales = list(scales) if scales is not None else [None] * nd
    dt = dtype(grad_output)
    acc = opmath_dtype(dt)
    taps_fn = _TAPS[mode]
    g = convert(grad_output, acc)
    for i in range(nd):
        n = input_size[lead + i]
        if mode.endswith("_aa") and n == gs[lead + i]:
            continue
        g = _apply_taps_transposed(g, lead + i, taps_fn(n, gs[lead + i], scales[i], _np_type(dt), align_corners), n)
    return convert(g, dt)


def _scale_list(scales, named, nd):
    """The trailing optional `scales_*` arguments (positional or keyword) as nd values."""
    values = list(scales) + list(named.values())
    return (values + [None] * nd)[:nd]


def _register_upsample(mode: str, nd: int, default_op, vec_op, backward_op, has_align: bool) -> None:
    if has_align:
        def rule(ctx, x, output_size, align_corners, *scales, **named):
            return _upsample(ctx, mode, nd, x, output_size, align_corners, _scale_list(scales, named, nd))

        def vec_rule(ctx, x, output_size, align_corners, scale_factors):
            return _upsample(ctx, mode, nd, x, output_size, align_corners, _scale_list(scale_factors or [], {}, nd))

        def backward_rule(ctx, grad_output, output_size, input_size, align_corners, *scales, **named):
            return _upsample_backward(ctx, mode, nd, grad_output, output_size, input_size, align_corners,
                                      _scale_list(scales, named, nd))
    else:
        def rule(ctx, x, output_size, *scales, **named):
            return _upsample(ctx, mode, nd, x, output_size, None, _scale_list(scales, named, nd))

        def vec_rule(ctx, x, output_size, scale_factors):
            return _upsample(ctx, mode, nd, x, output_size, None, _scale_list(scale_factors or [], {}, nd))

        def backward_rule(ctx, grad_output, output_size, input_size, *scales, **named):
            return _upsample_backward(ctx, mode, nd, grad_output, output_size, input_size, None,
                                      _scale_list(scales, named, nd))

    # Bounded dynamism: the scales use sizes as values, so a dynamic spatial dim runs in
    # eager; a dynamic batch dim is per sample.
    for op, lowering in ((default_op, rule), (vec_op, vec_rule), (backward_op, backward_rule)):
        if op is not None:
            lowers(op, dynamic=Padding.SIZE, dynamic_rule=reject_spatial_dynamic(op))(lowering)


for _mode, _nd, _name, _align in [
    ("nearest", 1, "upsample_nearest1d", False),
    ("nearest", 2, "upsample_nearest2d", False),
    ("nearest", 3, "upsample_nearest3d", False),
    ("nearest_exact", 1, "_upsample_nearest_exact1d", False),
    ("nearest_exact", 2, "_upsample_nearest_exact2d", False),
    ("nearest_exact", 3, "_upsample_nearest_exact3d", False),
    ("linear", 1, "upsample_linear1d", True),
    ("linear", 2, "upsample_bilinear2d", True),
    ("linear", 3, "upsample_trilinear3d", True),
    ("cubic", 2, "upsample_bicubic2d", True),
    ("linear_aa", 2, "_upsample_bilinear2d_aa", True),
    ("cubic_aa", 2, "_upsample_bicubic2d_aa", True),
]:
    _packet = getattr(aten, _name)
    _backward = getattr(aten, _name + "_backward", None)
    _register_upsample(_mode, _nd, _packet.default, _packet.vec, _backward.default if _backward else None, _align)


# -- grid_sampler_2d --------------------------------------------------------------------------------
# Follows PyTorch's vectorized CPU kernel (GridSamplerKernel.cpp), which is what eager runs
# for f32/f64: clipping maps NaN to 0, out-of-bounds taps read 0 but keep their weight
# (so a NaN/inf coordinate gives NaN with zeros padding), and taps are addressed with
# truncating float->int conversion.
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _f(value, like: ir.Value) -> ir.Value:
    return full(value, dtype(like), shape_of(like))


def _unnormalize(coord: ir.Value, size: int, align_corners: bool) -> ir.Value:
    np_t = _np_type(dtype(coord))
    if align_corners:  # (coord + 1) * ((size - 1) / 2)
        return hlo.mul(hlo.add(coord, _f(1, coord)), _f(np_t(size - 1) / np_t(2), coord))
    # (coord + 1) * (size / 2) - 0.5
    return hlo.sub(hlo.mul(hlo.add(coord, _f(1, coord)), _f(np_t(size) / np_t(2), coord)), _f(0.5, coord))


def _clip(coord: ir.Value, size: int) -> ir.Value:
    """min(max(coord, 0), size - 1) with NaN -> 0."""
    zero = _f(0, coord)
    coord = select(compare(coord, zero, "GT"), coord, zero)
    return stablehlo.MinOp(coord, _f(size - 1, coord)).result


def _reflect(coord: ir.Value, size: int, align_corners: bool) -> ir.Value:
    if align_corners:
        if size <= 1:
            return _f(0, coord)
        low, twice_span = 0.0, 2.0 * (size - 1)
    else:
        low, twice_span = -0.5, 2.0 * size
    c = stablehlo.AbsOp(hlo.sub(coord, _f(low, coord))).result
    flips = _trunc(stablehlo.DivOp(c, _f(twice_span, coord)).result)
    extra = hlo.sub(c, hlo.mul(flips, _f(twice_span, coord)))
    out = stablehlo.MinOp(extra, hlo.sub(_f(twice_span, coord), extra)).result
    return hlo.add(out, _f(low, coord)) if low else out


def _apply_padding(coord: ir.Value, size: int, padding_mode: int, align_corners: bool) -> ir.Value:
    if padding_mode == _BORDER:
        return _clip(coord, size)
    if padding_mode == _REFLECTION:
        return _clip(_reflect(coord, size, align_corners), size)
    return coord


def _trunc(v: ir.Value) -> ir.Value:
    return select(compare(v, _f(0, v), "LT"), stablehlo.CeilOp(v).result, stablehlo.FloorOp(v).result)


def _in_range(v: ir.Value, size: int) -> ir.Value:
    """-1 < v < size for integer-valued float coordinates (false for NaN)."""
    return stablehlo.AndOp(compare(v, _f(-1, v), "GT"), compare(v, _f(size, v), "LT")).result


def _flat_pixel_indices(ix: ir.Value, iy: ir.Value, h: int, w: int) -> ir.Value:
    """(N, P) float pixel coordinates -> (N, P, 2) [batch, y * W + x] gather/scatter
    indices (clamped; callers mask the out-of-bounds taps)."""
    n, p = shape_of(ix)
    xi = convert(_clip(ix, w), torch.int64)
    yi = convert(_clip(iy, h), torch.int64)
    flat = hlo.add(hlo.mul(yi, full(w, torch.int64, [n, p])), xi)
    return stablehlo.ConcatenateOp([iota([n, p, 1], 0, torch.int64), reshape(flat, [n, p, 1])], 2).result


def _concat_taps(taps) -> tuple[ir.Value, ir.Value]:
    """[(ix, iy, mask)] over (N, P) -> ((N, T*P) x, (N, T*P) y) plus the mask."""
    ix = stablehlo.ConcatenateOp([t[0] for t in taps], 1).result if len(taps) > 1 else taps[0][0]
    iy = stablehlo.ConcatenateOp([t[1] for t in taps], 1).result if len(taps) > 1 else taps[0][1]
    mask = stablehlo.ConcatenateOp([t[2] for t in taps], 1).result if len(taps) > 1 else taps[0][2]
    return ix, iy, mask


class _Sampler:
    """Reads input pixels (N, C, H, W) at integer-valued float coordinates (N, P),
    yielding (N, P, C) with 0 where the tap's mask is false. All taps of one call are
    one gather."""

    def __init__(self, x: ir.Value):
        self.n, self.c, self.h, self.w = shape_of(x)
        self.dt = dtype(x)
        self.table = transpose(reshape(x, [self.n, self.c, self.h * self.w]), [0, 2, 1])

    def many(self, taps) -> list[ir.Value]:
        n, p = shape_of(taps[0][0])
        ix, iy, mask = _concat_taps(taps)
        tp = len(taps) * p
        idx = _flat_pixel_indices(ix, iy, self.h, self.w)
        attr = ir.Attribute.parse(
            "#stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0, 1], start_index_map = [0, 1], "
            "index_vector_dim = 2>"
        )
        vals = stablehlo.GatherOp(self.table, idx, attr, [1, 1, self.c], results=[tensor_type([n, tp, self.c], self.dt)]).result
        mask = stablehlo.BroadcastInDimOp(tensor_type([n, tp, self.c], torch.bool), mask, [0, 1]).result
        vals = select(mask, vals, full(0, self.dt, [n, tp, self.c]))
        if len(taps) == 1:
            return [vals]
        return [stablehlo.SliceOp(vals, [0, t * p, 0], [n, (t + 1) * p, self.c], [1, 1, 1]).result for t in range(len(taps))]

    def __call__(self, ix: ir.Value, iy: ir.Value, mask: ir.Value) -> ir.Value:
        return self.many([(ix, iy, mask)])[0]


def _times(vals: ir.Value, weight: ir.Value) -> ir.Value:
    """(N, P, C) values times (N, P) weights."""
    w = stablehlo.BroadcastInDimOp(tensor_type(shape_of(vals), dtype(vals)), weight, [0, 1]).result
    return hlo.mul(vals, w)


def _cubic_weights(t: ir.Value) -> list[ir.Value]:
    a = -0.75

    def conv1(x):  # ((A + 2) * x - (A + 3)) * x * x + 1
        return hlo.add(hlo.mul(hlo.mul(hlo.sub(hlo.mul(_f(a + 2, x), x), _f(a + 3, x)), x), x), _f(1, x))

    def conv2(x):  # ((A * x - 5A) * x + 8A) * x - 4A
        return hlo.sub(hlo.mul(hlo.add(hlo.mul(hlo.sub(hlo.mul(_f(a, x), x), _f(5 * a, x)), x), _f(8 * a, x)), x), _f(4 * a, x))

    one = _f(1, t)
    return [conv2(hlo.add(t, one)), conv1(t), conv1(hlo.sub(one, t)), conv2(hlo.add(hlo.sub(one, t), one))]


@lowers(
    aten.grid_sampler_2d.default,
    dynamic=Padding.SIZE,
    dynamic_rule=reject_spatial_dynamic(aten.grid_sampler_2d.default),
)
def _grid_sampler_2d(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    n, c, h, w = shape_of(x)
    _, ho, wo, _ = shape_of(grid)
    dt = dtype(x)
    acc = opmath_dtype(dt)
    g = reshape(convert(grid, acc), [n, ho * wo, 2])
    gx = reshape(stablehlo.SliceOp(g, [0, 0, 0], [n, ho * wo, 1], [1, 1, 1]).result, [n, ho * wo])
    gy = reshape(stablehlo.SliceOp(g, [0, 0, 1], [n, ho * wo, 2], [1, 1, 1]).result, [n, ho * wo])
    sample = _Sampler(convert(x, acc))
    ix = _unnormalize(gx, w, align_corners)
    iy = _unnormalize(gy, h, align_corners)
    both = lambda p, q: stablehlo.AndOp(p, q).result
    if interpolation_mode == _BILINEAR:
        ix = _apply_padding(ix, w, padding_mode, align_corners)
        iy = _apply_padding(iy, h, padding_mode, align_corners)
        x0 = stablehlo.FloorOp(ix).result
        y0 = stablehlo.FloorOp(iy).result
        one = _f(1, ix)
        x1, y1 = hlo.add(x0, one), hlo.add(y0, one)
        we = hlo.sub(ix, x0)  # distance to the west column
        ea = hlo.sub(one, we)
        no = hlo.sub(iy, y0)  # distance to the north row
        so = hlo.sub(one, no)
        mw, me, mn, ms = _in_range(x0, w), _in_range(x1, w), _in_range(y0, h), _in_range(y1, h)
        nw_v, ne_v, sw_v, se_v = sample.many(
            [(x0, y0, both(mw, mn)), (x1, y0, both(me, mn)), (x0, y1, both(mw, ms)), (x1, y1, both(me, ms))]
        )
        out = _times(nw_v, hlo.mul(so, ea))
        out = hlo.add(out, _times(ne_v, hlo.mul(so, we)))
        out = hlo.add(out, _times(sw_v, hlo.mul(no, ea)))
        out = hlo.add(out, _times(se_v, hlo.mul(no, we)))
    elif interpolation_mode == _NEAREST:
        ix = stablehlo.RoundNearestEvenOp(_apply_padding(ix, w, padding_mode, align_corners)).result
        iy = stablehlo.RoundNearestEvenOp(_apply_padding(iy, h, padding_mode, align_corners)).result
        out = sample(ix, iy, both(_in_range(ix, w), _in_range(iy, h)))
    elif interpolation_mode == _BICUBIC:
        x0 = stablehlo.FloorOp(ix).result
        y0 = stablehlo.FloorOp(iy).result
        wx = _cubic_weights(hlo.sub(ix, x0))
        wy = _cubic_weights(hlo.sub(iy, y0))

        def bounded(cx, cy):
            cx = _trunc(_apply_padding(cx, w, padding_mode, align_corners))
            cy = _trunc(_apply_padding(cy, h, padding_mode, align_corners))
            return cx, cy, both(_in_range(cx, w), _in_range(cy, h))

        taps = [bounded(hlo.add(x0, _f(j - 1, x0)), hlo.add(y0, _f(i - 1, y0))) for i in range(4) for j in range(4)]
        vals = sample.many(taps)
        out = None
        for i in range(4):
            row = None
            for j in range(4):
                term = _times(vals[4 * i + j], wx[j])
                row = term if row is None else hlo.add(row, term)
            term = _times(row, wy[i])
            out = term if out is None else hlo.add(out, term)
    else:
        raise ctx.fail(f"unknown grid_sampler interpolation mode {interpolation_mode}")
    out = transpose(reshape(out, [n, ho, wo, c]), [0, 3, 1, 2])
    return convert(out, dt)


def _clip_with_grad(coord: ir.Value, size: int) -> tuple[ir.Value, ir.Value]:
    """clip_coordinates_get_grad: the clipped coordinate and a 0/1 multiplier that is 0
    on and beyond the borders."""
    clipped = _clip(coord, size)
    lo = stablehlo.MaxOp(coord, _f(0, coord)).result
    inside = stablehlo.AndOp(compare(lo, _f(0, coord), "NE"), compare(clipped, _f(size - 1, coord), "NE")).result
    return clipped, select(inside, _f(1, coord), _f(0, coord))


def _reflect_with_grad(coord: ir.Value, size: int, align_corners: bool) -> tuple[ir.Value, ir.Value]:
    """reflect_coordinates_get_grad: the reflected coordinate and its derivative (+-1)."""
    if align_corners:
        if size <= 1:
            return _f(0, coord), _f(0, coord)
        low, twice_span = 0.0, 2.0 * (size - 1)
    else:
        low, twice_span = -0.5, 2.0 * size
    shifted = hlo.sub(coord, _f(low, coord))
    negative = compare(shifted, _f(0, coord), "LT")
    c = stablehlo.AbsOp(shifted).result
    flips = _trunc(stablehlo.DivOp(c, _f(twice_span, coord)).result)
    extra = hlo.sub(c, hlo.mul(flips, _f(twice_span, coord)))
    reflected = hlo.sub(_f(twice_span, coord), extra)
    one_more = compare(extra, reflected, "GT")
    out = hlo.add(select(one_more, reflected, extra), _f(low, coord))
    flip = stablehlo.XorOp(one_more, negative).result
    return out, select(flip, _f(-1, coord), _f(1, coord))


def _coords_with_grad(grid_coord, size, padding_mode, align_corners):
    """ComputeLocation::apply_get_grad: the source coordinate and d coord / d grid."""
    np_t = _np_type(dtype(grid_coord))
    scale = np_t(size - 1) / np_t(2) if align_corners else np_t(size) / np_t(2)
    coord = _unnormalize(grid_coord, size, align_corners)
    mult = _f(scale, coord)
    if padding_mode == _BORDER:
        coord, g = _clip_with_grad(coord, size)
        mult = hlo.mul(mult, g)
    elif padding_mode == _REFLECTION:
        coord, g = _reflect_with_grad(coord, size, align_corners)
        mult = hlo.mul(mult, g)
        coord, g = _clip_with_grad(coord, size)
        mult = hlo.mul(mult, g)
    return coord, mult


class _Scatterer:
    """Accumulates (N, P, C) contributions at integer-valued float coordinates (N, P)
    into an (N, C, H, W) gradient, skipping taps whose mask is false; every `add` joins
    one scatter."""

    def __init__(self, n: int, c: int, h: int, w: int, dt: torch.dtype):
        self.n, self.c, self.h, self.w, self.dt = n, c, h, w, dt
        self.taps: list = []
        self.values: list[ir.Value] = []

    def add(self, ix: ir.Value, iy: ir.Value, mask: ir.Value, values: ir.Value) -> None:
        self.taps.append((ix, iy, mask))
        self.values.append(values)

    def result(self) -> ir.Value:
        n, c, h, w, dt = self.n, self.c, self.h, self.w, self.dt
        ix, iy, mask = _concat_taps(self.taps)
        values = stablehlo.ConcatenateOp(self.values, 1).result if len(self.values) > 1 else self.values[0]
        tp = shape_of(values)[1]
        mask = stablehlo.BroadcastInDimOp(tensor_type([n, tp, c], torch.bool), mask, [0, 1]).result
        values = select(mask, values, full(0, dt, [n, tp, c]))
        attr = ir.Attribute.parse(
            "#stablehlo.scatter<update_window_dims = [2], inserted_window_dims = [0, 1], "
            "scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>"
        )
        op = stablehlo.ScatterOp([tensor_type([n, h * w, c], dt)], [full(0, dt, [n, h * w, c])],
                                 _flat_pixel_indices(ix, iy, h, w), [values], attr)
        scalar_region(op.update_computation, [dt, dt], lambda a: [hlo.add(a[0], a[1])])
        return reshape(transpose(op.results[0], [0, 2, 1]), [n, c, h, w])


def _channel_sum(x: ir.Value) -> ir.Value:
    """(N, P, C) -> (N, P)."""
    (out,) = reduce([x], [full(0, dtype(x), [])], [2], lambda a, b: [hlo.add(a[0], b[0])])
    return out


def _cubic_weight_grads(t: ir.Value) -> list[ir.Value]:
    a = -0.75
    f = lambda v: _f(v, t)
    x0 = hlo.sub(f(-1), t)
    x1 = hlo.sub(f(0), t)
    x2 = hlo.sub(f(1), t)
    x3 = hlo.sub(f(2), t)
    return [
        hlo.sub(hlo.mul(hlo.sub(hlo.mul(f(-3 * a), x0), f(10 * a)), x0), f(8 * a)),
        hlo.mul(hlo.sub(hlo.mul(f(-3 * (a + 2)), x1), f(2 * (a + 3))), x1),
        hlo.mul(hlo.sub(hlo.mul(f(3 * (a + 2)), x2), f(2 * (a + 3))), x2),
        hlo.add(hlo.mul(hlo.sub(hlo.mul(f(3 * a), x3), f(10 * a)), x3), f(8 * a)),
    ]


@lowers(
    aten.grid_sampler_2d_backward.default,
    dynamic=Padding.SIZE,
    dynamic_rule=reject_spatial_dynamic(aten.grid_sampler_2d_backward.default),
)
def _grid_sampler_2d_backward(ctx, grad_output, x, grid, interpolation_mode, padding_mode, align_corners,
                              output_mask):
    n, c, h, w = shape_of(x)
    _, ho, wo, _ = shape_of(grid)
    p = ho * wo
    dt = dtype(x)
    acc = opmath_dtype(dt)
    g = reshape(convert(grid, acc), [n, p, 2])
    gx = reshape(stablehlo.SliceOp(g, [0, 0, 0], [n, p, 1], [1, 1, 1]).result, [n, p])
    gy = reshape(stablehlo.SliceOp(g, [0, 0, 1], [n, p, 2], [1, 1, 1]).result, [n, p])
    go = transpose(reshape(convert(grad_output, acc), [n, c, p]), [0, 2, 1])  # (N, P, C)
    sample = _Sampler(convert(x, acc))
    scatter = _Scatterer(n, c, h, w, acc) if output_mask[0] else None
    both = lambda a, b: stablehlo.AndOp(a, b).result
    bc = lambda v: stablehlo.BroadcastInDimOp(tensor_type([n, p, c], acc), v, [0, 1]).result
    zero_np = full(0, acc, [n, p])
    if interpolation_mode == _BILINEAR:
        ix, mx = _coords_with_grad(gx, w, padding_mode, align_corners)
        iy, my = _coords_with_grad(gy, h, padding_mode, align_corners)
        x0 = stablehlo.FloorOp(ix).result
        y0 = stablehlo.FloorOp(iy).result
        one = _f(1, ix)
        x1, y1 = hlo.add(x0, one), hlo.add(y0, one)
        we = hlo.sub(ix, x0)
        ea = hlo.sub(one, we)
        no = hlo.sub(iy, y0)
        so = hlo.sub(one, no)
        mw, me, mn, ms = _in_range(x0, w), _in_range(x1, w), _in_range(y0, h), _in_range(y1, h)
        corners = [(x0, y0, both(mw, mn), hlo.mul(so, ea)), (x1, y0, both(me, mn), hlo.mul(so, we)),
                   (x0, y1, both(mw, ms), hlo.mul(no, ea)), (x1, y1, both(me, ms), hlo.mul(no, we))]
        for cx, cy, mask, weight in corners:
            if scatter is not None:
                scatter.add(cx, cy, mask, hlo.mul(go, bc(weight)))
        nw, ne, sw, se = sample.many([corner[:3] for corner in corners])
        dx = hlo.add(hlo.mul(hlo.sub(ne, nw), bc(so)), hlo.mul(hlo.sub(se, sw), bc(no)))
        dy = hlo.add(hlo.mul(hlo.sub(sw, nw), bc(ea)), hlo.mul(hlo.sub(se, ne), bc(we)))
        grad_x = hlo.mul(_channel_sum(hlo.mul(dx, go)), mx)
        grad_y = hlo.mul(_channel_sum(hlo.mul(dy, go)), my)
    elif interpolation_mode == _NEAREST:
        ix = stablehlo.RoundNearestEvenOp(_apply_padding(_unnormalize(gx, w, align_corners), w, padding_mode, align_corners)).result
        iy = stablehlo.RoundNearestEvenOp(_apply_padding(_unnormalize(gy, h, align_corners), h, padding_mode, align_corners)).result
        if scatter is not None:
            scatter.add(ix, iy, both(_in_range(ix, w), _in_range(iy, h)), go)
        grad_x = grad_y = zero_np
    elif interpolation_mode == _BICUBIC:
        np_t = _np_type(acc)
        mx = _f(np_t(w - 1) / np_t(2) if align_corners else np_t(w) / np_t(2), gx)
        my = _f(np_t(h - 1) / np_t(2) if align_corners else np_t(h) / np_t(2), gy)
        ix = _unnormalize(gx, w, align_corners)
        iy = _unnormalize(gy, h, align_corners)
        x0 = stablehlo.FloorOp(ix).result
        y0 = stablehlo.FloorOp(iy).result
        tx, ty = hlo.sub(ix, x0), hlo.sub(iy, y0)
        cx, cy = _cubic_weights(tx), _cubic_weights(ty)
        dcx, dcy = _cubic_weight_grads(tx), _cubic_weight_grads(ty)
        taps = []
        for i in range(4):
            for j in range(4):
                xx = _trunc(_apply_padding(hlo.add(x0, _f(i - 1, x0)), w, padding_mode, align_corners))
                yy = _trunc(_apply_padding(hlo.add(y0, _f(j - 1, y0)), h, padding_mode, align_corners))
                taps.append((xx, yy, both(_in_range(xx, w), _in_range(yy, h))))
        vals = sample.many(taps)
        acc_x = acc_y = None
        for i in range(4):
            for j in range(4):
                xx, yy, mask = taps[4 * i + j]
                if scatter is not None:
                    scatter.add(xx, yy, mask, hlo.mul(go, bc(hlo.mul(cx[i], cy[j]))))
                vg = hlo.mul(vals[4 * i + j], go)
                tx_term = hlo.mul(vg, bc(hlo.mul(dcx[i], cy[j])))
                ty_term = hlo.mul(vg, bc(hlo.mul(dcy[j], cx[i])))
                acc_x = tx_term if acc_x is None else hlo.add(acc_x, tx_term)
                acc_y = ty_term if acc_y is None else hlo.add(acc_y, ty_term)
        grad_x = hlo.mul(stablehlo.NegOp(_channel_sum(acc_x)).result, mx)
        grad_y = hlo.mul(stablehlo.NegOp(_channel_sum(acc_y)).result, my)
    else:
        raise ctx.fail(f"unknown grid_sampler interpolation mode {interpolation_mode}")
    grad_grid = None
    if output_mask[1]:
        grad_grid = stablehlo.ConcatenateOp([reshape(grad_x, [n, p, 1]), reshape(grad_y, [n, p, 1])], 2).result
        grad_grid = convert(reshape(grad_grid, [n, ho, wo, 2]), dtype(grid))
    grad_input = convert(scatter.result(), dt) if scatter is not None else None
    return grad_input, grad_grid
