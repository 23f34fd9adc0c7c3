"""torchtpu-materialize-bounds: bounded-dynamic arguments and results as padded static
buffers plus i32 sizes, for platforms whose runtimes take only static buffers."""

from __future__ import annotations

from ..context import ir, stablehlo
from .base import Pass, register_pass
from .bounds_util import (
    SIZE_OF_ATTR,
    arg_attr_dicts,
    entry_functions,
    padded,
    ranked,
    result_attr_dicts,
    set_attr_dicts,
    unbounded_dims,
    update_function_type,
)


def _dynamic_dims(t: ir.RankedTensorType | None) -> list[int]:
    return [] if t is None else [d for d in range(t.rank) if t.is_dynamic_dim(d)]


def _i32_scalar(context: ir.Context) -> ir.RankedTensorType:
    return ir.RankedTensorType.get([], ir.IntegerType.get_signless(32, context))


@register_pass
class MaterializeBoundsPass(Pass):
    argument = "torchtpu-materialize-bounds"
    summary = "Bounded-dynamic arguments/results become padded static buffers plus i32 sizes"
    description = (
        "For runtimes without bounded-dynamic parameters (XLA:CPU: PadToStatic is not "
        "implemented for parameters; the frontend runs it on every platform, see "
        "`torch_tpu.backend._dynamic.MATERIALIZE_BOUNDS_PLATFORMS`). In every public function, an "
        "argument `tensor<?x..., #stablehlo.bounds<...>>` becomes its padded static buffer "
        "(each dynamic dim at its bound) and one `tensor<i32>` argument per dynamic dim is "
        "appended (marked `torchtpu.size_of = array<i64: arg, dim>`); the body re-marks the "
        "logical sizes with `stablehlo.set_dimension_size`. A bounded-dynamic result is "
        "returned padded to its bounds (`set_dimension_size` to the bound) and its sizes "
        "(`stablehlo.get_dimension_size`) are appended as `tensor<i32>` results, marked "
        "`torchtpu.size_of = array<i64: result, dim>`. Run `torchtpu-annotate-bounds` "
        "first: a dynamic dim without a bound is an error."
    )
    follows_calls = False

    def run(self, op: ir.Operation) -> None:
        for fn in entry_functions(op):
            if len(fn.regions[0].blocks) == 0:
                continue
            visibility = (
                fn.attributes["sym_visibility"] if "sym_visibility" in fn.attributes else None
            )
            if visibility is not None and ir.StringAttr(visibility).value == "private":
                continue
            if self._check(fn):
                self._materialize(fn)

    def _check(self, fn: ir.Operation) -> bool:
        block = fn.regions[0].blocks[0]
        terminator = list(block.operations)[-1]
        ok = True
        for index, arg in enumerate(block.arguments):
            t = ranked(arg.type)
            if t is not None and unbounded_dims(t):
                self.error(
                    fn,
                    f"argument #{index} ({t}) has dynamic dims {unbounded_dims(t)} without a bound; run torchtpu-annotate-bounds first",
                )
                ok = False
        for index, value in enumerate(terminator.operands):
            t = ranked(value.type)
            if t is not None and unbounded_dims(t):
                self.error(
                    terminator,
                    f"result #{index} ({t}) has dynamic dims {unbounded_dims(t)} without a bound; run torchtpu-annotate-bounds first",
                )
                ok = False
        return ok

    def _materialize(self, fn: ir.Operation) -> None:
        context = fn.context
        i32 = _i32_scalar(context)
        block = fn.regions[0].blocks[0]
        arg_attrs = arg_attr_dicts(fn)
        original_args = list(block.arguments)
        first_op = next(iter(block.operations))
        # Arguments: padded buffer + sizes; the body sees the bounded value it saw before.
        for index, arg in enumerate(original_args):
            t = ranked(arg.type)
            dims = _dynamic_dims(t)
            if not dims:
                continue
            loc = arg.location
            arg.set_type(padded(t))
            value = arg
            marks = []
            with ir.InsertionPoint(first_op), loc:
                shape = list(padded(t).shape)
                for d in dims:
                    size = block.add_argument(i32, loc)
                    arg_attrs.append({SIZE_OF_ATTR: ir.DenseI64ArrayAttr.get([index, d])})
                    shape[d] = ir.ShapedType.get_dynamic_size()
                    step = t if shape == list(t.shape) else _partially_bounded(t, shape)
                    op = stablehlo.SetDimensionSizeOp(value, size, d, results=[step])
                    marks.append(op.operation)
                    value = op.result
            arg.replace_all_uses_except(value, marks[0])
        set_attr_dicts(fn, "arg_attrs", arg_attrs)
        # Results: padded buffer + sizes.
        terminator = list(block.operations)[-1]
        results = list(terminator.operands)
        res_attrs = result_attr_dicts(fn, len(results))
        new_results = []
        sizes = []
        with ir.InsertionPoint(terminator), terminator.location:
            for index, value in enumerate(results):
                t = ranked(value.type)
                dims = _dynamic_dims(t)
                if not dims:
                    new_results.append(value)
                    continue
                bounds_type = padded(t)
                for d in dims:
                    sizes.append(stablehlo.GetDimensionSizeOp(value, d).result)
                    res_attrs.append({SIZE_OF_ATTR: ir.DenseI64ArrayAttr.get([index, d])})
                current = value
                shape = list(t.shape)
                for d in dims:
                    shape[d] = bounds_type.shape[d]
                    step = (
                        bounds_type
                        if shape == list(bounds_type.shape)
                        else _partially_bounded(t, shape)
                    )
                    bound = _i32_constant(bounds_type.shape[d], i32)
                    current = stablehlo.SetDimensionSizeOp(current, bound, d, results=[step]).result
                new_results.append(current)
            _replace_terminator(terminator, new_results + sizes)
        set_attr_dicts(fn, "res_attrs", res_attrs)
        update_function_type(fn)


def _partially_bounded(t: ir.RankedTensorType, shape: list[int]) -> ir.RankedTensorType:
    """`t` with the dims that are static in `shape` made static (the others keep their
    bounds)."""
    from .bounds_util import bounds_of, with_bounds

    bounds = bounds_of(t) or [None] * t.rank
    partial = ir.RankedTensorType.get(shape, t.element_type)
    return with_bounds(partial, bounds)


def _i32_constant(value: int, i32: ir.RankedTensorType) -> ir.Value:
    attr = ir.DenseElementsAttr.get_splat(i32, ir.IntegerAttr.get(i32.element_type, int(value)))
    return stablehlo.ConstantOp(attr).result


def _replace_terminator(terminator: ir.Operation, values: list[ir.Value]) -> None:
    from ..context import func

    func.ReturnOp(values)
    terminator.erase()
