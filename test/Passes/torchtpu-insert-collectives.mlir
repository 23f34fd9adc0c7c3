// RUN: torchtpu-opt %s --split-input-file --torchtpu-insert-collectives | FileCheck %s

// Megatron tensor parallelism: column-parallel then row-parallel matmul. Local shapes,
// the elementwise relu without communication, one all-reduce of the partial sums.
// CHECK-LABEL: func.func @tp_mlp
// CHECK-SAME:  %arg1: tensor<16x8xf32> {torchtpu.sharding = "#sdy.sharding<@mesh, [{}, {\22x\22}]>"}
// CHECK-SAME:  %arg2: tensor<8x16xf32>
// CHECK:       stablehlo.dot_general %arg0, %arg1{{.*}} -> tensor<8x8xf32>
// CHECK:       stablehlo.maximum {{.*}} : tensor<8x8xf32>
// CHECK:       stablehlo.dot_general {{.*}} -> tensor<8x16xf32>
// CHECK:       "stablehlo.all_reduce"({{.*}}) <{replica_groups = dense<{{\[\[}}0, 1, 2, 3]]> : tensor<1x4xi64>}>
// CHECK-NOT:   "stablehlo.all_gather"
// CHECK-NOT:   sdy.mesh @mesh
sdy.mesh @mesh = <["x"=4]>
func.func @tp_mlp(%x: tensor<8x16xf32>, %w1: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>}, %w2: tensor<32x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> tensor<8x16xf32> {
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %c = stablehlo.constant dense<0.0> : tensor<8x32xf32>
  %1 = stablehlo.maximum %0, %c : tensor<8x32xf32>
  %2 = stablehlo.dot_general %1, %w2, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}

// -----

// FSDP: the batch and the weight sharded on dim 0. The weight is all-gathered before
// the matmul; the weight gradient (a contraction over the sharded batch) is
// reduce-scattered into the weight's sharding.
// CHECK-LABEL: func.func @fsdp_linear
// CHECK-SAME:  (%arg0: tensor<16x8xf32> {{.*}}, %arg1: tensor<4x8xf32> {{.*}}, %arg2: tensor<16x16xf32> {{.*}}) -> (tensor<16x16xf32> {{.*}}, tensor<4x8xf32> {{.*}})
// CHECK:       %[[W:.*]] = "stablehlo.all_gather"(%arg1) <{all_gather_dim = 0 : i64, replica_groups = dense<{{\[\[}}0, 1, 2, 3]]>
// CHECK:       stablehlo.dot_general %arg0, %[[W]], contracting_dims = [1] x [1] {{.*}} -> tensor<16x16xf32>
// CHECK:       %[[G:.*]] = stablehlo.dot_general %arg2, %arg0, contracting_dims = [0] x [0] {{.*}} -> tensor<16x8xf32>
// CHECK:       "stablehlo.reduce_scatter"(%[[G]]) <{{.*}}scatter_dimension = 0 : i64}>
// CHECK:       -> tensor<4x8xf32>
sdy.mesh @mesh = <["x"=4]>
func.func @fsdp_linear(%x: tensor<64x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %w: tensor<16x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %dy: tensor<64x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>})
    -> (tensor<64x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, tensor<16x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<64x8xf32>, tensor<16x8xf32>) -> tensor<64x16xf32>
  %dw = stablehlo.dot_general %dy, %x, contracting_dims = [0] x [0] : (tensor<64x16xf32>, tensor<64x8xf32>) -> tensor<16x8xf32>
  return %y, %dw : tensor<64x16xf32>, tensor<16x8xf32>
}

// -----

// Elementwise ops on matching shardings need no communication; a splat constant and a
// broadcast are rebuilt at the local shape.
// CHECK-LABEL: func.func @elementwise
// CHECK-NOT:   "stablehlo.all_
// CHECK-NOT:   dynamic_slice
// CHECK:       stablehlo.constant dense<1.000000e+00> : tensor<2x8xf32>
// CHECK:       stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<8xf32>) -> tensor<2x8xf32>
// CHECK:       return {{.*}} : tensor<2x8xf32>
sdy.mesh @mesh = <["x"=4]>
func.func @elementwise(%a: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %b: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %bias: tensor<8xf32>)
    -> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) {
  %0 = stablehlo.add %a, %b : tensor<8x8xf32>
  %one = stablehlo.constant dense<1.0> : tensor<8x8xf32>
  %1 = stablehlo.multiply %0, %one : tensor<8x8xf32>
  %2 = stablehlo.broadcast_in_dim %bias, dims = [1] : (tensor<8xf32>) -> tensor<8x8xf32>
  %3 = stablehlo.subtract %1, %2 : tensor<8x8xf32>
  %4 = stablehlo.exponential %3 : tensor<8x8xf32>
  return %4 : tensor<8x8xf32>
}

// -----

// A reduction over a sharded dimension leaves partial sums (maxima), combined with an
// all-reduce of the same kind where the replicated result is needed.
// CHECK-LABEL: func.func @reductions
// CHECK:       stablehlo.reduce(%arg0 init: {{.*}}) applies stablehlo.add across dimensions = [0] : (tensor<2x8xf32>, tensor<f32>) -> tensor<8xf32>
// CHECK:       stablehlo.reduce(%arg0 init: {{.*}}) applies stablehlo.maximum across dimensions = [1] : (tensor<2x8xf32>, tensor<f32>) -> tensor<2xf32>
// CHECK:       "stablehlo.all_reduce"
// CHECK:       stablehlo.add
// CHECK-NOT:   "stablehlo.all_gather"
// CHECK:       return
sdy.mesh @mesh = <["x"=4]>
func.func @reductions(%a: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>})
    -> (tensor<8xf32>, tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %m = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x8xf32>, tensor<f32>) -> tensor<8xf32>
  %1 = stablehlo.reduce(%a init: %m) applies stablehlo.maximum across dimensions = [1] : (tensor<8x8xf32>, tensor<f32>) -> tensor<8xf32>
  return %0, %1 : tensor<8xf32>, tensor<8xf32>
}

// -----

// Splitting heads: the sharded dimension stays major through reshape and transpose.
// On a 2-D mesh, groups of axis "y" are the ranks that share their "x" coordinate.
// CHECK-LABEL: func.func @heads
// CHECK:       stablehlo.reshape %arg0 : (tensor<8x4xf32>) -> tensor<8x2x2xf32>
// CHECK:       stablehlo.transpose {{.*}} -> tensor<2x8x2xf32>
// CHECK:       "stablehlo.all_gather"({{.*}}) <{all_gather_dim = 0 : i64, replica_groups = dense<{{\[\[}}0, 1], [2, 3]]> : tensor<2x2xi64>}>
sdy.mesh @mesh = <["x"=2, "y"=2]>
func.func @heads(%q: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"y"}]>}) -> tensor<4x8x2xf32> {
  %0 = stablehlo.reshape %q : (tensor<8x8xf32>) -> tensor<8x4x2xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0, 2] : (tensor<8x4x2xf32>) -> tensor<4x8x2xf32>
  return %1 : tensor<4x8x2xf32>
}

// -----

// Merging an unsharded dimension in front of a sharded one ([B, H] -> [B*H], as batched
// matmuls do with heads) gives a dimension of B blocks each split on the axis; splitting
// it back restores the head sharding, and gathering it gathers inside the blocks.
// CHECK-LABEL: func.func @merged_heads
// CHECK:       stablehlo.reshape %arg0 : (tensor<2x2x8xf32>) -> tensor<4x8xf32>
// CHECK:       stablehlo.reshape {{.*}} : (tensor<4x8xf32>) -> tensor<2x2x8xf32>
// CHECK:       %[[S:.*]] = stablehlo.reshape {{.*}} : (tensor<4x8xf32>) -> tensor<2x2x8xf32>
// CHECK:       %[[G:.*]] = "stablehlo.all_gather"(%[[S]]) <{all_gather_dim = 1 : i64
// CHECK-SAME:  -> tensor<2x8x8xf32>
// CHECK:       stablehlo.reshape %[[G]] : (tensor<2x8x8xf32>) -> tensor<16x8xf32>
sdy.mesh @mesh = <["x"=4]>
func.func @merged_heads(%q: tensor<2x8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}, {}]>}) -> (tensor<2x8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}, {}]>}, tensor<16x8xf32>) {
  %0 = stablehlo.reshape %q : (tensor<2x8x8xf32>) -> tensor<16x8xf32>
  %1 = stablehlo.exponential %0 : tensor<16x8xf32>
  %2 = stablehlo.reshape %1 : (tensor<16x8xf32>) -> tensor<2x8x8xf32>
  return %2, %1 : tensor<2x8x8xf32>, tensor<16x8xf32>
}

// -----

// slice, pad, reverse and concatenate along unsharded dimensions stay local.
// CHECK-LABEL: func.func @unsharded_dims
// CHECK-NOT:   "stablehlo.all_
// CHECK:       stablehlo.slice %arg0 [0:2, 0:4] : (tensor<2x8xf32>) -> tensor<2x4xf32>
// CHECK:       stablehlo.pad {{.*}} -> tensor<2x6xf32>
// CHECK:       stablehlo.reverse {{.*}} : tensor<2x6xf32>
// CHECK:       stablehlo.concatenate {{.*}} dim = 1 : (tensor<2x6xf32>, tensor<2x8xf32>) -> tensor<2x14xf32>
sdy.mesh @mesh = <["x"=4]>
func.func @unsharded_dims(%a: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>})
    -> (tensor<8x14xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) {
  %0 = stablehlo.slice %a [0:8, 0:4] : (tensor<8x8xf32>) -> tensor<8x4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.pad %0, %z, low = [0, 1], high = [0, 1], interior = [0, 0] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8x6xf32>
  %2 = stablehlo.reverse %1, dims = [1] : tensor<8x6xf32>
  %3 = stablehlo.concatenate %2, %a, dim = 1 : (tensor<8x6xf32>, tensor<8x8xf32>) -> tensor<8x14xf32>
  return %3 : tensor<8x14xf32>
}

// -----

// Partial sums pass through linear ops (a float convert) but are combined before a
// convert to integers: rounding the parts is not rounding the sum.
// CHECK-LABEL: func.func @convert_partial
// CHECK:       %[[S:.*]] = stablehlo.reduce
// CHECK-NEXT:  %[[H:.*]] = stablehlo.convert %[[S]] : (tensor<8xf32>) -> tensor<8xf64>
// CHECK-NEXT:  %[[R:.*]] = "stablehlo.all_reduce"(%[[S]])
// CHECK:       stablehlo.convert %[[R]] : (tensor<8xf32>) -> tensor<8xi32>
// CHECK:       "stablehlo.all_reduce"(%[[H]])
sdy.mesh @mesh = <["x"=4]>
func.func @convert_partial(%a: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> (tensor<8xi32>, tensor<8xf64>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x8xf32>, tensor<f32>) -> tensor<8xf32>
  %1 = stablehlo.convert %0 : (tensor<8xf32>) -> tensor<8xf64>
  %2 = stablehlo.convert %0 : (tensor<8xf32>) -> tensor<8xi32>
  return %2, %1 : tensor<8xi32>, tensor<8xf64>
}
