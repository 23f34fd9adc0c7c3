"""torchtpu-inline: inline every call to a private function (jaxlib's `inline` cannot)."""

from __future__ import annotations

from ..context import inline_call, ir
from .base import Pass, ops_named, register_pass


def _name(fn: ir.Operation) -> str:
    return ir.StringAttr(fn.attributes["sym_name"]).value


def _is_private(fn: ir.Operation) -> bool:
    return "sym_visibility" in fn.attributes and ir.StringAttr(fn.attributes["sym_visibility"]).value == "private"


def _callee(call: ir.Operation) -> str:
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def _referenced_symbols(module: ir.Operation) -> set[str]:
    """Every symbol named by an attribute anywhere in `module` other than a function's own
    `sym_name` (calls, custom_call `called_computations`, sdy manual computations...)."""
    names: set[str] = set()

    def collect(op: ir.Operation) -> ir.WalkResult:
        for position in range(len(op.attributes)):
            named = op.attributes[position]
            if named.name == "sym_name":
                continue
            text = str(named.attr)
            start = text.find("@")
            while start >= 0:
                end = start + 1
                if end < len(text) and text[end] == '"':
                    end = text.index('"', end + 1) + 1
                    names.add(text[start + 2 : end - 1])
                else:
                    while end < len(text) and (text[end].isalnum() or text[end] in "_.$-"):
                        end += 1
                    names.add(text[start + 1 : end])
                start = text.find("@", end)
        return ir.WalkResult.ADVANCE

    module.walk(collect)
    return names


@register_pass
class InlinePass(Pass):
    argument = "torchtpu-inline"
    summary = "Inline every call to a private function and drop private functions nothing refers to"
    description = (
        "Modules made by JAX hold private functions and `func.call`s (nested `jax.jit`, "
        "`custom_jvp`, `named_call`, Pallas in interpret mode); jaxlib's build of the upstream "
        "`inline` pass has no func inliner and leaves them. This pass replaces each "
        "`func.call` to a private function defined in the module by the callee's body "
        "(callees first, so nested calls disappear too), then erases the private functions "
        "that nothing refers to any more. Calls to public functions and to declarations "
        "without a body stay. A recursive call is a located error naming the cycle; a callee "
        "with more than one block is a located error. torch_tpu passes that look through "
        "function boundaries (`torchtpu-insert-collectives`) run after this pass; the SPMD "
        "pipelines run it first."
    )

    def run(self, module: ir.Operation) -> None:
        top = [op.operation for op in module.regions[0].blocks[0].operations]
        functions = {_name(op): op for op in top if op.name == "func.func"}
        inlinable = {
            name for name, fn in functions.items()
            if _is_private(fn) and len(fn.regions[0].blocks) > 0
        }
        calls_in = {name: ops_named(fn, "func.call") for name, fn in functions.items()}
        order = self._callees_first(functions, calls_in, inlinable)
        if order is None:
            return
        for caller in order:
            for call in calls_in[caller]:
                callee = functions.get(_callee(call))
                if callee is None or _callee(call) not in inlinable:
                    continue
                if len(callee.regions[0].blocks) != 1:
                    self.error(call, f"cannot inline @{_callee(call)}: it has "
                               f"{len(callee.regions[0].blocks)} blocks (only single-block functions "
                               "are inlined); restructure the callee without branches between blocks")
                    return
                self._inline(call, callee)
        referenced = _referenced_symbols(module)
        for name in inlinable:
            if name not in referenced:
                functions[name].erase()

    def _callees_first(self, functions, calls_in, inlinable) -> list[str] | None:
        """Functions ordered so that every inlinable callee comes before its callers, or
        None after reporting a recursive cycle."""
        order: list[str] = []
        state: dict[str, str] = {}  # name -> "active" | "done"
        stack: list[tuple[str, ir.Operation | None]] = []

        def visit(name: str, via: ir.Operation | None) -> bool:
            if state.get(name) == "done":
                return True
            if state.get(name) == "active":
                names = [n for n, _ in stack]
                cycle = names[names.index(name):] + [name]
                self.error(via, "recursive call cannot be inlined: "
                           + " -> ".join(f"@{n}" for n in cycle)
                           + "; rewrite the recursion as a loop (stablehlo.while)")
                return False
            state[name] = "active"
            stack.append((name, via))
            for call in calls_in.get(name, ()):
                target = _callee(call)
                if target in inlinable and not visit(target, call):
                    return False
            stack.pop()
            state[name] = "done"
            order.append(name)
            return True

        for name in functions:
            if not visit(name, None):
                return None
        return order

    @staticmethod
    def _inline(call: ir.Operation, callee: ir.Operation) -> None:
        with ir.InsertionPoint(call):
            results = inline_call(callee, list(call.operands), call.location)
        for old, new in zip(call.results, results):
            old.replace_all_uses_with(new)
        call.erase()
