// RUN: torchtpu-opt %s --split-input-file --torchtpu-materialize-bounds | FileCheck %s
// RUN: torchtpu-opt %s --split-input-file --torchtpu-annotate-bounds --torchtpu-materialize-bounds | FileCheck %s

// A bounded argument becomes its padded buffer plus an i32 size that re-marks it; a
// bounded result is returned padded, followed by its size.
// CHECK-LABEL: func.func @seq
// CHECK-SAME:    (%[[X:.*]]: tensor<64x4xf32>, %[[N:.*]]: tensor<i32> {torchtpu.size_of = array<i64: 0, 0>})
// CHECK-SAME:    -> (tensor<64x4xf32>, tensor<i32> {torchtpu.size_of = array<i64: 0, 0>})
// CHECK:         %[[D:.*]] = stablehlo.set_dimension_size %[[X]], %[[N]], dim = 0 : (tensor<64x4xf32>, tensor<i32>) -> tensor<?x4xf32, #stablehlo.bounds<64, ?>>
// CHECK:         %[[E:.*]] = stablehlo.exponential %[[D]]
// CHECK:         %[[SIZE:.*]] = stablehlo.get_dimension_size %[[E]], dim = 0
// CHECK:         %[[BOUND:.*]] = stablehlo.constant dense<64> : tensor<i32>
// CHECK:         %[[PAD:.*]] = stablehlo.set_dimension_size %[[E]], %[[BOUND]], dim = 0 : (tensor<?x4xf32, #stablehlo.bounds<64, ?>>, tensor<i32>) -> tensor<64x4xf32>
// CHECK:         return %[[PAD]], %[[SIZE]] : tensor<64x4xf32>, tensor<i32>
func.func @seq(%x: tensor<?x4xf32, #stablehlo.bounds<64, ?>>) -> tensor<?x4xf32, #stablehlo.bounds<64, ?>> {
  %e = stablehlo.exponential %x : tensor<?x4xf32, #stablehlo.bounds<64, ?>>
  return %e : tensor<?x4xf32, #stablehlo.bounds<64, ?>>
}

// -----

// Several dynamic dims and arguments: sizes follow the arguments in (argument, dim)
// order; static arguments and results are unchanged.
// CHECK-LABEL: func.func @two
// CHECK-SAME:    (%{{.*}}: tensor<8x16xf32>, %{{.*}}: tensor<3xf32>, %{{.*}}: tensor<i32> {torchtpu.size_of = array<i64: 0, 0>}, %{{.*}}: tensor<i32> {torchtpu.size_of = array<i64: 0, 1>})
// CHECK-SAME:    -> (tensor<3xf32>, tensor<8x16xf32>, tensor<i32> {torchtpu.size_of = array<i64: 1, 0>}, tensor<i32> {torchtpu.size_of = array<i64: 1, 1>})
// CHECK:         stablehlo.set_dimension_size {{.*}} dim = 0 : (tensor<8x16xf32>, tensor<i32>) -> tensor<?x16xf32, #stablehlo.bounds<8, ?>>
// CHECK:         stablehlo.set_dimension_size {{.*}} dim = 1 : (tensor<?x16xf32, #stablehlo.bounds<8, ?>>, tensor<i32>) -> tensor<?x?xf32, #stablehlo.bounds<8, 16>>
// CHECK:         stablehlo.get_dimension_size {{.*}} dim = 0
// CHECK:         stablehlo.get_dimension_size {{.*}} dim = 1
// CHECK:         %[[P0:.*]] = stablehlo.set_dimension_size {{.*}} dim = 0 : (tensor<?x?xf32, #stablehlo.bounds<8, 16>>, tensor<i32>) -> tensor<8x?xf32, #stablehlo.bounds<?, 16>>
// CHECK:         %[[P1:.*]] = stablehlo.set_dimension_size %[[P0]], {{.*}} dim = 1 : (tensor<8x?xf32, #stablehlo.bounds<?, 16>>, tensor<i32>) -> tensor<8x16xf32>
// CHECK:         return %{{.*}}, %[[P1]], %{{.*}}, %{{.*}} : tensor<3xf32>, tensor<8x16xf32>, tensor<i32>, tensor<i32>
func.func @two(%x: tensor<?x?xf32, #stablehlo.bounds<8, 16>>, %y: tensor<3xf32>) -> (tensor<3xf32>, tensor<?x?xf32, #stablehlo.bounds<8, 16>>) {
  return %y, %x : tensor<3xf32>, tensor<?x?xf32, #stablehlo.bounds<8, 16>>
}

// -----

// Private functions keep their signature (only entry points are materialized).
// CHECK-LABEL: func.func private @helper
// CHECK-SAME:    tensor<?xf32, #stablehlo.bounds<4>>
func.func private @helper(%x: tensor<?xf32, #stablehlo.bounds<4>>) -> tensor<?xf32, #stablehlo.bounds<4>> {
  return %x : tensor<?xf32, #stablehlo.bounds<4>>
}
