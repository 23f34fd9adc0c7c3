// RUN: torchtpu-opt %s --split-input-file --torchtpu-outline-collectives | FileCheck %s

// Each collective moves into a function of its own; the runs of ops between them into
// compute functions; the caller becomes the sequence of calls.
// CHECK-LABEL: func.func private @step_compute_0(%arg0: tensor<4xf32>) -> tensor<4xf32> attributes {torchtpu.outlined = "compute"}
// CHECK:         stablehlo.multiply
// CHECK-LABEL: func.func private @step_collective_0(%arg0: tensor<4xf32>) -> tensor<4xf32> attributes {torchtpu.outlined = "collective"}
// CHECK-NEXT:    "stablehlo.all_reduce"(%arg0)
// CHECK:         return
// CHECK-LABEL: func.func private @step_compute_1(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>) -> tensor<4xf32> attributes {torchtpu.outlined = "compute"}
// CHECK:         stablehlo.add %arg0, %arg1
// CHECK-LABEL: func.func private @step_collective_1(%arg0: tensor<4xf32>) -> tensor<8xf32>
// CHECK-NEXT:    "stablehlo.all_gather"(%arg0)
// CHECK-LABEL: func.func @step(%arg0: tensor<4xf32>) -> tensor<8xf32>
// CHECK-NEXT:    %[[A:.*]] = call @step_compute_0(%arg0)
// CHECK-NEXT:    %[[B:.*]] = call @step_collective_0(%[[A]])
// CHECK-NEXT:    %[[C:.*]] = call @step_compute_1(%[[B]], %arg0)
// CHECK-NEXT:    %[[D:.*]] = call @step_collective_1(%[[C]])
// CHECK-NEXT:    return %[[D]]
func.func @step(%x: tensor<4xf32>) -> tensor<8xf32> {
  %0 = stablehlo.multiply %x, %x : tensor<4xf32>
  %1 = "stablehlo.all_reduce"(%0) ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) {replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
  %2 = stablehlo.add %1, %x : tensor<4xf32>
  %3 = "stablehlo.all_gather"(%2) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>} : (tensor<4xf32>) -> tensor<8xf32>
  return %3 : tensor<8xf32>
}

// -----

// Functions under torch_tpu.spmd_safe keep their collectives embedded.
// CHECK-LABEL: func.func @safe
// CHECK:         "stablehlo.all_reduce"
// CHECK-NOT:     call
func.func @safe(%x: tensor<4xf32>) -> tensor<4xf32> attributes {torchtpu.spmd_safe} {
  %0 = "stablehlo.all_reduce"(%x) ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Not-yet-lowered torchtpu.collective ops are outlined too; a function without
// collectives is left alone.
// CHECK-LABEL: func.func private @f_collective_0
// CHECK-NEXT:    "torchtpu.collective"
// CHECK-LABEL: func.func @f
// CHECK-NEXT:    call @f_collective_0
// CHECK-LABEL: func.func @g
// CHECK-NEXT:    stablehlo.negate
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "torchtpu.collective"(%x) {kind = "all_reduce", reduce_op = "sum", replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @g(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
