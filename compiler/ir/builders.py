"""One builder per StableHLO construct the compiler writes by hand (see the package
docstring). Each does what its op does, nothing more: operands of elementwise builders
already share a type (broadcasting and dtype promotion are the lowerings' business,
`compiler/lowering/helpers.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..context import ir, stablehlo


# -- types and values ----------------------------------------------------------------------
def shape_of(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def element_type_of(value: ir.Value) -> ir.Type:
    return ir.RankedTensorType(value.type).element_type


def tensor_type(shape: Sequence[int], element: ir.Type) -> ir.RankedTensorType:
    return ir.RankedTensorType.get([int(s) for s in shape], element)


def splat(value: bool | int | float, element: ir.Type, shape: Sequence[int] = ()) -> ir.Value:
    """A constant of `shape` filled with `value` (an integer, bool or float element type;
    an unsigned one takes `value` modulo 2**width)."""
    integer = _integer_type(element)
    if integer is not None:
        v = int(value)
        if integer.width == 1:
            v = 1 if value else 0
        elif integer.is_unsigned:
            v &= (1 << integer.width) - 1
        scalar = ir.IntegerAttr.get(element, v)
    else:
        scalar = ir.FloatAttr.get(element, float(value))
    return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(tensor_type(shape, element), scalar)).result


def _integer_type(element: ir.Type) -> ir.IntegerType | None:
    return ir.IntegerType(element) if element.typeid == ir.IntegerType.static_typeid else None


def iota(shape: Sequence[int], dim: int, element: ir.Type) -> ir.Value:
    """Each element's index along `dim` (the element type is always the caller's choice)."""
    return stablehlo.IotaOp(tensor_type(shape, element), dim).result


# -- elementwise ---------------------------------------------------------------------------
def add(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.AddOp(a, b).result


def sub(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.SubtractOp(a, b).result


def mul(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.MulOp(a, b).result


def div(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.DivOp(a, b).result


def maximum(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.MaxOp(a, b).result


def minimum(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.MinOp(a, b).result


def logical_and(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.AndOp(a, b).result


def logical_or(a: ir.Value, b: ir.Value) -> ir.Value:
    return stablehlo.OrOp(a, b).result


def logical_not(x: ir.Value) -> ir.Value:
    return stablehlo.NotOp(x).result


def neg(x: ir.Value) -> ir.Value:
    return stablehlo.NegOp(x).result


def absolute(x: ir.Value) -> ir.Value:
    return stablehlo.AbsOp(x).result


def sqrt(x: ir.Value) -> ir.Value:
    return stablehlo.SqrtOp(x).result


def exp(x: ir.Value) -> ir.Value:
    return stablehlo.ExpOp(x).result


def logistic(x: ir.Value) -> ir.Value:
    """1 / (1 + exp(-x)), the form PyTorch's kernels compute sigmoid in (and JAX lowers its
    logistic to). Not `stablehlo.logistic`: XLA:TPU expands that through tanh, which loses
    the relative accuracy of small results -- measured on a v5e over [-8, 8]: 1.8e-2
    relative error (at x = -8) against 5.0e-6 for this form."""
    one = splat(1, element_type_of(x), shape_of(x))
    return div(one, add(one, exp(neg(x))))


def log(x: ir.Value) -> ir.Value:
    return stablehlo.LogOp(x).result


def log1p(x: ir.Value) -> ir.Value:
    return stablehlo.Log1pOp(x).result


def sign(x: ir.Value) -> ir.Value:
    return stablehlo.SignOp(x).result


def compare_type(element: ir.Type) -> str:
    """The comparison type an element type implies: FLOAT for float and complex, UNSIGNED
    for unsigned integers and i1 (bool), SIGNED for the other integers."""
    integer = _integer_type(element)
    if integer is not None:
        return "UNSIGNED" if integer.width == 1 or integer.is_unsigned else "SIGNED"
    return "FLOAT"


def compare(lhs: ir.Value, rhs: ir.Value, direction: str) -> ir.Value:
    """`lhs <direction> rhs` (EQ, NE, LT, LE, GT, GE) as an i1 tensor."""
    kind = compare_type(element_type_of(lhs))
    direction_attr = ir.Attribute.parse(f"#stablehlo<comparison_direction {direction}>")
    type_attr = ir.Attribute.parse(f"#stablehlo<comparison_type {kind}>")
    result = tensor_type(shape_of(lhs), ir.IntegerType.get_signless(1))
    return stablehlo.CompareOp(lhs, rhs, direction_attr, compare_type=type_attr, results=[result]).result


def select(pred: ir.Value, on_true: ir.Value, on_false: ir.Value) -> ir.Value:
    """Elementwise `pred ? on_true : on_false` (same shapes, or a scalar `pred`)."""
    return stablehlo.SelectOp(pred, on_true, on_false).result


def convert(value: ir.Value, element: ir.Type) -> ir.Value:
    """stablehlo.convert to `element` (no-op when the type already matches)."""
    if element_type_of(value) == element:
        return value
    return stablehlo.ConvertOp(tensor_type(shape_of(value), element), value).result


def bitcast(value: ir.Value, element: ir.Type, shape: Sequence[int] | None = None) -> ir.Value:
    """The same bits read as `element` (`shape` defaults to the operand's: equal widths)."""
    shape = shape_of(value) if shape is None else shape
    return stablehlo.BitcastConvertOp(tensor_type(shape, element), value).result


# -- shapes --------------------------------------------------------------------------------
def broadcast_in_dim(value: ir.Value, shape: Sequence[int], dims: Sequence[int]) -> ir.Value:
    """`value` laid into `shape`, operand dim i becoming result dim dims[i]."""
    return stablehlo.BroadcastInDimOp(tensor_type(shape, element_type_of(value)), value, list(dims)).result


def reshape(value: ir.Value, shape: Sequence[int]) -> ir.Value:
    shape = [int(s) for s in shape]
    if shape_of(value) == shape:
        return value
    return stablehlo.ReshapeOp(tensor_type(shape, element_type_of(value)), value).result


def transpose(value: ir.Value, permutation: Sequence[int]) -> ir.Value:
    permutation = [int(p) for p in permutation]
    if permutation == list(range(len(permutation))):
        return value
    return stablehlo.TransposeOp(value, permutation).result


def slice_in_dim(x: ir.Value, dim: int, start: int, limit: int, stride: int = 1) -> ir.Value:
    """x[..., start:limit:stride, ...] along `dim` (indices already normalized); the
    whole dim is `x` itself."""
    shape = shape_of(x)
    if start == 0 and limit == shape[dim] and stride == 1:
        return x
    starts, limits, strides = [0] * len(shape), list(shape), [1] * len(shape)
    starts[dim], limits[dim], strides[dim] = int(start), int(limit), int(stride)
    return stablehlo.SliceOp(x, starts, limits, strides).result


def concatenate(values: Sequence[ir.Value], dim: int) -> ir.Value:
    """`values` joined along `dim`; a single value is itself."""
    values = list(values)
    if len(values) == 1:
        return values[0]
    return stablehlo.ConcatenateOp(values, dim).result


# -- products ------------------------------------------------------------------------------
def dot_dimension_numbers(
    lhs_batch: Sequence[int], rhs_batch: Sequence[int], lhs_contract: Sequence[int], rhs_contract: Sequence[int]
) -> ir.Attribute:
    """`#stablehlo.dot<...>`, built through the bindings (not parsed from text)."""
    return stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=[int(d) for d in lhs_batch],
        rhs_batching_dimensions=[int(d) for d in rhs_batch],
        lhs_contracting_dimensions=[int(d) for d in lhs_contract],
        rhs_contracting_dimensions=[int(d) for d in rhs_contract],
    )


def dot_general(
    lhs: ir.Value,
    rhs: ir.Value,
    *,
    contract: tuple[Sequence[int], Sequence[int]],
    batch: tuple[Sequence[int], Sequence[int]] = ((), ()),
    element: ir.Type | None = None,
    precision: str | None = None,
) -> ir.Value:
    """stablehlo.dot_general. Result dims: the batch dims, then lhs's free dims, then rhs's
    free dims (each in operand order); its element type is `element` (default: lhs's).
    `precision` (DEFAULT, HIGH, HIGHEST) sets both operands' precision."""
    (lc, rc), (lb, rb) = contract, batch
    ls, rs = shape_of(lhs), shape_of(rhs)
    lfree = [s for i, s in enumerate(ls) if i not in lc and i not in lb]
    rfree = [s for i, s in enumerate(rs) if i not in rc and i not in rb]
    shape = [ls[i] for i in lb] + lfree + rfree
    result_type = tensor_type(shape, element if element is not None else element_type_of(lhs))
    attr = dot_dimension_numbers(lb, rb, lc, rc)
    kwargs = {}
    if precision is not None:
        p = ir.Attribute.parse(f"#stablehlo<precision {precision}>")
        kwargs["precision_config"] = ir.ArrayAttr.get([p, p])
    return stablehlo.DotGeneralOp(result_type, lhs, rhs, attr, **kwargs).result


# -- loops ---------------------------------------------------------------------------------
def while_loop(
    init: Sequence[ir.Value],
    cond: Callable[[list[ir.Value]], ir.Value],
    body: Callable[[list[ir.Value]], Sequence[ir.Value]],
) -> list[ir.Value]:
    """stablehlo.while over the loop-carried values `init`: `cond(values)` returns a 0-d
    i1, `body(values)` the next values (same types)."""
    types = [v.type for v in init]
    op = stablehlo.WhileOp(types, list(init))
    cond_block = op.cond.blocks.append(*types)
    with ir.InsertionPoint(cond_block):
        stablehlo.ReturnOp([cond(list(cond_block.arguments))])
    body_block = op.body.blocks.append(*types)
    with ir.InsertionPoint(body_block):
        stablehlo.ReturnOp(list(body(list(body_block.arguments))))
    return list(op.results)


def fori_loop(
    start: int,
    stop: int,
    init: Sequence[ir.Value],
    body: Callable[[ir.Value, list[ir.Value]], Sequence[ir.Value]],
    step: int = 1,
) -> list[ir.Value]:
    """`for i in range(start, stop, step): values = body(i, values)` as a while loop
    whose counter `i` is a 0-d i32; no loop at all when the range is empty."""
    if (stop - start) * step <= 0:
        return list(init)
    i32 = ir.IntegerType.get_signless(32)

    def cond(values: list[ir.Value]) -> ir.Value:
        return compare(values[0], splat(stop, i32), "LT" if step > 0 else "GT")

    def loop(values: list[ir.Value]) -> list[ir.Value]:
        i, rest = values[0], values[1:]
        new = body(i, rest)  # the body's ops first, then the counter's increment
        return [add(i, splat(step, i32))] + list(new)

    return while_loop([splat(start, i32)] + list(init), cond, loop)[1:]
