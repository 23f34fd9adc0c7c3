"""Symbolic sizes at lowering time (bounded dynamism, docs/explanation/bounded-dynamism.md).

A graph traced with symbolic sizes is lowered *at its bounds*: every tensor is laid out
at the bound of each dynamic dimension (the padded layout) and rules see static shapes,
so they need no change. The logical size travels next to the data: the importer marks
dynamic dimensions with `stablehlo.set_dimension_size`, which XLA's dynamic padder reads
to mask reductions, dot contractions and other ops that would see the padding.

A `SymSize` is what a rule receives where PyTorch passed a `SymInt` (a view's shape, an
`arange` end, a scalar operand): an `int` equal to the bound — so shape arithmetic in
rules gives bound shapes — that also carries the size's run-time value (`value`, a 0-d
i64 tensor), used by `helpers.coerce`/`helpers.full` when the size is a *value* (a mean's
divisor, `x * seq_len`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ..context import ir, stablehlo

# True while the importer lowers a graph with symbolic sizes (see `static_layout`).
_DYNAMIC_IMPORT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchtpu_dynamic_import", default=False
)


@contextlib.contextmanager
def dynamic_import() -> Iterator[None]:
    token = _DYNAMIC_IMPORT.set(True)
    try:
        yield
    finally:
        _DYNAMIC_IMPORT.reset(token)


def static_layout(value: ir.Value) -> ir.Value:
    """Inside a rule of a dynamic import: `value` with every dim made static at its full
    (padded) extent, so XLA's dynamic padder treats a following reshape as the plain
    reshape of the padded buffer the rule computes with, instead of moving the padding.
    (The importer re-attaches the logical sizes to the rule's result.)

    `set_dimension_size` to a constant full extent makes a dim static for XLA; on a
    static-typed operand MLIR folds that away, so it goes through a bounded `?` type and
    back."""
    if not _DYNAMIC_IMPORT.get():
        return value
    t = ir.RankedTensorType(value.type)
    i32 = ir.RankedTensorType.get([], ir.IntegerType.get_signless(32))
    static_type = value.type
    for d, extent in enumerate(t.shape):
        if extent <= 1 or t.is_dynamic_dim(d):
            continue
        attr = ir.DenseElementsAttr.get_splat(i32, ir.IntegerAttr.get(i32.element_type, extent))
        size = stablehlo.ConstantOp(attr).result
        shape = list(t.shape)
        shape[d] = ir.ShapedType.get_dynamic_size()
        bounds = ", ".join(str(extent) if i == d else "?" for i in range(t.rank))
        bounded = ir.RankedTensorType.get(
            shape, t.element_type, ir.Attribute.parse(f"#stablehlo.bounds<{bounds}>")
        )
        value = stablehlo.SetDimensionSizeOp(value, size, d, results=[bounded]).result
        value = stablehlo.SetDimensionSizeOp(value, size, d, results=[static_type]).result
    return value


class SymSize(int):
    """An int equal to a symbolic size's bound, carrying its run-time value."""

    value: ir.Value
    expr: object  # the sympy expression PyTorch recorded

    def __new__(cls, bound: int, value: ir.Value, expr: object) -> SymSize:
        obj = super().__new__(cls, int(bound))
        obj.value = value
        obj.expr = expr
        return obj

    def __repr__(self) -> str:
        return f"SymSize({self.expr} <= {int(self)})"
