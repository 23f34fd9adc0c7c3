"""Located diagnostics: one representation for MLIR's own diagnostics (parser,
verifier, upstream passes) and ours (Python passes, the importer).

jaxlib can only emit *errors* from Python (`Location.emit_error`), so our passes report
through a `DiagnosticEngine` instead, which also supports warnings, remarks and notes.
Every user-facing message prints as `file:line:col: severity: message`, MLIR's format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from .context import ir

_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')
# A name location around a child (`"aten.addmm.default"("model.py":12:1)`): the importer
# names each op's location after its ATen op (fx_locations.py).
_NAMED_LOC = re.compile(r'"((?:[^"\\]|\\.)*)"\(')

SEVERITIES = ("error", "warning", "note", "remark")


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


def source_loc(loc: ir.Location | str | None) -> SourceLoc | None:
    """The first file:line:col inside an MLIR location (file, name, callsite or fused),
    or None for `unknown` locations."""
    if loc is None:
        return None
    match = _FILE_LOC.search(str(loc))
    if match is None:
        return None
    return SourceLoc(match.group(1), int(match.group(2)), int(match.group(3)))


def location_name(loc: ir.Location | str | None) -> str | None:
    """The name of the first name location (with a child) inside an MLIR location:
    the ATen op for locations the importer made, so a diagnostic can be traced back to
    the FX node that produced the op."""
    if loc is None:
        return None
    match = _NAMED_LOC.search(str(loc))
    return match.group(1) if match else None


@dataclass
class Diagnostic:
    severity: str
    message: str
    loc: SourceLoc | None = None
    notes: list["Diagnostic"] = field(default_factory=list)
    # The op named by the location (`location_name`), when it has one. Not printed:
    # callers that map diagnostics back to FX nodes read it (torch_tpu/backend/_recovery.py).
    op: str | None = field(default=None, compare=False)

    def format(self, file: str | None = None) -> str:
        """`file:line:col: severity: message`, then the notes. A diagnostic without a
        location prints as `file: severity: message` when `file` (the input being
        processed) is given, as LLVM tools print file-level diagnostics."""
        if self.loc:
            prefix = f"{self.loc}: "
        else:
            prefix = f"{file}: " if file else ""
        lines = [f"{prefix}{self.severity}: {self.message}"]
        lines.extend(note.format(file) for note in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _severity_name(severity: object) -> str:
    name = str(severity).rsplit(".", 1)[-1].lower()
    return name if name in SEVERITIES else "error"


def from_mlir(diag: object) -> Diagnostic:
    """Converts an `ir.Diagnostic` or `ir.DiagnosticInfo` (from `MLIRError`)."""
    return Diagnostic(
        severity=_severity_name(getattr(diag, "severity", "error")),
        message=str(getattr(diag, "message", diag)),
        loc=source_loc(getattr(diag, "location", None)),
        notes=[from_mlir(n) for n in getattr(diag, "notes", ())],
        op=location_name(getattr(diag, "location", None)),
    )


class DiagnosticEngine:
    """Collects diagnostics for one compilation. Attach it to a context with `with
    engine.capture(ctx):` to also receive the diagnostics MLIR emits."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    # -- emitting ------------------------------------------------------------------
    def emit(
        self,
        severity: str,
        loc: ir.Location | SourceLoc | None,
        message: str,
        notes: Iterable[tuple[ir.Location | SourceLoc | None, str]] = (),
    ) -> Diagnostic:
        assert severity in SEVERITIES, severity
        diag = Diagnostic(
            severity,
            message,
            loc if isinstance(loc, SourceLoc) or loc is None else source_loc(loc),
            [
                Diagnostic("note", msg, l if isinstance(l, SourceLoc) or l is None else source_loc(l))
                for l, msg in notes
            ],
            op=None if isinstance(loc, SourceLoc) else location_name(loc),
        )
        self.diagnostics.append(diag)
        return diag

    def error(self, loc, message: str, notes=()) -> Diagnostic:
        return self.emit("error", loc, message, notes)

    def warning(self, loc, message: str, notes=()) -> Diagnostic:
        return self.emit("warning", loc, message, notes)

    def remark(self, loc, message: str, notes=()) -> Diagnostic:
        return self.emit("remark", loc, message, notes)

    def extend_from_mlir_error(self, err: ir.MLIRError) -> None:
        diags = getattr(err, "error_diagnostics", None) or []
        if not diags:
            self.diagnostics.append(Diagnostic("error", str(err)))
        for d in diags:
            self.diagnostics.append(from_mlir(d))

    # -- capturing MLIR's own diagnostics -------------------------------------------
    def capture(self, ctx: ir.Context) -> "_Capture":
        return _Capture(self, ctx)

    # -- queries -------------------------------------------------------------------
    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)

    def clear(self) -> None:
        self.diagnostics.clear()

    def format(self) -> str:
        return "\n".join(d.format() for d in self.diagnostics)


class _Capture:
    def __init__(self, engine: DiagnosticEngine, ctx: ir.Context) -> None:
        self._engine = engine
        self._ctx = ctx
        self._handler = None

    def _on_diagnostic(self, diag: ir.Diagnostic) -> bool:
        self._engine.diagnostics.append(from_mlir(diag))
        return True  # handled: MLIR must not also print it to stderr

    def __enter__(self) -> DiagnosticEngine:
        self._handler = self._ctx.attach_diagnostic_handler(self._on_diagnostic)
        return self._engine

    def __exit__(self, *exc) -> None:
        if self._handler is not None:
            self._handler.detach()
            self._handler = None


class CompilationError(Exception):
    """Raised by library entry points when compilation produced error diagnostics. The
    message is the formatted diagnostics, ready to show a user."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(d.format() for d in self.diagnostics) or "compilation failed")
