"""What dynamic rules share (bounded dynamism, docs/explanation/bounded-dynamism.md): the
symbolic metadata of a node's arguments, run-time sizes as values, and the rule factories
used at the registrations of the family modules (`lowers(..., dynamic=Padding.X,
dynamic_rule=...)`).

XLA's dynamic padder masks what reads padding through reductions, dot contractions and
concatenation (class `masked`). It cannot fix what a rule computed from a *static* size:
a mean's divisor, a reshape that interleaves padding with data, a flattened index. A
dynamic rule runs when an operand or the result has a dynamic dim: it lowers the op for
the padded layout, returns `NotImplemented` when the ordinary rule is right for this node
(the dynamic dims are not the ones it works along), or raises `ctx.dynamic_limit(...)` so
the node runs in PyTorch eager rather than computing a wrong result.

A rule gets the graph's bounded-dynamism facts as `ctx.dynamic` (`registry.DynamicSizes`)
and the node's symbolic metadata through it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import sympy
import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import broadcast_to, normalize_dims, shape_of
from .registry import LoweringContext

Rule = Callable[..., Any]
# (ctx, args, kwargs) -> whether the node must run in eager.
Condition = Callable[[LoweringContext, tuple, dict], bool]


# -- symbolic metadata ---------------------------------------------------------------------------
def symbolic_arg(ctx: LoweringContext, position: int):
    """The symbolic metadata of argument `position` (a FakeTensor with SymInt sizes), or
    the argument itself when it is not an FX node."""
    arg = ctx.node.args[position]
    return ctx.dynamic.symbolic_val(arg) if isinstance(arg, torch.fx.Node) else arg


def dynamic_dims(ctx: LoweringContext, position: int) -> list[int]:
    """The dynamic dims of argument `position`."""
    return ctx.dynamic.dynamic_dims(symbolic_arg(ctx, position))


def is_dynamic_size(s) -> bool:
    return isinstance(s, torch.SymInt) and not s.node.is_constant()


def run_time_size(ctx: LoweringContext, s) -> ir.Value | int:
    """A size of symbolic metadata: a 0-d i64 value when symbolic, else an int."""
    if is_dynamic_size(s):
        return ctx.dynamic.size_value(s.node.expr, ctx.node)
    if isinstance(s, sympy.Expr) and not isinstance(s, sympy.Integer):
        return ctx.dynamic.size_value(s, ctx.node)
    return int(s)


def i64(v: ir.Value | int) -> ir.Value:
    """`v` as a 0-d i64 value."""
    if isinstance(v, ir.Value):
        return v
    attr = ir.DenseElementsAttr.get_splat(
        tensor_type([], torch.int64), ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v))
    )
    return stablehlo.ConstantOp(attr).result


def product(values) -> ir.Value | int:
    """The product of ints and 0-d i64 values: an int when all are ints."""
    static = math.prod(v for v in values if not isinstance(v, ir.Value))
    dynamic = [v for v in values if isinstance(v, ir.Value)]
    if not dynamic:
        return static
    result = dynamic[0]
    for v in dynamic[1:]:
        result = stablehlo.MulOp(result, v).result
    if static != 1:
        result = stablehlo.MulOp(result, i64(static)).result
    return result


def valid_positions(ctx: LoweringContext, position, shape) -> ir.Value | None:
    """i1 mask of `shape` (the padded layout of argument `position`, or of an FX node):
    True at logical positions, False in the padding of its dynamic dims; None when it
    has none."""
    from .helpers import compare

    sym = ctx.dynamic.symbolic_val(position) if isinstance(position, torch.fx.Node) else symbolic_arg(ctx, position)
    valid = None
    for d in ctx.dynamic.dynamic_dims(sym):
        position_d = stablehlo.IotaOp(tensor_type(list(shape), torch.int64), d).result
        inside = compare(position_d, broadcast_to(i64(run_time_size(ctx, sym.shape[d])), list(shape)), "LT")
        valid = inside if valid is None else stablehlo.AndOp(valid, inside).result
    return valid


# -- schema arguments ------------------------------------------------------------------------------
def schema_arg(ctx: LoweringContext, args, kwargs, name: str):
    """The value of argument `name` of the node's schema (positional, keyword or default)."""
    schema = ctx.node.target._schema.arguments
    for i, a in enumerate(schema):
        if a.name == name:
            if i < len(args):
                return args[i]
            if name in kwargs:
                return kwargs[name]
            return a.default_value if a.has_default_value() else None
    return None


def with_schema_arg(ctx: LoweringContext, args, kwargs, name: str, value):
    """`args, kwargs` with argument `name` of the node's schema set to `value`."""
    schema = ctx.node.target._schema.arguments
    args = list(args)
    for i, a in enumerate(schema):
        if a.name == name:
            if i < len(args):
                args[i] = value
            else:
                kwargs = {**kwargs, name: value}
    return args, kwargs


def arg_position(ctx: LoweringContext, name: str) -> int:
    """The position of argument `name` in the node's schema."""
    return [a.name for a in ctx.node.target._schema.arguments].index(name)


# -- rule factories --------------------------------------------------------------------------------
_ALL = object()


def reject_along_dynamic(what: str, dim_position: int | None, default=_ALL, keyword: str = "dim") -> Rule:
    """A rule sending `what` to eager when the dims it works along (argument
    `dim_position`, or keyword `keyword`, else `default`; None or absent: all dims)
    include a dynamic one."""

    def rule(ctx: LoweringContext, x, *args, **kwargs):
        dyn = dynamic_dims(ctx, 0)
        if not dyn:
            return NotImplemented
        if dim_position is not None:
            node_args = list(ctx.node.args)
            if dim_position < len(node_args):
                dims = node_args[dim_position]
            else:
                dims = ctx.node.kwargs.get(keyword, None if default is _ALL else default)
            dims = normalize_dims(dims, len(shape_of(x)))
            if not any(d in dyn for d in dims):
                return NotImplemented
        raise ctx.dynamic_limit(f"{what} along a dynamic (padded) dimension")

    rule.__doc__ = f"{what} along a dynamic (padded) dim runs in eager; along static dims the ordinary rule."
    rule.__name__ = rule.__qualname__ = f"reject_{what}_along_dynamic"
    return rule


def reject_when(condition: Condition, what: str) -> Rule:
    """A rule sending the node to eager (`what` is not supported) when `condition`
    holds; otherwise the ordinary rule."""

    def rule(ctx: LoweringContext, *args, **kwargs):
        if not condition(ctx, args, kwargs):
            return NotImplemented
        raise ctx.dynamic_limit(what)

    rule.__doc__ = f"{what[0].upper() + what[1:]}: runs in eager; otherwise the ordinary rule."
    rule.__name__ = rule.__qualname__ = f"reject_when_{getattr(condition, '__name__', 'condition').strip('_')}"
    return rule


def dynamic_beyond(first: int, argument: str = "input") -> Condition:
    """Whether the tensor argument `argument` has a dynamic dim at index >= first."""

    def condition(ctx, args, kwargs) -> bool:
        return any(d >= first for d in dynamic_dims(ctx, arg_position(ctx, argument)))

    condition.__name__ = f"{argument}_dynamic_beyond_dim_{first - 1}"
    return condition


_SPATIAL_DOC = (
    "Along a dynamic dim other than the batch dim: runs in eager (windows, padding modes and "
    "resampling depend on where the dim ends); along the batch dim the ordinary rule."
)


def reject_spatial_dynamic(op: Any) -> Rule:
    """The rule of a window, pool, padding-mode or resampling op `op` (an OpOverload):
    along a dynamic spatial dim it depends on where the dim ends, so it runs in eager;
    along the batch dim it is per sample."""
    name = op.__name__.split(".")[0]
    rule = reject_when(dynamic_beyond(1, first_tensor_argument(op)), f"{name} along a dynamic dimension")
    rule.__doc__ = _SPATIAL_DOC
    return rule


def first_tensor_argument(op: Any) -> str:
    names = [a.name for a in op._schema.arguments]
    return "self" if "self" in names else "input" if "input" in names else names[0]


def reject_dynamic_argument(name: str, what: str) -> Rule:
    """A rule sending the node to eager when tensor argument `name` has a dynamic dim
    (its padding would be read as data: boundaries, test elements)."""

    def rule(ctx: LoweringContext, *args, **kwargs):
        position = arg_position(ctx, name)
        if position < len(ctx.node.args) and isinstance(ctx.node.args[position], torch.fx.Node):
            if dynamic_dims(ctx, position):
                raise ctx.dynamic_limit(what)
        return NotImplemented

    rule.__doc__ = f"{what[0].upper() + what[1:]}: runs in eager (the padding would be read as data); otherwise the ordinary rule."
    rule.__name__ = rule.__qualname__ = f"reject_dynamic_{name}"
    return rule
