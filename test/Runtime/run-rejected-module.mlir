// RUN: not torchtpu-run %s --input-literal '2xf32=1' 2>&1 | FileCheck %s

// A module XLA rejects: the parser's located error, once, on one line.

// CHECK:     run-rejected-module.mlir:13:12: error: use of undeclared SSA value name
// CHECK-NOT: Failed to parse
// CHECK-NOT: Traceback
// CHECK-NOT: {{.}}

module @broken {
  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
    %0 = stablehlo.add %a, %a : tensor<2xf32>
    return %1 : tensor<2xf32>
  }
}
