// RUN: torchtpu-opt %s --emit-bytecode -o %t.mlirbc
// RUN: torchtpu-run %t.mlirbc --input-literal 'i32=20' | FileCheck %s

// MLIR bytecode runs like text.

// CHECK:      result[0]: tensor<i32>
// CHECK-NEXT: 42

module @twice_plus_two {
  func.func public @main(%a: tensor<i32>) -> tensor<i32> {
    %two = stablehlo.constant dense<2> : tensor<i32>
    %0 = stablehlo.add %a, %a : tensor<i32>
    %1 = stablehlo.add %0, %two : tensor<i32>
    return %1 : tensor<i32>
  }
}
