"""torchtpu-outline-collectives: each collective in its own function ("thin collectives")."""

from __future__ import annotations

from ..context import func, ir
from .base import Pass, register_pass

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
SPMD_SAFE = "torchtpu.spmd_safe"
# Marks an outlined function: "compute" or "collective".
OUTLINED = "torchtpu.outlined"


def _contains_collective(op: ir.Operation) -> ir.Operation | None:
    found: list[ir.Operation] = []

    def visit(inner: ir.Operation) -> ir.WalkResult:
        if inner.operation.name in COLLECTIVE_OPS:
            found.append(inner.operation)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op.walk(visit)
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
        members: set[ir.Operation] = set()
        for op in segment:
            op.walk(lambda inner: members.add(inner.operation) or ir.WalkResult.ADVANCE)
        inputs: list[ir.Value] = []
        for op in segment:
            def visit(inner: ir.Operation) -> ir.WalkResult:
                for value in inner.operation.operands:
                    if _defined_outside(value, members) and value not in inputs:
                        inputs.append(value)
                return ir.WalkResult.ADVANCE

            op.walk(visit)
        outputs: list[ir.Value] = []
        for op in segment:
            for result in op.results:
                if any(use.owner not in members for use in result.uses):
                    outputs.append(result)
        loc = segment[0].location
        with loc:
            with ir.InsertionPoint(fn):  # new function right before the caller
                callee = func.FuncOp(name, ir.FunctionType.get([v.type for v in inputs], [v.type for v in outputs]))
            callee.attributes["sym_visibility"] = ir.StringAttr.get("private")
            callee.attributes[OUTLINED] = ir.StringAttr.get(kind)
            block = callee.body.blocks.append(*[v.type for v in inputs])
            with ir.InsertionPoint(segment[0]):
                call = func.CallOp([v.type for v in outputs], ir.FlatSymbolRefAttr.get(name), inputs)
            # Uses of the outputs outside the segment now read the call's results.
            for value, replacement in zip(outputs, call.results):
                for use in list(value.uses):
                    if use.owner not in members:
                        use.owner.operands[use.operand_number] = replacement
            with ir.InsertionPoint(block):
                ret = func.ReturnOp(outputs)
            for op in segment:
                op.move_before(ret)
            for value, arg in zip(inputs, block.arguments):
                for use in list(value.uses):
                    if use.owner in members:
                        use.owner.operands[use.operand_number] = arg


def _defined_outside(value: ir.Value, members: set[ir.Operation]) -> bool:
    owner = value.owner
    if isinstance(owner, ir.Block):
        parent = owner.owner
        return parent is None or parent.operation not in members
    return owner.operation not in members
