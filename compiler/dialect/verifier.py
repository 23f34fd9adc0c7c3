"""Checks `torchtpu` ops and types against the declarative table (spec.py, ops.py)."""

from __future__ import annotations

from ..context import ir
from ..diagnostics import DiagnosticEngine
from .spec import DIALECT, KNOWN_TYPES, TORCHTPU, OpSpec, VerifyError, ref_tensor_type


def _check_type(t: ir.Type, what: str, op: ir.Operation, loc: ir.Location,
                engine: DiagnosticEngine) -> bool:
    if not (isinstance(t, ir.OpaqueType) and t.dialect_namespace == DIALECT):
        return True
    kind = t.data.split("<", 1)[0]
    if kind not in KNOWN_TYPES:
        engine.error(loc, f"'{op.name}' op {what}: unknown type !{DIALECT}.{kind}; "
                     f"known torchtpu types: {', '.join(sorted(KNOWN_TYPES))}")
        return False
    if kind == "ref" and ref_tensor_type(t) is None:
        engine.error(loc, f"'{op.name}' op {what}: malformed reference type {t}; "
                     "expected !torchtpu.ref<tensor<...>> around a ranked tensor type")
        return False
    return True


def _check_op_types(op: ir.Operation, engine: DiagnosticEngine) -> bool:
    """Checks the torchtpu types an op defines: its results, its blocks' arguments
    (reported at the argument) and, for functions, its declared signature. Operands
    are not checked: each is some op's result or block argument, checked there."""
    ok = True
    for index, result in enumerate(op.results):
        ok &= _check_type(result.type, f"result #{index}", op, op.location, engine)
    for region in op.regions:
        for block in region.blocks:
            for arg in block.arguments:
                ok &= _check_type(arg.type, f"block argument #{arg.arg_number}", op,
                                  arg.location, engine)
    if "function_type" in op.attributes and not any(len(r.blocks) for r in op.regions):
        signature = op.attributes["function_type"]
        if isinstance(signature, ir.TypeAttr) and isinstance(signature.value, ir.FunctionType):
            ftype = signature.value
            for index, t in enumerate(ftype.inputs):
                ok &= _check_type(t, f"argument #{index}", op, op.location, engine)
            for index, t in enumerate(ftype.results):
                ok &= _check_type(t, f"function result #{index}", op, op.location, engine)
    return bool(ok)


def verify_op(op: ir.Operation, spec: OpSpec, engine: DiagnosticEngine) -> bool:
    name = spec.full_name

    def fail(message: str) -> bool:
        engine.error(op.location, f"'{name}' op {message}")
        return False

    operands = list(op.operands)
    fixed = [o for o in spec.operands if not o.variadic]
    has_variadic = any(o.variadic for o in spec.operands)
    if (len(operands) != len(fixed)) if not has_variadic else (len(operands) < len(fixed)):
        expected = f"{len(fixed)}{' or more' if has_variadic else ''}"
        return fail(f"expects {expected} operands, but got {len(operands)}")
    # Match operands to their declarations (the variadic group takes the surplus).
    surplus = len(operands) - len(fixed)
    position = 0
    for decl in spec.operands:
        count = surplus if decl.variadic else 1
        for value in operands[position : position + count]:
            if not decl.type.check(value.type):
                return fail(f"operand '{decl.name}' must be {decl.type.description}, but got {value.type}")
        position += count

    results = list(op.results)
    if len(results) != len(spec.results):
        return fail(f"expects {len(spec.results)} results, but got {len(results)}")
    for decl, value in zip(spec.results, results):
        if not decl.type.check(value.type):
            return fail(f"result '{decl.name}' must be {decl.type.description}, but got {value.type}")

    if len(op.regions) != spec.num_regions:
        return fail(f"expects {spec.num_regions} regions, but got {len(op.regions)}")

    declared = {a.name: a for a in spec.attributes}
    present = {name: attr for name, attr in op.attributes.items()}
    values: dict = {}
    for attr_name, attr in present.items():
        decl = declared.get(attr_name)
        if decl is None:
            if "." in attr_name:  # discardable attributes of other dialects are allowed
                continue
            return fail(f"unknown attribute '{attr_name}'; declared attributes: "
                        f"{', '.join(declared) or 'none'}")
        if not decl.kind.check(attr):
            return fail(f"attribute '{attr_name}' must be {decl.kind.description}, but got {attr}")
        values[attr_name] = decl.kind.to_python(attr)
    for decl in spec.attributes:
        if not decl.optional and decl.name not in present:
            return fail(f"requires attribute '{decl.name}' ({decl.kind.description})")

    if spec.verify is not None:
        try:
            spec.verify(op, values)
        except VerifyError as err:
            return fail(str(err))
    return True


def verify_module(module: ir.Operation, engine: DiagnosticEngine) -> bool:
    """Verifies every `torchtpu` op and every use of a `torchtpu` type under `module`.
    Reports each problem as a located error; returns True when there were none."""
    ok = True

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal ok
        op = op.operation
        ok &= _check_op_types(op, engine)
        if op.name.startswith(DIALECT + "."):
            spec = TORCHTPU.lookup(op.name)
            if spec is None:
                known = ", ".join(sorted(TORCHTPU.ops))
                engine.error(op.location, f"unknown op '{op.name}' in the torchtpu dialect; known ops: {known}")
                ok = False
            else:
                ok &= verify_op(op, spec, engine)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return bool(ok)
