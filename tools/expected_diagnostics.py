"""`--verify-diagnostics`: MLIR's `expected-error {{...}}` annotations, checked against
the diagnostics a run produced.

Designators: none (same line), `@above` / `@below` (the previous / next line that holds
no designator), `@+N` / `@-N` (relative lines) and `@unknown` (no location)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch_tpu.compiler.diagnostics import Diagnostic, SourceLoc

_EXPECTED = re.compile(
    r"expected-(error|warning|note|remark) *(?:@(above|below|unknown|[+-]\d+))? *\{\{(.*?)\}\}"
)


@dataclass
class Expectation:
    severity: str
    line: int | None  # None: @unknown
    message: str
    written_at: int  # line of the annotation
    column: int
    matched: bool = False


@dataclass(frozen=True)
class AnnotationProblem:
    """An annotation that cannot be checked (e.g. `@below` on the last line)."""

    line: int
    column: int
    message: str


def parse_expectations(
    text: str, first_line: int = 1
) -> tuple[list[Expectation], list[AnnotationProblem]]:
    """Returns the expectations of `text` (whose first line is `first_line` of the file)
    and problems with the annotations themselves."""
    expectations: list[Expectation] = []
    problems: list[AnnotationProblem] = []
    pending_below: list[Expectation] = []
    last_plain_line: int | None = None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line does not start another
    for offset, line_text in enumerate(lines):
        line = first_line + offset
        matches = list(_EXPECTED.finditer(line_text))
        if not matches:
            # As in MLIR: any line without an annotation (blank or comment included)
            # takes the pending @below expectations and is the target of later @above.
            for exp in pending_below:
                exp.line = line
            pending_below.clear()
            last_plain_line = line
            continue
        for match in matches:
            severity, designator, message = match.group(1), match.group(2), match.group(3)
            exp = Expectation(severity, line, message, line, match.start() + 1)
            if designator == "unknown":
                exp.line = None
            elif designator == "below":
                pending_below.append(exp)
            elif designator == "above":
                if last_plain_line is None:
                    problems.append(AnnotationProblem(
                        line, match.start() + 1, f"expected-{severity}@above has no line above it"))
                    continue
                exp.line = last_plain_line
            elif designator is not None:
                exp.line = line + int(designator)
            expectations.append(exp)
    for exp in pending_below:
        problems.append(AnnotationProblem(
            exp.written_at, exp.column, f"expected-{exp.severity}@below has no line below it"))
        expectations.remove(exp)
    return expectations, problems


def _flatten(diags: list[Diagnostic]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for d in diags:
        out.append(d)
        for note in d.notes:
            out.append(note if note.loc else Diagnostic(note.severity, note.message, d.loc))
    return out


def check(
    source_name: str, text: str, first_line: int, diagnostics: list[Diagnostic]
) -> list[str]:
    """Compares diagnostics to the annotations in `text`. Returns error lines in MLIR's
    format; empty when everything matched."""
    expectations, problems = parse_expectations(text, first_line)
    errors = [
        f"{SourceLoc(source_name, p.line, p.column)}: error: malformed diagnostic annotation: {p.message}"
        for p in problems
    ]
    for diag in _flatten(diagnostics):
        line = diag.loc.line if diag.loc and diag.loc.file == source_name else None
        candidates = [
            e
            for e in expectations
            if e.severity == diag.severity and e.line == line and e.message in diag.message
        ]
        # Each expectation takes one diagnostic; as in MLIR, a repeated identical
        # diagnostic may still match an expectation already used.
        match = next((e for e in candidates if not e.matched), candidates[0] if candidates else None)
        if match is None:
            where = f"{diag.loc}: " if diag.loc else f"{source_name}: "
            errors.append(f"{where}error: unexpected {diag.severity}: {diag.message}")
        else:
            match.matched = True
    for exp in expectations:
        if not exp.matched:
            loc = SourceLoc(source_name, exp.written_at, exp.column)
            errors.append(f'{loc}: error: expected {exp.severity} "{exp.message}" was not produced')
    return errors
