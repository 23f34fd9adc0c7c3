"""Tensor creation: constants and fills, ranges (arange/linspace/logspace), eye, the
`empty*` family, and random tensors.

* Result shapes and dtypes come from `node.meta['val']`, so dtype inference, default
  dtypes and `*_like` arguments are PyTorch's own.
* `empty*` ops return zeros. PyTorch leaves their contents unspecified, so any value is
  faithful; zeros make programs deterministic.
* Random ops draw bits from the graph's threaded RNG state (`ctx.random_bits`); they
  follow PyTorch's distributions, not its bit streams, so results differ from eager
  for the same `torch.manual_seed`. An explicit `torch.Generator` argument cannot be
  honoured and fails.
* Arithmetic runs in f32 for every float result of 32 bits or fewer and in f64 only for
  f64 results (TPUs have no fast f64). PyTorch's CPU kernels accumulate `arange` in
  double, so an f32 `arange` with a non-integral step can differ from eager in the last
  ulp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..context import ir, stablehlo
from .helpers import (
    array_constant,
    broadcast_to,
    compare,
    convert,
    dtype,
    full,
    iota,
    scalar_region,
    select,
    shape_of,
)
from .symsize import SymSize
from .registry import declare_padding, LoweringContext, lowers, Padding

aten = torch.ops.aten


def _compute_dtype(dt: torch.dtype) -> torch.dtype:
    """The float type arithmetic for a `dt` result runs in (see the module docstring)."""
    return torch.float64 if dt in (torch.float64, torch.complex128) else torch.float32


def _component_dtype(dt: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dt, dt)


def _binary(op, a: ir.Value, b) -> ir.Value:
    """`op(a, b)` with a Python scalar `b` splatted to a's shape and dtype."""
    if not isinstance(b, ir.Value):
        b = full(b, dtype(a), shape_of(a))
    return op(a, b).result


def _add_splat(a, b):
    return _binary(stablehlo.AddOp, a, b)


def _mul_splat(a, b):
    return _binary(stablehlo.MulOp, a, b)


# -- constants and fills ------------------------------------------------------------------------
def _filled(value, ctx: LoweringContext) -> ir.Value:
    return full(value, ctx.result_dtype(), ctx.result_shape())


@lowers(aten.full.default)
def _full(ctx: LoweringContext, size, fill_value, **kwargs):
    return _filled(fill_value, ctx)


@lowers(aten.full_like.default)
def _full_like(ctx: LoweringContext, x, fill_value, **kwargs):
    return _filled(fill_value, ctx)


@lowers(aten.new_full.default)
def _new_full(ctx: LoweringContext, x, size, fill_value, **kwargs):
    return _filled(fill_value, ctx)


@lowers(aten.scalar_tensor.default)
def _scalar_tensor(ctx: LoweringContext, s, **kwargs):
    return _filled(s, ctx)


@lowers(aten.fill.Scalar)
def _fill_scalar(ctx: LoweringContext, x, value):
    return _filled(value, ctx)


@lowers(aten.fill.Tensor)
def _fill_tensor(ctx: LoweringContext, x, value):
    return broadcast_to(convert(value, dtype(x)), shape_of(x))


def _zeros(ctx: LoweringContext, *args, **kwargs):
    """zeros/empty and their variants (empty contents are unspecified in PyTorch; zeros
    are a faithful choice)."""
    return _filled(0, ctx)


def _ones(ctx: LoweringContext, *args, **kwargs):
    return _filled(1, ctx)


lowers(
    aten.zeros.default,
    aten._efficientzerotensor.default,  # autograd's "known zero" gradient
    aten.zeros_like.default,
    aten.new_zeros.default,
    aten.zero.default,
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.empty_permuted.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
)(_zeros)
lowers(aten.ones.default, aten.ones_like.default, aten.new_ones.default)(_ones)


@lowers(aten.lift_fresh_copy.default, aten.lift_fresh.default)
def _lift_fresh(ctx: LoweringContext, x):
    """Constants (torch.tensor(...) inside the traced code) arrive as get_attr values."""
    return x


# -- ranges ------------------------------------------------------------------------------------------
def _arange(ctx: LoweringContext, start, end, step):
    """start + i * step, i < len (PyTorch computed len into the result shape). Integer
    results compute in int64 with start/step truncated to integers, as PyTorch's kernel
    does."""
    out = ctx.result_dtype()
    shape = ctx.result_shape()
    if out.is_floating_point:
        compute, start, step = _compute_dtype(out), float(start), float(step)
    else:
        compute, start, step = torch.int64, int(start), int(step)
    values = iota(shape, 0, compute)
    if step != 1:
        values = _mul_splat(values, step)
    if start != 0:
        values = _add_splat(values, start)
    return convert(values, out)


@lowers(aten.arange.default)
def _arange_default(ctx: LoweringContext, end, **kwargs):
    return _arange(ctx, 0, end, 1)


def _reject_symbolic_start_or_step(ctx: LoweringContext, start, end, step=1, **kwargs):
    """The iota is right at the bound; a symbolic start or step would be read as its bound."""
    if isinstance(start, SymSize) or isinstance(step, SymSize):
        raise ctx.dynamic_limit("arange with a symbolic start or step")
    return NotImplemented


@lowers(aten.arange.start, dynamic=Padding.SIZE, dynamic_rule=_reject_symbolic_start_or_step)
def _arange_start(ctx: LoweringContext, start, end, **kwargs):
    return _arange(ctx, start, end, 1)


@lowers(aten.arange.start_step, dynamic=Padding.SIZE, dynamic_rule=_reject_symbolic_start_or_step)
def _arange_start_step(ctx: LoweringContext, start, end, step=1, **kwargs):
    return _arange(ctx, start, end, step)


def _linear_steps(out: torch.dtype, start, end, steps: int) -> ir.Value:
    """PyTorch's linspace kernel: start + i*step for the first half, end - (steps-1-i)*step
    for the second (symmetric rounding); integer results are computed in double and
    truncated."""
    compute = _compute_dtype(out) if out.is_floating_point else torch.float64
    if not out.is_floating_point:
        start, end = int(start), int(end)  # Scalar.to<int>() truncates
    start, end = float(start), float(end)
    if steps == 1:
        return full(start, compute, [1])
    step = (end - start) / (steps - 1)
    i = iota([steps], 0, compute)
    head = _add_splat(_mul_splat(i, step), start)
    remaining = _add_splat(_mul_splat(i, -1.0), float(steps - 1))
    tail = _add_splat(_mul_splat(remaining, -step), end)
    first_half = compare(i, full(steps // 2, compute, [steps]), "LT")
    return select(first_half, head, tail)


@lowers(aten.linspace.default, dynamic=Padding.SIZE)
def _linspace(ctx: LoweringContext, start, end, steps, **kwargs):
    out = ctx.result_dtype()
    if out.is_complex:
        raise ctx.fail("complex linspace is not supported")
    return convert(_linear_steps(out, start, end, int(steps)), out)


@lowers(aten.logspace.default, dynamic=Padding.SIZE)
def _logspace(ctx: LoweringContext, start, end, steps, base=10.0, **kwargs):
    out = ctx.result_dtype()
    if out.is_complex:
        raise ctx.fail("complex logspace is not supported")
    exponents = _linear_steps(out, start, end, int(steps))
    powers = stablehlo.PowOp(full(float(base), dtype(exponents), [int(steps)]), exponents).result
    return convert(powers, out)


@lowers(aten.eye.default)
def _eye(ctx: LoweringContext, n, **kwargs):
    return _eye_m(ctx, n, n)


@lowers(aten.eye.m)
def _eye_m(ctx: LoweringContext, n, m, **kwargs):
    shape = ctx.result_shape()
    on_diagonal = compare(iota(shape, 0, torch.int64), iota(shape, 1, torch.int64), "EQ")
    return convert(on_diagonal, ctx.result_dtype())


def _triangle_indices(fn, ctx: LoweringContext, row, col, offset=0, **kwargs):
    """Static index lists: computed by PyTorch itself at compile time."""
    indices = fn(int(row), int(col), int(offset), dtype=ctx.result_dtype())
    return array_constant(indices, ctx.result_dtype())


lowers(aten.tril_indices.default, dynamic=Padding.SIZE)(
    lambda ctx, *a, **k: _triangle_indices(torch.tril_indices, ctx, *a, **k)
)
lowers(aten.triu_indices.default, dynamic=Padding.SIZE)(
    lambda ctx, *a, **k: _triangle_indices(torch.triu_indices, ctx, *a, **k)
)


# -- random numbers ----------------------------------------------------------------------------------
def _no_generator(ctx: LoweringContext, generator) -> None:
    if generator is not None:
        raise ctx.fail(
            "an explicit torch.Generator is not supported: random ops draw from the compiled "
            "graph's own RNG state (seeded per call)"
        )


_MANTISSA_DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


def _uniform01(ctx: LoweringContext, shape: Sequence[int], dt: torch.dtype) -> ir.Value:
    """Uniform [0, 1) in `dt` (a real float type): the top k random bits times 2^-k,
    k = dt's mantissa digits, so every value is exact and 1 is never produced (PyTorch's
    `uniform_real` construction)."""
    digits = _MANTISSA_DIGITS.get(dt)
    if digits is None:
        raise ctx.fail(f"random floats of dtype {dt} are not supported")
    width = 64 if dt is torch.float64 else 32
    unsigned = torch.uint64 if width == 64 else torch.uint32
    bits = ctx.random_bits(list(shape), width)
    top = stablehlo.ShiftRightLogicalOp(bits, full(width - digits, unsigned, shape)).result
    compute = _compute_dtype(dt)
    return convert(_mul_splat(convert(top, compute), 2.0**-digits), dt)


def _standard_normal(ctx: LoweringContext, shape: Sequence[int], dt: torch.dtype) -> ir.Value:
    """N(0, 1) by Box-Muller in the compute dtype: sqrt(-2 log(1-u1)) * cos(2 pi u2)."""
    compute = _compute_dtype(dt)
    u1 = _uniform01(ctx, shape, compute)
    u2 = _uniform01(ctx, shape, compute)
    one_minus = stablehlo.SubtractOp(full(1.0, compute, shape), u1).result  # (0, 1]
    radius = stablehlo.SqrtOp(_mul_splat(stablehlo.LogOp(one_minus).result, -2.0)).result
    angle = stablehlo.CosineOp(_mul_splat(u2, 2.0 * math.pi)).result
    return convert(stablehlo.MulOp(radius, angle).result, dt)


def _real_or_complex(sample, ctx: LoweringContext, shape, dt: torch.dtype, complex_scale: float = 1.0):
    """`sample(ctx, shape, real_dtype)`; complex dtypes draw real and imaginary parts
    independently (scaled, e.g. by sqrt(1/2) for randn, as PyTorch does)."""
    if not dt.is_complex:
        return sample(ctx, shape, dt)
    part = _component_dtype(dt)
    real, imag = sample(ctx, shape, part), sample(ctx, shape, part)
    if complex_scale != 1.0:
        real, imag = _mul_splat(real, complex_scale), _mul_splat(imag, complex_scale)
    return stablehlo.ComplexOp(real, imag).result


def _rand(ctx: LoweringContext, *args, generator=None, **kwargs):
    _no_generator(ctx, generator)
    return _real_or_complex(_uniform01, ctx, ctx.result_shape(), ctx.result_dtype())


def _randn(ctx: LoweringContext, *args, generator=None, **kwargs):
    _no_generator(ctx, generator)
    return _real_or_complex(_standard_normal, ctx, ctx.result_shape(), ctx.result_dtype(), math.sqrt(0.5))


lowers(aten.rand.default, aten.rand.generator, aten.rand_like.default, aten.rand_like.generator)(_rand)
lowers(aten.randn.default, aten.randn.generator, aten.randn_like.default, aten.randn_like.generator)(_randn)


def _integers(ctx: LoweringContext, low, high, generator=None) -> ir.Value:
    """Uniform integers in [low, high) as the result dtype: 64 random bits modulo the
    range (PyTorch's `random_from_to` construction). `high` may be a tensor."""
    _no_generator(ctx, generator)
    out, shape = ctx.result_dtype(), ctx.result_shape()
    bits = ctx.random_bits(shape, 64)
    if isinstance(high, ir.Value):
        span = stablehlo.SubtractOp(broadcast_to(convert(high, torch.int64), shape), full(int(low), torch.int64, shape)).result
        span = convert(span, torch.uint64)
    else:
        if int(high) <= int(low):
            raise ctx.fail(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
        span = full(int(high) - int(low), torch.uint64, shape)
    offset = convert(stablehlo.RemOp(bits, span).result, torch.int64)
    return convert(_add_splat(offset, int(low)), out)


@lowers(aten.randint.default, aten.randint.generator)
def _randint(ctx: LoweringContext, high, size, *, generator=None, **kwargs):
    return _integers(ctx, 0, high, generator)


@lowers(aten.randint.low, aten.randint.low_generator)
def _randint_low(ctx: LoweringContext, low, high, size, *, generator=None, **kwargs):
    return _integers(ctx, low, high, generator)


@lowers(aten.randint_like.default, aten.randint_like.generator, aten.randint_like.Tensor, aten.randint_like.Tensor_generator)
def _randint_like(ctx: LoweringContext, x, high, *, generator=None, **kwargs):
    return _integers(ctx, 0, high, generator)


@lowers(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype)
def _randint_like_low(ctx: LoweringContext, x, low, high, *, generator=None, **kwargs):
    return _integers(ctx, low, high, generator)


def _random_high(dt: torch.dtype) -> int:
    """Exclusive upper bound of `random_()` without `to`: floats draw integers up to
    2^digits inclusive, integers up to their max inclusive."""
    if dt is torch.bool:
        return 2
    if dt.is_floating_point:
        return 2 ** _MANTISSA_DIGITS[dt] + 1
    return torch.iinfo(dt).max + 1


@lowers(aten.random.default)
def _random(ctx: LoweringContext, x, *, generator=None):
    return _integers(ctx, 0, _random_high(dtype(x)), generator)


@lowers(aten.random.to)
def _random_to(ctx: LoweringContext, x, to, *, generator=None):
    return _integers(ctx, 0, to, generator)


@lowers(aten.uniform.default)
def _uniform(ctx: LoweringContext, x, low=0.0, high=1.0, *, generator=None):
    _no_generator(ctx, generator)
    dt = dtype(x)
    compute = _compute_dtype(dt)
    u = _uniform01(ctx, shape_of(x), compute)
    return convert(_add_splat(_mul_splat(u, float(high) - float(low)), float(low)), dt)


def _bernoulli_mask(ctx: LoweringContext, p, shape, dt: torch.dtype) -> ir.Value:
    """u < p with u uniform [0, 1) (p a float or a tensor of probabilities)."""
    compute = _compute_dtype(dt if dt.is_floating_point else torch.float32)
    u = _uniform01(ctx, shape, compute)
    p = broadcast_to(convert(p, compute), shape) if isinstance(p, ir.Value) else full(float(p), compute, shape)
    return compare(u, p, "LT")


@lowers(aten.bernoulli.default)
def _bernoulli(ctx: LoweringContext, x, *, generator=None):
    _no_generator(ctx, generator)
    return convert(_bernoulli_mask(ctx, x, shape_of(x), dtype(x)), ctx.result_dtype())


@lowers(aten.bernoulli.p, aten.bernoulli.Tensor)
def _bernoulli_p(ctx: LoweringContext, x, p, *, generator=None):
    _no_generator(ctx, generator)
    return convert(_bernoulli_mask(ctx, p, shape_of(x), dtype(x)), ctx.result_dtype())


@lowers(aten.native_dropout.default)
def _native_dropout(ctx: LoweringContext, x, p, train):
    """(x * mask / (1 - p), mask) with mask ~ Bernoulli(1 - p); `train=None` trains, as
    ATen's kernel does. p == 1 gives zeros (scale 0); train=False is the identity."""
    shape, dt = shape_of(x), dtype(x)
    if train is False:
        return x, full(True, torch.bool, shape)
    keep_probability = 1.0 - float(p)
    mask = _bernoulli_mask(ctx, keep_probability, shape, dt)
    scale = 0.0 if keep_probability == 0 else 1.0 / keep_probability
    # Multiply (not select) like ATen, so dropped NaN/inf elements still give NaN.
    kept = stablehlo.MulOp(x, convert(mask, dt)).result
    return _mul_splat(kept, scale), mask


@lowers(aten.randperm.default, aten.randperm.generator, dynamic=Padding.SIZE)
def _randperm(ctx: LoweringContext, n, *, generator=None, **kwargs):
    """Sorts iota by 64-bit random keys (a uniform permutation up to key collisions,
    probability ~n^2/2^65)."""
    _no_generator(ctx, generator)
    n = int(n)
    keys = ctx.random_bits([n], 64)
    ids = iota([n], 0, torch.int64)
    sort = stablehlo.SortOp([keys.type, ids.type], [keys, ids], dimension=0, is_stable=True)
    scalar_region(sort.comparator, [torch.uint64, torch.uint64, torch.int64, torch.int64], lambda a: [compare(a[0], a[1], "LT")])
    return convert(sort.results[1], ctx.result_dtype())


# -- distributions of an existing tensor's shape and dtype -------------------------------------------
def _sample_like(ctx: LoweringContext, x, generator, transform) -> ir.Value:
    """`transform(u)` of uniform [0, 1) samples in the compute dtype, then cast to x's
    dtype."""
    _no_generator(ctx, generator)
    dt = dtype(x)
    if not dt.is_floating_point:
        raise ctx.fail(f"this distribution needs a floating-point tensor, got {dt}")
    compute = _compute_dtype(dt)
    u = _uniform01(ctx, shape_of(x), compute)
    return convert(transform(u, compute), dt)


@lowers(aten.exponential.default)
def _exponential(ctx: LoweringContext, x, lambd=1.0, *, generator=None):
    # -log(1 - u) / lambda, u in [0, 1) keeps the log finite.
    def transform(u, compute):
        return _mul_splat(stablehlo.Log1pOp(_mul_splat(u, -1.0)).result, -1.0 / float(lambd))

    return _sample_like(ctx, x, generator, transform)


@lowers(aten.geometric.default)
def _geometric(ctx: LoweringContext, x, p, *, generator=None):
    # ceil(log(1 - u) / log(1 - p)), at least 1 (support {1, 2, ...}).
    def transform(u, compute):
        log_u = stablehlo.Log1pOp(_mul_splat(u, -1.0)).result
        trials = stablehlo.CeilOp(_mul_splat(log_u, 1.0 / math.log1p(-float(p)))).result
        return stablehlo.MaxOp(trials, full(1.0, compute, shape_of(u))).result

    return _sample_like(ctx, x, generator, transform)


@lowers(aten.cauchy.default)
def _cauchy(ctx: LoweringContext, x, median=0.0, sigma=1.0, *, generator=None):
    def transform(u, compute):
        angle = _mul_splat(_add_splat(u, -0.5), math.pi)
        return _add_splat(_mul_splat(stablehlo.TanOp(angle).result, float(sigma)), float(median))

    return _sample_like(ctx, x, generator, transform)


def _normal(ctx: LoweringContext, mean, std, generator=None) -> ir.Value:
    """mean + std * N(0, 1) in the result's shape and dtype (mean/std tensors broadcast)."""
    _no_generator(ctx, generator)
    out, shape = ctx.result_dtype(), ctx.result_shape()
    compute = _compute_dtype(out) if not out.is_complex else out

    def operand(v):
        return broadcast_to(convert(v, compute), shape) if isinstance(v, ir.Value) else full(v, compute, shape)

    noise = _real_or_complex(_standard_normal, ctx, shape, compute, math.sqrt(0.5))
    return convert(stablehlo.AddOp(operand(mean), stablehlo.MulOp(operand(std), noise).result).result, out)


@lowers(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def _normal_tensors(ctx: LoweringContext, mean, std=1.0, *, generator=None):
    return _normal(ctx, mean, std, generator)


@lowers(aten.normal_functional.default)
def _normal_functional(ctx: LoweringContext, x, mean=0.0, std=1.0, *, generator=None):
    """`x.normal_(mean, std)`'s value: x's shape and dtype."""
    return _normal(ctx, mean, std, generator)


@lowers(aten.normal.float_float)
def _normal_float_float(ctx: LoweringContext, mean, std, size, *, generator=None, **kwargs):
    return _normal(ctx, mean, std, generator)


@lowers(aten.log_normal.default)
def _log_normal(ctx: LoweringContext, x, mean=1.0, std=2.0, *, generator=None):
    _no_generator(ctx, generator)
    dt = dtype(x)
    compute = _compute_dtype(dt)
    z = _standard_normal(ctx, shape_of(x), compute)
    return convert(stablehlo.ExpOp(_add_splat(_mul_splat(z, float(std)), float(mean))).result, dt)


# Bounded dynamism (registry.Padding): fills, random values and iota-based ranges are the
# same at every logical position of the padded buffer. arange with a symbolic start or
# step, linspace/logspace (their step divides by the size) and the index/permutation
# creators use sizes as values (class `size`, declared at their registrations).
declare_padding(Padding.SAFE, family="creation")
