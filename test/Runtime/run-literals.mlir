// RUN: torchtpu-run %s --input-literal '2x3xf32=1,2,3,4,5,6' --input-literal '2x3xf32=0.5' | FileCheck %s
// RUN: torchtpu-run %s --input-literal '2x3xf32=1,2,3,4,5,6' --input-literal '2x3xf32=0.5' --print -o %t.npz | FileCheck %s
// RUN: %PYTHON -c "import numpy as n; z = n.load('%t.npz'); print(sorted(z.files), z['result0'].tolist(), z['result1'].tolist())" | FileCheck %s --check-prefix=NPZ

// Inline inputs (one value splats to every element), results printed in order with
// their StableHLO types; -o writes the same results to an .npz.

// CHECK:      result[0]: tensor<2x3xf32>
// CHECK-NEXT: {{^\[\[}}1.5, 2.5, 3.5],
// CHECK-NEXT: {{^}} [4.5, 5.5, 6.5]]
// CHECK-NEXT: result[1]: tensor<f32>
// CHECK-NEXT: {{^}}21{{$}}
// CHECK-NOT:  result

// NPZ: ['result0', 'result1'] {{\[\[}}1.5, 2.5, 3.5], [4.5, 5.5, 6.5]] 21.0

module @add_and_sum {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<f32>) {
    %0 = stablehlo.add %a, %b : tensor<2x3xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %1 = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>
    return %0, %1 : tensor<2x3xf32>, tensor<f32>
  }
}
