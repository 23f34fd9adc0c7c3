"""Resampling: upsampling (nearest, nearest-exact, linear, bilinear, trilinear, bicubic,
anti-aliased, and their backward) and grid_sampler_2d/3d (and their backward).

Static index arithmetic (source pixels, interpolation weights) is done here in NumPy with
the float type PyTorch's CPU kernels use, so indices and weights match eager bit for bit;
the graph only gathers, weights and reduces. Gathers and interpolation never multiply by a
0/1 matrix, so an inf or NaN stays where PyTorch would put it."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

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


# -- grid_sampler_2d, grid_sampler_3d --------------------------------------------------------------
# Eager runs a different CPU kernel for each, and each is followed in its own arithmetic
# (a _Kernel below); gathering the taps, blending them and scattering gradients are shared
# and work over any number of spatial dims. Coordinates are listed innermost first (x, y[, z]),
# as the grid holds them; sizes likewise (W, H[, D]).
#
# grid_sampler_2d: the vectorized kernel (GridSamplerKernel.cpp), what eager runs for f32/f64.
# It computes in opmath; clipping maps NaN to 0, out-of-bounds taps read 0 but keep their
# weight (so a NaN/inf coordinate gives NaN with zeros padding), and taps are addressed with
# truncating float->int conversion.
#
# grid_sampler_3d: the scalar kernel (grid_sampler_3d_cpu_impl in GridSampler.cpp). It computes
# in the tensor's own type (f16/bf16 round after every operation); clipping is
# std::min(size - 1, std::max(coord, 0)), which sends NaN to size - 1; reflection uses fmod; a
# corner's weight is its distance to the opposite corner ((x0 + 1) - x, not 1 - (x - x0)); and
# out-of-bounds taps are skipped, weight and all (so a NaN/inf coordinate gives 0 with zeros
# padding). It has no bicubic mode: PyTorch refuses bicubic on 5-D input.
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _f(value, like: ir.Value) -> ir.Value:
    return full(value, dtype(like), shape_of(like))


def _unnormalize_scale(size: int, align_corners: bool) -> float:
    """d coord / d grid. Halving is exact, so rounding it once to the coordinate's type gives
    the value both kernels compute ((size - 1) / 2 or size / 2 in that type)."""
    return (size - 1) / 2 if align_corners else size / 2


def _clip(coord: ir.Value, size: int) -> ir.Value:
    """min(max(coord, 0), size - 1) with NaN -> 0."""
    zero = _f(0, coord)
    coord = select(compare(coord, zero, "GT"), coord, zero)
    return stablehlo.MinOp(coord, _f(size - 1, coord)).result


def _trunc(v: ir.Value) -> ir.Value:
    return select(compare(v, _f(0, v), "LT"), stablehlo.CeilOp(v).result, stablehlo.FloorOp(v).result)


def _odd(v: ir.Value) -> ir.Value:
    """Whether the integer-valued float v is odd (false for NaN and inf)."""
    return compare(stablehlo.RemOp(v, _f(2, v)).result, _f(1, v), "EQ")


def _in_range(v: ir.Value, size: int) -> ir.Value:
    """-1 < v < size for integer-valued float coordinates (false for NaN)."""
    return hlo.logical_and(compare(v, _f(-1, v), "GT"), compare(v, _f(size, v), "LT"))


def _reflection_bounds(size: int, align_corners: bool) -> tuple[float, int]:
    """The low end and the length of the interval coordinates reflect into."""
    return (0.0, size - 1) if align_corners else (-0.5, size)


class _Corner(NamedTuple):
    """One corner of the cell around a coordinate, for linear interpolation."""

    sides: tuple[int, ...]  # per dim (x first): 0 on floor(coord), 1 on floor(coord) + 1
    coords: list[ir.Value]
    mask: ir.Value  # inside the input along every dim
    weight: ir.Value


class _Kernel(ABC):
    """The coordinate arithmetic of one of PyTorch's grid_sampler CPU kernels."""

    # Whether an out-of-bounds tap is left out entirely rather than read as 0 with its weight.
    skips_out_of_bounds_taps: bool

    @abstractmethod
    def compute_dtype(self, dt: torch.dtype) -> torch.dtype:
        """The type the kernel computes a `dt` input in."""

    @abstractmethod
    def unnormalize(self, coord: ir.Value, size: int, align_corners: bool) -> ir.Value:
        """Grid coordinate in [-1, 1] -> pixel coordinate."""

    @abstractmethod
    def clip(self, coord: ir.Value, size: int) -> ir.Value:
        """The coordinate clamped to [0, size - 1] (border padding)."""

    @abstractmethod
    def reflect(self, coord: ir.Value, size: int, align_corners: bool) -> ir.Value:
        """The coordinate mirrored into the input's extent (reflection padding, before the clip)."""

    @abstractmethod
    def clip_with_grad(self, coord: ir.Value, size: int) -> tuple[ir.Value, ir.Value]:
        """The clipped coordinate and its derivative."""

    @abstractmethod
    def reflect_with_grad(self, coord: ir.Value, size: int, align_corners: bool) -> tuple[ir.Value, ir.Value]:
        """The reflected coordinate and its derivative."""

    @abstractmethod
    def linear_weights(self, coord: ir.Value, low: ir.Value, high: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The weights of the taps at floor(coord) = low and low + 1 = high."""

    @abstractmethod
    def corner_weight(self, factors: list[ir.Value]) -> ir.Value:
        """A corner's weight from its per-dim (x first) weights, multiplied in the kernel's
        order: XLA:CPU fuses products into the sums that follow as multiply-adds, and the
        other order moves results by an ulp."""

    @abstractmethod
    def linear_grid_grads(self, values: list[ir.Value], corners: list[_Corner], weights,
                          go: ir.Value) -> list[ir.Value]:
        """d loss / d pixel coordinate, per dim, from the corners' values (N, P, C), their
        per-dim (low, high) weights and the output gradient (N, P, C)."""

    def apply_padding(self, coord: ir.Value, size: int, padding_mode: int, align_corners: bool) -> ir.Value:
        if padding_mode == _BORDER:
            return self.clip(coord, size)
        if padding_mode == _REFLECTION:
            return self.clip(self.reflect(coord, size, align_corners), size)
        return coord

    def source_coordinate(self, grid_coord: ir.Value, size: int, padding_mode: int,
                          align_corners: bool) -> ir.Value:
        """grid_sampler_compute_source_index: the padded pixel coordinate."""
        coord = self.unnormalize(grid_coord, size, align_corners)
        return self.apply_padding(coord, size, padding_mode, align_corners)

    @abstractmethod
    def backward_source_coordinate(self, grid_coord: ir.Value, size: int, padding_mode: int,
                                   align_corners: bool) -> ir.Value:
        """Where the backward pass places a nearest-neighbour sample."""

    def coords_with_grad(self, grid_coord: ir.Value, size: int, padding_mode: int,
                         align_corners: bool) -> tuple[ir.Value, ir.Value]:
        """The padded pixel coordinate and d coord / d grid."""
        coord = self.unnormalize(grid_coord, size, align_corners)
        mult = _f(_unnormalize_scale(size, align_corners), coord)
        if padding_mode == _BORDER:
            coord, g = self.clip_with_grad(coord, size)
            mult = hlo.mul(mult, g)
        elif padding_mode == _REFLECTION:
            coord, g = self.reflect_with_grad(coord, size, align_corners)
            mult = hlo.mul(mult, g)
            coord, g = self.clip_with_grad(coord, size)
            mult = hlo.mul(mult, g)
        return coord, mult


class _VectorizedKernel(_Kernel):
    """grid_sampler_2d's kernel (GridSamplerKernel.cpp)."""

    skips_out_of_bounds_taps = False

    def compute_dtype(self, dt):
        return opmath_dtype(dt)

    def unnormalize(self, coord, size, align_corners):
        scale = _f(_unnormalize_scale(size, align_corners), coord)
        if align_corners:  # (coord + 1) * ((size - 1) / 2)
            return hlo.mul(hlo.add(coord, _f(1, coord)), scale)
        # (coord + 1) * (size / 2) - 0.5
        return hlo.sub(hlo.mul(hlo.add(coord, _f(1, coord)), scale), _f(0.5, coord))

    def clip(self, coord, size):
        return _clip(coord, size)

    def reflect(self, coord, size, align_corners):
        if align_corners and size <= 1:
            return _f(0, coord)
        low, span = _reflection_bounds(size, align_corners)
        twice_span = 2.0 * span
        c = stablehlo.AbsOp(hlo.sub(coord, _f(low, coord))).result
        flips = _trunc(stablehlo.DivOp(c, _f(twice_span, coord)).result)
        extra = hlo.sub(c, hlo.mul(flips, _f(twice_span, coord)))
        out = stablehlo.MinOp(extra, hlo.sub(_f(twice_span, coord), extra)).result
        return hlo.add(out, _f(low, coord)) if low else out

    def clip_with_grad(self, coord, size):
        """clip_coordinates_get_grad: a 0/1 multiplier that is 0 on and beyond the borders."""
        clipped = _clip(coord, size)
        lo = stablehlo.MaxOp(coord, _f(0, coord)).result
        inside = hlo.logical_and(compare(lo, _f(0, coord), "NE"), compare(clipped, _f(size - 1, coord), "NE"))
        return clipped, select(inside, _f(1, coord), _f(0, coord))

    def reflect_with_grad(self, coord, size, align_corners):
        """reflect_coordinates_get_grad: the derivative is +-1."""
        if align_corners and size <= 1:
            return _f(0, coord), _f(0, coord)
        low, span = _reflection_bounds(size, align_corners)
        twice_span = 2.0 * span
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

    def backward_source_coordinate(self, grid_coord, size, padding_mode, align_corners):
        return self.source_coordinate(grid_coord, size, padding_mode, align_corners)

    def linear_weights(self, coord, low, high):
        above = hlo.sub(coord, low)  # the distance to the low tap is the high tap's weight
        return hlo.sub(_f(1, coord), above), above

    def corner_weight(self, factors):
        return _product(factors[::-1])  # nw = s * e: the y distance times the x distance

    def linear_grid_grads(self, values, corners, weights, go):
        # The kernel's formulation: differences of neighbouring corners (out-of-bounds ones
        # read 0), each weighted by the other dim's distances. 2-D only, as the kernel is.
        nw, ne, sw, se = values
        (ea, we), (so, no) = weights
        dx = hlo.add(_times(hlo.sub(ne, nw), so), _times(hlo.sub(se, sw), no))
        dy = hlo.add(_times(hlo.sub(sw, nw), ea), _times(hlo.sub(se, ne), we))
        return [_channel_sum(hlo.mul(dx, go)), _channel_sum(hlo.mul(dy, go))]


class _ScalarKernel(_Kernel):
    """grid_sampler_3d's kernel (grid_sampler_3d_cpu_impl and its backward, GridSampler.cpp,
    with the coordinate helpers of GridSampler.h)."""

    skips_out_of_bounds_taps = True

    def compute_dtype(self, dt):
        return dt

    def unnormalize(self, coord, size, align_corners):
        plus_one = hlo.add(coord, _f(1, coord))
        if align_corners:  # ((coord + 1) / 2) * (size - 1)
            return hlo.mul(hlo.div(plus_one, _f(2, coord)), _f(size - 1, coord))
        # ((coord + 1) * size - 1) / 2
        return hlo.div(hlo.sub(hlo.mul(plus_one, _f(size, coord)), _f(1, coord)), _f(2, coord))

    def clip(self, coord, size):
        """std::min(size - 1, std::max(coord, 0)): each keeps its first argument unless the
        comparison holds, so NaN becomes size - 1."""
        zero, last = _f(0, coord), _f(size - 1, coord)
        at_least_zero = select(compare(coord, zero, "LT"), zero, coord)
        return select(compare(at_least_zero, last, "LT"), at_least_zero, last)

    def _fold(self, c: ir.Value, size: int, align_corners: bool) -> tuple[ir.Value, ir.Value]:
        """A distance c >= 0 from the low end folded into the interval (fmod, then mirrored
        on an odd number of flips), and whether it was mirrored."""
        low, span = _reflection_bounds(size, align_corners)
        extra = stablehlo.RemOp(c, _f(span, c)).result
        mirrored = _odd(stablehlo.FloorOp(stablehlo.DivOp(c, _f(span, c)).result).result)
        out = select(mirrored, hlo.sub(_f(span, c), extra), extra)
        return (hlo.add(out, _f(low, c)) if low else out), mirrored

    def reflect(self, coord, size, align_corners):
        if align_corners and size <= 1:  # a one-pixel interval: every coordinate lands on 0
            return _f(0, coord)
        low, _ = _reflection_bounds(size, align_corners)
        c = stablehlo.AbsOp(hlo.sub(coord, _f(low, coord))).result
        return self._fold(c, size, align_corners)[0]

    def clip_with_grad(self, coord, size):
        """clip_coordinates_set_grad: borders count as outside (derivative 0); NaN fails both
        comparisons and passes through with derivative 1."""
        below = compare(coord, _f(0, coord), "LE")
        above = compare(coord, _f(size - 1, coord), "GE")
        out = select(below, _f(0, coord), select(above, _f(size - 1, coord), coord))
        outside = stablehlo.OrOp(below, above).result
        return out, select(outside, _f(0, coord), _f(1, coord))

    def reflect_with_grad(self, coord, size, align_corners):
        """reflect_coordinates_set_grad: the derivative is -1 when exactly one of (below the
        low end, mirrored) holds, else 1."""
        if align_corners and size <= 1:
            return _f(0, coord), _f(0, coord)
        low, _ = _reflection_bounds(size, align_corners)
        shifted = hlo.sub(coord, _f(low, coord))
        negative = compare(shifted, _f(0, coord), "LT")
        out, mirrored = self._fold(stablehlo.AbsOp(shifted).result, size, align_corners)
        flip = stablehlo.XorOp(mirrored, negative).result
        return out, select(flip, _f(-1, coord), _f(1, coord))

    def backward_source_coordinate(self, grid_coord, size, padding_mode, align_corners):
        # The backward places every sample with the _set_grad helpers, whose clip lets NaN
        # through (out of bounds) where the forward's sends it to the border.
        return self.coords_with_grad(grid_coord, size, padding_mode, align_corners)[0]

    def linear_weights(self, coord, low, high):
        return hlo.sub(high, coord), hlo.sub(coord, low)

    def corner_weight(self, factors):
        return _product(factors)  # tnw = (x distance) * (y distance) * (z distance)

    def linear_grid_grads(self, values, corners, weights, go):
        # Each in-bounds corner adds -/+ (its value . go) times the other dims' weights: minus
        # on the low side of the dim, plus on the high side. A skipped corner adds nothing
        # (not 0 times a NaN weight).
        dots = [_channel_sum(hlo.mul(v, go)) for v in values]
        grads = []
        for d in range(len(weights)):
            total = _f(0, dots[0])
            for corner, dot in zip(corners, dots):
                others = [weights[e][side] for e, side in enumerate(corner.sides) if e != d]
                term = select(corner.mask, hlo.mul(dot, _product(others)), _f(0, dot))
                total = hlo.add(total, term) if corner.sides[d] else hlo.sub(total, term)
            grads.append(total)
        return grads


_VECTORIZED = _VectorizedKernel()
_SCALAR = _ScalarKernel()


def _product(factors: list[ir.Value]) -> ir.Value:
    """The factors multiplied left to right, as the kernels write them."""
    out = factors[0]
    for factor in factors[1:]:
        out = hlo.mul(out, factor)
    return out


# -- taps -----------------------------------------------------------------------------------------
def _per_dim(place, grid_coords: list[ir.Value], sizes: Sequence[int], padding_mode: int,
             align_corners: bool) -> list:
    """place(grid coordinate, size, padding_mode, align_corners) for every dim."""
    return [place(g, size, padding_mode, align_corners) for g, size in zip(grid_coords, sizes)]


def _grid_coordinates(grid: ir.Value, dt: torch.dtype) -> list[ir.Value]:
    """(N, *out, nd) grid -> its nd coordinates (x first), each (N, P) in `dt`."""
    n, *out, nd = shape_of(grid)
    p = math.prod(out)
    g = reshape(convert(grid, dt), [n, p, nd])
    return [reshape(stablehlo.SliceOp(g, [0, 0, d], [n, p, d + 1], [1, 1, 1]).result, [n, p])
            for d in range(nd)]


def _flat_pixel_indices(coords: list[ir.Value], sizes: Sequence[int]) -> ir.Value:
    """(N, P) float pixel coordinates (x first) -> (N, P, 2) [batch, row-major pixel offset]
    gather/scatter indices (clamped; callers mask the out-of-bounds taps)."""
    n, p = shape_of(coords[0])
    ints = [convert(_clip(c, size), torch.int64) for c, size in zip(coords, sizes)]
    flat = ints[-1]
    for i, size in zip(ints[-2::-1], sizes[-2::-1]):
        flat = hlo.add(hlo.mul(flat, full(size, torch.int64, [n, p])), i)
    return stablehlo.ConcatenateOp([iota([n, p, 1], 0, torch.int64), reshape(flat, [n, p, 1])], 2).result


def _join(values: list[ir.Value]) -> ir.Value:
    """(N, P, ...) values side by side along dim 1."""
    return stablehlo.ConcatenateOp(values, 1).result if len(values) > 1 else values[0]


def _concat_taps(taps) -> tuple[list[ir.Value], ir.Value]:
    """[(coords, mask)] over (N, P) -> the (N, T*P) coordinates of all taps, per dim, and
    their mask."""
    nd = len(taps[0][0])
    return [_join([coords[d] for coords, _ in taps]) for d in range(nd)], _join([mask for _, mask in taps])


class _Sampler:
    """Reads input pixels (N, C, *spatial) at integer-valued float coordinates (N, P),
    yielding (N, P, C) with 0 where the tap's mask is false. All taps of one call are
    one gather."""

    def __init__(self, x: ir.Value):
        self.n, self.c, *spatial = shape_of(x)
        self.sizes = spatial[::-1]
        self.dt = dtype(x)
        self.table = transpose(reshape(x, [self.n, self.c, math.prod(spatial)]), [0, 2, 1])

    def many(self, taps) -> list[ir.Value]:
        """taps: [(coords, mask)]."""
        n, p = shape_of(taps[0][1])
        coords, mask = _concat_taps(taps)
        tp = len(taps) * p
        idx = _flat_pixel_indices(coords, self.sizes)
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

    def __call__(self, coords: list[ir.Value], mask: ir.Value) -> ir.Value:
        return self.many([(coords, mask)])[0]


class _Scatterer:
    """Accumulates (N, P, C) contributions at integer-valued float coordinates (N, P)
    into an (N, C, *spatial) gradient, skipping taps whose mask is false; every `add`
    joins one scatter."""

    def __init__(self, n: int, c: int, spatial: Sequence[int], dt: torch.dtype):
        self.n, self.c, self.spatial, self.dt = n, c, list(spatial), dt
        self.taps: list = []
        self.values: list[ir.Value] = []

    def add(self, coords: list[ir.Value], mask: ir.Value, values: ir.Value) -> None:
        self.taps.append((coords, mask))
        self.values.append(values)

    def result(self) -> ir.Value:
        n, c, dt = self.n, self.c, self.dt
        pixels = math.prod(self.spatial)
        coords, mask = _concat_taps(self.taps)
        values = _join(self.values)
        tp = shape_of(values)[1]
        mask = stablehlo.BroadcastInDimOp(tensor_type([n, tp, c], torch.bool), mask, [0, 1]).result
        values = select(mask, values, full(0, dt, [n, tp, c]))
        attr = ir.Attribute.parse(
            "#stablehlo.scatter<update_window_dims = [2], inserted_window_dims = [0, 1], "
            "scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>"
        )
        op = stablehlo.ScatterOp([tensor_type([n, pixels, c], dt)], [full(0, dt, [n, pixels, c])],
                                 _flat_pixel_indices(coords, self.spatial[::-1]), [values], attr)
        scalar_region(op.update_computation, [dt, dt], lambda a: [hlo.add(a[0], a[1])])
        return reshape(transpose(op.results[0], [0, 2, 1]), [n, c, *self.spatial])


def _times(vals: ir.Value, weight: ir.Value) -> ir.Value:
    """(N, P, C) values times (N, P) weights."""
    w = stablehlo.BroadcastInDimOp(tensor_type(shape_of(vals), dtype(vals)), weight, [0, 1]).result
    return hlo.mul(vals, w)


def _channel_sum(x: ir.Value) -> ir.Value:
    """(N, P, C) -> (N, P)."""
    (out,) = reduce([x], [full(0, dtype(x), [])], [2], lambda a, b: [hlo.add(a[0], b[0])])
    return out


# -- linear (bilinear, trilinear) ---------------------------------------------------------------------
def _linear_corners(kernel: _Kernel, coords: list[ir.Value], sizes: Sequence[int]):
    """The 2**nd corners around each coordinate, x varying fastest (the kernels' nw, ne,
    sw, se and tnw, tne, ..., bse order), and the per-dim (low, high) weights."""
    ends, inside, weights = [], [], []
    for coord, size in zip(coords, sizes):
        low = stablehlo.FloorOp(coord).result
        high = hlo.add(low, _f(1, low))
        ends.append((low, high))
        inside.append((_in_range(low, size), _in_range(high, size)))
        weights.append(kernel.linear_weights(coord, low, high))
    corners = []
    for k in range(2 ** len(coords)):
        sides = tuple((k >> d) & 1 for d in range(len(coords)))
        mask = inside[0][sides[0]]
        for d in range(1, len(coords)):
            mask = hlo.logical_and(mask, inside[d][sides[d]])
        weight = kernel.corner_weight([weights[d][side] for d, side in enumerate(sides)])
        if kernel.skips_out_of_bounds_taps:
            weight = select(mask, weight, _f(0, weight))
        corners.append(_Corner(sides, [ends[d][side] for d, side in enumerate(sides)], mask, weight))
    return corners, weights


def _sum_weighted(values: list[ir.Value], weights: list[ir.Value]) -> ir.Value:
    """sum_t values_t * weights_t in order: (N, P, C) values, (N, P) weights."""
    out = _times(values[0], weights[0])
    for vals, weight in zip(values[1:], weights[1:]):
        out = hlo.add(out, _times(vals, weight))
    return out


def _linear_sample(kernel, sample, grid_coords, sizes, padding_mode, align_corners):
    coords = _per_dim(kernel.source_coordinate, grid_coords, sizes, padding_mode, align_corners)
    corners, _ = _linear_corners(kernel, coords, sizes)
    values = sample.many([(corner.coords, corner.mask) for corner in corners])
    return _sum_weighted(values, [corner.weight for corner in corners])


def _linear_backward(kernel, sample, scatter, grid_coords, sizes, go, padding_mode, align_corners):
    located = _per_dim(kernel.coords_with_grad, grid_coords, sizes, padding_mode, align_corners)
    corners, weights = _linear_corners(kernel, [coord for coord, _ in located], sizes)
    if scatter is not None:
        for corner in corners:
            scatter.add(corner.coords, corner.mask, _times(go, corner.weight))
    values = sample.many([(corner.coords, corner.mask) for corner in corners])
    grads = kernel.linear_grid_grads(values, corners, weights, go)
    return [hlo.mul(grad, mult) for grad, (_, mult) in zip(grads, located)]


# -- nearest -----------------------------------------------------------------------------------------
def _nearest_pixels(coords: list[ir.Value], sizes: Sequence[int]) -> tuple[list[ir.Value], ir.Value]:
    """The pixels nearest the padded coordinates (std::nearbyint: ties to even) and whether
    they are inside the input."""
    pixels = [stablehlo.RoundNearestEvenOp(coord).result for coord in coords]
    mask = _in_range(pixels[0], sizes[0])
    for pixel, size in zip(pixels[1:], sizes[1:]):
        mask = hlo.logical_and(mask, _in_range(pixel, size))
    return pixels, mask


# -- bicubic (2-D only) ------------------------------------------------------------------------------
def _cubic_weights(t: ir.Value) -> list[ir.Value]:
    a = -0.75

    def conv1(x):  # ((A + 2) * x - (A + 3)) * x * x + 1
        return hlo.add(hlo.mul(hlo.mul(hlo.sub(hlo.mul(_f(a + 2, x), x), _f(a + 3, x)), x), x), _f(1, x))

    def conv2(x):  # ((A * x - 5A) * x + 8A) * x - 4A
        return hlo.sub(hlo.mul(hlo.add(hlo.mul(hlo.sub(hlo.mul(_f(a, x), x), _f(5 * a, x)), x), _f(8 * a, x)), x), _f(4 * a, x))

    one = _f(1, t)
    return [conv2(hlo.add(t, one)), conv1(t), conv1(hlo.sub(one, t)), conv2(hlo.add(hlo.sub(one, t), one))]


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


def _cubic_tap(kernel, x, y, sizes, padding_mode, align_corners):
    """get_value_bounded's addressing: pad, then truncate to a pixel."""
    (w, h) = sizes
    x = _trunc(kernel.apply_padding(x, w, padding_mode, align_corners))
    y = _trunc(kernel.apply_padding(y, h, padding_mode, align_corners))
    return [x, y], hlo.logical_and(_in_range(x, w), _in_range(y, h))


def _bicubic_sample(kernel, sample, grid_coords, sizes, padding_mode, align_corners):
    ix, iy = (kernel.unnormalize(g, size, align_corners) for g, size in zip(grid_coords, sizes))
    x0 = stablehlo.FloorOp(ix).result
    y0 = stablehlo.FloorOp(iy).result
    wx = _cubic_weights(hlo.sub(ix, x0))
    wy = _cubic_weights(hlo.sub(iy, y0))
    taps = [_cubic_tap(kernel, hlo.add(x0, _f(j - 1, x0)), hlo.add(y0, _f(i - 1, y0)), sizes, padding_mode,
                       align_corners)
            for i in range(4) for j in range(4)]
    vals = sample.many(taps)
    out = None
    for i in range(4):
        row = _sum_weighted(vals[4 * i:4 * i + 4], wx)
        term = _times(row, wy[i])
        out = term if out is None else hlo.add(out, term)
    return out


def _bicubic_backward(kernel, sample, scatter, grid_coords, sizes, go, padding_mode, align_corners):
    (gx, gy), (w, h) = grid_coords, sizes
    mx = _f(_unnormalize_scale(w, align_corners), gx)
    my = _f(_unnormalize_scale(h, align_corners), gy)
    ix = kernel.unnormalize(gx, w, align_corners)
    iy = kernel.unnormalize(gy, h, align_corners)
    x0 = stablehlo.FloorOp(ix).result
    y0 = stablehlo.FloorOp(iy).result
    tx, ty = hlo.sub(ix, x0), hlo.sub(iy, y0)
    cx, cy = _cubic_weights(tx), _cubic_weights(ty)
    dcx, dcy = _cubic_weight_grads(tx), _cubic_weight_grads(ty)
    taps = [_cubic_tap(kernel, hlo.add(x0, _f(i - 1, x0)), hlo.add(y0, _f(j - 1, y0)), sizes, padding_mode,
                       align_corners)
            for i in range(4) for j in range(4)]
    vals = sample.many(taps)
    acc_x = acc_y = None
    for i in range(4):
        for j in range(4):
            coords, mask = taps[4 * i + j]
            if scatter is not None:
                scatter.add(coords, mask, _times(go, hlo.mul(cx[i], cy[j])))
            vg = hlo.mul(vals[4 * i + j], go)
            tx_term = _times(vg, hlo.mul(dcx[i], cy[j]))
            ty_term = _times(vg, hlo.mul(dcy[j], cx[i]))
            acc_x = tx_term if acc_x is None else hlo.add(acc_x, tx_term)
            acc_y = ty_term if acc_y is None else hlo.add(acc_y, ty_term)
    return [hlo.mul(stablehlo.NegOp(_channel_sum(acc_x)).result, mx),
            hlo.mul(stablehlo.NegOp(_channel_sum(acc_y)).result, my)]


# -- the ops -----------------------------------------------------------------------------------------
def _check_interpolation(ctx, interpolation_mode: int, nd: int) -> None:
    if interpolation_mode == _BICUBIC and nd != 2:
        raise ctx.fail("grid_sampler: bicubic interpolation only supports 4-D input "
                       "(PyTorch refuses 5-D as well)")
    if interpolation_mode not in (_BILINEAR, _NEAREST, _BICUBIC):
        raise ctx.fail(f"unknown grid_sampler interpolation mode {interpolation_mode}")


def _channels_first(out: ir.Value, n: int, out_spatial: Sequence[int], c: int) -> ir.Value:
    """(N, P, C) -> (N, C, *out_spatial)."""
    nd = len(out_spatial)
    return transpose(reshape(out, [n, *out_spatial, c]), [0, nd + 1, *range(1, nd + 1)])


def _grid_sample(ctx, kernel: _Kernel, x, grid, interpolation_mode, padding_mode, align_corners):
    n, c, *spatial = shape_of(x)
    out_spatial = shape_of(grid)[1:-1]
    _check_interpolation(ctx, interpolation_mode, len(spatial))
    dt = dtype(x)
    ct = kernel.compute_dtype(dt)
    grid_coords = _grid_coordinates(grid, ct)
    sizes = spatial[::-1]
    sample = _Sampler(convert(x, ct))
    if interpolation_mode == _BILINEAR:
        out = _linear_sample(kernel, sample, grid_coords, sizes, padding_mode, align_corners)
    elif interpolation_mode == _NEAREST:
        coords = _per_dim(kernel.source_coordinate, grid_coords, sizes, padding_mode, align_corners)
        out = sample(*_nearest_pixels(coords, sizes))
    else:
        out = _bicubic_sample(kernel, sample, grid_coords, sizes, padding_mode, align_corners)
    return convert(_channels_first(out, n, out_spatial, c), dt)


def _grid_sample_backward(ctx, kernel: _Kernel, grad_output, x, grid, interpolation_mode, padding_mode,
                          align_corners, output_mask):
    n, c, *spatial = shape_of(x)
    out_spatial = shape_of(grid)[1:-1]
    _check_interpolation(ctx, interpolation_mode, len(spatial))
    p = math.prod(out_spatial)
    dt = dtype(x)
    ct = kernel.compute_dtype(dt)
    grid_coords = _grid_coordinates(grid, ct)
    sizes = spatial[::-1]
    go = transpose(reshape(convert(grad_output, ct), [n, c, p]), [0, 2, 1])  # (N, P, C)
    sample = _Sampler(convert(x, ct))
    scatter = _Scatterer(n, c, spatial, ct) if output_mask[0] else None
    if interpolation_mode == _BILINEAR:
        grads = _linear_backward(kernel, sample, scatter, grid_coords, sizes, go, padding_mode, align_corners)
    elif interpolation_mode == _NEAREST:
        coords = _per_dim(kernel.backward_source_coordinate, grid_coords, sizes, padding_mode, align_corners)
        pixels, mask = _nearest_pixels(coords, sizes)
        if scatter is not None:
            scatter.add(pixels, mask, go)
        grads = [full(0, ct, [n, p])] * len(spatial)  # a step function: no gradient to the grid
    else:
        grads = _bicubic_backward(kernel, sample, scatter, grid_coords, sizes, go, padding_mode,
                                  align_corners)
    # Eager returns grad_grid whatever output_mask[1] says (its meta too); unused, XLA drops it.
    grad_grid = stablehlo.ConcatenateOp([reshape(g, [n, p, 1]) for g in grads], 2).result
    grad_grid = convert(reshape(grad_grid, [n, *out_spatial, len(spatial)]), dtype(grid))
    grad_input = convert(scatter.result(), dt) if scatter is not None else None
    return grad_input, grad_grid


@lowers(
    aten.grid_sampler_2d.default,
    dynamic=Padding.SIZE,
    dynamic_rule=reject_spatial_dynamic(aten.grid_sampler_2d.default),
)
def _grid_sampler_2d(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(ctx, _VECTORIZED, x, grid, interpolation_mode, padding_mode, align_corners)


@lowers(
    aten.grid_sampler_2d_backward.default,
    dynamic=Padding.SIZE,
    dynamic_rule=reject_spatial_dynamic(aten.grid_sampler_2d_backward.default),
)
def _grid_sampler_2d_backward(ctx, grad_output, x, grid, interpolation_mode, padding_mode, align_corners,
                              output_mask):
    return _grid_sample_backward(ctx, _VECTORIZED, grad_output, x, grid, interpolation_mode, padding_mode,
                                 align_corners, output_mask)


@lowers(
    aten.grid_sampler_3d.default,
    dynamic=Padding.SIZE,
    dynamic_rule=reject_spatial_dynamic(aten.grid_sampler_3d.default),
)
def _grid_sampler_3d(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(ctx, _SCALAR, x, grid, interpolation_mode, padding_mode, align_corners)


@lowers(
    aten.grid_sampler_3d_backward.default,
    dynamic=Padding.SIZE,
    dynamic_rule=reject_spatial_dynamic(aten.grid_sampler_3d_backward.default),
)
def _grid_sampler_3d_backward(ctx, grad_output, x, grid, interpolation_mode, padding_mode, align_corners,
                              output_mask):
    return _grid_sample_backward(ctx, _SCALAR, grad_output, x, grid, interpolation_mode, padding_mode,
                                 align_corners, output_mask)
