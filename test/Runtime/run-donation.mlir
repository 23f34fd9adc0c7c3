// RUN: torchtpu-run %s --input-literal '4xf32=1,2,3,4' --input-literal '4xf32=10' | FileCheck %s
// RUN: torchtpu-run %s --donate 1 --input-literal '4xf32=1,2,3,4' --input-literal '4xf32=10' | FileCheck %s

// An argument the module aliases to an output (tf.aliasing_output), or one donated with
// --donate, is consumed by the run; the result is the same.

// CHECK:      result[0]: tensor<4xf32>
// CHECK-NEXT: [11, 12, 13, 14]

module @accumulate {
  func.func public @main(%acc: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %acc, %x : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
