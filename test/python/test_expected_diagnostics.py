"""`--verify-diagnostics` annotations (tools/expected_diagnostics.py): where each
designator points, and how diagnostics are matched against them."""

from __future__ import annotations

from torch_tpu.compiler.diagnostics import Diagnostic, SourceLoc
from torch_tpu.tools.expected_diagnostics import check, parse_expectations


def targets(text: str, first_line: int = 1) -> list[tuple[str, int | None, str]]:
    expectations, problems = parse_expectations(text, first_line)
    assert problems == []
    return [(e.severity, e.line, e.message) for e in expectations]


def test_designators() -> None:
    text = "\n".join([
        "op  // expected-error {{same line}}",           # 1
        "// expected-warning @below {{below}}",          # 2
        "op",                                            # 3
        "// expected-note @above {{above}}",             # 4
        "// expected-remark @+2 {{plus two}}",           # 5
        "op",                                            # 6
        "op",                                            # 7
        "// expected-error @-6 {{minus six}}",           # 8
        "// expected-error @unknown {{nowhere}}",        # 9
    ])
    assert targets(text) == [
        ("error", 1, "same line"),
        ("warning", 3, "below"),
        ("note", 3, "above"),
        ("remark", 7, "plus two"),
        ("error", 2, "minus six"),
        ("error", None, "nowhere"),
    ]


def test_below_skips_annotation_lines_and_above_skips_them_too() -> None:
    text = "\n".join([
        "op",                                    # 1
        "// expected-error @below {{a}}",        # 2
        "// expected-error @below {{b}}",        # 3
        "target",                                # 4
        "// expected-error @above {{c}}",        # 5
        "// expected-error @above {{d}}",        # 6
    ])
    assert targets(text) == [("error", 4, "a"), ("error", 4, "b"), ("error", 4, "c"), ("error", 4, "d")]


def test_several_annotations_on_one_line_and_braces_in_messages() -> None:
    text = "op // expected-error {{one}} expected-note {{two {nested} }}"
    assert targets(text) == [("error", 1, "one"), ("note", 1, "two {nested} ")]


def test_first_line_offsets_every_target() -> None:
    assert targets("\n// expected-error @below {{x}}\nop", first_line=10) == [("error", 12, "x")]


def test_malformed_annotations_are_problems() -> None:
    expectations, problems = parse_expectations("// expected-error @above {{nothing above}}")
    assert expectations == []
    assert [(p.line, p.column, p.message) for p in problems] == [
        (1, 4, "expected-error@above has no line above it")
    ]
    expectations, problems = parse_expectations("op\n  // expected-note @below {{nothing below}}\n")
    assert expectations == []
    assert [(p.line, p.column, p.message) for p in problems] == [
        (2, 6, "expected-note@below has no line below it")
    ]


def d(severity: str, line: int | None, message: str, notes=(), file: str = "t.mlir") -> Diagnostic:
    return Diagnostic(severity, message, SourceLoc(file, line, 5) if line else None, list(notes))


def test_matching_diagnostics_pass() -> None:
    text = "op // expected-error {{bad op}}\n// expected-note @-1 {{see}}\nx // expected-error @unknown {{lost}}"
    diags = [d("error", 1, "'x.y' op bad op here", notes=[d("note", 1, "see this")]), d("error", None, "lost it")]
    assert check("t.mlir", text, 1, diags) == []


def test_unexpected_and_missing_diagnostics_are_reported_with_locations() -> None:
    text = "op\nop // expected-error {{wanted}}"
    errors = check("t.mlir", text, 1, [d("error", 1, "surprise")])
    assert errors == [
        "t.mlir:1:5: error: unexpected error: surprise",
        't.mlir:2:7: error: expected error "wanted" was not produced',
    ]


def test_severity_line_and_text_must_all_match() -> None:
    text = "op // expected-warning {{careful}}"
    assert check("t.mlir", text, 1, [d("error", 1, "careful")]) == [
        "t.mlir:1:5: error: unexpected error: careful",
        't.mlir:1:7: error: expected warning "careful" was not produced',
    ]
    assert len(check("t.mlir", text, 1, [d("warning", 2, "careful")])) == 2
    assert len(check("t.mlir", text, 1, [d("warning", 1, "careless")])) == 2
    # The expected text is a substring of the message.
    assert check("t.mlir", text, 1, [d("warning", 1, "be careful here")]) == []


def test_each_expectation_takes_one_diagnostic_first() -> None:
    text = "op // expected-error {{dup}} expected-error {{dup}}"
    assert check("t.mlir", text, 1, [d("error", 1, "dup"), d("error", 1, "dup")]) == []
    # One expectation for a diagnostic repeated on its line is accepted, as in MLIR.
    assert check("t.mlir", "op // expected-error {{dup}}", 1, [d("error", 1, "dup")] * 2) == []
    # But two expectations need two diagnostics.
    assert check("t.mlir", text, 1, [d("error", 1, "dup")]) == [
        't.mlir:1:30: error: expected error "dup" was not produced'
    ]


def test_diagnostics_in_other_files_only_match_unknown() -> None:
    text = "op // expected-error @unknown {{elsewhere}}"
    assert check("t.mlir", text, 1, [d("error", 1, "elsewhere", file="model.py")]) == []
    assert check("t.mlir", "op // expected-error {{elsewhere}}", 1,
                 [d("error", 1, "elsewhere", file="model.py")]) != []


def test_malformed_annotation_fails_the_check() -> None:
    errors = check("t.mlir", "// expected-error @above {{x}}", 1, [])
    assert errors == ["t.mlir:1:4: error: malformed diagnostic annotation: expected-error@above has no line above it"]
