"""Shared helpers of the bounded-dynamism passes (`torchtpu-annotate-bounds`,
`torchtpu-materialize-bounds`): reading and writing `#stablehlo.bounds` encodings."""

from __future__ import annotations

from torch_tpu.core import attributes

from ..context import ir

BOUNDS_ATTR = attributes.BOUNDS  # argument attribute: bound per dim, -1 for static dims
SIZE_OF_ATTR = "torchtpu.size_of"  # a materialized size: [argument or result index, dim]
DYNAMIC = ir.ShapedType.get_dynamic_size()


def ranked(t: ir.Type) -> ir.RankedTensorType | None:
    try:
        return ir.RankedTensorType(t)
    except ValueError:
        return None


def bounds_of(t: ir.RankedTensorType) -> list[int | None] | None:
    """The bound of each dim of `t` from its `#stablehlo.bounds` encoding (None for a
    static dim or a dim without one); None when the type has no encoding."""
    encoding = t.encoding
    if encoding is None:
        return None
    text = str(encoding)
    if not text.startswith("#stablehlo.bounds<"):
        return None
    inner = text[len("#stablehlo.bounds<") : -1].strip()
    if not inner:
        return [None] * t.rank
    return [None if item.strip() == "?" else int(item) for item in inner.split(",")]


def dim_bound(t: ir.RankedTensorType, dim: int) -> int | None:
    """A static dim's size, a dynamic dim's bound, or None."""
    if not t.is_dynamic_dim(dim):
        return t.shape[dim]
    bounds = bounds_of(t)
    return bounds[dim] if bounds is not None else None


def unbounded_dims(t: ir.RankedTensorType) -> list[int]:
    return [d for d in range(t.rank) if t.is_dynamic_dim(d) and dim_bound(t, d) is None]


def with_bounds(t: ir.RankedTensorType, bounds: list[int | None]) -> ir.RankedTensorType:
    """`t` with `#stablehlo.bounds` for its dynamic dims (static dims keep their size)."""
    if not any(t.is_dynamic_dim(d) for d in range(t.rank)):
        return ir.RankedTensorType.get(list(t.shape), t.element_type)
    items = ", ".join(str(bounds[d]) if t.is_dynamic_dim(d) else "?" for d in range(t.rank))
    encoding = ir.Attribute.parse(f"#stablehlo.bounds<{items}>", t.context)
    return ir.RankedTensorType.get(list(t.shape), t.element_type, encoding)


def padded(t: ir.RankedTensorType) -> ir.RankedTensorType:
    """The static type of `t`'s padded buffer: every dynamic dim at its bound."""
    shape = [dim_bound(t, d) for d in range(t.rank)]
    return ir.RankedTensorType.get(shape, t.element_type)


def entry_functions(module: ir.Operation) -> list[ir.Operation]:
    funcs = []
    for region in module.regions:
        for block in region.blocks:
            for op in block.operations:
                if op.operation.name == "func.func":
                    funcs.append(op.operation)
    return funcs


def arg_attr_dicts(fn: ir.Operation) -> list[dict[str, ir.Attribute]]:
    count = len(fn.regions[0].blocks[0].arguments) if len(fn.regions[0].blocks) else 0
    out: list[dict[str, ir.Attribute]] = [{} for _ in range(count)]
    if "arg_attrs" in fn.attributes:
        for i, entry in enumerate(ir.ArrayAttr(fn.attributes["arg_attrs"])):
            d = ir.DictAttr(entry)
            out[i] = {named.name: named.attr for named in d} if len(d) else {}
    return out


def result_attr_dicts(fn: ir.Operation, count: int) -> list[dict[str, ir.Attribute]]:
    out: list[dict[str, ir.Attribute]] = [{} for _ in range(count)]
    if "res_attrs" in fn.attributes:
        for i, entry in enumerate(ir.ArrayAttr(fn.attributes["res_attrs"])):
            if i < count:
                d = ir.DictAttr(entry)
                out[i] = {named.name: named.attr for named in d} if len(d) else {}
    return out


def set_attr_dicts(fn: ir.Operation, name: str, dicts: list[dict[str, ir.Attribute]]) -> None:
    if not any(dicts):
        if name in fn.attributes:
            del fn.attributes[name]
        return
    fn.attributes[name] = ir.ArrayAttr.get([ir.DictAttr.get(d) for d in dicts])


def update_function_type(fn: ir.Operation) -> None:
    block = fn.regions[0].blocks[0]
    terminator = list(block.operations)[-1]
    fn.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(
            [a.type for a in block.arguments], [v.type for v in terminator.operands]
        )
    )
