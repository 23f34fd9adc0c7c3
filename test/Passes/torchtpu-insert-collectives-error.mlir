// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-insert-collectives

// Patterns the partitioner does not support are located errors naming the op and the
// operands' shardings.

sdy.mesh @mesh = <["x"=4]>
func.func @slice_sharded_dim(%a: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> tensor<2x8xf32> {
  // expected-error @below {{torchtpu-insert-collectives: 'stablehlo.slice' on operands sharded [{"x"}, {}]: it changes sharded dimension(s) [0]; only unsharded dimensions may be sliced, padded or reversed}}
  %0 = stablehlo.slice %a [0:2, 0:8] : (tensor<8x8xf32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

sdy.mesh @mesh = <["x"=4]>
func.func @no_rule(%a: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %i: tensor<2x1xi32>) -> tensor<2x8xf32> {
  // expected-error @below {{'stablehlo.gather' on operands sharded [{"x"}, {}], [{}, {}]: the partitioner has no rule for this op on sharded values}}
  %0 = "stablehlo.gather"(%a, %i) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 8>} : (tensor<8x8xf32>, tensor<2x1xi32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

sdy.mesh @mesh = <["x"=4]>
func.func @reshape_split(%a: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> tensor<2x4xf32> {
  // expected-error @below {{'stablehlo.reshape' on operands sharded [{"x"}]: reshape [8] -> [2, 4] splits sharded dimension 0 (axis "x") across dimensions so that no single dimension holds the split}}
  %0 = stablehlo.reshape %a : (tensor<8xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

sdy.mesh @mesh = <["x"=4]>
// expected-error @below {{argument #0: dimension of size 6 is sharded on "x" of size 4, which does not divide it}}
func.func @uneven(%a: tensor<6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> tensor<6xf32> {
  return %a : tensor<6xf32>
}

// -----

sdy.mesh @mesh = <["x"=2, "y"=2]>
// expected-error @below {{a dimension sharded on several axes ("x", "y") is not supported}}
func.func @two_axes(%a: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x", "y"}]>}) -> tensor<8xf32> {
  return %a : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["x"=4]>
func.func @sort(%a: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> tensor<8xf32> {
  // expected-error @below {{'stablehlo.sort' on operands sharded [{"x"}]}}
  %0 = "stablehlo.sort"(%a) ({
  ^bb0(%x: tensor<f32>, %y: tensor<f32>):
    %c = stablehlo.compare LT, %x, %y : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  }) {dimension = 0 : i64} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["x"=4]>
func.func @argmax(%a: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}, %i: tensor<8xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> (tensor<f32>, tensor<i32>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %zi = stablehlo.constant dense<0> : tensor<i32>
  // expected-error @below {{a reduce of several operands (argmax-like) over sharded values is not supported}}
  %0:2 = stablehlo.reduce(%a init: %z), (%i init: %zi) across dimensions = [0] : (tensor<8xf32>, tensor<8xi32>, tensor<f32>, tensor<i32>) -> (tensor<f32>, tensor<i32>)
    reducer(%x: tensor<f32>, %y: tensor<f32>) (%j: tensor<i32>, %k: tensor<i32>) {
      stablehlo.return %x, %j : tensor<f32>, tensor<i32>
    }
  return %0#0, %0#1 : tensor<f32>, tensor<i32>
}

// -----

// The partitioner does not look through calls: it asks for torchtpu-inline first.
sdy.mesh @mesh = <["x"=4]>
func.func @calls(%a: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> tensor<8x8xf32> {
  // expected-error @below {{torchtpu-insert-collectives: does not look through calls (@helper); run torchtpu-inline first}}
  %0 = func.call @helper(%a) : (tensor<8x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
func.func private @helper(%a: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.add %a, %a : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
