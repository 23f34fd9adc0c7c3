"""Matrix products: mm, bmm, addmm (and `_addmm_activation`), baddbmm, addbmm, mv, addmv,
dot, vdot, _int_mm, and `_trilinear` (F.bilinear). (The pairwise distances `_cdist_forward` / `_pdist_forward` live in
the distances family.)

Every product is one `stablehlo.dot_general` with explicit batch and contracting
dimensions (`dot_general` below, shared with the attention family). Integer products
stay integer. No `precision_config` is set here: the `torchtpu-set-precision` pass
applies `torch.get_float32_matmul_precision()` to every dot_general and convolution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..context import chlo, ir, stablehlo
from .. import ir as ir_builders
from ..dtypes import element_type
from .helpers import broadcast_to, convert, dtype, full, reduce, reshape, shape_of
from .opmath import opmath_dtype
from .registry import declare_padding, LoweringContext, lowers, Padding

aten = torch.ops.aten


# -- shared builder (attention uses it too) -------------------------------------------------------
def dot_general(
    lhs: ir.Value,
    rhs: ir.Value,
    contract: tuple[Sequence[int], Sequence[int]],
    batch: tuple[Sequence[int], Sequence[int]] = ((), ()),
    out_dtype: torch.dtype | None = None,
) -> ir.Value:
    """compiler.ir's `dot_general` with the result dtype spelled as a torch dtype: result
    dims are the batch dims, then lhs's free dims, then rhs's free dims. Both operands
    must share a dtype."""
    element = element_type(out_dtype) if out_dtype is not None else None
    return ir_builders.dot_general(lhs, rhs, contract=contract, batch=batch, element=element)


def _scale(value: ir.Value, factor) -> ir.Value:
    if factor == 1:
        return value
    return stablehlo.MulOp(value, full(factor, dtype(value), shape_of(value))).result


def _add_scaled(ctx: LoweringContext, self: ir.Value, product: ir.Value, beta, alpha) -> ir.Value:
    """beta * self + alpha * product in the opmath dtype, rounded to the result dtype once,
    as the CPU and CUDA kernels' GEMM epilogues do (a bf16 addmm rounding the product first
    and then the sum differs from theirs by an ulp where the two roundings compound).
    PyTorch: with beta == 0, `self` is ignored, so its NaNs and infs do not propagate."""
    out = ctx.result_dtype()
    compute = opmath_dtype(out)
    product = _scale(convert(product, compute), alpha)
    if beta != 0:
        self = broadcast_to(convert(self, compute), shape_of(product))
        product = stablehlo.AddOp(_scale(self, beta), product).result
    return convert(product, out)


def _opmath_product(ctx: LoweringContext) -> torch.dtype:
    """The dtype a product that feeds `_add_scaled` is accumulated and returned in: the
    result's opmath dtype (float32 for 16-bit floats: the matrix unit's accumulator)."""
    return opmath_dtype(ctx.result_dtype())


# -- rules ---------------------------------------------------------------------------------------
@lowers(aten.mm.default)
def _mm(ctx: LoweringContext, a, b):
    return dot_general(a, b, ([1], [0]), out_dtype=ctx.result_dtype())


@lowers(aten.bmm.default)
def _bmm(ctx: LoweringContext, a, b):
    return dot_general(a, b, ([2], [1]), ([0], [0]), out_dtype=ctx.result_dtype())


@lowers(aten.mm.dtype)
def _mm_dtype(ctx: LoweringContext, a, b, out_dtype):
    return dot_general(a, b, ([1], [0]), out_dtype=out_dtype)


@lowers(aten.bmm.dtype)
def _bmm_dtype(ctx: LoweringContext, a, b, out_dtype):
    return dot_general(a, b, ([2], [1]), ([0], [0]), out_dtype=out_dtype)


@lowers(aten.addmm.default)
def _addmm(ctx: LoweringContext, self, mat1, mat2, *, beta=1, alpha=1):
    product = dot_general(mat1, mat2, ([1], [0]), out_dtype=_opmath_product(ctx))
    return _add_scaled(ctx, self, product, beta, alpha)


@lowers(aten.addmm.dtype)
def _addmm_dtype(ctx: LoweringContext, self, mat1, mat2, out_dtype, *, beta=1, alpha=1):
    return _add_scaled(ctx, self, dot_general(mat1, mat2, ([1], [0]), out_dtype=out_dtype), beta, alpha)


@lowers(aten.baddbmm.default)
def _baddbmm(ctx: LoweringContext, self, batch1, batch2, *, beta=1, alpha=1):
    product = dot_general(batch1, batch2, ([2], [1]), ([0], [0]), out_dtype=_opmath_product(ctx))
    return _add_scaled(ctx, self, product, beta, alpha)


@lowers(aten.baddbmm.dtype)
def _baddbmm_dtype(ctx: LoweringContext, self, batch1, batch2, out_dtype, *, beta=1, alpha=1):
    product = dot_general(batch1, batch2, ([2], [1]), ([0], [0]), out_dtype=out_dtype)
    return _add_scaled(ctx, self, product, beta, alpha)


@lowers(aten.addbmm.default)
def _addbmm(ctx: LoweringContext, self, batch1, batch2, *, beta=1, alpha=1):
    # sum_b batch1[b] @ batch2[b]: contract the batch dim together with the inner one.
    product = dot_general(batch1, batch2, ([0, 2], [0, 1]), out_dtype=_opmath_product(ctx))
    return _add_scaled(ctx, self, product, beta, alpha)


@lowers(aten.mv.default)
def _mv(ctx: LoweringContext, mat, vec):
    return dot_general(mat, vec, ([1], [0]), out_dtype=ctx.result_dtype())


@lowers(aten.addmv.default)
def _addmv(ctx: LoweringContext, self, mat, vec, *, beta=1, alpha=1):
    product = dot_general(mat, vec, ([1], [0]), out_dtype=_opmath_product(ctx))
    return _add_scaled(ctx, self, product, beta, alpha)


@lowers(aten.dot.default)
def _dot(ctx: LoweringContext, a, b):
    return dot_general(a, b, ([0], [0]), out_dtype=ctx.result_dtype())


@lowers(aten.vdot.default)
def _vdot(ctx: LoweringContext, a, b):
    if dtype(a).is_complex:
        # conj(a) . b
        real = stablehlo.RealOp(a).result
        imag = stablehlo.NegOp(stablehlo.ImagOp(a).result).result
        a = stablehlo.ComplexOp(real, imag).result
    return dot_general(a, b, ([0], [0]), out_dtype=ctx.result_dtype())


@lowers(aten._int_mm.default)
def _int_mm(ctx: LoweringContext, a, b):
    # int8 x int8 -> int32, accumulated in int32 (exact).
    out = ctx.result_dtype()
    return dot_general(convert(a, out), convert(b, out), ([1], [0]), out_dtype=out)


@lowers(aten._addmm_activation.default)
def _addmm_activation(ctx: LoweringContext, self, mat1, mat2, *, beta=1, alpha=1, use_gelu=False):
    """addmm followed by relu, or by the exact (erf) GELU, as the CPU kernel applies it: to
    addmm's rounded result, GELU computed in the opmath dtype and rounded once."""
    y = _addmm(ctx, self, mat1, mat2, beta=beta, alpha=alpha)
    shape, out = shape_of(y), dtype(y)
    if not use_gelu:
        return stablehlo.MaxOp(y, full(0, out, shape)).result
    x = convert(y, opmath_dtype(out))
    dt = dtype(x)
    # 0.5 * x * (1 + erf(x / sqrt(2)))
    erf = chlo.ErfOp(stablehlo.MulOp(x, full(math.sqrt(0.5), dt, shape)).result).result
    one_plus = stablehlo.AddOp(erf, full(1, dt, shape)).result
    return convert(stablehlo.MulOp(stablehlo.MulOp(x, full(0.5, dt, shape)).result, one_plus).result, out)


# -- _trilinear (F.bilinear) -------------------------------------------------------------------------
class _Labeled:
    """A value whose dims carry labels (positions in _trilinear's common rank)."""

    def __init__(self, value: ir.Value, labels: list[int]):
        self.value, self.labels = value, labels

    def size(self, label: int) -> int:
        return shape_of(self.value)[self.labels.index(label)]

    def sum_out(self, labels: set[int]) -> _Labeled:
        dims = [i for i, lab in enumerate(self.labels) if lab in labels]
        if not dims:
            return self
        dt = dtype(self.value)
        (out,) = reduce([self.value], [full(0, dt, [])], dims, lambda a, b: [stablehlo.AddOp(a[0], b[0]).result])
        return _Labeled(out, [lab for lab in self.labels if lab not in labels])


def _contract_pair(a: _Labeled, b: _Labeled, summed: set[int], needed_later: set[int]) -> _Labeled:
    """a * b (broadcast over shared labels), summing the labels in `summed` that no later
    operand needs: shared ones are contracted by dot_general, private ones summed first."""
    shared = set(a.labels) & set(b.labels)
    drop = summed - needed_later
    a = a.sum_out((drop & set(a.labels)) - shared)
    b = b.sum_out((drop & set(b.labels)) - shared)
    contract = [lab for lab in a.labels if lab in shared and lab in drop]
    batch = [lab for lab in a.labels if lab in shared and lab not in drop]
    value = dot_general(
        a.value, b.value,
        ([a.labels.index(lab) for lab in contract], [b.labels.index(lab) for lab in contract]),
        ([a.labels.index(lab) for lab in batch], [b.labels.index(lab) for lab in batch]),
    )
    free_a = [lab for lab in a.labels if lab not in shared]
    free_b = [lab for lab in b.labels if lab not in shared]
    return _Labeled(value, batch + free_a + free_b)


@lowers(aten._trilinear.default)
def _trilinear(ctx: LoweringContext, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """sum over `sumdim` of i1 * i2 * i3, each unsqueezed at its `expand` dims, as two
    dot_generals. Size-1 dims are dropped first (they broadcast), so shared labels
    always have equal sizes."""
    out_dtype = ctx.result_dtype()
    # A dim every operand is unsqueezed at has size 0 in ATen's result (not 1): the
    # result is empty, or all zeros where that dim is summed; so is a result that a
    # zero-size operand dim makes empty.
    everywhere = set(expand1) & set(expand2) & set(expand3)
    if everywhere or 0 in ctx.result_shape():
        return full(0, out_dtype, ctx.result_shape())
    operands = []
    for value, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        value = convert(value, out_dtype)
        rank = len(shape_of(value)) + len(expand)
        labels = [d for d in range(rank) if d not in set(expand)]
        keep = [i for i, s in enumerate(shape_of(value)) if s != 1]
        value = reshape(value, [shape_of(value)[i] for i in keep])
        operands.append(_Labeled(value, [labels[i] for i in keep]))
    summed = set(sumdim)
    first = _contract_pair(operands[0], operands[1], summed, set(operands[2].labels))
    result = _contract_pair(first, operands[2], summed, set())
    result = result.sum_out(summed)
    order = sorted(range(len(result.labels)), key=lambda i: result.labels[i])
    value = stablehlo.TransposeOp(result.value, order).result if order != list(range(len(order))) else result.value
    return reshape(value, ctx.result_shape())


# Bounded dynamism: XLA's dynamic padder masks dot contractions over a dynamic dim; other
# dims are per position. (_trilinear expands and sums in one rule: not trusted.)
declare_padding(Padding.EAGER, aten._trilinear.default)
declare_padding(Padding.MASKED, family="linear")
