"""torchtpu-annotate-bounds: every dynamic dimension gets a `#stablehlo.bounds`."""

from __future__ import annotations

from ..context import ir
from .base import Pass, register_pass
from .bounds_util import (
    BOUNDS_ATTR,
    arg_attr_dicts,
    dim_bound,
    entry_functions,
    ranked,
    set_attr_dicts,
    unbounded_dims,
    update_function_type,
    with_bounds,
)

# Ops whose result has the shape of their (same-rank) tensor operands: a dynamic result
# dim takes the bound of the operands' dim.
_SAME_SHAPE_OPS = frozenset(
    "stablehlo." + name
    for name in [
        "abs",
        "add",
        "and",
        "atan2",
        "cbrt",
        "ceil",
        "clamp",
        "compare",
        "complex",
        "convert",
        "cosine",
        "count_leading_zeros",
        "divide",
        "exponential",
        "exponential_minus_one",
        "floor",
        "imag",
        "is_finite",
        "log",
        "log_plus_one",
        "logistic",
        "maximum",
        "minimum",
        "multiply",
        "negate",
        "not",
        "or",
        "popcnt",
        "power",
        "real",
        "reduce_precision",
        "remainder",
        "round_nearest_afz",
        "round_nearest_even",
        "rsqrt",
        "select",
        "shift_left",
        "shift_right_arithmetic",
        "shift_right_logical",
        "sign",
        "sine",
        "sqrt",
        "subtract",
        "tan",
        "tanh",
        "xor",
        "optimization_barrier",
    ]
)


@register_pass
class AnnotateBoundsPass(Pass):
    argument = "torchtpu-annotate-bounds"
    summary = (
        "Give every dynamic dimension a #stablehlo.bounds, from torchtpu.bounds argument attributes"
    )
    description = (
        "Bounded dynamism (docs/explanation/bounded-dynamism.md). A function argument "
        "`tensor<?x...>` with the argument attribute `torchtpu.bounds = array<i64: ...>` "
        "(the bound of each dim; -1 for static dims) gets the type "
        "`tensor<?x..., #stablehlo.bounds<...>>` and the attribute is removed. Bounds then "
        "flow forward through the function: `stablehlo.set_dimension_size` takes the "
        "operand's size (or bound) at the dim it sets, shape-preserving elementwise ops take "
        "their operands' bounds, and the function's result types follow its return. A "
        "dynamic dimension whose bound cannot be derived is an error at the op that makes "
        "it; a `torchtpu.bounds` that does not fit its argument's type is an error too."
    )
    follows_calls = False

    def run(self, op: ir.Operation) -> None:
        for fn in entry_functions(op):
            if len(fn.regions[0].blocks) == 0:
                continue
            if self._annotate_arguments(fn):
                self._propagate(fn)
                update_function_type(fn)

    # -- arguments ----------------------------------------------------------------------------
    def _annotate_arguments(self, fn: ir.Operation) -> bool:
        block = fn.regions[0].blocks[0]
        attrs = arg_attr_dicts(fn)
        ok = True
        for index, arg in enumerate(block.arguments):
            t = ranked(arg.type)
            attr = attrs[index].get(BOUNDS_ATTR)
            if t is None:
                if attr is not None:
                    self.error(
                        fn,
                        f"argument #{index}: {BOUNDS_ATTR} needs a ranked tensor argument, got {arg.type}",
                    )
                    ok = False
                continue
            if attr is None:
                continue
            try:
                bounds = list(ir.DenseI64ArrayAttr(attr))
            except ValueError:
                self.error(
                    fn,
                    f"argument #{index}: {BOUNDS_ATTR} must be an array<i64: ...> (one bound per dim), got {attr}",
                )
                ok = False
                continue
            if len(bounds) != t.rank:
                self.error(
                    fn,
                    f"argument #{index}: {BOUNDS_ATTR} has {len(bounds)} entries for a rank-{t.rank} tensor {t}",
                )
                ok = False
                continue
            for d in range(t.rank):
                if t.is_dynamic_dim(d) and bounds[d] < 0:
                    self.error(
                        fn,
                        f"argument #{index}: dynamic dim {d} of {t} has no bound in {BOUNDS_ATTR} (got {bounds[d]}); give a positive bound",
                    )
                    ok = False
                elif not t.is_dynamic_dim(d) and bounds[d] not in (-1, t.shape[d]):
                    self.error(
                        fn,
                        f"argument #{index}: static dim {d} of {t} has size {t.shape[d]} but {BOUNDS_ATTR} says {bounds[d]}; use -1 for static dims",
                    )
                    ok = False
            if not ok:
                continue
            arg.set_type(with_bounds(t, [b if b >= 0 else None for b in bounds]))
            del attrs[index][BOUNDS_ATTR]
        set_attr_dicts(fn, "arg_attrs", attrs)
        for index, arg in enumerate(block.arguments):
            t = ranked(arg.type)
            if ok and t is not None and unbounded_dims(t):
                self.error(
                    fn,
                    f"argument #{index} of type {t} has dynamic dims {unbounded_dims(t)} without a bound; "
                    f"give it a {BOUNDS_ATTR} argument attribute",
                )
                ok = False
        return ok

    # -- forward propagation ----------------------------------------------------------------
    def _propagate(self, fn: ir.Operation) -> None:
        def visit(inner: ir.Operation) -> ir.WalkResult:
            inner = inner.operation
            if inner.name == "func.func":
                return ir.WalkResult.ADVANCE
            for index, result in enumerate(inner.results):
                t = ranked(result.type)
                if t is None or not unbounded_dims(t):
                    continue
                bounds = self._derive(inner, t)
                missing = [d for d in range(t.rank) if t.is_dynamic_dim(d) and bounds[d] is None]
                if missing:
                    self.error(
                        inner,
                        f"cannot derive a bound for dynamic dim(s) {missing} of result #{index} ({t}) "
                        f"of '{inner.name}'; bounds flow from {BOUNDS_ATTR} argument attributes "
                        "through set_dimension_size and elementwise ops: make this dim static or "
                        "derive it from a bounded one",
                    )
                    return ir.WalkResult.INTERRUPT
                result.set_type(with_bounds(t, bounds))
            return ir.WalkResult.ADVANCE

        fn.walk(visit)

    @staticmethod
    def _derive(op: ir.Operation, t: ir.RankedTensorType) -> list[int | None]:
        bounds: list[int | None] = [
            dim_bound(t, d) if not t.is_dynamic_dim(d) else None for d in range(t.rank)
        ]
        if op.name == "stablehlo.set_dimension_size":
            operand = ranked(op.operands[0].type)
            if operand is not None and operand.rank == t.rank:
                return [
                    dim_bound(operand, d) if t.is_dynamic_dim(d) else bounds[d]
                    for d in range(t.rank)
                ]
            return bounds
        if op.name in _SAME_SHAPE_OPS:
            for value in op.operands:
                operand = ranked(value.type)
                if operand is None or operand.rank != t.rank:
                    continue
                for d in range(t.rank):
                    if t.is_dynamic_dim(d) and bounds[d] is None:
                        bounds[d] = dim_bound(operand, d)
        return bounds
