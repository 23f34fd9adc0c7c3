"""torchtpu-outline-collectives: each collective in its own function ("thin collectives")."""

from __future__ import annotations

from torch_tpu.core import attributes

from ..context import func, ir
from .base import Pass, operation_of, ops_named, register_pass

COLLECTIVE_OPS = frozenset(
    {
        "stablehlo.all_reduce",
        "stablehlo.all_gather",
        "stablehlo.reduce_scatter",
        "stablehlo.all_to_all",
        "stablehlo.collective_permute",
        "stablehlo.collective_broadcast",
        "torchtpu.collective",
    }
)
# Marks a function whose collectives stay embedded (torch_tpu.spmd_safe).
SPMD_SAFE = attributes.SPMD_SAFE
# Marks an outlined function: "compute" or "collective".
OUTLINED = attributes.OUTLINED


def _contains_collective(op: ir.Operation) -> ir.Operation | None:
    found = ops_named(op, *COLLECTIVE_OPS)
    return found[0] if found else None


def _enclosing_func_name(op: ir.Operation) -> str | None:
    current = op
    while current is not None:
        if current.name == "func.func":
            return ir.StringAttr(current.attributes["sym_name"]).value
        parent = current.parent
        current = parent.operation if parent is not None else None
    return None


@register_pass
class OutlineCollectivesPass(Pass):
    argument = "torchtpu-outline-collectives"
    summary = "Move each collective into its own function so every rank compiles identical collective modules"
    description = (
        "Thin collectives: in each function that holds collectives (StableHLO collectives "
        "or `torchtpu.collective`), every collective moves into a private function of its "
        "own (`torchtpu.outlined = \"collective\"`) and each run of ops between two "
        "collectives into a compute function (`torchtpu.outlined = \"compute\"`); the "
        "original function becomes the sequence of calls. A collective function depends "
        "only on the collective, its shapes and its replica groups, so every rank compiles "
        "a byte-identical module for it whatever the rest of its program is, and ranks "
        "cannot disagree on what they exchange. The runtime compiles each function as a "
        "module and runs the sequence (`torch_tpu.spmd`). Functions marked "
        "`torchtpu.spmd_safe` (code under `torch_tpu.spmd_safe`) keep their collectives "
        "embedded, so XLA may overlap communication with compute. A collective nested in "
        "a region (a loop body, a branch) cannot be outlined and is a located error."
    )
    follows_calls = False

    def run(self, module: ir.Operation) -> None:
        functions = [
            op for op in module.regions[0].blocks[0].operations
            if op.operation.name == "func.func"
            and SPMD_SAFE not in op.operation.attributes
            and OUTLINED not in op.operation.attributes
            and len(op.operation.regions[0].blocks) > 0
        ]
        symbols = {ir.StringAttr(op.operation.attributes["sym_name"]).value for op in module.regions[0].blocks[0].operations if "sym_name" in op.operation.attributes}
        for fn in functions:
            self._outline(module, fn.operation, symbols)

    def _outline(self, module: ir.Operation, fn: ir.Operation, symbols: set[str]) -> None:
        body = fn.regions[0].blocks[0]
        ops = [op.operation for op in body.operations]
        terminator, ops = ops[-1], ops[:-1]
        if not any(op.name in COLLECTIVE_OPS for op in ops):
            nested = next((c for op in ops if (c := _contains_collective(op)) is not None), None)
            if nested is not None:
                self.error(nested, f"'{nested.name}' inside a region cannot be outlined; mark the code "
                           "torch_tpu.spmd_safe to keep its collectives embedded, or move the collective "
                           "out of the loop/branch")
            return
        for op in ops:
            if op.name not in COLLECTIVE_OPS:
                nested = _contains_collective(op)
                if nested is not None:
                    self.error(nested, f"'{nested.name}' inside a region of '{op.name}' cannot be outlined; "
                               "mark the code torch_tpu.spmd_safe to keep its collectives embedded")
                    return
        segments: list[tuple[str, list[ir.Operation]]] = []
        current: list[ir.Operation] = []
        for op in ops:
            if op.name in COLLECTIVE_OPS:
                if current:
                    segments.append(("compute", current))
                    current = []
                segments.append(("collective", [op]))
            else:
                current.append(op)
        if current:
            segments.append(("compute", current))
        base = ir.StringAttr(fn.attributes["sym_name"]).value
        counters = {"compute": 0, "collective": 0}
        for kind, segment in segments:
            name = f"{base}_{kind}_{counters[kind]}"
            counters[kind] += 1
            while name in symbols:
                name += "_"
            symbols.add(name)
            self._extract(module, fn, segment, kind, name)
        del terminator

    def _extract(self, module: ir.Operation, fn: ir.Operation, segment: list[ir.Operation], kind: str, name: str) -> None:
        inputs: list[ir.Value] = []
        for op in segment:
            def visit(inner: ir.Operation) -> ir.WalkResult:
                for value in inner.operation.operands:
                    if not _defined_in(value, segment, fn) and value not in inputs:
                        inputs.append(value)
                return ir.WalkResult.ADVANCE

            op.walk(visit)
        outputs: list[ir.Value] = []
        for op in segment:
            for result in op.results:
                if any(not _in_segment(operation_of(use.owner), segment, fn) for use in result.uses):
                    outputs.append(result)
        with segment[0].location:
            with ir.InsertionPoint(fn):  # new function right before the caller
                callee = func.FuncOp(name, ir.FunctionType.get([v.type for v in inputs], [v.type for v in outputs]))
            callee.attributes["sym_visibility"] = ir.StringAttr.get("private")
            callee.attributes[OUTLINED] = ir.StringAttr.get(kind)
            block = callee.body.blocks.append(*[v.type for v in inputs])
            with ir.InsertionPoint(segment[0]):
                call = func.CallOp([v.type for v in outputs], ir.FlatSymbolRefAttr.get(name), inputs)
            with ir.InsertionPoint(block):
                ret = func.ReturnOp(outputs)
            for op in segment:
                op.move_before(ret)
        target = callee.operation
        # Uses of the outputs outside the callee now read the call's results; uses of the
        # inputs inside it read the callee's arguments.
        for value, replacement in zip(outputs, call.results):
            for owner, index in _uses(value):
                if not _inside(owner, target):
                    owner.operands[index] = replacement
        for value, arg in zip(inputs, block.arguments):
            for owner, index in _uses(value):
                if _inside(owner, target):
                    owner.operands[index] = arg


def _top_level(op: ir.Operation, fn: ir.Operation) -> ir.Operation | None:
    """The ancestor of `op` (or `op`) directly in `fn`'s body; None when not in `fn`.
    (Operations are compared with ==, which compares the underlying pointers: their
    hash is not stable while operands are rewritten, jaxlib 0.10.2.)"""
    current = op
    while True:
        parent = current.parent
        if parent is None:
            return None
        parent = operation_of(parent)
        if parent == fn:
            return current
        current = parent


def _in_segment(op: ir.Operation, segment: list[ir.Operation], fn: ir.Operation) -> bool:
    top = _top_level(op, fn)
    return top is not None and any(top == s for s in segment)


def _defined_in(value: ir.Value, segment: list[ir.Operation], fn: ir.Operation) -> bool:
    owner = value.owner
    if isinstance(owner, ir.Block):
        parent = owner.owner
        return parent is not None and operation_of(parent) != fn and _in_segment(operation_of(parent), segment, fn)
    return _in_segment(operation_of(owner), segment, fn)


def _inside(op: ir.Operation, target: ir.Operation) -> bool:
    current = op
    while current is not None:
        if current == target:
            return True
        parent = current.parent
        current = operation_of(parent) if parent is not None else None
    return False


def _uses(value: ir.Value) -> list[tuple[ir.Operation, int]]:
    """(owner, operand index) of every use, read before any is rewritten (rewriting an
    operand edits the use list being walked)."""
    return [(operation_of(use.owner), use.operand_number) for use in value.uses]


