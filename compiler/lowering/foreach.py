"""`aten._foreach_*`: one op over lists of tensors (torch.optim's `foreach=True` steps,
`clip_grad_norm_`). A foreach op means the same as its single-tensor op applied to each
element of its lists, with that op's type promotion and broadcasting per element, so each
one is lowered by calling the single-tensor op's rule from the lowering table once per
element, with a record (`OpRecord`) of that element's arguments and result. Nothing of
the single-tensor ops' semantics is repeated here, and a rule replaced in the table
(`torch_tpu.register_lowering`) is the one the foreach op uses.

How an overload's arguments split into elements is read from its schema: `Tensor[]` and
`Scalar[]` arguments give element `i` their `i`-th entry; a `Tensor` or `Scalar` argument
is shared by every element (`_foreach_add.Tensor`'s `other` broadcasts against each
tensor), except the `Tensor scalars` of `_foreach_addcmul/addcdiv.Tensor`, a 1-D tensor
holding one scalar per element (`ForeachRule.per_element`). The in-place forms
(`_foreach_add_`, ...) need no rules of their own: functionalization, or the importer's
non-functional mode, lowers them through these out-of-place ones (on the eager device they
keep PyTorch's kernel, which runs each tensor's in-place op there).

While tracing, PyTorch's fake kernels turn `_foreach_add.Tensor` into `.item()` and
`_foreach_add.Scalar`, and refuse the CPU tensor of `_foreach_addcmul/addcdiv.Tensor`: those
rules serve graphs built otherwise (test/python/lowering/test_foreach.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .. import ir as hlo
from ..context import ir
from .registry import LOWERINGS, LoweringContext, OpRecord, Padding, lowers

aten = torch.ops.aten


@dataclass(frozen=True)
class ForeachRule:
    """How one foreach overload maps onto its single-tensor op.

    `element`: the single-tensor overload applied to each element. `names`: the element
    op's argument name for each of the foreach op's arguments, in the foreach schema's
    order (None: the same positions in the element schema). `per_element`: `Tensor`
    arguments that hold one scalar per element, in a 1-D tensor."""

    element: Any
    names: tuple[str, ...] | None = None
    per_element: frozenset[str] = frozenset()


def _is_list(argument: torch._C.Argument) -> bool:
    return isinstance(argument.type, torch._C.ListType)


def _bind(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments the call gives, by schema name (defaults left to the element rule)."""
    bound = {a.name: v for a, v in zip(schema.arguments, args)}
    bound.update(kwargs)
    return bound


def _list_length(ctx: LoweringContext, schema: torch._C.FunctionSchema, bound: dict) -> int:
    lengths = {len(bound[a.name]) for a in schema.arguments if _is_list(a) and a.name in bound}
    if len(lengths) != 1:
        raise ctx.fail(
            f"the tensor and scalar lists of {schema.name} have different lengths {sorted(lengths)}; "
            "PyTorch requires them to be equal"
        )
    return lengths.pop()


def _element_scalar(value: ir.Value, meta: torch.Tensor, index: int) -> tuple[ir.Value, torch.Tensor]:
    """Entry `index` of a 1-D tensor of per-element scalars: a 0-d value and its metadata.
    ATen's kernels read the entries as Python scalars; the element rules convert a 0-d
    value to their compute dtype as they do a scalar."""
    entry = hlo.reshape(hlo.slice_in_dim(value, 0, index, index + 1), [])
    return entry, torch.empty((), dtype=meta.dtype, device="meta")


def _element_call(element, named: dict[str, Any]) -> tuple[tuple, dict]:
    """(args, kwargs) of a call of `element` as an FX graph holds it: positional schema
    arguments by position (a skipped one takes its schema default), keyword-only ones by
    name."""
    positional = [a for a in element._schema.arguments if not a.kwarg_only]
    given = [i for i, a in enumerate(positional) if a.name in named]
    args = []
    for a in positional[: given[-1] + 1 if given else 0]:
        args.append(named[a.name] if a.name in named else a.default_value)
    kwargs = {a.name: named[a.name] for a in element._schema.arguments if a.kwarg_only and a.name in named}
    return tuple(args), kwargs


def _lower_foreach(rule: ForeachRule, ctx: LoweringContext, *args, **kwargs) -> list[ir.Value]:
    op = ctx.record.target
    schema = op._schema
    values = _bind(schema, args, kwargs)
    metas = _bind(schema, ctx.record.args, ctx.record.kwargs or {})
    element_names = rule.names or tuple(a.name for a in rule.element._schema.arguments)
    renamed = dict(zip((a.name for a in schema.arguments), element_names))
    lowering = LOWERINGS.get(rule.element)
    if lowering is None:
        raise ctx.fail(f"{op} is lowered element by element through {rule.element}, which has no lowering")
    results = []
    for index in range(_list_length(ctx, schema, values)):
        element_values, element_metas = {}, {}
        for argument in schema.arguments:
            name = argument.name
            if name not in values:
                continue
            value, meta = values[name], metas.get(name)
            if _is_list(argument):
                value, meta = value[index], meta[index]
            elif name in rule.per_element:
                value, meta = _element_scalar(value, meta, index)
            element_values[renamed[name]] = value
            element_metas[renamed[name]] = meta
        call_args, call_kwargs = _element_call(rule.element, element_values)
        meta_args, meta_kwargs = _element_call(rule.element, element_metas)
        record = OpRecord(rule.element, meta_args, meta_kwargs, ctx.meta(index), ctx.record.where)
        element_ctx = ctx.for_record(record)
        results.append(lowering.fn(element_ctx, *call_args, **call_kwargs))
    return results


def _register(foreach_op, rule: ForeachRule, padding: Padding) -> None:
    def lower(ctx: LoweringContext, *args, **kwargs):
        return _lower_foreach(rule, ctx, *args, **kwargs)

    lower.__doc__ = f"Each element through {rule.element}."
    lowers(foreach_op, dynamic=padding)(lower)


def _binary(name: str, tensor_op, scalar_op, *, with_tensor: bool = True) -> dict:
    """The List / Tensor / Scalar / ScalarList overloads of a binary foreach op: a tensor
    operand (List, Tensor) through `tensor_op`, a Python scalar one through `scalar_op`."""
    packet = getattr(aten, f"_foreach_{name}")
    rules = {
        packet.List: ForeachRule(tensor_op),
        packet.Scalar: ForeachRule(scalar_op),
        packet.ScalarList: ForeachRule(scalar_op),
    }
    if with_tensor:
        rules[packet.Tensor] = ForeachRule(tensor_op)
    return rules


# Each elementwise foreach overload and the single-tensor overload it applies per element
# (the ones torch.optim's foreach Adam, AdamW and SGD emit, and their siblings).
ELEMENTWISE: dict = {
    **_binary("add", aten.add.Tensor, aten.add.Scalar),
    **_binary("sub", aten.sub.Tensor, aten.sub.Scalar, with_tensor=False),
    **_binary("mul", aten.mul.Tensor, aten.mul.Scalar),
    **_binary("div", aten.div.Tensor, aten.div.Scalar),
    # ATen's foreach kernels for a scalar maximum/minimum are clamp_min/clamp_max.
    **_binary("maximum", aten.maximum.default, aten.clamp_min.default, with_tensor=False),
    **_binary("minimum", aten.minimum.default, aten.clamp_max.default, with_tensor=False),
    **_binary("clamp_min", aten.clamp_min.Tensor, aten.clamp_min.default, with_tensor=False),
    **_binary("clamp_max", aten.clamp_max.Tensor, aten.clamp_max.default, with_tensor=False),
    **_binary("pow", aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, with_tensor=False),
    aten._foreach_pow.ScalarAndTensor: ForeachRule(aten.pow.Scalar),
    aten._foreach_lerp.List: ForeachRule(aten.lerp.Tensor),
    aten._foreach_lerp.Scalar: ForeachRule(aten.lerp.Scalar),
    aten._foreach_lerp.ScalarList: ForeachRule(aten.lerp.Scalar),
    aten._foreach_copy.default: ForeachRule(aten.copy.default),
    aten._foreach_zero.default: ForeachRule(aten.zero.default),
}
for _name in ("addcmul", "addcdiv"):
    _packet, _element = getattr(aten, f"_foreach_{_name}"), getattr(aten, _name).default
    ELEMENTWISE[_packet.Scalar] = ForeachRule(_element)
    ELEMENTWISE[_packet.ScalarList] = ForeachRule(_element)
    ELEMENTWISE[_packet.Tensor] = ForeachRule(_element, per_element=frozenset({"scalars"}))
UNARY = (
    "abs", "acos", "asin", "atan", "ceil", "clone", "cos", "cosh", "erf", "erfc", "exp", "expm1",
    "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round",
    "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
)
for _name in UNARY:
    ELEMENTWISE[getattr(aten, f"_foreach_{_name}").default] = ForeachRule(getattr(aten, _name).default)

for _op, _rule in ELEMENTWISE.items():
    _register(_op, _rule, Padding.SAFE)

# Reductions of each whole tensor (clip_grad_norm_'s per-tensor norms).
_register(
    aten._foreach_norm.Scalar,
    ForeachRule(aten.linalg_vector_norm.default, names=("self", "ord", "dtype")),
    Padding.MASKED,
)
_register(aten._foreach_max.default, ForeachRule(aten.max.default), Padding.MASKED)
