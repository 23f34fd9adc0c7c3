"""Split a module produced by `torchtpu-outline-collectives` into the modules a rank
compiles and the order it runs them in.

Each outlined function becomes a module of its own whose entry is `@main`, printed
without locations and with its channel handles renumbered from 1, so a collective
module's text depends only on the collective itself: ranks whose programs differ
elsewhere still compile byte-identical collective modules (equal fingerprints).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from torch_tpu.core import attributes

from .context import ir

_CHANNEL = re.compile(r"channel_handle<handle = \d+")


@dataclass(frozen=True)
class ValueRef:
    """Where a value comes from: argument `index` of the entry (stage=-1) or result
    `index` of stage `stage`."""

    stage: int
    index: int


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str  # "compute" | "collective"
    text: str  # the stage's own module, entry @main
    args: tuple[ValueRef, ...]
    num_results: int

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class OutlinedProgram:
    stages: tuple[Stage, ...]
    outputs: tuple[ValueRef, ...]
    num_args: int


class NotOutlinedError(ValueError):
    """The entry function is not a sequence of calls to outlined functions."""


def _renumber_channels(text: str) -> str:
    counter = iter(range(1, 1 << 30))
    return _CHANNEL.sub(lambda _: f"channel_handle<handle = {next(counter)}", text)


def _stage_module(callee: ir.Operation) -> str:
    clone = callee.clone()
    try:
        clone.attributes["sym_name"] = ir.StringAttr.get("main", callee.context)
        del clone.attributes["sym_visibility"]
        for key in (attributes.OUTLINED,):
            if key in clone.attributes:
                del clone.attributes[key]
        body = clone.get_asm(enable_debug_info=False)
    finally:
        clone.erase()
    return _renumber_channels(f"module @stage {{\n{body}\n}}\n")


def functions_by_name(module: ir.Operation) -> dict[str, ir.Operation]:
    """The module's `func.func`s by symbol name."""
    return {
        ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
        for op in module.regions[0].blocks[0].operations
        if op.operation.name == "func.func"
    }


def split_outlined(module: ir.Operation, entry: str = "main") -> OutlinedProgram:
    functions = functions_by_name(module)
    if entry not in functions:
        raise NotOutlinedError(f"no function @{entry} in the module")
    fn = functions[entry]
    block = fn.regions[0].blocks[0]
    if not _calls_outlined(block, functions):
        return _single_stage(module, fn, entry)
    where: dict = {}
    for i, arg in enumerate(block.arguments):
        where[arg] = ValueRef(-1, i)
    stages: list[Stage] = []
    outputs: tuple[ValueRef, ...] = ()
    for op in block.operations:
        op = op.operation
        if op.name == "func.return":
            outputs = tuple(where[v] for v in op.operands)
            break
        if op.name != "func.call":
            raise NotOutlinedError(
                f"@{entry} holds '{op.name}' outside an outlined function; run torchtpu-outline-collectives first"
            )
        callee_name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        callee = functions[callee_name]
        kind = ir.StringAttr(callee.attributes[attributes.OUTLINED]).value if attributes.OUTLINED in callee.attributes else "compute"
        args = tuple(where[v] for v in op.operands)
        for k, result in enumerate(op.results):
            where[result] = ValueRef(len(stages), k)
        stages.append(Stage(callee_name, kind, _stage_module(callee), args, len(op.results)))
    return OutlinedProgram(tuple(stages), outputs, len(block.arguments))


def _calls_outlined(block: ir.Block, functions: dict) -> bool:
    for op in block.operations:
        op = op.operation
        if op.name == "func.call":
            callee = functions.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
            if callee is not None and attributes.OUTLINED in callee.attributes:
                return True
    return False


def _single_stage(module: ir.Operation, fn: ir.Operation, entry: str) -> OutlinedProgram:
    """A program torchtpu-outline-collectives left whole because it has no collectives
    (nothing to communicate: all replicated, batch-only sharding): the module is one
    compute stage. Collectives left in it mean the pass did not run."""
    from .passes.outline_collectives import _contains_collective

    found = _contains_collective(module)
    if found is not None:
        raise NotOutlinedError(
            f"@{entry} holds '{found.name}' outside an outlined function; run torchtpu-outline-collectives first"
        )
    clone = module.clone()
    try:
        for op in clone.regions[0].blocks[0].operations:
            op = op.operation
            if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == entry:
                op.attributes["sym_name"] = ir.StringAttr.get("main", op.context)
        text = _renumber_channels(clone.get_asm(enable_debug_info=False))
    finally:
        clone.erase()
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    num_args = len(fn.regions[0].blocks[0].arguments)
    stage = Stage(entry, "compute", text, tuple(ValueRef(-1, i) for i in range(num_args)), len(ftype.results))
    return OutlinedProgram((stage,), tuple(ValueRef(0, k) for k in range(len(ftype.results))), num_args)
