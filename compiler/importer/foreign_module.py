"""Merging a foreign StableHLO module (one JAX lowered, one a user wrote) into one of
ours as private functions, and calling it.

Torch-free and jax-free: the foreign module arrives as MLIR text or bytecode and is
parsed into *our* context (a module built in jax's context cannot be moved into ours;
JAXLIB_NOTES.md). What the merge does, and why:

* every `func.func` of the foreign module is renamed `<prefix>.<name>` and every use of
  its symbol follows, so two foreign modules (each with its own `@main`) and our own
  `@main` never clash; the functions become private (our module has one public entry);
* argument/result attributes (`jax.result_info`, `mhlo.sharding`, `mhlo.layout_mode`,
  `tf.aliasing_output`, ...) and other function attributes are dropped: they describe
  the foreign module's *entry* to its own runtime, and on a private callee XLA and our
  passes either reject or misread them (an aliasing attribute would donate our values);
* an entry with dynamic dimensions is specialised to the operand types of the call
  (`stablehlo-refine-shapes`), then jax's shape assertions
  (`custom_call @shape_assertion`) are checked: a constant true one is removed, a
  constant false one is an error carrying jax's message, any other is an error;
* what cannot work inside our program is rejected with a located message: token
  arguments or results (effects), top-level ops other than functions (`sdy.mesh`), and
  results whose shape stays dynamic.

The same foreign module merged twice under one prefix is merged once (the caller keys
the prefix by the module's identity and operand types).
"""

from __future__ import annotations

from typing import Sequence

from ..context import func, ir, passmanager, stablehlo

__all__ = ["ForeignModuleError", "merge_foreign_module", "call_foreign_module", "enclosing_module"]

# Function attributes kept on a merged function; everything else is the foreign
# runtime's business (see the module docstring).
_KEPT_FUNC_ATTRIBUTES = ("sym_name", "function_type", "sym_visibility")
_SHAPE_ASSERTION = "shape_assertion"


class ForeignModuleError(Exception):
    """A foreign module that cannot be merged; the message names it (`where`)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.reason = message


def enclosing_module(block: ir.Block) -> ir.Operation:
    """The `builtin.module` that (transitively) holds `block`."""
    op = block.owner
    while op is not None and op.name != "builtin.module":
        op = op.parent
    if op is None:
        raise ValueError("the insertion point is not inside a module")
    return op


def _symbol_name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _functions(module: ir.Module) -> dict[str, ir.Operation]:
    return {_symbol_name(op.operation): op.operation for op in module.body.operations if op.operation.name == "func.func"}


_BYTECODE_MAGIC = b"ML\xefR"


def _parse(source: str | bytes, where: str) -> ir.Module:
    """Text, MLIR bytecode, or a StableHLO portable artifact (VHLO bytecode, what
    `jax.export` serializes: `Exported.mlir_module_serialized`)."""
    if not source or isinstance(source, str) and not source.strip():
        raise ForeignModuleError(where, "the module is empty")
    if isinstance(source, bytes) and source.startswith(_BYTECODE_MAGIC):
        try:
            return stablehlo.deserialize_portable_artifact(ir.Context.current, source)
        except (ir.MLIRError, ValueError, RuntimeError):
            pass  # plain MLIR bytecode, not a portable artifact
    try:
        return ir.Module.parse(source)
    except ir.MLIRError as err:
        notes = "; ".join(f"{d.location}: {d.message}" for d in err.error_diagnostics)
        raise ForeignModuleError(where, f"the module does not parse: {notes or err}") from None


def _check_top_level(module: ir.Module, where: str) -> None:
    for op in module.body.operations:
        if op.operation.name != "func.func":
            raise ForeignModuleError(
                where, f"top-level '{op.operation.name}' is not supported in a merged module (only func.func)"
            )


def _has_tokens(types: Sequence[ir.Type]) -> bool:
    return any("token" in str(t) for t in types)


def _specialise(module: ir.Module, entry: ir.Operation, arg_types: Sequence[ir.Type], where: str) -> None:
    """Gives the entry the call's operand types; a dynamic entry is refined."""
    fn = entry.opview
    declared = list(fn.type.inputs)
    if len(declared) != len(arg_types):
        raise ForeignModuleError(where, f"the module's entry takes {len(declared)} arguments, the call passes {len(arg_types)}")
    if declared == list(arg_types) and all(_is_static(t) for t in fn.type.results):
        return
    for i, (have, want) in enumerate(zip(declared, arg_types)):
        have_t, want_t = ir.RankedTensorType(have), ir.RankedTensorType(want)
        compatible = (
            have_t.element_type == want_t.element_type
            and have_t.rank == want_t.rank
            and all(h == w or h == ir.ShapedType.get_dynamic_size() for h, w in zip(have_t.shape, want_t.shape))
        )
        if not compatible:
            raise ForeignModuleError(where, f"argument {i} of the module's entry is {have}, the call passes {want}")
    if _symbol_name(entry) != "main":
        raise ForeignModuleError(where, f"the entry @{_symbol_name(entry)} has dynamic shapes; only @main is refined")
    # stablehlo's own refinement: retypes the entry and propagates the shapes through
    # every op and callee (jax's size arithmetic folds to constants on the way).
    types = ",".join(str(t) for t in arg_types)
    _run(module, f"builtin.module(stablehlo-refine-arguments{{types={types}}},stablehlo-refine-shapes,canonicalize)", where)


def _run(module: ir.Module, pipeline: str, where: str) -> None:
    try:
        passmanager.PassManager.parse(pipeline).run(module.operation)
    except ir.MLIRError as err:
        notes = "; ".join(f"{d.location}: {d.message}" for d in err.error_diagnostics)
        raise ForeignModuleError(where, f"{pipeline} failed: {notes or err}") from None


def _constant_truth(value: ir.Value) -> bool | None:
    """The value of an i1 predicate when it is a constant (after refinement and
    canonicalization fold jax's size arithmetic), else None."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation
    if op.name != "stablehlo.constant":
        return None
    attr = ir.DenseElementsAttr(op.attributes["value"])
    if not attr.is_splat or ir.IntegerType(attr.type.element_type).width != 1:
        return None
    return ir.IntegerAttr(attr.get_splat_value()).value != 0


def _check_shape_assertions(module: ir.Module, where: str) -> None:
    """jax.export's `custom_call @shape_assertion(pred, dims...)`: checked now that the
    shapes are known, then removed (XLA has no such target)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.custom_call" and ir.StringAttr(op.attributes["call_target_name"]).value == _SHAPE_ASSERTION:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in found:
        truth = _constant_truth(op.operands[0])
        message = ir.StringAttr(op.attributes["error_message"]).value if "error_message" in op.attributes else ""
        if truth is None:
            raise ForeignModuleError(
                where, f"a shape assertion depends on run-time values ({message or 'no message'}); "
                "lower the function with static shapes"
            )
        if not truth:
            raise ForeignModuleError(where, f"a shape assertion fails for these operand shapes: {message}")
        op.erase()
    if found:
        _run(module, "builtin.module(canonicalize)", where)  # the predicates' now-dead arithmetic


def _is_static(t: ir.Type) -> bool:
    try:
        return ir.RankedTensorType(t).has_static_shape
    except ValueError:  # not a ranked tensor
        return False


def _check_static_results(entry: ir.Operation, where: str) -> None:
    for i, t in enumerate(entry.opview.type.results):
        if not _is_static(t):
            raise ForeignModuleError(where, f"result {i} of the module's entry has no static shape ({t})")


def _clean_function(op: ir.Operation) -> None:
    for name in [op.attributes[i].name for i in range(len(op.attributes))]:
        if name not in _KEPT_FUNC_ATTRIBUTES:
            del op.attributes[name]
    op.attributes["sym_visibility"] = ir.StringAttr.get("private")


def merge_foreign_module(
    source: str | bytes,
    target: ir.Operation,
    prefix: str,
    arg_types: Sequence[ir.Type],
    *,
    entry: str = "main",
    where: str = "",
) -> ir.Operation:
    """Merges `source` into the module `target` (under the active context) as private
    functions named `<prefix>.<name>`, its `entry` specialised to `arg_types`; returns
    the merged entry function. Merged once per prefix: a second call finds it."""
    entry_name = f"{prefix}.{entry}"
    body = target.regions[0].blocks[0]
    for op in body.operations:
        if op.operation.name == "func.func" and _symbol_name(op.operation) == entry_name:
            return op.operation
    module = _parse(source, where)
    _check_top_level(module, where)
    functions = _functions(module)
    if entry not in functions:
        raise ForeignModuleError(where, f"the module has no function @{entry} (it has {sorted(functions) or 'none'})")
    entry_op = functions[entry]
    entry_type = entry_op.opview.type
    if _has_tokens(list(entry_type.inputs) + list(entry_type.results)):
        raise ForeignModuleError(where, "the module's entry takes or returns tokens (side effects), which a merged call cannot thread")
    _specialise(module, entry_op, arg_types, where)
    _check_shape_assertions(module, where)
    _check_static_results(entry_op, where)
    for name, op in functions.items():
        new_name = f"{prefix}.{name}"
        ir.SymbolTable.replace_all_symbol_uses(name, new_name, module.operation)
        op.attributes["sym_name"] = ir.StringAttr.get(new_name)
        _clean_function(op)
    for op in list(module.body.operations):
        ir.InsertionPoint(body).insert(op.operation.detach_from_parent())
    return entry_op


def call_foreign_module(
    source: str | bytes,
    operands: Sequence[ir.Value],
    prefix: str,
    *,
    entry: str = "main",
    where: str = "",
) -> list[ir.Value]:
    """At the current insertion point (inside a function of a module): merges `source`
    (`merge_foreign_module`) and calls its entry on `operands`; returns the results."""
    block = ir.InsertionPoint.current.block
    target = enclosing_module(block)
    callee = merge_foreign_module(source, target, prefix, [v.type for v in operands], entry=entry, where=where)
    results = list(callee.opview.type.results)
    call = func.CallOp(results, ir.FlatSymbolRefAttr.get(_symbol_name(callee)), list(operands))
    return list(call.results)
