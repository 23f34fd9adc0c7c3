# RUN: %PYTHON %s | FileCheck %s
# compiler/importer/foreign_module.py: a foreign StableHLO module (as jax lowers one)
# merged into ours as private functions, renamed, specialised to the call's operand
# types, its entry attributes and shape assertions gone. Each case prints its name,
# then the module.

from torch_tpu.compiler.context import func, ir, make_context, stablehlo
from torch_tpu.compiler.importer.foreign_module import call_foreign_module

JAX_STYLE = """
module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<?x8xf32> {mhlo.sharding = "{replicated}"}, %arg1: tensor<8x3xf32>)
      -> (tensor<?x3xf32> {jax.result_info = "result[0]"}) {
    %c = stablehlo.constant dense<8> : tensor<i32>
    %d = stablehlo.get_dimension_size %arg1, dim = 0 : (tensor<8x3xf32>) -> tensor<i32>
    %ok = stablehlo.compare EQ, %d, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.custom_call @shape_assertion(%ok, %d) {error_message = "dim 0 must be 8, got {0}", has_side_effect = true} : (tensor<i1>, tensor<i32>) -> ()
    %0 = call @helper(%arg0) : (tensor<?x8xf32>) -> tensor<?x8xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<?x8xf32>, tensor<8x3xf32>) -> tensor<?x3xf32>
    return %1 : tensor<?x3xf32>
  }
  func.func private @helper(%arg0: tensor<?x8xf32>) -> tensor<?x8xf32> {
    %0 = stablehlo.sine %arg0 : tensor<?x8xf32>
    return %0 : tensor<?x8xf32>
  }
}
"""


def build(name, sources_and_prefixes, rows=4):
    """@main(rows x 8, 8 x 3) calling each foreign module in turn, results added."""
    print(name)
    with make_context(), ir.Location.unknown():
        module = ir.Module.create()
        f32 = ir.F32Type.get()
        a, b = ir.RankedTensorType.get([rows, 8], f32), ir.RankedTensorType.get([8, 3], f32)
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("main", ir.FunctionType.get([a, b], []))
        block = fn.body.blocks.append(a, b)
        with ir.InsertionPoint(block):
            results = [call_foreign_module(src, list(block.arguments), prefix)[0] for src, prefix in sources_and_prefixes]
            total = results[0]
            for r in results[1:]:
                total = stablehlo.AddOp(total, r).result
            func.ReturnOp([total])
        fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([a, b], [total.type]))
        module.operation.verify()
        print(module)


# The entry and its helper are renamed under the prefix and private; the entry is
# specialised to 4x8 (the helper too, through the call); the shape assertion (true for
# these shapes) and jax's argument/result attributes are gone. Merged once, called twice.
# CHECK-LABEL: test_merge_specialise
# CHECK:       func.func @main(%{{.*}}: tensor<4x8xf32>, %{{.*}}: tensor<8x3xf32>) -> tensor<4x3xf32>
# CHECK:         call @jax.f.main(%{{.*}}) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
# CHECK:         call @jax.f.main(
# CHECK:       func.func private @jax.f.main(%{{.*}}: tensor<4x8xf32>, %{{.*}}: tensor<8x3xf32>) -> tensor<4x3xf32>
# CHECK-NOT:     stablehlo.constant
# CHECK-NOT:     shape_assertion
# CHECK:         call @jax.f.helper(%{{.*}}) : (tensor<4x8xf32>) -> tensor<4x8xf32>
# CHECK:       func.func private @jax.f.helper(%{{.*}}: tensor<4x8xf32>) -> tensor<4x8xf32>
# CHECK-NOT:   func.func private @jax.f.main
# CHECK-NOT:   jax.result_info
# CHECK-NOT:   mhlo.sharding
build("test_merge_specialise", [(JAX_STYLE, "jax.f"), (JAX_STYLE, "jax.f")])

# Two modules with the same symbols under two prefixes do not clash.
# CHECK-LABEL: test_two_prefixes
# CHECK-DAG:   func.func private @jax.a.main
# CHECK-DAG:   func.func private @jax.a.helper
# CHECK-DAG:   func.func private @jax.b.main
# CHECK-DAG:   func.func private @jax.b.helper
build("test_two_prefixes", [(JAX_STYLE, "jax.a"), (JAX_STYLE, "jax.b")], rows=2)
