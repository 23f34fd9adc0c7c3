// RUN: torchtpu-opt %s --split-input-file --torchtpu-annotate-bounds | FileCheck %s

// The argument attribute becomes the type's bounds; set_dimension_size and elementwise
// ops carry them forward, and the function type follows.
// CHECK-LABEL: func.func @seq
// CHECK-SAME:    (%{{.*}}: tensor<?x4xf32, #stablehlo.bounds<64, ?>>) -> tensor<?x4xf32, #stablehlo.bounds<64, ?>>
// CHECK-NOT:     torchtpu.bounds
// CHECK:         stablehlo.set_dimension_size {{.*}} -> tensor<64x4xf32>
// CHECK:         stablehlo.exponential {{.*}} : tensor<64x4xf32>
// CHECK:         stablehlo.set_dimension_size {{.*}} -> tensor<?x4xf32, #stablehlo.bounds<64, ?>>
// CHECK:         stablehlo.negate {{.*}} : tensor<?x4xf32, #stablehlo.bounds<64, ?>>
func.func @seq(%x: tensor<?x4xf32> {torchtpu.bounds = array<i64: 64, -1>}) -> tensor<?x4xf32> {
  %n = stablehlo.get_dimension_size %x, dim = 0 : (tensor<?x4xf32>) -> tensor<i32>
  %s = stablehlo.set_dimension_size %x, %n, dim = 0 : (tensor<?x4xf32>, tensor<i32>) -> tensor<64x4xf32>
  %e = stablehlo.exponential %s : tensor<64x4xf32>
  %d = stablehlo.set_dimension_size %e, %n, dim = 0 : (tensor<64x4xf32>, tensor<i32>) -> tensor<?x4xf32>
  %r = stablehlo.negate %d : tensor<?x4xf32>
  return %r : tensor<?x4xf32>
}

// -----

// Two dynamic dims, one of them set from a static operand dim (its size is the bound).
// CHECK-LABEL: func.func @two_dims
// CHECK-SAME:    tensor<2x?x?xf32, #stablehlo.bounds<?, 16, 8>>
// CHECK:         stablehlo.add {{.*}} : tensor<2x?x?xf32, #stablehlo.bounds<?, 16, 8>>
// CHECK:         return {{.*}} : tensor<2x?x?xf32, #stablehlo.bounds<?, 16, 8>>
func.func @two_dims(%x: tensor<2x?x?xf32> {torchtpu.bounds = array<i64: -1, 16, 8>}, %y: tensor<2x16x8xf32>, %n: tensor<i32>) -> tensor<2x?x?xf32> {
  %a = stablehlo.set_dimension_size %y, %n, dim = 1 : (tensor<2x16x8xf32>, tensor<i32>) -> tensor<2x?x8xf32>
  %b = stablehlo.set_dimension_size %a, %n, dim = 2 : (tensor<2x?x8xf32>, tensor<i32>) -> tensor<2x?x?xf32>
  %c = stablehlo.add %x, %b : tensor<2x?x?xf32>
  return %c : tensor<2x?x?xf32>
}

// -----

// Static functions are left alone.
// CHECK-LABEL: func.func @static
// CHECK-SAME:    (%{{.*}}: tensor<3xf32>) -> tensor<3xf32>
// CHECK-NOT:     bounds
func.func @static(%x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = stablehlo.abs %x : tensor<3xf32>
  return %0 : tensor<3xf32>
}
