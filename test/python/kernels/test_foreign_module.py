"""compiler/importer/foreign_module.py rejects what cannot work inside our program with
a message naming the module (`where`) and what to do; the merged module verifies."""

import pytest

from torch_tpu.compiler.context import func, ir, make_context
from torch_tpu.compiler.importer.foreign_module import ForeignModuleError, call_foreign_module


def _call(source: str, shape=(4, 8)):
    """@main(f32[shape]) -> the foreign module's results; returns the printed module."""
    with make_context(), ir.Location.unknown():
        module = ir.Module.create()
        t = ir.RankedTensorType.get(list(shape), ir.F32Type.get())
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("main", ir.FunctionType.get([t], []))
        block = fn.body.blocks.append(t)
        with ir.InsertionPoint(block):
            results = call_foreign_module(source, list(block.arguments), "ext", where="kernel 'k'")
            func.ReturnOp(results)
        fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([t], [r.type for r in results]))
        module.operation.verify()
        return str(module)


def _assertion(predicate: str) -> str:
    return f"""
func.func public @main(%arg0: tensor<?x8xf32>) -> tensor<?x8xf32> {{
  %d = stablehlo.get_dimension_size %arg0, dim = 0 : (tensor<?x8xf32>) -> tensor<i32>
  %c = stablehlo.constant dense<4> : tensor<i32>
  %ok = stablehlo.compare {predicate}, %d, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
  stablehlo.custom_call @shape_assertion(%ok, %d) {{error_message = "rows must be 4, got {{0}}", has_side_effect = true}} : (tensor<i1>, tensor<i32>) -> ()
  return %arg0 : tensor<?x8xf32>
}}"""


def test_true_shape_assertion_is_removed():
    text = _call(_assertion("EQ"))
    assert "shape_assertion" not in text
    assert "func.func private @ext.main(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32>" in text


def test_false_shape_assertion_is_an_error_with_jax_message():
    with pytest.raises(ForeignModuleError, match=r"kernel 'k': a shape assertion fails .*rows must be 4"):
        _call(_assertion("NE"))


def test_run_time_shape_assertion_is_an_error():
    source = """
func.func public @main(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%arg0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<f32>
  %ok = stablehlo.compare GT, %s, %z, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
  stablehlo.custom_call @shape_assertion(%ok) {error_message = "positive", has_side_effect = true} : (tensor<i1>) -> ()
  return %arg0 : tensor<4x8xf32>
}"""
    with pytest.raises(ForeignModuleError, match="depends on run-time values .*static shapes"):
        _call(source)


@pytest.mark.parametrize(
    "source, message",
    [
        ("func.func public @other(%a: tensor<4x8xf32>) -> tensor<4x8xf32> { return %a : tensor<4x8xf32> }",
         r"no function @main \(it has \['other'\]\)"),
        ("func.func public @main(%a: tensor<4x8xf32>, %t: !stablehlo.token) -> tensor<4x8xf32> { return %a : tensor<4x8xf32> }",
         "tokens"),
        ("func.func public @main(%a: tensor<4x9xf32>) -> tensor<4x9xf32> { return %a : tensor<4x9xf32> }",
         r"argument 0 of the module's entry is tensor<4x9xf32>, the call passes tensor<4x8xf32>"),
        ("func.func public @main(%a: tensor<4x8xf32>) -> tensor<?xf32> {\n"
         "  %n = stablehlo.constant dense<[32]> : tensor<1xi32>\n"
         "  %r = stablehlo.dynamic_reshape %a, %n : (tensor<4x8xf32>, tensor<1xi32>) -> tensor<?xf32>\n"
         "  return %r : tensor<?xf32> }", None),
        ("sdy.mesh @mesh = <[\"x\"=1]>\nfunc.func public @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> { return %a : tensor<4x8xf32> }",
         "top-level 'sdy.mesh' is not supported"),
        ("func.func public @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> { return %b : tensor<4x8xf32> }",
         "does not parse"),
        ("", "the module is empty"),
    ],
    ids=["no-entry", "tokens", "wrong-type", "refined-result", "sdy-mesh", "parse-error", "empty"],
)
def test_rejected_modules(source, message):
    if message is None:
        # A result whose shape a constant determines is refined to a static one.
        assert "-> tensor<32xf32>" in _call(source)
        return
    with pytest.raises(ForeignModuleError, match=f"^kernel 'k': .*{message}"):
        _call(source)


def test_jax_export_artifact_with_symbolic_shapes():
    """A `jax.export` portable artifact (VHLO bytecode) with a symbolic batch size: the
    entry is specialised to the call, jax's real shape assertions hold and are removed;
    shapes that break them (b >= 1 fails for 0 rows) are an error quoting jax."""
    jax = pytest.importorskip("jax")
    from jax import export

    b = export.symbolic_shape("b")
    exported = export.export(jax.jit(lambda x: jax.numpy.sin(x) * 2))(jax.ShapeDtypeStruct((b[0], 8), "float32"))
    text = _call(exported.mlir_module_serialized)
    assert "func.func private @ext.main(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32>" in text
    assert "shape_assertion" not in text and "jax." not in text.replace("@ext.", "@")
    with pytest.raises(ForeignModuleError, match="a shape assertion fails .*Expected value >= 1 for dimension variable 'b'"):
        _call(exported.mlir_module_serialized, shape=(0, 8))
