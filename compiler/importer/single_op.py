"""Lowering ONE ATen overload into a module of its own, without an FX graph.

The eager device (and later fused traces) lower ops one at a time through the same
lowering table `torch.compile` graphs use. The caller describes the op with an
`OpRecord` (overload, argument metadata, result metadata) and gives:

* `operand_types`: the (shape, dtype) of each argument of `@main`;
* `read(block_args)`: returns the rule's `(args, kwargs)` built from @main's arguments
  (it may emit ops first: a view of a storage, a run-time scalar);
* `write(result, block_args)`: returns @main's results from the rule's result (it may
  emit ops: the result laid out as a storage, a write into a view of an argument).

so this module knows nothing about storages or devices. A rule that draws random
numbers gets a `tensor<2xui64>` RNG state argument appended to @main after the operands
(the graph importer's convention, `FxImporter.random_bits`); `takes_rng_state` says
whether a module has one, and the caller passes the state. Errors are `LoweringError`s
naming the op by `record.where`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..context import func, ir, stablehlo
from ..dtypes import dtype_of, tensor_type
from ..lowering import LOWERINGS, LoweringContext, LoweringError, UnsupportedOpError
from ..lowering.registry import OpRecord
from .random_state import RandomState


def normalize_result(result: Any) -> Any:
    """A rule's result as an ir.Value, a tuple of them, or a Python value."""
    if isinstance(result, ir.OpView):
        result = result.operation
    if isinstance(result, ir.Operation):
        results = list(result.results)
        return results[0] if len(results) == 1 else tuple(results)
    if isinstance(result, list):
        return tuple(normalize_result(r) for r in result)
    return result


def check_result(record: OpRecord, result: Any) -> None:
    """The rule's result must match PyTorch's metadata (shape and dtype of each tensor)."""
    vals = record.val if isinstance(record.val, (tuple, list)) else (record.val,)
    values = result if isinstance(result, tuple) else (result,)
    for value, val in zip(values, vals):
        if isinstance(val, torch.Tensor) and isinstance(value, ir.Value):
            t = ir.RankedTensorType(value.type)
            if list(t.shape) != [int(s) for s in val.shape] or dtype_of(t) != val.dtype:
                raise LoweringError(
                    f"the lowering produced {t} but PyTorch expects {list(val.shape)} {val.dtype}",
                    where=record.where,
                )




def takes_rng_state(module: ir.Module, operand_count: int, func_name: str = "main") -> bool:
    """Whether `lower_op` appended an RNG state argument to the module's function."""
    for op in module.body.operations:
        if isinstance(op.opview, func.FuncOp) and ir.StringAttr(op.attributes["sym_name"]).value == func_name:
            return len(op.opview.arguments) > operand_count
    return False


def lower_op(
    record: OpRecord,
    operand_types: Sequence[tuple[Sequence[int], torch.dtype]],
    read: Callable[[list[ir.Value]], tuple[tuple, dict]],
    write: Callable[[Any, list[ir.Value]], list[ir.Value]],
    *,
    context: ir.Context,
    func_name: str = "main",
) -> ir.Module:
    """The module `@main(operands) -> write(rule(read(operands)))` of `record.target`.
    Raises `UnsupportedOpError` when the overload has no lowering, `LoweringError` when
    its rule rejects the arguments."""
    lowering = LOWERINGS.get(record.target)
    if lowering is None:
        raise UnsupportedOpError(f"no lowering registered for {record.target}", where=record.where)
    with context, ir.Location.name(str(record.where or record.target)) as loc:
        module = ir.Module.create()
        types = [tensor_type(shape, dtype) for shape, dtype in operand_types]
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp(func_name, ir.FunctionType.get(types, []))
        block = fn.body.blocks.append(*types)
        with ir.InsertionPoint(block):
            block_args = list(block.arguments)
            try:
                args, kwargs = read(block_args)
                ctx = LoweringContext(None, loc, record=record, random_source=RandomState(block))
                result = normalize_result(lowering.fn(ctx, *args, **kwargs))
                check_result(record, result)
                results = write(result, block_args)
            except LoweringError:
                raise
            except (ir.MLIRError, ValueError, TypeError, IndexError, KeyError, NotImplementedError, AttributeError) as err:
                raise LoweringError(f"lowering failed: {type(err).__name__}: {err}", where=record.where) from err
            func.ReturnOp(results)
        fn.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], [r.type for r in results])
        )
    return module
