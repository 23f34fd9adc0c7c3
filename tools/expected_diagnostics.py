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


def parse_expectations(text: str, first_line: int = 1) -> tuple[list[Expectation], list[str]]:
    """Returns the expectations of `text` (whose first line is `first_line` of the file)
    and problems with the annotations themselves."""
    expectations: list[Expectation] = []
    problems: list[str] = []
    pending_below: list[Expectation] = []
    last_plain_line: int | None = None
    for offset, line_text in enumerate(text.split("\n")):
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
                    problems.append(f"{line}:{match.start() + 1}: expected-{severity}@above has no line above it")
                    continue
                exp.line = last_plain_line
            elif designator is not None:
                exp.line = line + int(designator)
            expectations.append(exp)
    for exp in pending_below:
        problems.append(f"{exp.written_at}:{exp.column}: expected-{exp.severity}@below has no line below it")
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
    errors = [f"{source_name}:{p}: error: malformed diagnostic annotation" for p in problems]
    for diag in _flatten(diagnostics):
        line = diag.loc.line if diag.loc and diag.loc.file == source_name else None
        match = next(
            (
                e
                for e in expectations
                if e.severity == diag.severity and e.line == line and e.message in diag.message
            ),
            None,
        )
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
