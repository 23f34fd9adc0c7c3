"""Grouped matrix multiplication (`aten._grouped_mm`, `torch.nn.functional.grouped_mm`):
the GEMMs of a mixture-of-experts layer, one per group (expert), with the groups of a 2D
operand delimited at run time by `offs` (group g spans `[offs[g-1], offs[g])`, group 0
starts at 0).

Layouts (PyTorch's meta and CPU kernels):

| mat_a | mat_b | offs slice | result |
|---|---|---|---|
| (M, K) | (G, K, N) | rows of mat_a | (M, N): row m uses mat_b[group(m)] |
| (G, M, K) | (K, N) | columns of mat_b | (M, N): column n uses mat_a[group(n)] |
| (M, K) | (K, N) | the contraction K | (G, M, N): out[g] = mat_a[:, K_g] @ mat_b[K_g, :] |
| (G, M, K) | (G, K, N) | none | (G, M, N): a batched matmul |

The offsets are run-time values, so the groups cannot become static slices. Each rule
computes every group's product densely and keeps, per position, the product of the group
that position belongs to (a select, never a multiply by a 0/1 mask: an inf in another
group's product must not become a NaN here). Positions past `offs[-1]` belong to no
group: PyTorch leaves them uninitialised, we give zeros. Products accumulate in float32
and round once to the result dtype, as PyTorch's CPU kernel does for bfloat16.

Padding class MASKED: a padded (bounded-dynamic) token dimension lies past `offs[-1]`,
so its positions are in no group, and a dynamic contraction is masked by XLA.
"""

from __future__ import annotations

import torch

from ..context import ir, stablehlo
from .helpers import broadcast_to, compare, convert, dtype, full, iota, reduce, reshape, select, shape_of
from .linear import dot_general
from .registry import LoweringContext, Padding, lowers, metadata_rule

aten = torch.ops.aten


def _group_membership(offs: ir.Value, length: int) -> ir.Value:
    """(G, length) i1: position p along the sliced dimension is in group g, that is
    `offs[g-1] <= p < offs[g]` (with `offs[-1]` of group 0 read as 0)."""
    groups = shape_of(offs)[0]
    offs = convert(offs, torch.int64)
    ends = broadcast_to(reshape(offs, [groups, 1]), [groups, length])
    # The start of group g is the end of group g-1: offs shifted right by one, 0 first.
    zero = full(0, torch.int64, [1])
    starts = stablehlo.ConcatenateOp([zero, _leading(offs, groups - 1)], 0).result if groups > 1 else zero
    starts = broadcast_to(reshape(starts, [groups, 1]), [groups, length])
    position = iota([groups, length], 1, torch.int64)
    after_start = compare(position, starts, "GE")
    before_end = compare(position, ends, "LT")
    return stablehlo.AndOp(after_start, before_end).result


def _leading(vector: ir.Value, count: int) -> ir.Value:
    return stablehlo.SliceOp(vector, [0], [count], [1]).result


def _sum_over(value: ir.Value, dim: int) -> ir.Value:
    def add(acc, new):
        return [stablehlo.AddOp(acc[0], new[0]).result]

    return reduce([value], [full(0, dtype(value), [])], [dim], add)[0]


def _accumulation_dtype(result: torch.dtype) -> torch.dtype:
    return torch.float32 if result in (torch.bfloat16, torch.float16) else result


def _keep_own_group(products: ir.Value, membership: ir.Value, group_dim: int) -> ir.Value:
    """`products` with a group dim at `group_dim`: per position, the product of the group
    the position is in (zero where it is in none), the group dim summed away."""
    zero = full(0, dtype(products), shape_of(products))
    return _sum_over(select(broadcast_to(membership, shape_of(products)), products, zero), group_dim)


def _rows_grouped(a: ir.Value, b: ir.Value, offs: ir.Value, acc: torch.dtype) -> ir.Value:
    """(M, K) x (G, K, N) -> (M, N)."""
    (m, _), (groups, _, n) = shape_of(a), shape_of(b)
    products = dot_general(a, b, ([1], [1]), out_dtype=acc)  # (M, G, N)
    membership = reshape(stablehlo.TransposeOp(_group_membership(offs, m), [1, 0]).result, [m, groups, 1])
    return _keep_own_group(products, broadcast_to(membership, [m, groups, n]), 1)


def _columns_grouped(a: ir.Value, b: ir.Value, offs: ir.Value, acc: torch.dtype) -> ir.Value:
    """(G, M, K) x (K, N) -> (M, N)."""
    (groups, m, _), (_, n) = shape_of(a), shape_of(b)
    products = dot_general(a, b, ([2], [0]), out_dtype=acc)  # (G, M, N)
    membership = reshape(_group_membership(offs, n), [groups, 1, n])
    return _keep_own_group(products, broadcast_to(membership, [groups, m, n]), 0)


def _contraction_grouped(a: ir.Value, b: ir.Value, offs: ir.Value, acc: torch.dtype) -> ir.Value:
    """(M, K) x (K, N) -> (G, M, N): each group's slice of K contracted on its own."""
    (m, k), groups = shape_of(a), shape_of(offs)[0]
    membership = broadcast_to(reshape(_group_membership(offs, k), [groups, 1, k]), [groups, m, k])
    a_by_group = broadcast_to(reshape(a, [1, m, k]), [groups, m, k])
    masked = select(membership, a_by_group, full(0, dtype(a), [groups, m, k]))
    return dot_general(masked, b, ([2], [0]), out_dtype=acc)


@lowers(aten._grouped_mm.default, dynamic=Padding.MASKED)
def _grouped_mm(ctx: LoweringContext, a, b, offs=None, bias=None, out_dtype=None):
    if dtype(a) != dtype(b):
        raise ctx.fail(f"grouped_mm operands must share a dtype, found {dtype(a)} and {dtype(b)}")
    result = ctx.result_dtype()
    acc = _accumulation_dtype(result)
    rank_a, rank_b = len(shape_of(a)), len(shape_of(b))
    if rank_a == 3 and rank_b == 3:
        if offs is not None:
            raise ctx.fail("grouped_mm of two 3D operands takes no offs (PyTorch rejects them)")
        out = dot_general(a, b, ([2], [1]), ([0], [0]), out_dtype=acc)
    elif offs is None:
        raise ctx.fail("grouped_mm with a 2D operand needs offs (the end of each group)")
    elif rank_a == 2 and rank_b == 3:
        out = _rows_grouped(a, b, offs, acc)
    elif rank_a == 3 and rank_b == 2:
        out = _columns_grouped(a, b, offs, acc)
    elif rank_a == 2 and rank_b == 2:
        out = _contraction_grouped(a, b, offs, acc)
    else:
        raise ctx.fail(f"grouped_mm takes 2D or 3D operands, found ranks {rank_a} and {rank_b}")
    if bias is not None:
        raise ctx.fail("grouped_mm with a bias is not supported (PyTorch's kernels reject it too)")
    return convert(out, result)


@metadata_rule(aten._grouped_mm.default, tracing=True)
def grouped_mm_metadata(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The result of `_grouped_mm` on meta tensors, for every floating dtype the CPU kernel
    and this lowering take (PyTorch's meta kernel rejects all but bfloat16): PyTorch's
    checks with the 16-byte stride alignment counted in the operands' own element size,
    then PyTorch's output rule."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    # The dtypes PyTorch's CPU kernel takes (its messages): float64 and a different
    # out_dtype are errors there, so they are here.
    torch._check(mat_a.dtype in (torch.float32, torch.bfloat16, torch.float16),
                 lambda: f"Expected mat_a to be Float32, BFloat16 or Float16 matrix, got {mat_a.dtype}")
    torch._check(mat_a.dtype == mat_b.dtype,
                 lambda: f"grouped_mm operands must share a dtype, got {mat_a.dtype} and {mat_b.dtype}")
    torch._check(out_dtype is None or out_dtype == mat_a.dtype,
                 lambda: "Grouped gemm output dtype must match mat_a dtype")
    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} and mat_b.dim()={mat_b.dim()}")
    if mat_a.dim() == 3 or mat_b.dim() == 3:
        torch._check(mat_a.size(-1) == mat_b.size(-2), lambda: "contraction dimension of mat_a and mat_b must match")
    for name, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
        alignment = 16 // mat.element_size()
        rows, cols = mat.stride()[-2:]
        if rows == 1 and cols >= max(1, mat.shape[-2]):
            torch._check(cols % alignment == 0, lambda: f"{name}: strides should be multiple of 16 bytes")
        elif cols == 1 and rows >= max(1, mat.shape[-1]):
            torch._check(rows % alignment == 0, lambda: f"{name}: strides should be multiple of 16 bytes")
        else:
            torch._check(False, lambda: f"Invalid strides/sizes, got {mat.stride()} for strides and {mat.shape} for sizes.")
    if mat_a.dim() == 2 or mat_b.dim() == 2:
        torch._check(offs is not None and offs.dim() == 1 and offs.dtype == torch.int32,
                     lambda: "grouped_mm with a 2D operand needs 1D int32 offsets")
    else:
        torch._check(offs is None, lambda: "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts.")
    torch._check(bias is None, lambda: "Bias tensor provided, but it is not supported yet.")
    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)
