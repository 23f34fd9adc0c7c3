// RUN: torchtpu-opt %s --split-input-file --torchtpu-narrow-iotas | FileCheck %s

// A 64-bit integer iota becomes a 32-bit iota converted to its type; its users read the
// converted value.
// CHECK-LABEL: func.func @signless_i64
// CHECK:         %[[N:.*]] = stablehlo.iota dim = 0 : tensor<16xi32>
// CHECK-NEXT:    %[[W:.*]] = stablehlo.convert %[[N]] : (tensor<16xi32>) -> tensor<16xi64>
// CHECK-NEXT:    %[[S:.*]] = stablehlo.add %[[W]], %[[W]] : tensor<16xi64>
// CHECK-NEXT:    return %[[S]]
// CHECK-NOT:     iota {{.*}}xi64>
func.func @signless_i64() -> tensor<16xi64> {
  %0 = stablehlo.iota dim = 0 : tensor<16xi64>
  %1 = stablehlo.add %0, %0 : tensor<16xi64>
  return %1 : tensor<16xi64>
}

// -----

// Unsigned 64-bit too, along any dimension; only the iota dimension's size counts.
// CHECK-LABEL: func.func @unsigned_inner_dim
// CHECK:         %[[N:.*]] = stablehlo.iota dim = 1 : tensor<2x8xi32>
// CHECK-NEXT:    stablehlo.convert %[[N]] : (tensor<2x8xi32>) -> tensor<2x8xui64>
// CHECK:         %[[M:.*]] = stablehlo.iota dim = 0 : tensor<3x2147483648xi32>
// CHECK-NEXT:    stablehlo.convert %[[M]] : (tensor<3x2147483648xi32>) -> tensor<3x2147483648xi64>
func.func @unsigned_inner_dim() -> (tensor<2x8xui64>, tensor<3x2147483648xi64>) {
  %0 = stablehlo.iota dim = 1 : tensor<2x8xui64>
  %1 = stablehlo.iota dim = 0 : tensor<3x2147483648xi64>
  return %0, %1 : tensor<2x8xui64>, tensor<3x2147483648xi64>
}

// -----

// Left alone: other element types, and an iota dimension whose values would not fit in i32.
// CHECK-LABEL: func.func @left_alone
// CHECK:         stablehlo.iota dim = 0 : tensor<4xi32>
// CHECK-NEXT:    stablehlo.iota dim = 0 : tensor<4xf32>
// CHECK-NEXT:    stablehlo.iota dim = 0 : tensor<4xi16>
// CHECK-NEXT:    stablehlo.iota dim = 0 : tensor<2147483648xi64>
// CHECK-NOT:     stablehlo.convert
func.func @left_alone() -> (tensor<4xi32>, tensor<4xf32>, tensor<4xi16>, tensor<2147483648xi64>) {
  %0 = stablehlo.iota dim = 0 : tensor<4xi32>
  %1 = stablehlo.iota dim = 0 : tensor<4xf32>
  %2 = stablehlo.iota dim = 0 : tensor<4xi16>
  %3 = stablehlo.iota dim = 0 : tensor<2147483648xi64>
  return %0, %1, %2, %3 : tensor<4xi32>, tensor<4xf32>, tensor<4xi16>, tensor<2147483648xi64>
}

// -----

// A bounded dynamic iota dimension (torchtpu-annotate-bounds' form) is not static: left alone.
// CHECK-LABEL: func.func @dynamic
// CHECK:         stablehlo.dynamic_iota {{.*}}xi64>
// CHECK-NOT:     stablehlo.convert
func.func @dynamic(%n: tensor<1xi64>) -> tensor<?xi64> {
  %0 = stablehlo.dynamic_iota %n, dim = 0 : (tensor<1xi64>) -> tensor<?xi64>
  return %0 : tensor<?xi64>
}
