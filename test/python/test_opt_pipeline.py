"""The textual pass-pipeline parser and builder (compiler/pipeline.py) and the pass
option syntax (compiler/passes/base.py) behind torchtpu-opt."""

from __future__ import annotations

import pytest
from torch_tpu.compiler.context import ir, make_context
from torch_tpu.compiler.diagnostics import DiagnosticEngine
from torch_tpu.compiler.passes import PASS_REGISTRY, Option, Pass, PassOptionError, register_pass
from torch_tpu.compiler.passes.base import matching_brace, split_options
from torch_tpu.compiler.passes.set_precision import SetPrecisionPass
from torch_tpu.compiler.pipeline import (
    Element,
    PipelineError,
    build_pass_manager,
    parse_pipeline,
    run_pipeline,
)


def shape(elements: list[Element]) -> list:
    """A compact view: name, name{opts} or (name, [children])."""
    out = []
    for e in elements:
        label = e.name + ("{" + e.options + "}" if e.options is not None else "")
        out.append((label, shape(e.children)) if e.children is not None else label)
    return out


# -- parsing --------------------------------------------------------------------------
def test_flat_list_and_builtin_module_wrapper_are_the_same() -> None:
    assert shape(parse_pipeline("cse,canonicalize")) == ["cse", "canonicalize"]
    assert shape(parse_pipeline("builtin.module(cse,canonicalize)")) == ["cse", "canonicalize"]
    assert parse_pipeline("builtin.module()") == []


def test_nested_pipelines() -> None:
    text = "builtin.module(torchtpu-verify,func.func(cse,chlo-legalize-to-stablehlo),builtin.module(func.func(canonicalize)))"
    assert shape(parse_pipeline(text)) == [
        "torchtpu-verify",
        ("func.func", ["cse", "chlo-legalize-to-stablehlo"]),
        ("builtin.module", [("func.func", ["canonicalize"])]),
    ]


def test_whitespace_between_elements() -> None:
    assert shape(parse_pipeline(" builtin.module( cse ,\n func.func( canonicalize ) ) ")) == [
        "cse",
        ("func.func", ["canonicalize"]),
    ]


def test_options_keep_quotes_and_nested_braces() -> None:
    (element,) = parse_pipeline('p{a="x }, y" b={c={d}} e=\'q{\'}')
    assert element.options == 'a="x }, y" b={c={d}} e=\'q{\''
    assert element.text() == 'p{a="x }, y" b={c={d}} e=\'q{\'}'


def test_columns_point_at_each_element() -> None:
    elements = parse_pipeline("builtin.module(cse, func.func(canonicalize),x)")
    assert [e.column for e in elements] == [16, 21, 45]
    assert elements[1].children[0].column == 31


@pytest.mark.parametrize(
    "text, message, column",
    [
        ("builtin.module(cse", "expected ')' to close 'builtin.module('", 19),
        ("cse,,canonicalize", "expected a pass or operation name, found ','", 5),
        ("cse,", "expected a pass or operation name, found 'end of pipeline'", 5),
        ("cse)", "unexpected ')' in pass pipeline", 4),
        ("func.func(cse))", "unexpected ')' in pass pipeline", 15),
        ("p{a=1", "unbalanced '{' in the options of 'p'", 2),
        ('p{a="}', "unbalanced '{' in the options of 'p'", 2),
        ("cse canonicalize", "unexpected 'c' in pass pipeline", 5),
        ("(cse)", "expected a pass or operation name, found '('", 1),
    ],
)
def test_syntax_errors_name_the_column(text: str, message: str, column: int) -> None:
    with pytest.raises(PipelineError) as info:
        parse_pipeline(text)
    assert info.value.column == column
    assert str(info.value) == f"{message} (at column {column})"


# -- pass options -----------------------------------------------------------------------
def test_split_options() -> None:
    assert split_options('a=1 b="x y" c={k=v w={z}} d=\'p q\' flag') == [
        ("a", "1"), ("b", "x y"), ("c", "k=v w={z}"), ("d", "p q"), ("flag", None),
    ]
    assert split_options("   ") == []
    with pytest.raises(PassOptionError, match="unterminated quote"):
        split_options('a="x')
    with pytest.raises(PassOptionError, match="unbalanced"):
        split_options("a={x")


def test_matching_brace_skips_quotes() -> None:
    assert matching_brace("{a}", 0) == 2
    assert matching_brace('{a="}"}', 0) == 6
    assert matching_brace("{{}", 0) == -1


def test_option_values_are_typed_and_checked() -> None:
    p = SetPrecisionPass.from_option_string("mode=high override=1")
    assert (p.mode, p.override) == ("high", True)
    p = SetPrecisionPass.from_option_string("override")  # a bare bool flag means true
    assert (p.mode, p.override) == ("medium", True)
    with pytest.raises(PassOptionError, match="option 'mode' must be one of medium, high, highest; got 'low'"):
        SetPrecisionPass.from_option_string("mode=low")
    with pytest.raises(PassOptionError, match="option 'override' expects true or false, got 'maybe'"):
        SetPrecisionPass.from_option_string("override=maybe")
    with pytest.raises(PassOptionError, match="unknown option 'fast'; available: mode, override"):
        SetPrecisionPass.from_option_string("fast=1")
    with pytest.raises(PassOptionError, match="option 'mode' needs a value"):
        SetPrecisionPass.from_option_string("mode")


def test_int_and_float_options() -> None:
    class Numbers(Pass):
        argument = "test-numbers"
        summary = "numbers"
        options = (Option("n", int, 3, "count"), Option("x", float, 0.5, "ratio"))

    p = Numbers.from_option_string("n=7 x=2.5")
    assert (p.n, p.x) == (7, 2.5)
    with pytest.raises(PassOptionError, match="option 'n' expects an integer, got '7.5'"):
        Numbers.from_option_string("n=7.5")
    with pytest.raises(PassOptionError, match="option 'x' expects a number, got 'big'"):
        Numbers.from_option_string("x=big")


# -- building and running -------------------------------------------------------------
MODULE = """
func.func @f(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.dot %a, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %1 = stablehlo.dot %a, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %2 = stablehlo.add %0, %1 : tensor<2x2xf32>
  return %2 : tensor<2x2xf32>
}
func.func @g(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = chlo.broadcast_add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


@pytest.fixture
def module():
    ctx = make_context()
    with ctx:
        yield ir.Module.parse(MODULE, ctx).operation


def test_mixed_pipeline_runs_python_and_upstream_passes(module) -> None:
    engine = DiagnosticEngine()
    ok = run_pipeline(
        module,
        "builtin.module(torchtpu-verify,canonicalize,func.func(cse),"
        "torchtpu-set-precision{mode=highest},chlo-legalize-to-stablehlo)",
        engine,
    )
    assert ok, engine.format()
    text = str(module)
    assert text.count("stablehlo.dot") == 1  # cse merged the two dots
    assert "precision = [HIGHEST, HIGHEST]" in text
    assert "chlo." not in text  # nested under func.func automatically


def test_python_pass_inside_a_nest_runs_on_each_anchor_op(module) -> None:
    engine = DiagnosticEngine()
    assert run_pipeline(module, "func.func(cse,torchtpu-set-precision{mode=high},canonicalize)", engine)
    assert "precision = [HIGH, HIGH]" in str(module)


def test_builder_reports_unknown_passes_and_bad_options_with_columns(module) -> None:
    engine = DiagnosticEngine()
    with pytest.raises(PipelineError) as info:
        build_pass_manager(parse_pipeline("cse,func.func(no-such-pass)"), module.context, engine)
    assert info.value.column == 15
    assert "'no-such-pass' does not refer to a registered pass" in str(info.value)
    assert "--list-passes" in str(info.value)
    with pytest.raises(PipelineError) as info:
        build_pass_manager(parse_pipeline("cse, torchtpu-set-precision{mode=x}"), module.context, engine)
    assert info.value.column == 6
    assert "torchtpu-set-precision: option 'mode' must be one of" in str(info.value)


def test_exception_in_a_pass_is_a_located_internal_error(module) -> None:
    @register_pass
    class Broken(Pass):
        argument = "test-broken-pass"
        summary = "raises"

        def run(self, op: ir.Operation) -> None:
            raise KeyError("boom")

    try:
        engine = DiagnosticEngine()
        assert not run_pipeline(module, "test-broken-pass,canonicalize", engine)
        (error,) = engine.errors
        assert error.message.startswith("test-broken-pass: internal error: KeyError: 'boom'")
        assert error.loc is not None  # the module's location
    finally:
        PASS_REGISTRY.pop("test-broken-pass")


def test_pass_errors_fail_the_pipeline_with_the_pass_name(module) -> None:
    @register_pass
    class Reject(Pass):
        argument = "test-reject-dots"
        summary = "rejects dots"

        def run(self, op: ir.Operation) -> None:
            def visit(inner):
                if inner.operation.name == "stablehlo.dot":
                    self.error(inner, "no dots here")
                return ir.WalkResult.ADVANCE

            op.walk(visit)

    try:
        engine = DiagnosticEngine()
        assert not run_pipeline(module, "test-reject-dots,canonicalize", engine)
        assert [str(e.loc.line) for e in engine.errors] == ["3", "4"]
        assert all(e.message == "test-reject-dots: no dots here" for e in engine.errors)
    finally:
        PASS_REGISTRY.pop("test-reject-dots")


def test_diagnostics_keep_the_op_named_by_the_location() -> None:
    """Locations the importer makes name the ATen op around the user's line; diagnostics
    keep that name (`Diagnostic.op`), so the frontend can map a failure back to the FX node
    (torch_tpu/backend/_recovery.py). A plain file location has none."""
    source = """
    func.func @f(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
      %0 = stablehlo.dot %a, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32> loc("aten.mm.default"("model.py":12:1))
      %1 = stablehlo.dot %0, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32> loc("model.py":13:1)
      return %1 : tensor<2x2xf32>
    }
    """

    @register_pass
    class Reject(Pass):
        argument = "test-reject-named-dots"
        summary = "rejects dots"

        def run(self, op: ir.Operation) -> None:
            def visit(inner):
                if inner.operation.name == "stablehlo.dot":
                    self.error(inner, "no dots here")
                return ir.WalkResult.ADVANCE

            op.walk(visit)

    try:
        with make_context() as ctx:
            module = ir.Module.parse(source, ctx).operation
            engine = DiagnosticEngine()
            assert not run_pipeline(module, "test-reject-named-dots", engine)
        assert [(e.op, str(e.loc)) for e in engine.errors] == [
            ("aten.mm.default", "model.py:12:1"),
            (None, "model.py:13:1"),
        ]
    finally:
        PASS_REGISTRY.pop("test-reject-named-dots")


def test_torchtpu_opt_on_a_mlir_file_does_not_import_torch(tmp_path):
    """Passes load when a pipeline names them; the dialect and the passes a plain
    pipeline runs need no torch (start-up: bench/tool_startup.py)."""
    import subprocess
    import sys

    path = tmp_path / "f.mlir"
    path.write_text(
        "func.func @f(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {\n"
        "  %0 = stablehlo.dot %a, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>\n"
        "  return %0 : tensor<2x2xf32>\n}\n"
    )
    code = (
        "import sys\nfrom torch_tpu.tools import opt\n"
        f"rc = opt.main([{str(path)!r}, '--torchtpu-compile-pipeline=precision=high', '--torchtpu-inline', "
        "'--torchtpu-insert-collectives', '-o', '/dev/null'])\n"
        "print(rc, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0 []", done.stdout


@pytest.mark.parametrize("argv", [["torch_tpu.tools.opt", "--help"], ["torch_tpu.tools.opt", "--list-passes"],
                                  ["torch_tpu.tools.run", "{mlir}"]])
def test_tools_that_need_no_graph_import_no_torch(tmp_path, argv):
    """`torchtpu-opt --help` lists every pass, the view passes included, whose code uses
    torch; `torchtpu-run file.mlir` asks whether its input is a saved export. Neither may
    load torch (3 s against 0.3 s): the view passes bind torch on their first run, and the
    saved-export check reads the folder only (`_saved_export_format`)."""
    import subprocess
    import sys

    path = tmp_path / "f.mlir"
    path.write_text(
        "func.func @main() -> tensor<2xf32> {\n"
        "  %0 = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>\n"
        "  return %0 : tensor<2xf32>\n}\n"
    )
    module, *args = [a.format(mlir=path) for a in argv]
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['tool', *{args!r}]\n"
        "try:\n"
        f"    runpy.run_module({module!r}, run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "print('torch loaded:', sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch loaded: []" in done.stdout, done.stdout[-2000:]
    if "--help" in args or "--list-passes" in args:
        assert "torchtpu-decompose-views" in done.stdout and "torchtpu-inverse-views" in done.stdout


def test_every_declared_pass_module_registers_its_pass():
    import importlib

    from torch_tpu.compiler import passes

    for argument, module in passes._PASS_MODULES.items():
        importlib.import_module(f"torch_tpu.compiler.passes.{module}")
        assert PASS_REGISTRY[argument].argument == argument
