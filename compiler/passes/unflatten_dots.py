"""torchtpu-unflatten-dots: matrix products on the operands PyTorch flattened for them.

PyTorch computes `nn.Linear` on a (batch, seq, features) input as a 2-D `mm` of the input
flattened to (batch * seq, features), and its weight gradient as `grad.t() @ input` over
the same flattened rows. In StableHLO that is `reshape` (merging the leading dims) feeding a
2-D `dot_general`. Merging two dims requires them to be adjacent in memory, so XLA must give
every tensor that reaches such a product the row-major order of its leading dims -- and
where a tensor also feeds a product that prefers another layout (attention's gradients in
(batch, heads, seq, dim) order feed both the weight gradient and the input gradient), it
copies it. The same model written with `dot_general` over the unmerged dims (what JAX's
`x @ w.T` on a 3-D `x` is) has no such copies: on a TPU v5e, a 2-layer Llama training step
written in JAX with PyTorch's flattening gains the 16 layout copies of attention tensors and
2 of weights that ours had, and ours loses them with this pass
(docs/explanation/performance.md, twelfth session).

The pass rewrites a 2-D `dot_general` (no batching dims, one contracting dim) whose operand
is `reshape(x)` -- or `transpose(reshape(x), [1, 0])` -- of an `x` of rank >= 3 whose
leading dims the reshape merged:

* a merged *contracting* dim: the product contracts over those leading dims of `x` instead
  (the other operand is reshaped to the same leading dims when it is not an unflattening
  of them already: splitting a row-major dim is free);
* a merged *free* dim: the product keeps those dims, and a reshape gives the old 2-D result
  to its users.

The arithmetic is the same sum of the same products. Operands that reach the product any
other way, dynamic shapes and batched products are left as they are.
"""

from __future__ import annotations

import math

from ..context import ir, stablehlo
from ..ir import dot_general, element_type_of, reshape, shape_of, transpose
from .base import Pass, defining_op, operation_of, ops_named, register_pass


class _Unflattened:
    """A 2-D dot operand seen as `source` (rank >= 3, static): `merged` is the operand dim
    that is `source`'s leading dims merged (`lead`), the operand's other dim is `source`'s
    last dim."""

    def __init__(self, source: ir.Value, lead: list[int], merged: int, via: list[ir.Operation]) -> None:
        self.source, self.lead, self.merged, self.via = source, lead, merged, via


def _defining(value: ir.Value, name: str) -> ir.Operation | None:
    op = defining_op(value)
    return op if op is not None and op.name == name else None


def _static(value: ir.Value) -> bool:
    try:
        return ir.RankedTensorType(value.type).has_static_shape
    except ValueError:  # (not a ranked tensor)
        return False


def _unflattened(operand: ir.Value) -> _Unflattened | None:
    """`operand` as an unflattening, when it is `reshape(x)` merging `x`'s leading dims into
    dim 0, or that reshape transposed (merged dim 1)."""
    via: list[ir.Operation] = []
    merged = 0
    value = operand
    permute = _defining(value, "stablehlo.transpose")
    if permute is not None:
        if list(ir.DenseI64ArrayAttr(permute.attributes["permutation"])) != [1, 0]:
            return None
        via.append(permute)
        value = permute.operands[0]
        merged = 1
    flatten = _defining(value, "stablehlo.reshape")
    if flatten is None:
        return None
    source = flatten.operands[0]
    if not (_static(source) and _static(value)):
        return None
    source_shape, flat_shape = shape_of(source), shape_of(value)
    if len(source_shape) < 3 or len(flat_shape) != 2 or source_shape[-1] != flat_shape[1]:
        return None
    if math.prod(source_shape[:-1]) != flat_shape[0] or 0 in source_shape:
        return None
    via.append(flatten)
    return _Unflattened(source, list(source_shape[:-1]), merged, via)


def _split_contracting(operand: ir.Value, contracting: int, lead: list[int]) -> ir.Value:
    """A 2-D `operand` as (*lead, its other dim), `lead` splitting its `contracting` dim
    row-major."""
    rows = operand if contracting == 0 else transpose(operand, [1, 0])
    return reshape(rows, [*lead, shape_of(rows)[1]])


@register_pass
class UnflattenDotsPass(Pass):
    argument = "torchtpu-unflatten-dots"
    summary = "Contract over (or keep) the dims a reshape merged before a 2-D dot_general"
    description = (
        "PyTorch flattens (batch, seq, features) to (batch * seq, features) around `mm`: "
        "`nn.Linear`'s product and its weight gradient `grad.t() @ input`. A 2-D "
        "`stablehlo.dot_general` (no batching dims, one contracting dim) whose operand is "
        "`reshape` -- or `transpose(reshape, [1, 0])` -- merging the leading dims of a tensor "
        "of rank >= 3 is rewritten over the unmerged tensor: a merged contracting dim becomes "
        "one contracting dim per leading dim (the other operand split to match: a row-major "
        "reshape, after a transpose when it contracts its dim 1), a merged free dim stays "
        "split in the product and a `reshape` gives the 2-D result to its users. The sum is "
        "the same; what goes is the constraint that the merged dims be adjacent in memory, "
        "which makes XLA copy tensors that other products want in another layout "
        "(attention's gradients on a TPU). Dynamic shapes and batched products are left "
        "alone; the flattening ops are erased when nothing else reads them."
    )

    def run(self, op: ir.Operation) -> None:
        for dot in ops_named(op, "stablehlo.dot_general"):
            _rewrite(dot)


def _rewrite(dot: ir.Operation) -> None:
    numbers = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    if list(numbers.lhs_batching_dimensions) or list(numbers.rhs_batching_dimensions):
        return
    lc, rc = list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)
    lhs, rhs = dot.operands[0], dot.operands[1]
    if len(lc) != 1 or len(rc) != 1 or not (_static(lhs) and _static(rhs) and _static(dot.result)):
        return
    if len(shape_of(lhs)) != 2 or len(shape_of(rhs)) != 2:
        return
    lc, rc = lc[0], rc[0]
    left, right = _unflattened(lhs), _unflattened(rhs)
    if left is None and right is None:
        return
    with ir.InsertionPoint(dot), dot.location:
        new_lhs, new_rhs, contract, unflattenings = _unmerged_operands(lhs, rhs, lc, rc, left, right)
        product = dot_general(new_lhs, new_rhs, contract=contract, element=element_type_of(dot.result))
        for name in _attribute_names(dot):  # precision, algorithm, markers such as torchtpu.fixed_precision
            if name != "dot_dimension_numbers":
                product.owner.attributes[name] = dot.attributes[name]
        result = reshape(product, shape_of(dot.result))  # (itself when no free dim was split)
    dot.result.replace_all_uses_with(result)
    dot.erase()
    if result is not product:
        _fold_reshapes_back(result, product)
    # Each flattening op once (both operands may read the same one: x.t() @ x), listed while
    # all are alive (an erased op can no longer be compared or asked for its uses); erased
    # in rounds, so an op goes once the one reading it went.
    alive: list[ir.Operation] = []
    for op in (op for unflattening in unflattenings for op in unflattening.via):
        if op not in alive:
            alive.append(op)
    while dead := [i for i, op in enumerate(alive) if _unused(op)]:
        for i in dead:
            alive[i].erase()
        alive = [op for i, op in enumerate(alive) if i not in dead]


def _unmerged_operands(lhs, rhs, lc: int, rc: int, left: _Unflattened | None, right: _Unflattened | None):
    """(lhs, rhs, contracting dims, unflattenings used) of the product over the unmerged
    operands; at least one of `left`, `right` is an unflattening. Builds at the caller's
    insertion point."""
    if left is not None and left.merged == lc:
        # The rows both operands contract: the other side split the same way.
        k = list(range(len(left.lead)))
        if right is not None and right.merged == rc and right.lead == left.lead:
            return left.source, right.source, (k, k), (left, right)
        return left.source, _split_contracting(rhs, rc, left.lead), (k, k), (left,)
    if right is not None and right.merged == rc:
        k = list(range(len(right.lead)))
        return _split_contracting(lhs, lc, right.lead), right.source, (k, k), (right,)
    if left is not None:  # the lhs's free dim is merged rows: kept apart in the product
        return left.source, rhs, ([len(left.lead)], [rc]), (left,)
    return lhs, right.source, ([lc], [len(right.lead)]), (right,)


def _fold_reshapes_back(result: ir.Value, product: ir.Value) -> None:
    """Readers of the 2-D `result` that reshape it back to the product's shape (the
    `_unsafe_view` after PyTorch's `mm`) read the product itself."""
    for use in list(result.uses):
        reader = operation_of(use.owner)
        if reader.name == "stablehlo.reshape" and reader.result.type == product.type:
            reader.result.replace_all_uses_with(product)
            reader.erase()
    flatten = defining_op(result)
    if _unused(flatten):
        flatten.erase()


def _attribute_names(op: ir.Operation) -> list[str]:
    return [a if isinstance(a, str) else a.name for a in op.attributes]


def _unused(op: ir.Operation) -> bool:
    return all(False for _ in op.result.uses)
