// RUN: torchtpu-opt %s --split-input-file --torchtpu-verify | FileCheck %s

// Well-formed torchtpu ops and types pass the verifier unchanged.

// CHECK-LABEL: func.func @load_store
// CHECK-SAME:    (%[[REF:.*]]: !torchtpu.ref<tensor<2x3xf32>>)
// CHECK:         %[[V:.*]] = "torchtpu.load"(%[[REF]]) : (!torchtpu.ref<tensor<2x3xf32>>) -> tensor<2x3xf32>
// CHECK:         "torchtpu.store"(%[[REF]], %[[V]])
func.func @load_store(%r: !torchtpu.ref<tensor<2x3xf32>>) -> tensor<2x3xf32> {
  %0 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<2x3xf32>>) -> tensor<2x3xf32>
  "torchtpu.store"(%r, %0) : (!torchtpu.ref<tensor<2x3xf32>>, tensor<2x3xf32>) -> ()
  return %0 : tensor<2x3xf32>
}

// -----

// Dynamic and zero-rank tensors inside a reference.
// CHECK-LABEL: func.func @dynamic_and_scalar
// CHECK: "torchtpu.load"(%{{.*}}) : (!torchtpu.ref<tensor<?x4xi32>>) -> tensor<?x4xi32>
// CHECK: "torchtpu.store"(%{{.*}}, %{{.*}}) : (!torchtpu.ref<tensor<f16>>, tensor<f16>) -> ()
func.func @dynamic_and_scalar(%a: !torchtpu.ref<tensor<?x4xi32>>, %b: !torchtpu.ref<tensor<f16>>, %v: tensor<f16>) -> tensor<?x4xi32> {
  %0 = "torchtpu.load"(%a) : (!torchtpu.ref<tensor<?x4xi32>>) -> tensor<?x4xi32>
  "torchtpu.store"(%b, %v) : (!torchtpu.ref<tensor<f16>>, tensor<f16>) -> ()
  return %0 : tensor<?x4xi32>
}

// -----

// Discardable attributes of other dialects are allowed on torchtpu ops.
// CHECK-LABEL: func.func @discardable_attribute
// CHECK: "torchtpu.load"(%{{.*}}) {mhlo.frontend_attributes = {}}
func.func @discardable_attribute(%r: !torchtpu.ref<tensor<4xf32>>) -> tensor<4xf32> {
  %0 = "torchtpu.load"(%r) {mhlo.frontend_attributes = {}} : (!torchtpu.ref<tensor<4xf32>>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// torchtpu ops nested in regions of other ops are verified and kept.
// CHECK-LABEL: func.func @nested_in_while
// CHECK: stablehlo.while
// CHECK: "torchtpu.load"
// CHECK: "torchtpu.store"
func.func @nested_in_while(%r: !torchtpu.ref<tensor<f32>>, %n: tensor<i32>) -> tensor<i32> {
  %0 = stablehlo.while(%i = %n) : tensor<i32>
   cond {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %p = stablehlo.compare GT, %i, %c0 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %v = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<f32>>) -> tensor<f32>
    %w = stablehlo.add %v, %v : tensor<f32>
    "torchtpu.store"(%r, %w) : (!torchtpu.ref<tensor<f32>>, tensor<f32>) -> ()
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.subtract %i, %c1 : tensor<i32>
    stablehlo.return %j : tensor<i32>
  }
  return %0 : tensor<i32>
}

// -----

// Modules without torchtpu ops pass through untouched.
// CHECK-LABEL: func.func @plain_stablehlo
// CHECK: stablehlo.add
func.func @plain_stablehlo(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
