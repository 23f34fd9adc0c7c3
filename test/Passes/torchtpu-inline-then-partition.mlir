// RUN: torchtpu-opt %s --split-input-file --pass-pipeline='builtin.module(torchtpu-inline,torchtpu-insert-collectives)' | FileCheck %s --check-prefix=INLINED

// torchtpu-inline runs before the passes that do not look through calls: the partitioner
// then sees through what were calls (JAX's nested jit).
// INLINED-LABEL: func.func @tp_through_call
// INLINED-NOT:   call @
// INLINED:       stablehlo.dot_general {{.*}} -> tensor<8x8xf32>
// INLINED:       "stablehlo.all_reduce"
// INLINED-NOT:   func.func private @layer
sdy.mesh @mesh = <["x"=4]>
func.func @tp_through_call(%x: tensor<8x16xf32>, %w1: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>}, %w2: tensor<32x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> tensor<8x16xf32> {
  %0 = func.call @layer(%x, %w1) : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %2 = stablehlo.dot_general %0, %w2, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}
func.func private @layer(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  return %0 : tensor<8x32xf32>
}
