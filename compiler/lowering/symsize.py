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

from ..context import ir


class SymSize(int):
    """An int equal to a symbolic size's bound, carrying its run-time value."""

    value: ir.Value
    expr: object  # the sympy expression PyTorch recorded

    def __new__(cls, bound: int, value: ir.Value, expr: object) -> "SymSize":
        obj = super().__new__(cls, int(bound))
        obj.value = value
        obj.expr = expr
        return obj

    def __repr__(self) -> str:
        return f"SymSize({self.expr} <= {int(self)})"
