"""FFTs (`_fft_r2c`, `_fft_c2r`, `_fft_c2c`, what every `torch.fft.*` function reaches)
and the complex helpers around them (`real`, `imag`, `conj*`, `complex`, `polar`,
`angle`). `view_as_real` / `view_as_complex` are view ops (view_like family).

`stablehlo.fft` transforms the 1 to 3 innermost dims: the transformed dims are moved
there with a transpose (in the order given, so a real transform halves the last listed
dim as PyTorch does), more than 3 dims are done in rounds. XLA's inverse transforms
divide by n; PyTorch's `normalization` (0: none, 1: 1/sqrt(n), 2: 1/n) is applied on
top of that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import (
    compare,
    convert,
    dtype,
    full,
    normalize_dim,
    rank_of,
    select,
    shape_of,
    transpose,
)
from .padded import dynamic_dims
from .registry import LOWERINGS, declare_padding, LoweringContext, lowers, Padding
from .symsize import static_layout

aten = torch.ops.aten

_MAX_FFT_RANK = 3
_COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_REAL_OF = {v: k for k, v in _COMPLEX_OF.items()}


def _fft_innermost(x: ir.Value, dims: Sequence[int], fft_type: str, lengths: Sequence[int], out_dtype: torch.dtype) -> ir.Value:
    """`stablehlo.fft` over `dims` (at most 3) of `x`: moves them innermost in the
    given order, transforms with `lengths`, and moves them back."""
    rank = rank_of(x)
    others = [d for d in range(rank) if d not in dims]
    perm = others + list(dims)
    moved = transpose(x, perm)
    shape = shape_of(moved)
    out_shape = shape[: rank - len(dims)] + list(lengths)
    if fft_type == "RFFT":
        out_shape[-1] = lengths[-1] // 2 + 1
    attr = ir.Attribute.parse(f"#stablehlo<fft_type {fft_type}>")
    out = stablehlo.FftOp(moved, attr, [int(n) for n in lengths], results=[tensor_type(out_shape, out_dtype)]).result
    inverse = [perm.index(d) for d in range(rank)]
    return transpose(out, inverse)


def _c2c(x: ir.Value, dims: Sequence[int], forward: bool) -> ir.Value:
    """Complex-to-complex transform over any number of dims, in rounds of 3."""
    dims = list(dims)
    shape = shape_of(x)
    while dims:
        chunk, dims = dims[-_MAX_FFT_RANK:], dims[:-_MAX_FFT_RANK]
        x = _fft_innermost(x, chunk, "FFT" if forward else "IFFT", [shape[d] for d in chunk], dtype(x))
    return x


def _splat(value: float, dt: torch.dtype, shape: Sequence[int]) -> ir.Value:
    """A real `value` splat, complex types built from two real splats."""
    if dt.is_complex:
        part = _REAL_OF[dt]
        return stablehlo.ComplexOp(full(value, part, shape), full(0, part, shape)).result
    return full(value, dt, shape)


def _scale(x: ir.Value, factor: float) -> ir.Value:
    if factor == 1.0:
        return x
    return stablehlo.MulOp(x, _splat(factor, dtype(x), shape_of(x))).result


def _norm_factor(normalization: int, n: int) -> float:
    """PyTorch's fft_norm_mode: 0 none, 1 1/sqrt(n), 2 1/n."""
    if n == 0:
        return 1.0
    return {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[int(normalization)]


def _dims(ctx: LoweringContext, x: ir.Value, dim) -> list[int]:
    """The transformed dims (in the given order); fails for complex32 (half) FFTs,
    which StableHLO has no element type for."""
    complex_dtype = ctx.result_dtype() if ctx.result_dtype().is_complex else dtype(x)
    if complex_dtype.is_complex and complex_dtype not in _REAL_OF:
        raise ctx.fail(f"FFTs of {complex_dtype} are not supported (only complex64 and complex128)")
    rank = rank_of(x)
    return [normalize_dim(int(d), rank) for d in dim]


def _fit_last(x: ir.Value, dim: int, size: int) -> ir.Value:
    """Cuts or zero-pads `x` along `dim` to `size`."""
    shape = shape_of(x)
    if shape[dim] == size:
        return x
    rank = len(shape)
    if shape[dim] > size:
        limits = list(shape)
        limits[dim] = size
        return stablehlo.SliceOp(x, [0] * rank, limits, [1] * rank).result
    high = [0] * rank
    high[dim] = size - shape[dim]
    return stablehlo.PadOp(x, _splat(0, dtype(x), []), [0] * rank, high, [0] * rank).result


# Bounded dynamism: a transform along a dynamic dim would include the padding; along
# static dims (and for the complex-part ops) positions are independent.
def _fft_padded(ctx: LoweringContext, x, dim, *args, **kwargs):
    """A transform along a dynamic dim runs in eager (it would include the padding);
    along static dims the ordinary rule, on the static layout (XLA cannot propagate a
    dynamic dim through an FFT)."""
    dims = [d % len(ctx.arg_meta(0).shape) for d in dim]
    if set(dims) & set(dynamic_dims(ctx, 0)):
        raise ctx.dynamic_limit("an FFT along a dynamic (padded) dimension")
    return LOWERINGS[ctx.node.target].fn(ctx, static_layout(x), dim, *args, **kwargs)


_FFT = {"dynamic": Padding.MOVEMENT, "dynamic_rule": _fft_padded}


@lowers(aten._fft_c2c.default, **_FFT)
def _fft_c2c(ctx, self, dim, normalization, forward):
    dims = _dims(ctx, self, dim)
    out_dtype = ctx.result_dtype()
    x = convert(self, out_dtype)
    if not dims or 0 in shape_of(x):
        return x
    n = math.prod(shape_of(x)[d] for d in dims)
    out = _c2c(x, dims, forward)
    factor = _norm_factor(normalization, n)
    if not forward:
        factor *= n  # XLA's IFFT already divided by n
    return _scale(out, factor)


@lowers(aten._fft_r2c.default, **_FFT)
def _fft_r2c(ctx, self, dim, normalization, onesided):
    dims = _dims(ctx, self, dim)
    out_dtype = ctx.result_dtype()
    out_shape = ctx.result_shape()
    if 0 in shape_of(self) or 0 in out_shape:
        return _splat(0, out_dtype, out_shape)
    x = convert(self, _REAL_OF[out_dtype])
    shape = shape_of(x)
    n = math.prod(shape[d] for d in dims)
    if not onesided:
        out = _c2c(convert(x, out_dtype), dims, True)
    else:
        # Real transform over the last (up to 3) listed dims, complex over the rest.
        inner, outer = dims[-_MAX_FFT_RANK:], dims[:-_MAX_FFT_RANK]
        out = _fft_innermost(x, inner, "RFFT", [shape[d] for d in inner], out_dtype)
        out = _c2c(out, outer, True)
    return _scale(out, _norm_factor(normalization, n))


@lowers(aten._fft_c2r.default, **_FFT)
def _fft_c2r(ctx, self, dim, normalization, last_dim_size):
    dims = _dims(ctx, self, dim)
    out_dtype = ctx.result_dtype()
    out_shape = ctx.result_shape()
    if 0 in out_shape:
        return _splat(0, out_dtype, out_shape)
    x = convert(self, _COMPLEX_OF[out_dtype])
    last = dims[-1]
    x = _fit_last(x, last, last_dim_size // 2 + 1)
    inner, outer = dims[-_MAX_FFT_RANK:], dims[:-_MAX_FFT_RANK]
    x = _c2c(x, outer, False)
    lengths = [shape_of(x)[d] for d in inner[:-1]] + [int(last_dim_size)]
    out = _fft_innermost(x, inner, "IRFFT", lengths, out_dtype)
    n = math.prod(out_shape[d] for d in dims)
    return _scale(out, _norm_factor(normalization, n) * n)  # XLA's inverse divided by n


# -- complex helpers -----------------------------------------------------------------------------
@lowers(aten.real.default)
def _real(ctx, self):
    return stablehlo.RealOp(self).result if dtype(self).is_complex else self


@lowers(aten.imag.default)
def _imag(ctx, self):
    if not dtype(self).is_complex:
        raise ctx.fail("imag is not implemented for tensors with non-complex dtypes")
    return stablehlo.ImagOp(self).result


@lowers(aten.conj.default, aten._conj.default, aten.conj_physical.default, aten._conj_physical.default)
def _conj(ctx, self):
    if not dtype(self).is_complex:
        return self
    re, im = stablehlo.RealOp(self).result, stablehlo.ImagOp(self).result
    return stablehlo.ComplexOp(re, stablehlo.NegOp(im).result).result


@lowers(aten.complex.default)
def _complex(ctx, real, imag):
    out = ctx.result_dtype()
    if out not in _REAL_OF:
        raise ctx.fail(f"complex tensors of dtype {out} are not supported (only complex64 and complex128)")
    part = _REAL_OF[out]
    shape = ctx.result_shape()
    from .helpers import broadcast_to

    re = broadcast_to(convert(real, part), shape)
    im = broadcast_to(convert(imag, part), shape)
    return stablehlo.ComplexOp(re, im).result


@lowers(aten.polar.default)
def _polar(ctx, abs, angle):
    out = ctx.result_dtype()
    if out not in _REAL_OF:
        raise ctx.fail(f"complex tensors of dtype {out} are not supported (only complex64 and complex128)")
    from .helpers import promote

    magnitude, theta = promote(abs, angle, to=_REAL_OF[out])
    re = stablehlo.MulOp(magnitude, stablehlo.CosineOp(theta).result).result
    im = stablehlo.MulOp(magnitude, stablehlo.SineOp(theta).result).result
    return stablehlo.ComplexOp(re, im).result


@lowers(aten.angle.default)
def _angle(ctx, self):
    out = ctx.result_dtype()
    if dtype(self).is_complex:
        return stablehlo.Atan2Op(stablehlo.ImagOp(self).result, stablehlo.RealOp(self).result).result
    # Real input: pi for negative numbers, 0 otherwise, NaN stays NaN.
    x = convert(self, out)
    shape = shape_of(x)
    result = select(compare(x, full(0, out, shape), "LT"), full(math.pi, out, shape), full(0, out, shape))
    return select(compare(x, x, "NE"), x, result)


declare_padding(Padding.SAFE, family="fft")
