// RUN: rm -rf %t && mkdir -p %t
// RUN: %PYTHON -c "import numpy as n; n.save('%t/x.npy', n.arange(6, dtype=n.int32).reshape(2, 3)); n.save('%t/w.npy', n.array([[1, 0], [0, 1], [2, 2]], dtype=n.int32))"
// RUN: torchtpu-run %s --input %t/x.npy --input %t/w.npy | FileCheck %s

// .npy inputs, in argument order.

// CHECK:      result[0]: tensor<2x2xi32>
// CHECK-NEXT: {{^\[\[}}4, 5],
// CHECK-NEXT: {{^}} [13, 14]]

module @matmul {
  func.func public @main(%x: tensor<2x3xi32>, %w: tensor<3x2xi32>) -> tensor<2x2xi32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xi32>, tensor<3x2xi32>) -> tensor<2x2xi32>
    return %0 : tensor<2x2xi32>
  }
}
