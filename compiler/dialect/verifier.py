"""Checks `torchtpu` ops and types against the declarative table (spec.py, ops.py)."""

from __future__ import annotations

from ..context import ir
from ..diagnostics import DiagnosticEngine
from .spec import DIALECT, KNOWN_TYPES, TORCHTPU, OpSpec, VerifyError, ref_tensor_type


def _check_types(types, what: str, op: ir.Operation, engine: DiagnosticEngine) -> bool:
    ok = True
    for index, t in enumerate(types):
        if isinstance(t, ir.OpaqueType) and t.dialect_namespace == DIALECT:
            kind = t.data.split("<", 1)[0]
            if kind not in KNOWN_TYPES:
                engine.error(op.location, f"'{op.name}' op {what} #{index}: unknown type !{DIALECT}.{kind}; "
                             f"known torchtpu types: {', '.join(sorted(KNOWN_TYPES))}")
                ok = False
            elif kind == "ref" and ref_tensor_type(t) is None:
                engine.error(op.location, f"'{op.name}' op {what} #{index}: malformed reference type {t}; "
                             "expected !torchtpu.ref<tensor<...>> around a ranked tensor type")
                ok = False
    return ok


def _function_argument_types(op: ir.Operation):
    types = []
    for region in op.regions:
        for block in region.blocks:
            types.extend(arg.type for arg in block.arguments)
    return types


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
    present = {named.name: named.attr for named in op.attributes}
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
        ok &= _check_types([r.type for r in op.results], "result", op, engine)
        ok &= _check_types([v.type for v in op.operands], "operand", op, engine)
        ok &= _check_types(_function_argument_types(op), "block argument", op, engine)
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
