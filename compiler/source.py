"""Reading `.mlir` text and MLIR bytecode into a module, the way `mlir-opt` does:
an implicit `builtin.module` around top-level ops that are not one module, located
diagnostics instead of exceptions, and no crash on garbage."""

from __future__ import annotations

from .context import ir
from .diagnostics import DiagnosticEngine, SourceLoc

BYTECODE_MAGIC = b"ML\xefR"
_NOT_ONE_TOP_LEVEL_OP = "source must contain a single top-level operation"


def is_bytecode(data: bytes | str) -> bool:
    return isinstance(data, bytes) and data.startswith(BYTECODE_MAGIC)


def parse_source(
    data: str | bytes,
    source_name: str,
    ctx: ir.Context,
    engine: DiagnosticEngine,
) -> ir.Operation | None:
    """Parses text or bytecode into a detached, verified `builtin.module` operation.

    Returns None after reporting located errors into `engine` on failure.
    """
    if isinstance(data, bytes):
        if is_bytecode(data):
            return _parse_bytecode(data, source_name, ctx, engine)
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            engine.error(
                SourceLoc(source_name, 1, 1),
                f"input is neither UTF-8 text nor MLIR bytecode (invalid byte at offset "
                f"{err.start}); pass a .mlir text file or a file written with --emit-bytecode",
            )
            return None
    if "\x00" in data:
        # MLIR's lexer treats NUL as end of buffer, which would silently drop the rest.
        line = data.count("\n", 0, data.index("\x00")) + 1
        engine.error(SourceLoc(source_name, line, 1), "input contains a NUL byte; expected MLIR text")
        return None
    return _parse_text(data, source_name, ctx, engine)


def _parse_text(text: str, source_name: str, ctx: ir.Context, engine: DiagnosticEngine):
    with ctx:
        try:
            op = ir.Operation.parse(text, source_name=source_name)
        except ir.MLIRError as err:
            if _NOT_ONE_TOP_LEVEL_OP not in str(err):
                engine.extend_from_mlir_error(err)
                return None
            op = None
        if op is not None and op.operation.name == "builtin.module":
            return op.operation
        # Several (or zero, or one non-module) top-level ops: wrap them in a module as
        # mlir-opt does. "module {" goes on the first line so every other line keeps
        # its number (only line 1's columns move, by 8).
        try:
            wrapped = ir.Operation.parse("module {" + text + "\n}", source_name=source_name)
        except ir.MLIRError as err:
            engine.extend_from_mlir_error(err)
            return None
        return wrapped.operation


def _parse_bytecode(data: bytes, source_name: str, ctx: ir.Context, engine: DiagnosticEngine):
    with ctx:
        try:
            module = ir.Module.parse(data)
        except ir.MLIRError as err:
            engine.extend_from_mlir_error(err)
            _relocate_unknown(engine, source_name)
            return None
        except Exception as err:  # the bytecode reader reports some failures this way
            engine.error(SourceLoc(source_name, 1, 1), f"invalid MLIR bytecode: {err}")
            return None
        # Own the operation independently of the temporary Module wrapper.
        return module.operation.clone()


def _relocate_unknown(engine: DiagnosticEngine, source_name: str) -> None:
    for diag in engine.diagnostics:
        if diag.loc is None:
            diag.loc = SourceLoc(source_name, 1, 1)
