// torchtpu-collective-pipeline: what a tpu_dist collective program runs (a dump's
// pipeline.txt names it): broadcasts through all-gather, bitwise reductions through bytes.

// RUN: torchtpu-opt %s --pass-pipeline='builtin.module(torchtpu-collective-pipeline)' | FileCheck %s

// CHECK-LABEL: func.func @broadcast
// CHECK-NOT:   torchtpu.collective
// CHECK:       stablehlo.all_gather
// CHECK-NOT:   stablehlo.collective_broadcast
func.func @broadcast(%x: tensor<8xf32>) -> tensor<8xf32> {
  %y = "torchtpu.collective"(%x) {kind = "broadcast", src = 1 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<8xf32>) -> tensor<8xf32>
  return %y : tensor<8xf32>
}

// CHECK-LABEL: func.func @xor
// CHECK-NOT:   torchtpu.collective
// CHECK:       stablehlo.all_reduce
// CHECK:       }) : (tensor<4x32xui8>) -> tensor<4x32xui8>
func.func @xor(%x: tensor<4xi32>) -> tensor<4xi32> {
  %y = "torchtpu.collective"(%x) {kind = "all_reduce", reduce_op = "bxor", replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xi32>) -> tensor<4xi32>
  return %y : tensor<4xi32>
}
