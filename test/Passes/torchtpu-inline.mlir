// RUN: torchtpu-opt %s --split-input-file --torchtpu-inline | FileCheck %s

// Nested private calls are inlined callees first; dead private functions are dropped.
// CHECK-LABEL: func.func @nested
// CHECK-NOT:   func.call
// CHECK:       %[[A:.*]] = stablehlo.add %arg0, %arg0
// CHECK:       %[[M:.*]] = stablehlo.multiply %[[A]], %arg0
// CHECK:       stablehlo.add %[[M]], %[[M]]
// CHECK-NOT:   func.func private
func.func @nested(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @outer(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = func.call @inner(%0) : (tensor<4xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}
func.func private @outer(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @inner(%a) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = stablehlo.multiply %0, %a : tensor<4xf32>
  return %1 : tensor<4xf32>
}
func.func private @inner(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @never_called(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}

// -----

// Several results; a call inside a loop body (a region) is reached too.
// CHECK-LABEL: func.func @results_and_regions
// CHECK:       stablehlo.while
// CHECK:       stablehlo.subtract
// CHECK-NOT:   func.call
// CHECK:       return
func.func @results_and_regions(%x: tensor<f32>, %n: tensor<i32>) -> (tensor<f32>, tensor<f32>) {
  %r:2 = stablehlo.while(%i = %n, %v = %x) : tensor<i32>, tensor<f32>
  cond {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %p = stablehlo.compare GT, %i, %c0 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.subtract %i, %one : tensor<i32>
    %w:2 = func.call @pair(%v) : (tensor<f32>) -> (tensor<f32>, tensor<f32>)
    stablehlo.return %j, %w#0 : tensor<i32>, tensor<f32>
  }
  %s:2 = func.call @pair(%r#1) : (tensor<f32>) -> (tensor<f32>, tensor<f32>)
  return %s#0, %s#1 : tensor<f32>, tensor<f32>
}
func.func private @pair(%a: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  %0 = stablehlo.negate %a : tensor<f32>
  %1 = stablehlo.exponential %a : tensor<f32>
  return %0, %1 : tensor<f32>, tensor<f32>
}

// -----

// Calls to public functions and to declarations stay; a private function still named
// by another attribute (custom_call's called_computations) is kept after inlining.
// CHECK-LABEL: func.func @kept
// CHECK:       call @public_helper
// CHECK:       call @external
// CHECK:       stablehlo.custom_call @host_callback
// CHECK:       func.func @public_helper
// CHECK:       func.func private @external
// CHECK:       func.func private @referenced
func.func @kept(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @public_helper(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = func.call @external(%0) : (tensor<4xf32>) -> tensor<4xf32>
  %2 = func.call @referenced(%1) : (tensor<4xf32>) -> tensor<4xf32>
  %3 = stablehlo.custom_call @host_callback(%2) {called_computations = [@referenced]} : (tensor<4xf32>) -> tensor<4xf32>
  return %3 : tensor<4xf32>
}
func.func @public_helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
func.func private @external(tensor<4xf32>) -> tensor<4xf32>
func.func private @referenced(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.abs %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
